"""The offline half of ``bench/hare_parity.py`` (docs/hare.md §7, "Sim-live
parity"): the executor's times, the simulation of the workload and the
verdict against the 10% target. The live half is the bench's own run."""

from __future__ import annotations

import msgspec
import pytest

from bench import hare_parity as hp
from scheduling.policies.hare.model import Gpu, GpuId, TaskJob
from shared.ids import GpuType, JobId
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.hare import ps_sync_time, step_sync_time
from world.truth import GroundTruth

TYPES = (GpuType("RTX3090"), GpuType("TitanXP"))
GPUS = tuple(Gpu(GpuId(f"{s}:{i}"), t) for s, t in zip(("rtx3090-0", "titanxp-0"), TYPES,
                                                        strict=True) for i in range(2))


def planned(compute: float = 0.2, sync: float = 0.1) -> tuple[TaskJob, ...]:
    """The workload with the same made-up times on both types."""
    return tuple(TaskJob(id=JobId(j.id), arrival_s=j.arrival_s, rounds=j.rounds,
                         tasks_per_round=j.s, compute_s=dict.fromkeys(TYPES, compute),
                         sync_s=dict.fromkeys(TYPES, sync), model=j.model)
                 for j in hp.WORKLOAD)


def test_the_executor_times_are_the_world_models_on_the_clusters_links() -> None:
    jobs = hp.with_executor_times(planned())
    truth = GroundTruth(cluster_arg(str(hp.CLUSTER)), builtin_catalog())
    for job in jobs:
        assert job.sync_s == {t: pytest.approx(step_sync_time(truth, job.model, t))
                              for t in TYPES}
        # the example's 30 MB/s links: longer than the testbed's parameter server
        params = builtin_catalog()[job.model].params
        assert all(s > ps_sync_time(params) for s in job.sync_s.values())
        # the RTX 3090 is the faster type for both models
        assert job.compute_s[TYPES[0]] < job.compute_s[TYPES[1]]
        assert (job.id, job.rounds, job.arrival_s) in {(j.id, j.rounds, j.arrival_s)
                                                       for j in hp.WORKLOAD}


def test_the_sim_finishes_every_job_after_its_arrival() -> None:
    jobs = planned()
    sim = hp.run_sim(jobs, GPUS)
    assert set(sim.jct) == set(sim.first) == {j.id for j in jobs}
    for job in jobs:
        # no faster than its rounds of compute and sync back to back
        floor = job.rounds * (0.2 + 0.1)
        assert sim.jct[job.id] >= floor - 1e-9
        assert sim.first[job.id] >= job.arrival_s
    slower = hp.run_sim(tuple(msgspec.structs.replace(j, sync_s=dict.fromkeys(TYPES, 0.3))
                              for j in jobs), GPUS)
    assert sum(slower.jct.values()) > sum(sim.jct.values())


@pytest.mark.parametrize(("factor", "verdict"), [(1.05, "target: live weighted JCT within "
                                                       "10% of the sim's: met"),
                                                 (1.2, "NOT met")])
def test_the_report_states_the_target(factor: float, verdict: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    jobs = planned()
    sim = hp.run_sim(jobs, GPUS)
    arrivals = {str(j.id): j.arrival_s for j in jobs}
    live = hp.LiveRun(arrivals, dict(sim.first),
                      {j: arrivals[j] + sim.jct[j] * factor for j in arrivals}, dict(sim.gap),
                      jobs, GPUS, dict(sim.gaps))
    hp.report(live, sim, sim, 2.0, cold=False)
    out = capsys.readouterr().out
    assert verdict in out
    assert f"{100 * (factor - 1):+.1f}%" in out
    assert "what the columns share and what they do not" in out


def test_round_gaps_are_the_median_wait_after_each_barrier() -> None:
    runs = [hp.Ran("a", 0, 0.0, 1.0), hp.Ran("a", 0, 0.5, 1.5),  # round 0 synced at 1.5
            hp.Ran("a", 1, 1.7, 2.0), hp.Ran("a", 1, 2.5, 3.0),  # starts 0.2 after
            hp.Ran("a", 2, 3.6, 4.0),                            # 0.6 after
            hp.Ran("a", 3, 4.1, 4.5),                            # 0.1 after
            hp.Ran("b", 0, 0.0, 1.0)]                            # one round: no gap
    assert hp.round_gaps(runs) == {"a": pytest.approx(0.2)}
    assert hp.first_starts(runs) == {"a": 0.0, "b": 0.0}


def test_the_turnaround_is_the_live_gap_where_the_sim_starts_at_the_barrier() -> None:
    live = {("a", 1): 0.05, ("a", 2): 0.07, ("a", 3): 0.5, ("b", 1): 0.06}
    sim = {("a", 1): 0.0, ("a", 2): 0.0005, ("a", 3): 0.4, ("b", 1): 0.0}
    assert hp.turnaround(live, sim) == pytest.approx(0.06)  # a's round 3 waited for a GPU
    assert hp.turnaround(live, {}) == 0.0


def test_the_sim_runs_the_leaders_horizon_and_pays_a_turnaround() -> None:
    jobs = planned()
    leader = hp.leader_settings(0.25)
    ahead = hp.run_sim(jobs, GPUS, leader)
    slower = hp.run_sim(jobs, GPUS, leader, release_s=0.05)
    # every barrier passes later (one job may gain from a changed order)
    assert sum(slower.jct.values()) > sum(ahead.jct.values())
