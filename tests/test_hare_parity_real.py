"""The offline half of ``bench/hare_parity_real.py`` (docs/hare.md §7,
"Reduced parity run on the real executor"): the jobs' specs, the bitwise
check of a job's final parameters and the report. The live half is the
bench's own run."""

from __future__ import annotations

import msgspec
import pytest
import torch

from bench import hare_parity_real as hr
from bench.hare_parity import LiveRun, SimRun, run_sim
from hops.aggregator.codec import encode_params
from scheduling.live.taskrun import rounds_of
from scheduling.policies.hare.model import Gpu, GpuId, TaskJob
from shared.ids import GpuType, JobId
from shared.job import JobSpec

CPU = GpuType("cpu")
GPUS = tuple(Gpu(GpuId(f"solo:{i}"), CPU) for i in range(2))
SMALL = hr.Job("t", "lm", 2, 3, 0.0)  # the LM: a few milliseconds a micro-batch


@pytest.mark.parametrize("scale", [1, 8])
def test_a_spec_runs_its_rounds_of_s_micro_batches(scale: int) -> None:
    for job in hr.WORKLOAD:
        spec = msgspec.convert(hr.spec_of(job, scale), JobSpec)
        assert spec.batch_size == hr.SCRIPTS[job.script]["batch_size"] * scale
        assert spec.sync_scale == job.s
        assert rounds_of(spec.total_samples, spec.sync_scale, spec.batch_size) == job.rounds
        assert spec.command == tuple(hr.SCRIPTS[job.script]["command"])


def test_bitwise_holds_for_the_reference_and_for_nothing_else() -> None:
    spec = hr.spec_of(SMALL)
    want = hr.reference_params(spec)
    assert hr.bitwise(spec, encode_params(want))
    name = next(iter(want))
    off = dict(want)
    flat = want[name].flatten().clone()
    flat[0] = torch.nextafter(flat[0], flat[0] + 1)  # one bit of one parameter
    off[name] = flat.reshape(want[name].shape)
    assert not hr.bitwise(spec, encode_params(off))
    assert not hr.bitwise(spec, None)
    # one round more is another result
    longer = hr.spec_of(hr.Job("t", "lm", 2, 4, 0.0))
    assert not hr.bitwise(longer, encode_params(want))


def test_the_report_prints_each_job_and_the_weighted_jct(
        capsys: pytest.CaptureFixture[str]) -> None:
    jobs = tuple(TaskJob(id=JobId(j.id), arrival_s=j.arrival_s, rounds=j.rounds,
                         tasks_per_round=j.s, compute_s={CPU: 0.01}, sync_s={CPU: 0.005},
                         model=j.script) for j in hr.WORKLOAD)
    ids = [j.id for j in hr.WORKLOAD]
    arrivals = {j.id: j.arrival_s for j in hr.WORKLOAD}
    sim = SimRun(dict.fromkeys(ids, 1.0), dict(arrivals), dict.fromkeys(ids, 0.0), {})
    run = LiveRun(arrivals, dict(arrivals), {j: arrivals[j] + 1.5 for j in ids},
                  dict.fromkeys(ids, 0.1), jobs, GPUS, {})
    spent = hr.Measured(dict.fromkeys(ids, 0.02), dict.fromkeys(ids, 0.05),
                        {j: j == "r1" for j in ids})
    hr.report(hr.Live(run, spent, {}), sim, dict.fromkeys(ids, 2.0), {j: j != "r2" for j in ids},
              1)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ids}
    assert set(rows) == set(ids)
    assert rows["r0"][5:10] == ["1.00", "1.50", "+50.0%", "2.00", "-25.0%"]
    assert rows["r1"][-2:] == ["yes", "yes"] and rows["r2"][-2:] == ["no", "NO"]
    assert "sim 4.00, live 6.00 (+50.0%); sim h4 8.00 (live -25.0%)" in out
    assert "3 of 4 jobs" in out


def test_the_horizon_sim_sees_four_rounds_of_each_job() -> None:
    """Two jobs on one GPU: ``many`` has more micro-batches in all (12
    rounds of 1), ``wide`` more in four rounds (5 rounds of 2). With every
    round in view hare-eft runs ``wide`` first; with four in view,
    ``many``."""
    assert hr.HORIZON == 4
    jobs = tuple(TaskJob(id=JobId(name), arrival_s=0.0, rounds=rounds, tasks_per_round=s,
                         compute_s={CPU: 0.1}, sync_s={CPU: 0.0}, model="m")
                 for name, rounds, s in (("many", 12, 1), ("wide", 5, 2)))
    full = run_sim(jobs, GPUS[:1]).jct
    ahead = hr.sim_horizon(jobs, GPUS[:1])
    assert full["wide"] < full["many"]
    assert ahead["many"] < ahead["wide"]
