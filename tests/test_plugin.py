"""The in-job plugin (hops.plugin): its pure parts, and the loop in this process.

The example scripts under the executor's environment (real subprocesses,
DDP over gloo, SIGTERM) are in tests/test_examples.py.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from hops import plugin
from hops.plugin import checkpoint
from hops.plugin.measure import (
    IterationTimes,
    SamplePeriod,
    detect_pattern,
    evenly,
    samples_done,
    scaled_lr,
    time_modules,
)
from hops.plugin.report import Reporter
from shared.ids import JobId
from shared.job import JobSpec
from shared.jobreport import (
    AnyReport,
    Checkpointed,
    Finished,
    Profiled,
    Progress,
    Sampled,
    Started,
    decode_line,
)


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        "HOPS_JOB_ID": "job-1", "HOPS_MODE": "run", "HOPS_BATCH_SIZE": "8",
        "HOPS_REPORT_FILE": str(tmp_path / "report.jsonl"),
        "HOPS_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "HOPS_SAMPLE_S": "0.05",
    }
    env.update(extra)
    return env


def lines(path: Path) -> list[AnyReport]:
    raw = path.read_bytes().splitlines()
    decoded = [decode_line(r) for r in raw]
    assert None not in decoded, raw
    return [d for d in decoded if d is not None]


# ---- learning rate (§2.2) ------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("rule", ["linear", "sqrt"])
def test_scaled_lr_agrees_with_the_job_spec(gpus: int, rule: str) -> None:
    spec = JobSpec(id=JobId("j"), model="m", batch_size=8, params=10, total_samples=10,
                   requirements=(1, 2), base_lr=0.1, base_gpus=2, lr_rule=rule,  # type: ignore[arg-type]
                   lr={3: 0.7})
    assert scaled_lr(gpus, 0.1, 2, rule, {3: 0.7}) == pytest.approx(spec.learning_rate(gpus))  # type: ignore[arg-type]


def test_scaled_lr_rules() -> None:
    assert scaled_lr(4, 0.1) == pytest.approx(0.4)
    assert scaled_lr(4, 0.1, rule="sqrt") == pytest.approx(0.2)
    assert scaled_lr(1, 0.4, base_gpus=4) == pytest.approx(0.1)
    assert scaled_lr(4, 0.1, table={4: 0.25}) == 0.25
    with pytest.raises(ValueError):
        scaled_lr(0, 0.1)


def test_run_learning_rate_prefers_the_executors_rate(tmp_path: Path) -> None:
    given = plugin.init(env=job_env(tmp_path, HOPS_LR="0.3", HOPS_TOTAL_GPUS="4"),
                        handle_sigterm=False)
    assert given.learning_rate(0.1) == 0.3
    four = plugin.init(env=job_env(tmp_path, HOPS_TOTAL_GPUS="4"), handle_sigterm=False)
    assert four.learning_rate(0.1, rule="linear") == pytest.approx(0.4)
    assert four.learning_rate(0.1, rule="sqrt") == pytest.approx(0.2)
    assert four.learning_rate(0.1, table={4: 0.25}) == 0.25
    two = plugin.init(env=job_env(tmp_path, WORLD_SIZE="2", RANK="1"), handle_sigterm=False)
    assert two.learning_rate(0.1) == pytest.approx(0.2)  # HOPS_TOTAL_GPUS defaults to WORLD_SIZE


# ---- pattern detection and time modules (Eq. 1) -----------------------------


def test_serial_loading_is_pattern_2() -> None:
    production = [0.010 + 0.001 * (i % 3) for i in range(20)]
    waits = [p + 0.0002 for p in production]  # the loop waits the whole production
    assert detect_pattern(waits, production) == 2


def test_background_loading_is_pattern_1() -> None:
    production = [0.010 + 0.001 * (i % 3) for i in range(20)]
    waits = [0.0004] * 20  # the batch was ready: only the hand-over is waited
    assert detect_pattern(waits, production) == 1


def test_pattern_threshold_and_missing_production() -> None:
    assert detect_pattern([0.007] * 5, [0.010] * 5) == 1  # part of it was hidden
    assert detect_pattern([0.009] * 5, [0.010] * 5) == 2
    assert detect_pattern([0.001] * 5, [None] * 5) == 2  # only the wait is known
    assert detect_pattern([0.0] * 5, [0.0] * 5) == 2
    assert detect_pattern([], []) == 2


def test_time_modules_take_medians_and_keep_per_iteration_times() -> None:
    records = [
        IterationTimes(data_wait=0.001, production=0.02, forward=0.010 + i * 0.001,
                       backward=0.030, update=0.002 + (0.1 if i == 4 else 0.0),
                       sync_wait=0.001 * i, comm=0.012, comm_exposed=0.005, total=0.05)
        for i in range(5)
    ]
    m = time_modules(records)
    assert m.t_f == pytest.approx(0.012)
    assert m.t_b == pytest.approx(0.025)  # the all-reduce BP did not hide is not BP
    assert m.t_u == pytest.approx(0.002)  # a stray slow update does not move the median
    assert m.pattern == 1
    assert m.t_d == (0.02,) * 5
    assert m.t_w == pytest.approx((0.0, 0.001, 0.002, 0.003, 0.004))


def test_data_time_falls_back_to_the_wait() -> None:
    m = time_modules([IterationTimes(data_wait=0.007, forward=0.01)] * 3)
    assert m.t_d == (0.007,) * 3
    assert m.pattern == 2


def test_evenly_keeps_ends_and_bounds() -> None:
    assert evenly(10, 50) == list(range(10))
    picked = evenly(1000, 50)
    assert len(picked) == 50 and picked[0] == 0 and picked[-1] == 999
    assert picked == sorted(set(picked))


def test_sample_period_line() -> None:
    period = SamplePeriod(started=10.0, batch_size=16)
    assert period.line(11.0, 0.0, at=1.0) is None
    for i in range(120):
        period.add(IterationTimes(data_wait=0.001, production=0.002 * i, sync_wait=0.003,
                                  comm=0.004, total=0.01))
    line = period.line(12.0, 1920.0, at=5.0)
    assert line is not None
    assert line.per_gpu_throughput == pytest.approx(16 * 120 / 2.0)
    assert 0 < len(line.data_times) <= 50
    assert len(line.wait_times) == len(line.comm_times) == len(line.data_times)
    assert line.data_times[-1] == pytest.approx(0.002 * 119)


def test_samples_done_never_exceeds_the_total() -> None:
    assert samples_done(100.0, 3, 16, 2, 1000.0) == 196.0
    assert samples_done(100.0, 30, 16, 2, 1000.0) == 1000.0
    assert samples_done(0.0, 5, 4, 1, None) == 20.0


# ---- settings, reports, checkpoints --------------------------------------------


def test_settings_from_the_environment(tmp_path: Path) -> None:
    s = plugin.settings_from_env(job_env(tmp_path, HOPS_MODE="profile", HOPS_PROFILE_ITERS="12",
                                         HOPS_TOTAL_SAMPLES="640", HOPS_SAMPLES_DONE="64"))
    assert (s.mode, s.profile_iters, s.total_samples, s.samples_done) == ("profile", 12, 640, 64)
    assert s.batch_size == 8 and s.report_file == tmp_path / "report.jsonl"
    assert plugin.settings_from_env(job_env(tmp_path), batch_size=32).batch_size == 32
    alone = plugin.settings_from_env({"HOPS_MODE": "profile"}, batch_size=4)
    assert alone.mode == "run" and alone.report_file is None and alone.total_samples is None
    assert not alone.writes_reports
    ranks = [plugin.settings_from_env(job_env(tmp_path, WORLD_SIZE="2", RANK=str(r),
                                              LOCAL_RANK=str(r))) for r in (0, 1)]
    assert [s.writes_reports for s in ranks] == [True, False]  # local rank 0 speaks for the node


@pytest.mark.parametrize(("name", "value"), [
    ("HOPS_BATCH_SIZE", "many"), ("HOPS_BATCH_SIZE", "0"), ("HOPS_SAMPLE_S", "-1"),
    ("HOPS_MODE", "train"), ("RANK", "2"), ("HOPS_THREADS", "0"),
])
def test_bad_settings_are_named(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        plugin.settings_from_env(job_env(tmp_path, **{name: value}))


def test_an_unwritable_report_file_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a folder")
    reporter = Reporter(tmp_path / "file" / "report.jsonl")
    with caplog.at_level(logging.WARNING, logger="hops.plugin"):
        assert not any(reporter.write(Progress(samples_done=float(i))) for i in range(3))
    assert len([r for r in caplog.records if "report file" in r.getMessage()]) == 1


class Wrapper(nn.Module):
    """Stands where DistributedDataParallel would: the model is ``.module``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_checkpoint_written_at_one_world_size_loads_at_another(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss: torch.Tensor = model(torch.randn(2, 4)).sum()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    path = checkpoint.save(tmp_path, Wrapper(model), opt, samples_done=96.0, world_size=4)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    fresh = nn.Linear(4, 3)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    loaded = checkpoint.load(tmp_path, fresh, fresh_opt)
    assert loaded is not None and (loaded.samples_done, loaded.world_size) == (96.0, 4)
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    assert checkpoint.load(tmp_path / "none", fresh, fresh_opt) is None


# ---- the loop, in this process ---------------------------------------------------


def batches(n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    while True:
        yield torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)


def train(run: plugin.Run, after: int = -1) -> int:
    """The loop; SIGTERM to this process during iteration ``after``."""
    model = run.wrap(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=run.learning_rate(0.01))
    run.resume(model, opt)
    data = run.batches(batches(run.batch_size))
    count = 0
    for step in run.steps():
        count += 1
        if step.index == after:
            signal.raise_signal(signal.SIGTERM)
        with step.data():
            x, y = next(data)
        with step.forward():
            loss = nn.functional.mse_loss(model(x), y)
        with step.backward():
            loss.backward()  # type: ignore[no-untyped-call]
        with step.update():
            opt.step()
            opt.zero_grad()
    return count


def test_profiling_mode_in_process(tmp_path: Path) -> None:
    run = plugin.init(env=job_env(tmp_path, HOPS_MODE="profile", HOPS_PROFILE_ITERS="6"),
                      warmup_iters=2)
    assert train(run) == 8
    assert run.close() == 0
    (profiled,) = lines(tmp_path / "report.jsonl")
    assert isinstance(profiled, Profiled)
    m = profiled.modules
    assert profiled.iterations == 6 and profiled.batch_size == 8 and profiled.throughput > 0
    assert min(m.t_f, m.t_b, m.t_u) > 0 and m.pattern == 2  # made in the loop: serial
    assert len(m.t_d) == len(m.t_w) == 6 and m.t_w == (0.0,) * 6
    assert not (tmp_path / "ckpt").exists()


def test_running_mode_in_process_cuts_the_last_iteration(tmp_path: Path) -> None:
    run = plugin.init(env=job_env(tmp_path, HOPS_TOTAL_SAMPLES="60", HOPS_SAMPLES_DONE="4"))
    assert train(run) == 7  # 56 samples left at 8 a step
    assert run.close() == 0
    got = lines(tmp_path / "report.jsonl")
    assert isinstance(got[0], Started) and got[0].samples_done == 4.0
    assert isinstance(got[-1], Finished) and got[-1].samples_done == 60.0
    assert any(isinstance(x, Sampled) and x.per_gpu_throughput > 0 for x in got)
    done = [x.samples_done for x in got if isinstance(x, Progress)]
    assert done == sorted(done) and max(done) == 60.0


def test_sigterm_in_process_checkpoints_at_the_boundary(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    threads = torch.get_num_threads()
    try:
        run = plugin.init(env=job_env(tmp_path, HOPS_TOTAL_SAMPLES="100000", HOPS_THREADS="1"))
        assert torch.get_num_threads() == 1
        assert train(run, after=2) == 3  # the iteration under way completes, no more
        assert run.close() == 0
    finally:
        torch.set_num_threads(threads)
    assert signal.getsignal(signal.SIGTERM) is before
    got = lines(tmp_path / "report.jsonl")
    assert isinstance(got[-1], Checkpointed) and got[-1].samples_done == 24.0
    assert isinstance(got[-2], Progress) and got[-2].samples_done == 24.0
    loaded = checkpoint.load(tmp_path / "ckpt", nn.Sequential(nn.Linear(16, 64), nn.ReLU(),
                                                              nn.Linear(64, 1)), None)
    assert loaded is not None and loaded.samples_done == 24.0
