"""A GPU's pool of resident trainers (executor.trainers), with real
trainer processes on the CPU: two jobs (both examples, small) interleaved
within their rounds reach the one-process parameters bitwise through
their aggregators, with models moved out and back; a trainer killed with
SIGKILL mid-task; pinning; the round's parameters once per trainer."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import executor.__main__ as executor_main
from executor.settings import ExecutorSettings
from executor.taskrun import trainer_pool
from executor.trainers import DEFAULT_TRAINERS, TrainerPool, TrainerRefused
from hops.aggregator import Aggregator, GradientReport
from hops.trainer.api import load_task, reference_rounds, task_gradients
from services.runtime.settings import parse_args
from tests.trainer_task import same_gradients
from world.clusters import cluster_arg

ROOT = Path(__file__).resolve().parents[1]
CNN = str(ROOT / "examples" / "train_cnn.py")
LM = str(ROOT / "examples" / "train_lm.py")
TINY = str(ROOT / "tests" / "trainer_task.py")
S = 3
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "cnn": (CNN, {"batch_size": 4, "dataset_size": 32, "sync_scale": S, "seed": 1}),
    "lm": (LM, {"batch_size": 2, "seq_len": 8, "vocab": 32, "d_model": 16, "layers": 1,
                "sync_scale": S, "seed": 2}),
}
# Each round: cnn 0..1, lm 0..0, cnn 2, lm 1..2 (interleaved within the round).
ROUND = (("cnn", 0, 2), ("lm", 0, 1), ("cnn", 2, 3), ("lm", 1, 3))


def _shift(model: torch.nn.Module) -> None:
    """Move the initial weights off the script's seeded ones, so that a
    trainer keeping its seeded weights for round 0 would show."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)


@pytest.mark.parametrize(("count", "capacity"), [(1, 1), (2, 2)])
def test_two_jobs_interleaved_reach_the_one_process_result(
        count: int, capacity: int, tmp_path: Path) -> None:
    rounds = 3
    aggregators, references = {}, {}
    for job, (script, config) in CONFIGS.items():
        task = load_task(script, config)
        _shift(task.model)
        aggregators[job] = Aggregator(job, S, dict(task.model.named_parameters()),
                                      task.optimizer)
        reference = load_task(script, config)
        _shift(reference.model)
        reference_rounds(reference, S, rounds)
        references[job] = reference.model
    sequence = [step for _ in range(rounds) for step in ROUND]
    reloads = 0
    with TrainerPool(count, capacity=capacity, folder=str(tmp_path)) as pool:
        for job, (script, config) in CONFIGS.items():
            pool.add_job(job, script, config)
        for i, (job, lo, hi) in enumerate(sequence):
            agg = aggregators[job]
            upcoming = [j for j, _, _ in sequence[i + 1:]]
            out = pool.run(job, agg.applied, lo, hi, S, agg.parameters, upcoming)
            reloads += out.reload_s > 0
            assert out.attempts == 1 and len(out.gradients) == hi - lo
            got = agg.receive(GradientReport(job, agg.applied, lo, hi, out.gradients))
            assert got.outcome in ("counted", "applied"), got
            assert all(len(h) <= capacity for h in pool.holding())
    for job, agg in aggregators.items():
        assert agg.applied == rounds
        for name, param in references[job].named_parameters():
            assert torch.equal(param, agg.parameters[name]), (job, name)
    assert (reloads > 0) == (capacity == 1)  # one place: each switch moves a model out
    assert not list(tmp_path.iterdir())  # every moved-out model came back or was dropped


@pytest.fixture
def tiny_pool(tmp_path: Path) -> Iterator[TrainerPool]:
    with TrainerPool(2, capacity=1, cores=(0,), folder=str(tmp_path)) as pool:
        yield pool


def _params(config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {n: t.detach() + 0.03 for n, t in load_task(TINY, config).model.named_parameters()}


def _local(config: Mapping[str, Any], params: Mapping[str, torch.Tensor], round_: int,
           lo: int, hi: int) -> tuple[dict[str, torch.Tensor], ...]:
    task = load_task(TINY, config)
    with torch.no_grad():
        for name, param in task.model.named_parameters():
            param.copy_(params[name])
    return task_gradients(task, round_, lo, hi, 4)


def test_a_trainer_killed_mid_task_is_replaced_and_the_task_runs_once(
        tiny_pool: TrainerPool, tmp_path: Path) -> None:
    marker = tmp_path / "died"
    config = {"die_once": str(marker), "die_at": 4 * 2 + 1}  # round 2, micro-batch 1
    params = _params(config)
    tiny_pool.add_job("k", TINY, config)
    first = tiny_pool.run("k", 2, 0, 1, 4, params)
    before = tiny_pool.pids
    out = tiny_pool.run("k", 2, 1, 3, 4, params)  # dies at micro-batch 1, runs again
    assert marker.exists() and int(marker.read_text()) == before[out.trainer]
    assert out.attempts == 2 and out.params_sent and out.loaded
    assert tiny_pool.pids[out.trainer] != before[out.trainer]
    assert same_gradients(first.gradients + out.gradients, _local(config, params, 2, 0, 3))


def test_a_trainer_killed_between_tasks_is_replaced(tiny_pool: TrainerPool) -> None:
    params = _params({})
    tiny_pool.add_job("t", TINY, {})
    first = tiny_pool.run("t", 0, 0, 2, 4, params)
    os.kill(tiny_pool.pids[first.trainer], signal.SIGKILL)
    out = tiny_pool.run("t", 0, 2, 4, 4, params)
    assert out.attempts == 2 and out.params_sent
    assert same_gradients(first.gradients + out.gradients, _local({}, params, 0, 0, 4))


def test_params_go_once_per_round_and_trainer(tiny_pool: TrainerPool) -> None:
    tiny_pool.add_job("a", TINY, {"seed": 5})
    tiny_pool.add_job("b", TINY, {"seed": 6})
    pa, pb = _params({"seed": 5}), _params({"seed": 6})
    runs = [tiny_pool.run("a", 0, 0, 1, 4, pa, ["a", "b"]),
            tiny_pool.run("a", 0, 1, 2, 4, pa, ["b"]),
            tiny_pool.run("b", 0, 0, 2, 4, pb, ["a"]),
            tiny_pool.run("a", 0, 2, 4, 4, pa),
            tiny_pool.run("a", 1, 0, 1, 4, pa)]
    assert [r.params_sent for r in runs] == [True, False, True, False, True]
    assert [r.loaded for r in runs] == [True, False, True, False, False]
    assert runs[2].trainer != runs[0].trainer  # a free trainer, no model moved out
    assert same_gradients(tuple(g for r in (runs[0], runs[1], runs[3]) for g in r.gradients),
                 _local({"seed": 5}, pa, 0, 0, 4))
    tiny_pool.forget("a")
    assert all("a" not in h for h in tiny_pool.holding())
    with pytest.raises(TrainerRefused) as refused:
        tiny_pool.run("a", 1, 0, 1, 4, pa)
    assert refused.value.code == "unknown_job"


def test_trainers_start_ahead_pinned_to_the_gpu_cores(tiny_pool: TrainerPool) -> None:
    for pid in tiny_pool.pids:  # up before any task
        assert os.sched_getaffinity(pid) == {0}
    tiny_pool.add_job("p", TINY, {})
    out = tiny_pool.run("p", 0, 0, 1, 4, _params({}))
    pid = tiny_pool.pids[out.trainer]
    for tid in os.listdir(f"/proc/{pid}/task"):  # every thread, torch's included
        assert os.sched_getaffinity(int(tid)) == {0}


def test_a_refusal_is_raised_with_its_code(tiny_pool: TrainerPool) -> None:
    tiny_pool.add_job("f", TINY, {"fail": True})
    with pytest.raises(TrainerRefused) as refused:
        tiny_pool.run("f", 0, 0, 1, 4, _params({}))
    assert refused.value.code == "task_failed" and "on purpose" in refused.value.words
    with pytest.raises(TrainerRefused) as refused:
        tiny_pool.run("f", 0, 0, 5, 4, _params({}))
    assert refused.value.code == "bad_span"


def test_a_deterministic_pool_keeps_its_trainers_deterministic(
        tiny_pool: TrainerPool, tmp_path: Path) -> None:
    config = {"need_deterministic": True}
    params = _params(config)
    tiny_pool.add_job("d", TINY, config)
    with pytest.raises(TrainerRefused) as refused:  # torch's default: off
        tiny_pool.run("d", 0, 0, 1, 4, params)
    assert refused.value.code == "task_failed" and "deterministic" in refused.value.words
    with TrainerPool(1, capacity=1, folder=str(tmp_path), deterministic=True) as pool:
        pool.add_job("d", TINY, config)
        first = pool.run("d", 0, 0, 2, 4, params)
        os.kill(pool.pids[first.trainer], signal.SIGKILL)  # its replacement is too
        out = pool.run("d", 0, 2, 4, 4, params)
    assert out.attempts == 2  # the same model and data as without the switch:
    assert same_gradients(first.gradients + out.gradients, _local({}, params, 0, 0, 4))


def test_the_next_task_starts_while_the_gradients_travel(tiny_pool: TrainerPool) -> None:
    pa, pb = _params({"seed": 7}), _params({"seed": 8})
    tiny_pool.add_job("a", TINY, {"seed": 7})
    tiny_pool.add_job("b", TINY, {"seed": 8})
    first = tiny_pool.start("a", 0, 0, 1, 4, pa, ["b", "a"])
    other = tiny_pool.start("b", 0, 0, 2, 4, pb, ["a"])
    again = tiny_pool.start("a", 0, 1, 4, 4, pa)  # same trainer: after a's first compute
    assert first.trainer == again.trainer != other.trainer
    assert other.computed.compute_start >= first.computed.compute_end
    results = [tiny_pool.finish(t) for t in (again, other, first)]
    assert same_gradients(results[2].gradients + results[0].gradients,
                          _local({"seed": 7}, pa, 0, 0, 4))
    assert same_gradients(results[1].gradients, _local({"seed": 8}, pb, 0, 0, 2))
    # Killed once its compute ended: the gradients come once, from it or from a rerun.
    late = tiny_pool.start("b", 1, 0, 3, 4, pb)
    os.kill(tiny_pool.pids[late.trainer], signal.SIGKILL)
    out = tiny_pool.finish(late)
    assert out.attempts in (1, 2)
    assert same_gradients(out.gradients, _local({"seed": 8}, pb, 1, 0, 3))


def test_the_next_command_goes_before_the_last_gradients_are_read(
        tiny_pool: TrainerPool) -> None:
    pa = _params({"seed": 9})
    tiny_pool.add_job("a", TINY, {"seed": 9})
    first = tiny_pool.stage("a", 0, 0, 1, 4, pa)
    again = tiny_pool.stage("a", 0, 1, 3, 4, pa)  # its model's trainer: the same one
    assert again.trainer == first.trainer
    assert first.computed is not None and first.reply is None  # counted; gradients unread
    later, earlier = tiny_pool.finish(again), tiny_pool.finish(first)  # in either order
    assert same_gradients(earlier.gradients + later.gradients, _local({"seed": 9}, pa, 0, 0, 3))
    # Killed with a task sent and the gradients of the one before unread (a
    # slow job's: 0.2 s a micro-batch): both come, once.
    slow = {"seed": 9, "sleep_s": 0.2}
    tiny_pool.add_job("s", TINY, slow)
    one = tiny_pool.stage("s", 1, 0, 1, 4, pa)
    two = tiny_pool.stage("s", 1, 1, 2, 4, pa)
    os.kill(tiny_pool.pids[one.trainer], signal.SIGKILL)
    second, first_ = tiny_pool.finish(two), tiny_pool.finish(one)
    assert second.attempts == 2 and first_.attempts in (1, 2)
    assert same_gradients(first_.gradients + second.gradients, _local(slow, pa, 1, 0, 2))
    third = tiny_pool.run("a", 2, 0, 4, 4, pa)  # and the pool goes on
    assert same_gradients(third.gradients, _local({"seed": 9}, pa, 2, 0, 4))


def test_trainers_per_gpu_and_the_params_wait_are_executor_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = cluster_arg("paper-physical")
    argv = ["--cluster", "paper-physical", "--server-id", cluster.servers[0].id]

    def settings(*extra: str) -> ExecutorSettings:
        _, args = parse_args([*argv, *extra], service="executor", parser=executor_main._parser())
        return executor_main.executor_settings(args, cluster)

    assert settings().trainers_per_gpu == DEFAULT_TRAINERS == 2
    assert settings().task_params_wait_s == 120.0
    monkeypatch.setenv("HOPS_TRAINERS_PER_GPU", "3")
    monkeypatch.setenv("HOPS_TASK_PARAMS_WAIT_S", "7.5")
    assert (settings().trainers_per_gpu, settings().task_params_wait_s) == (3, 7.5)
    assert settings("--trainers-per-gpu", "4").trainers_per_gpu == 4
    assert settings("--task-params-wait-s", "3").task_params_wait_s == 3.0
    assert not settings().deterministic_trainers
    assert settings("--deterministic-trainers").deterministic_trainers
    monkeypatch.setenv("HOPS_DETERMINISTIC_TRAINERS", "1")
    on = settings()
    assert on.deterministic_trainers
    pool = trainer_pool(on, 0)  # what the real executor's task work makes per GPU
    try:
        assert pool.deterministic and len(pool.pids) == 3
    finally:
        pool.close()


def test_tenants_never_share_a_trainer_process(tiny_pool: TrainerPool) -> None:
    """Two trainers, three tenants: a job goes to a free trainer or its
    tenant's; with none left, a trainer is replaced by a fresh process."""
    for job, tenant in (("a", "t1"), ("a2", "t1"), ("b", "t2"), ("c", "t3")):
        tiny_pool.add_job(job, TINY, {"seed": 3}, tenant)
    params = _params({"seed": 3})
    ran: dict[int, set[str]] = {}  # pid -> tenants whose tasks it ran
    for job in ("a", "b", "a2", "c", "a", "b"):
        out = tiny_pool.run(job, 0, 0, 1, 4, params)
        pid = tiny_pool.pids[out.trainer]
        ran.setdefault(pid, set()).add(tiny_pool.jobs[job].tenant)
        assert tiny_pool.owners()[out.trainer] == tiny_pool.jobs[job].tenant
        assert same_gradients(out.gradients, _local({"seed": 3}, params, 0, 0, 1))
    assert all(len(tenants) == 1 for tenants in ran.values()), ran
    assert len(ran) > 2  # resets happened: more processes than trainers
