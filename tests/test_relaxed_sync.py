"""Relaxed scale-fixed synchronisation within one job (hare.md §2.2.2-2.2.3).

- :func:`shared.relaxed.relaxed_split`: micro-batches per rank, each >= 1,
  summing exactly to the sync scale, in proportion to the ranks' speeds;
  the planner's split from the estimator's per-GPU throughputs.
- The contract: ``JobSpec.sync_scale`` (refused on the wire when bad),
  ``start_job``'s ``micro_batches``, the executor's ``HOPS_SYNC_SCALE`` and
  ``HOPS_MICRO_BATCHES`` (and ``HOPS_LR`` for S GPUs), read back by the
  plugin, which refuses malformed values.
- The plugin's step: the accumulated gradient is the global batch's, in one
  process and over two ranks with DDP over gloo.
- Two real ranks of different speeds, launched as the executor launches
  them (:func:`executor.launch.launches`, :func:`executor.ranks.start_ranks`,
  a rendezvous on a port the kernel picked free): the even split against
  the speed-proportional one. **How the slow rank is slowed:** each rank
  emulates its device's time per micro-batch with a sleep in the forward
  pass, 20 ms on the "fast" GPU type and 60 ms on the "slow" one (three
  times slower), on top of a tiny model's real computation. A sleep, not
  busy work, so that the speed ratio holds on a loaded two-core machine.
  The fast rank's wait is the plugin's own measure of the gradient
  all-reduce (first bucket launched to all-reduce done, ``Sampled``
  lines): with S = 4 split 2:2 it waits for the slow rank about 80 ms a
  step; split 3:1 by speed, about nothing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset

from cli.up.launcher import free_port
from executor.launch import (
    LaunchOptions,
    job_paths,
    launches,
    micro_batches_of,
    relaxed_refusal,
)
from executor.ranks import start_ranks
from hops import plugin
from hops.plugin.config import settings_from_env
from hops.plugin.data import MicroBatchSampler
from hops.plugin.micro import loss_factor
from shared import events as ev
from shared import jobenv
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.jobreport import AnyReport, Finished, Progress, Sampled, Started, decode_line
from shared.node import Rendezvous
from shared.relaxed import (
    config_split,
    even_split,
    format_split,
    parse_split,
    plan_splits,
    rank_speeds,
    relaxed_split,
    split_problem,
)
from shared.snapshot import Assignment, Plan
from shared.wire import INVALID

ROOT = Path(__file__).resolve().parents[1]
FAST, SLOW = GpuType("fast"), GpuType("slow")
F0, F1, S0 = ServerId("fast-0"), ServerId("fast-1"), ServerId("slow-0")
DEVICE_S = {FAST: 0.020, SLOW: 0.060}  # emulated device time per micro-batch
SCALE, BATCH, STEPS, FEATURES = 4, 8, 16, 16
TOTAL = STEPS * SCALE * BATCH
BASE_LR = 0.1


# --- the split -------------------------------------------------------------------------


@pytest.mark.parametrize(("scale", "speeds", "split"), [
    (4, [3.0, 1.0], (3, 1)),
    (4, [1.0, 1.0], (2, 2)),
    (10, [9.0, 1.0], (9, 1)),  # no floor of one bias: quotas are exact
    (4, [10.0, 1.0], (3, 1)),  # quota 0.36 is held at one, the rest to the other
    (5, [1.0, 1.0], (3, 2)),  # a tie of remainders: the lower rank
    (7, [1.0, 2.0, 4.0], (1, 2, 4)),
    (8, [100.0, 1.0, 1.0], (6, 1, 1)),
    (3, [5.0, 5.0, 1.0], (1, 1, 1)),  # k = S: one each
    (6, [0.1, 0.2, 0.3], (1, 2, 3)),  # decimal speeds, exact arithmetic
])
def test_relaxed_split_examples(scale: int, speeds: list[float], split: tuple[int, ...]) -> None:
    assert relaxed_split(scale, speeds) == split


def test_relaxed_split_sums_exactly_and_follows_the_speeds() -> None:
    g = torch.Generator().manual_seed(7)
    for _ in range(300):
        k = int(torch.randint(1, 7, (1,), generator=g))
        scale = k + int(torch.randint(0, 30, (1,), generator=g))
        speeds = (torch.rand(k, generator=g) * 10 + 0.05).tolist()
        split = relaxed_split(scale, speeds)
        assert sum(split) == scale and min(split) >= 1 and len(split) == k
        # Faster never gets fewer; the ranks above the floor of one are within
        # one micro-batch of their exact quota of what the floors left.
        order = sorted(range(k), key=lambda r: speeds[r])
        assert [split[r] for r in order] == sorted(split)
        free = [r for r in range(k) if split[r] > 1]
        if free:
            seats = scale - (k - len(free))
            total = sum(speeds[r] for r in free)
            assert all(abs(split[r] - seats * speeds[r] / total) < 1 + 1e-9 for r in free)
        assert relaxed_split(scale, list(speeds)) == split  # deterministic
    # proportional exactly where the quotas are whole
    assert relaxed_split(12, [2.0, 1.0, 1.0]) == (6, 3, 3)
    assert relaxed_split(6, [1.0, 1.0, 1.0]) == even_split(6, 3) == (2, 2, 2)


@pytest.mark.parametrize(("scale", "speeds", "says"), [
    (1, [1.0, 1.0], "2 ranks need a sync scale of at least 2, got 1"),
    (4, [], "no ranks"),
    (4, [1.0, 0.0], "rank 1 has speed 0.0"),
    (4, [-1.0, 1.0], "rank 0 has speed -1.0"),
    (4, [math.nan, 1.0], "rank 0 has speed nan"),
    (4, [math.inf, 1.0], "rank 0 has speed inf"),
])
def test_relaxed_split_refuses(scale: int, speeds: list[float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        relaxed_split(scale, speeds)


def cluster() -> Cluster:
    types = tuple(GpuTypeSpec(t, 1e9, 1e8) for t in (FAST, SLOW))
    return Cluster(types, (Server(F0, FAST, 2), Server(F1, FAST, 2), Server(S0, SLOW, 2)))


def estimate(job: str = "j", types: tuple[GpuType, ...] = (FAST, SLOW)) -> JobEstimate:
    # Per-GPU samples/s: the fast type three times the slow one, on one server
    # (agg) and in a placement over several (dist).
    curves = {FAST: ThroughputCurve(agg=(300.0, 290.0), dist=(270.0,)),
              SLOW: ThroughputCurve(agg=(100.0, 95.0), dist=(90.0,))}
    return JobEstimate(JobId(job), {t: curves[t] for t in types})


def test_the_planner_splits_a_configuration_by_the_estimated_speeds() -> None:
    c, est = cluster(), estimate()
    config = Configuration.of({F0: 1, S0: 1})
    assert rank_speeds(est, c, config) == (270.0, 90.0)  # distributed: the dist figures
    assert config_split(4, est, c, config) == (3, 1)
    # quotas 3.43, 3.43, 1.14: the spare micro-batch to the lower of the tied ranks
    assert config_split(8, est, c, Configuration.of({F0: 2, S0: 1})) == (4, 3, 1)
    assert config_split(4, est, c, Configuration.of({S0: 2})) == (2, 2)
    # Not relaxed, more GPUs than S, no estimate, or a type it lacks: no split.
    assert config_split(0, est, c, config) == ()
    assert config_split(2, est, c, Configuration.of({F0: 2, S0: 1})) == ()
    assert config_split(4, None, c, config) == ()
    assert config_split(4, estimate(types=(FAST,)), c, config) == ()
    # Without distributed figures, each server's own per-GPU throughput.
    flat = JobEstimate(JobId("j"), {FAST: ThroughputCurve(agg=(300.0,)),
                                    SLOW: ThroughputCurve(agg=(100.0,))})
    assert rank_speeds(flat, c, config) == (300.0, 100.0)


def gpu_spec(job: str = "j", **kw: Any) -> JobSpec:
    base: dict[str, Any] = {"requirements": (1, 2), "sync_scale": SCALE, "base_lr": BASE_LR,
                            "total_samples": TOTAL}
    base.update(kw)
    return JobSpec(JobId(job), "mlp", BATCH, 1000, **base)


def test_plan_splits_covers_the_relaxed_jobs_of_a_plan() -> None:
    plain = gpu_spec("p", sync_scale=0)
    specs = {JobId("j"): gpu_spec(), JobId("p"): plain, JobId("x"): gpu_spec("x")}
    plan = Plan(assignments=(
        Assignment(JobId("j"), Configuration.of({F0: 1, S0: 1})),
        Assignment(JobId("p"), Configuration.of({F1: 1, S0: 1})),
        Assignment(JobId("x"), Configuration.of({F1: 2})),  # no estimate for it
    ))
    splits = plan_splits(plan, specs, {JobId("j"): estimate(), JobId("p"): estimate("p")},
                         cluster())
    assert splits == {JobId("j"): (3, 1)}
    issued = ev.PlanIssued(round=1, term=1, plan=plan, at=0.0, micro_batches=splits)
    assert ev.decode_plan_event(ev.encode(issued)) == issued
    assert ev.PlanIssued(round=1, term=1, plan=plan, at=0.0).micro_batches == {}


# --- the contract: job spec, start_job, environment ------------------------------------


def body(**fields: Any) -> bytes:
    spec = {"id": "r1", "model": "m", "batch_size": 8, "params": 10, "total_samples": 100,
            "requirements": [1, 2], **fields}
    return json.dumps({k: v for k, v in spec.items() if v is not None}).encode()


def test_a_sync_scale_is_accepted_on_the_wire() -> None:
    assert ev.decode_submit(body(sync_scale=4)).spec.sync_scale == 4
    assert ev.decode_submit(body()).spec.sync_scale == 0  # the default: not relaxed
    assert ev.decode_submit(body(sync_scale="4")).spec.sync_scale == 4  # lax, as every number
    wrapped = ev.decode_submit(ev.encode(ev.SubmitJob(spec=gpu_spec()))).spec
    assert wrapped.sync_scale == SCALE
    assert ev.decode_submit(body(sync_scale=4, requirements=None, min_gpus=1,
                                 max_gpus=4)).spec.sync_scale == 4


@pytest.mark.parametrize(("fields", "says"), [
    ({"sync_scale": -1}, "sync_scale must be >= 0, got -1"),
    ({"sync_scale": 1}, "runs on at most sync_scale = 1 GPUs; its requirements go up to 2"),
    ({"sync_scale": 3, "requirements": None, "min_gpus": 1, "max_gpus": 4},
     "its requirements go up to 4"),
    ({"sync_scale": 2.5}, "Expected `int`"),
    ({"sync_scale": "four"}, "Expected `int`, got `str` - at `$.sync_scale`"),
    ({"sync_scale": 2, "kind": "cpu", "cores": 2, "requirements": None},
     "a cpu job takes no sync_scale"),
    ({"sync_scale": 4, "env": {"HOPS_MICRO_BATCHES": "3,1"}, "command": ["python"]},
     "HOPS_MICRO_BATCHES is set by the executor"),
])
def test_a_bad_sync_scale_is_invalid_at_decoding(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ev.WireError) as refused:
        ev.decode_submit(body(**fields))
    assert refused.value.code == INVALID and says in str(refused.value), refused.value


def start(config: dict[ServerId, int], server: ServerId, split: tuple[int, ...] = (),
          job: JobSpec | None = None, mode: str = "run", port: int = 31000) -> ev.StartJob:
    cfg = Configuration.of(config)
    return ev.StartJob(key=f"start:{server}", job_id=JobId("j"), server_id=server,
                       spec=job or gpu_spec(), configuration=cfg,
                       gpu_indices=tuple(range(cfg.as_dict()[server])),
                       mode=mode,  # type: ignore[arg-type]
                       rendezvous=Rendezvous("127.0.0.1", port), micro_batches=split)


def test_start_job_carries_the_split_and_refuses_a_bad_one() -> None:
    cmd = start({F0: 2, S0: 1}, F0, (2, 1, 1))
    assert ev.decode_command(ev.encode(cmd)) == cmd
    for split, says in [((3, 1), "name 2 ranks, the job has 3"),
                        ((2, 1, 2), "sum to 5, not the sync scale 4"),
                        ((3, 1, 0), "every rank needs at least one")]:
        with pytest.raises(ValueError, match=says):
            start({F0: 2, S0: 1}, F0, split)
        raw = json.loads(ev.encode(cmd))
        raw["micro_batches"] = list(split)
        with pytest.raises(ev.WireError) as refused:
            ev.decode_command(json.dumps(raw).encode())
        assert refused.value.code == INVALID and says in str(refused.value)
    with pytest.raises(ValueError, match="need a sync scale > 0"):
        start({F0: 1, S0: 1}, F0, (1, 1), job=gpu_spec(sync_scale=0))


def rank_envs(cmd: ev.StartJob, tmp_path: Path, gpu_type: str = "fast") -> list[dict[str, str]]:
    opts = LaunchOptions(gpu_type=gpu_type, threads=1)
    return [r.env for r in launches(cmd, opts, job_paths(tmp_path, "j", cmd.server_id), {})]


def test_the_executor_sets_the_split_and_the_plugin_reads_it(tmp_path: Path) -> None:
    config = {F0: 2, S0: 1}
    envs = [e for s in (F0, S0) for e in rank_envs(start(config, s, (2, 1, 1)), tmp_path)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    for rank, env in enumerate(envs):
        assert env[jobenv.SYNC_SCALE] == "4" and env[jobenv.MICRO_BATCHES] == "2,1,1"
        assert env[jobenv.LR] == repr(BASE_LR * SCALE)  # the rate of S GPUs, not of 3
        s = settings_from_env(env)
        assert (s.sync_scale, s.micro_batches, s.step_batches) == (4, (2, 1, 1), 4)
        assert s.own_micro_batches == (2, 1, 1)[rank]
        assert s.first_micro_batch == (0, 2, 3)[rank] and s.lr_gpus == 4
        assert loss_factor(s) == 3 / 4  # k / S
    # No split from the planner: an even one; a profiling run: none at all.
    (even,) = rank_envs(start({F0: 1, S0: 1}, S0), tmp_path)
    assert even[jobenv.MICRO_BATCHES] == "2,2"
    assert micro_batches_of(start({F0: 1}, F0)) == (4,)
    (profile,) = rank_envs(start({F0: 1}, F0, mode="profile"), tmp_path)
    assert (profile[jobenv.SYNC_SCALE], profile[jobenv.MICRO_BATCHES]) == ("0", "")
    (plain,) = rank_envs(start({F0: 1}, F0, job=gpu_spec(sync_scale=0)), tmp_path)
    assert (plain[jobenv.SYNC_SCALE], plain[jobenv.MICRO_BATCHES]) == ("0", "")
    assert plain[jobenv.LR] == repr(BASE_LR)
    assert not settings_from_env(plain).relaxed and settings_from_env(plain).step_batches == 1
    assert not settings_from_env(profile).relaxed
    # More GPUs than micro-batches a step (a policy outside the requirements).
    wide = start({F0: 2, F1: 2, S0: 1}, F0, job=gpu_spec(requirements=(1,)))
    assert "cannot run on 5 GPUs" in (relaxed_refusal(wide) or "")
    assert relaxed_refusal(start({F0: 1, S0: 1}, F0)) is None


def test_the_split_round_trips_through_its_text() -> None:
    for split in [(3, 1), (1,), (2, 1, 1, 4)]:
        assert parse_split(format_split(split)) == split
    assert parse_split("") == () and parse_split(" 3 , 1 ") == (3, 1)
    with pytest.raises(ValueError, match="'x' is not an integer"):
        parse_split("3,x")
    assert split_problem(4, 2, (3, 1)) is None


LAUNCH = {"WORLD_SIZE": "2", "RANK": "1", "HOPS_JOB_ID": "j", "HOPS_BATCH_SIZE": "8"}


@pytest.mark.parametrize(("extra", "says"), [
    ({"HOPS_SYNC_SCALE": "4", "HOPS_MICRO_BATCHES": "3,x"}, "HOPS_MICRO_BATCHES='3,x'"),
    ({"HOPS_SYNC_SCALE": "4", "HOPS_MICRO_BATCHES": "2,1"}, "sum to 3, not the sync scale 4"),
    ({"HOPS_SYNC_SCALE": "4", "HOPS_MICRO_BATCHES": "4"}, "name 1 ranks, the job has 2"),
    ({"HOPS_SYNC_SCALE": "4", "HOPS_MICRO_BATCHES": "4,0"}, "every rank needs at least one"),
    ({"HOPS_MICRO_BATCHES": "3,1"}, "HOPS_MICRO_BATCHES needs HOPS_SYNC_SCALE > 0"),
    ({"HOPS_SYNC_SCALE": "1"}, "2 ranks need a sync scale of at least 2"),
    ({"HOPS_SYNC_SCALE": "-2"}, "HOPS_SYNC_SCALE must be >= 0"),
    ({"HOPS_SYNC_SCALE": "four"}, "HOPS_SYNC_SCALE='four' is not a valid int"),
])
def test_the_plugin_refuses_a_bad_split(extra: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        settings_from_env(LAUNCH | extra)


# --- the plugin's step ----------------------------------------------------------------


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def micro_data(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` (0..S-1) of step ``step``: the same in every process."""
    g = torch.Generator().manual_seed(1000 * step + index)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, x.sum(1, keepdim=True) + 0.1 * torch.randn(BATCH, 1, generator=g)


def global_gradient(step: int = 0) -> list[torch.Tensor]:
    """One process, one pass over the step's whole global batch (S · b samples)."""
    model = make_model()
    parts = [micro_data(step, j) for j in range(SCALE)]
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    loss: torch.Tensor = nn.functional.mse_loss(model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def test_one_process_accumulates_the_global_batch_gradient(tmp_path: Path) -> None:
    env = {"HOPS_JOB_ID": "j", "HOPS_BATCH_SIZE": str(BATCH), "HOPS_SYNC_SCALE": str(SCALE),
           "HOPS_TOTAL_SAMPLES": str(SCALE * BATCH), "HOPS_REPORT_FILE": str(tmp_path / "r")}
    run = plugin.init(env=env, handle_sigterm=False)
    model = run.wrap(make_model())
    seen: list[int] = []
    grads: list[torch.Tensor] = []
    for step in run.steps():
        for micro in step.micro_batches():
            seen.append(micro.index)
            x, y = micro_data(step.index, micro.index)
            with step.forward():
                loss = micro.scale(nn.functional.mse_loss(model(x), y))
            with step.backward():
                loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        assert step.samples == SCALE * BATCH
    assert run.close() == 0 and seen == [0, 1, 2, 3]
    assert run.samples_done == SCALE * BATCH and run.iterations == 1
    for got, want in zip(grads, global_gradient(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_job_without_a_sync_scale_has_one_micro_batch(tmp_path: Path) -> None:
    run = plugin.init(env={"HOPS_JOB_ID": "j", "HOPS_BATCH_SIZE": "8", "HOPS_TOTAL_SAMPLES": "8",
                           "HOPS_REPORT_FILE": str(tmp_path / "r")}, handle_sigterm=False)
    for step in run.steps():
        (micro,) = step.micro_batches()
        assert (micro.index, micro.count, micro.factor, micro.last) == (0, 1, 1.0, True)
    assert run.close() == 0 and run.samples_done == 8


def test_the_sampler_deals_each_step_the_batches_of_s_replicas() -> None:
    data = TensorDataset(torch.arange(203))
    b, epoch = 5, 2
    samplers = [MicroBatchSampler(data, SCALE, first, count, b, seed=3)
                for first, count in ((0, 3), (3, 1))]
    reference: list[DistributedSampler[Any]] = [
        DistributedSampler(data, SCALE, j, seed=3, drop_last=True) for j in range(SCALE)]
    for s in [*samplers, *reference]:
        s.set_epoch(epoch)
    own = [list(s) for s in samplers]
    shards = [list(s) for s in reference]
    steps = len(shards[0]) // b
    assert [len(o) for o in own] == [3 * steps * b, steps * b] == [len(s) for s in samplers]
    for t in range(steps):
        got = own[0][3 * t * b:3 * (t + 1) * b] + own[1][t * b:(t + 1) * b]
        assert got == [i for j in range(SCALE) for i in shards[j][t * b:(t + 1) * b]]
    assert len({i for o in own for i in o}) == SCALE * steps * b  # nothing read twice


# --- two ranks of different speeds ---------------------------------------------------


def worker(out: Path) -> int:
    """One rank, as the executor starts it (this file is the job's command)."""
    device_s = DEVICE_S[GpuType(os.environ[jobenv.GPU_TYPE])]
    run = plugin.init()
    model = run.wrap(make_model())
    lr = run.learning_rate(BASE_LR)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    steps: list[list[int]] = []
    grads: list[list[float]] = []
    started = time.perf_counter()
    for step in run.steps():
        steps.append([])
        for micro in step.micro_batches():
            with step.data():
                x, y = micro_data(step.index, micro.index)
            with step.forward():
                time.sleep(device_s)  # the emulated device's time for this micro-batch
                loss = micro.scale(nn.functional.mse_loss(model(x), y))
            with step.backward():
                loss.backward()  # type: ignore[no-untyped-call]
            steps[-1].append(micro.index)
        if step.index == 0:  # all-reduced: what the update applies
            grads = [p.grad.flatten().tolist() for p in model.parameters()
                     if p.grad is not None]
        with step.update():
            opt.step()
            opt.zero_grad()
    elapsed = time.perf_counter() - started
    code = run.close()
    result = {"rank": run.settings.rank, "steps": steps, "grads": grads, "lr": lr,
              "samples_done": run.samples_done, "elapsed": elapsed}
    (out / f"rank{run.settings.rank}.json").write_text(json.dumps(result))
    return code


def run_job(run_dir: Path, job: JobSpec, split: tuple[int, ...]) -> list[list[AnyReport]]:
    """``job`` on one fast and one slow GPU, each its own server (local rank
    0 there), launched as their executors launch it; each server's reports."""
    port = free_port()  # the kernel's pick of a free port (bound to port 0)
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    groups = []
    for server, gpu_type in ((F0, FAST), (S0, SLOW)):
        cmd = start({F0: 1, S0: 1}, server, split, job=job, port=port)
        opts = LaunchOptions(gpu_type=gpu_type, sample_s=0.25, threads=1)
        plan = launches(cmd, opts, job_paths(run_dir, job.id, server), base)
        ranks, _ = start_ranks(plan, f"relaxed test on {server}")
        groups.append((ranks[0], plan[0]))
    for rank, launch in groups:
        try:
            code = rank.proc.wait(timeout=90)
        except BaseException:
            for other, _ in groups:
                other.proc.kill()
            raise
        assert code == 0, launch.log.read_text()[-3000:]
    reports = []
    for server in (F0, S0):
        raw = job_paths(run_dir, job.id, server).report.read_bytes().splitlines()
        got = [decode_line(r) for r in raw]
        reports.append([g for g in got if g is not None])
        assert len(reports[-1]) == len(got), raw
    return reports


def two_ranks(tmp_path: Path, split: tuple[int, ...]) -> tuple[list[dict[str, Any]],
                                                                  list[list[float]]]:
    """Rank 0 on a fast GPU, rank 1 on a slow one; each rank's result and its
    measured all-reduce times, per step."""
    run_dir = tmp_path / (format_split(split).replace(",", "-") or "even")
    out = run_dir / "out"
    out.mkdir(parents=True)
    job = gpu_spec(command=(sys.executable, str(Path(__file__).resolve()), str(out)))
    reports = run_job(run_dir, job, split)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    comms: list[list[float]] = []
    for got in reports:
        assert isinstance(got[-1], Finished) and got[-1].samples_done == TOTAL, got
        comms.append([c for x in got if isinstance(x, Sampled) for c in x.comm_times])
    return results, comms


def test_a_speed_proportional_split_cuts_the_fast_ranks_wait(tmp_path: Path) -> None:
    proportional = config_split(SCALE, estimate(), cluster(), Configuration.of({F0: 1, S0: 1}))
    assert proportional == (3, 1)
    runs = {split: two_ranks(tmp_path, split) for split in ((), proportional)}
    want = global_gradient()
    waits: dict[tuple[int, ...], float] = {}
    for split, (results, comms) in runs.items():
        shares = split or (2, 2)  # no split from the planner: the executor's even one
        for r, res in enumerate(results):
            assert res["lr"] == pytest.approx(BASE_LR * SCALE)
            assert res["samples_done"] == TOTAL and len(res["steps"]) == STEPS
            assert all(len(s) == shares[r] for s in res["steps"])
            got = [torch.tensor(g) for g in res["grads"]]
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w.flatten(), rtol=1e-5, atol=1e-6)
        # The global batch is kept: each step, the S micro-batches once.
        for a, b in zip(results[0]["steps"], results[1]["steps"], strict=True):
            assert sorted(a + b) == list(range(SCALE))
        assert len(comms[0]) >= STEPS - 1
        waits[split] = statistics.median(comms[0])
    even, prop = waits[()], waits[proportional]
    # Even: the fast rank's 2 x 20 ms against the slow rank's 2 x 60 ms, an
    # 80 ms wait; 3 x 20 ms against 1 x 60 ms balances it.
    assert even > 0.04, waits
    assert prop < 0.5 * even, waits
    assert runs[proportional][0][0]["elapsed"] < 0.85 * runs[()][0][0]["elapsed"]


def test_the_example_scripts_run_relaxed(tmp_path: Path) -> None:
    """train_cnn.py as a relaxed job: the plugin's loader deals each rank its
    micro-batches' samples, and the progress counts S batches a step."""
    total = 3 * SCALE * BATCH
    cnn = (sys.executable, str(ROOT / "examples" / "train_cnn.py"), "--dataset-size", "256")
    job = gpu_spec(command=cnn, total_samples=total)
    for got in run_job(tmp_path, job, (3, 1)):
        first, last = got[0], got[-1]
        assert isinstance(first, Started) and first.world_size == 2, got
        assert isinstance(last, Finished) and last.samples_done == total, got
        done = [p.samples_done for p in got if isinstance(p, Progress)]
        assert done[-1] == total and all(d % (SCALE * BATCH) == 0 for d in done)
        assert all(s.per_gpu_throughput > 0 for s in got if isinstance(s, Sampled))


if __name__ == "__main__":
    sys.exit(worker(Path(sys.argv[1])))
