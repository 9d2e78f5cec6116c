"""The task simulator's planning horizon (``TaskSimSettings.horizon_rounds``,
simulator/tasks.py "Horizon"): None keeps the paper's offline plan, digit for
digit; H plans at most H rounds of each job and replans at every barrier, as
the live leader does, and still runs every micro-batch exactly once."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from experiments import catalog
from experiments.hare.run import HareExperiment
from experiments.hare.workload import HareWorkload, cluster_gpus, generate
from scheduling.live.tasks import LiveTaskSettings, assumed_started
from scheduling.policies.hare.model import Gpu, TaskJob, TaskPolicy
from scheduling.policies.hare.names import TASK_POLICIES, task_policy
from services.scheduler.settings import SchedulerSettings
from simulator.tasks import TaskSimSettings, TaskSimulation, simulate
from tests.test_hare_sim import (
    V100,
    Spy,
    _check_execution,
    check_each_task_once,
    gpus,
    job,
    workloads,
)
from world.hare import cluster_shape, task_models

# What the offline simulator wrote for this workload before the horizon
# existed: sha256 of every job's outcome and every executed task, per policy.
OFFLINE = {"hare": "e2c1d72061abc1ff", "hare-eft": "26d2edad489cdf59",
           "gavel-fifo": "c3d90cdc0614bdbe", "srtf": "412ec07fa19ac9f5",
           "homo": "bfc088ce5924dddf", "allox": "de8eb034ae8394fe"}


@pytest.mark.parametrize("name", TASK_POLICIES)
def test_no_horizon_keeps_the_offline_results_to_the_last_digit(name: str) -> None:
    pool = cluster_gpus(cluster_shape("testbed"))
    jobs = generate(HareWorkload(jobs=6, load=1.5), task_models(), len(pool),
                    np.random.default_rng(3))
    r = simulate(jobs, pool, task_policy(name), TaskSimSettings(budget=200, record=True))
    digest = hashlib.sha256(msgspec.json.encode([r.jobs, r.tasks])).hexdigest()[:16]
    assert digest == OFFLINE[name]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(TASK_POLICIES), st.integers(1, 3))
def test_with_a_horizon_every_micro_batch_runs_exactly_once(
        w: tuple[tuple[TaskJob, ...], tuple[Gpu, ...]], name: str, horizon: int) -> None:
    jobs, pool = w
    policy: TaskPolicy = task_policy(name)
    sim = Spy(jobs, pool, policy, TaskSimSettings(switch_s=0.1, record=True,
                                                  horizon_rounds=horizon))
    r = sim.run()
    check_each_task_once(r.tasks, jobs)
    # No revision sees more than the horizon of any job.
    assert all(j.remaining_rounds <= horizon for p in sim.seen for j in p.jobs)
    _check_execution(r.tasks, jobs)


def test_a_horizon_replans_at_every_barrier() -> None:
    jobs = (job("a", 0.0, 5, 1, 1.0), job("b", 0.0, 3, 1, 2.0))  # one task a round
    offline = Spy(jobs, gpus(V100, V100), task_policy("gavel-fifo"),
                  TaskSimSettings(switch_s=0.0))
    offline.run()
    assert [p.now for p in offline.seen] == [0.0]  # the arrival alone
    live = Spy(jobs, gpus(V100, V100), task_policy("gavel-fifo"),
               TaskSimSettings(switch_s=0.0, record=True, horizon_rounds=1))
    r = live.run()
    barriers = {t.done_s for t in r.tasks}
    assert [p.now for p in live.seen] == sorted({0.0} | barriers)
    assert len(barriers) >= 5  # a's five rounds alone end at five times


def test_a_horizon_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="horizon_rounds must be >= 1"):
        TaskSimSettings(horizon_rounds=0)


def test_the_command_passes_its_horizon_to_the_experiment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[HareExperiment] = []

    def run_hare(out: Path, exp: HareExperiment, **_: object) -> None:
        got.append(exp)
        out.mkdir(parents=True)
        (out / "results.md").write_text("ran\n")

    monkeypatch.setattr(catalog, "run_hare", run_hare)
    args = ["experiment", "hare", "--out", str(tmp_path / "o"), "--no-progress",
            "--clusters", "testbed"]
    done = CliRunner().invoke(app, [*args, "--horizon", "4"])
    assert done.exit_code == 0, done.output
    assert got[-1].horizon == 4 and got[-1].clusters == ("testbed",)
    assert CliRunner().invoke(app, [*args[:2], "--out", str(tmp_path / "p")]).exit_code == 0
    assert got[-1].horizon is None
    refused = CliRunner().invoke(app, [*args, "--horizon", "0"])
    assert refused.exit_code == 2 and "horizon must be >= 1, got 0" in refused.output


class Keeps(TaskSimulation):
    """Checks at every replan that the tasks the live leader would count as
    started (:func:`scheduling.live.tasks.assumed_started`) keep their GPU
    and their order there."""

    checked = 0

    def _drop_unstarted(self, now: float) -> None:
        before = self.seqs
        done = {k for k in self.started if self.done_at[k] <= now}
        assumed = assumed_started(before, done, now)
        super()._drop_unstarted(now)
        for gpu, entries in before.gpus.items():
            mine = [e.key for e in entries if e.key in assumed]
            kept = [e.key for e in self.seqs.gpus[gpu] if e.key in assumed]
            assert kept == mine, (now, gpu)
            self.checked += len(mine)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(TASK_POLICIES), st.integers(1, 3))
def test_with_a_horizon_the_tasks_the_leader_counts_started_stay_in_place(
        w: tuple[tuple[TaskJob, ...], tuple[Gpu, ...]], name: str, horizon: int) -> None:
    jobs, pool = w
    sim = Keeps(jobs, pool, task_policy(name), TaskSimSettings(switch_s=0.1, record=True,
                                                                horizon_rounds=horizon))
    check_each_task_once(sim.run().tasks, jobs)


def test_a_gpus_next_task_of_an_open_round_is_kept_at_a_barrier() -> None:
    """One GPU, a job that synchronises long (a) and one that computes long
    (b): when a's round ends, the task planned next on the GPU has not
    started, yet the leader cannot tell it from a running one, so the
    simulator of the leader's way keeps it, as the leader does."""
    jobs = (job("a", 0.0, 3, 1, 0.1, sync=1.0), job("b", 0.0, 2, 1, 0.5))
    sim = Keeps(jobs, gpus(V100), task_policy("hare-eft"),
                TaskSimSettings(switch_s=0.0, record=True, horizon_rounds=1))
    r = sim.run()
    check_each_task_once(r.tasks, jobs)
    assert sim.checked > 0


def test_the_leaders_settings_give_the_simulators_horizon() -> None:
    live = LiveTaskSettings(horizon_rounds=3, check=False)
    got = TaskSimSettings.of_leader(live, record=True)
    assert (got.horizon_rounds, got.check, got.record) == (3, False, True)
    assert SchedulerSettings(task_horizon=7).live_tasks().horizon_rounds == 7


@pytest.mark.parametrize("horizon", [None, 2])
def test_a_release_delays_every_barrier(horizon: int | None) -> None:
    one = (job("a", 0.0, 3, 1, 1.0, sync=0.5),)
    at_once = simulate(one, gpus(V100), task_policy("hare-eft"),
                       TaskSimSettings(switch_s=0.0, horizon_rounds=horizon))
    later = simulate(one, gpus(V100), task_policy("hare-eft"),
                     TaskSimSettings(switch_s=0.0, horizon_rounds=horizon, release_s=0.25))
    assert at_once.jobs[0].jct_s == pytest.approx(3 * 1.5)
    assert later.jobs[0].jct_s == pytest.approx(3 * 1.75)
    with pytest.raises(ValueError, match="release_s >= 0"):
        TaskSimSettings(release_s=-0.1)
