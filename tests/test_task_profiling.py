"""Step 2c of the live Hare mechanism, pure parts: the profiling runs the
task loop asks for (scheduling/live/taskprofile.py), its times on the wall
clock of emulated executors (``HOPS_TASK_TIME_SCALE``), what ``hops up``
passes to the scheduler, and the entries a server holds until their job's
earlier rounds are applied (docs/hare.md §7)."""

from __future__ import annotations

import msgspec
import pytest

from cli.up.stack import StackConfig, components
from executor.tasks import Follower
from scheduling.live import taskrun as tr
from scheduling.live.taskprofile import (
    ask_now,
    profiling_servers,
    profiling_tasks,
    to_estimate,
)
from scheduling.live.tasks import TaskSnapshot, replan, sequence_messages
from scheduling.policies.hare.model import TaskJob
from scheduling.policies.hare.names import task_policy
from services.scheduler.settings import scheduler_settings
from shared.ids import JobId, ServerId
from shared.snapshot import ProfilingTask
from tests.test_task_loop import A, B, estimate, node, record
from tests.test_task_wire import GPUS, JOBS, SPECS


def test_each_job_without_an_estimate_is_profiled_once_per_alive_type() -> None:
    nodes = [node("a1", A, 2), node("a2", A, 4), node("b1", B, 1), node("b2", B, 8, alive=False)]
    assert profiling_servers(nodes) == {A: ServerId("a2"), B: ServerId("b1")}
    plain = record("p", s=0)
    profiled = msgspec.structs.replace(record("q"), profiled=(A,))
    recs = [record("j"), record("k"), plain, profiled]
    every = {JobId(j) for j in "jkpq"}  # each asked of the estimators
    tasks = profiling_tasks(recs, [JobId("k")], nodes, {}, 10.0, every)
    assert tasks == (ProfilingTask(JobId("j"), A, ServerId("a2"), 1),
                     ProfilingTask(JobId("j"), B, ServerId("b1"), 1),
                     ProfilingTask(JobId("q"), B, ServerId("b1"), 1))
    # asked for at 10 s: not again before the retry interval, then again
    asked = {JobId("j"): 10.0, JobId("q"): 10.0}
    assert profiling_tasks(recs, [JobId("k")], nodes, asked, 69.0, every, retry_s=60.0) == ()
    assert len(profiling_tasks(recs, [JobId("k")], nodes, asked, 70.0, every, retry_s=60.0)) == 3
    assert profiling_tasks(recs, [], [node("a1", A, 2, alive=False)], {}, 10.0, every) == ()
    # a job the estimators were not asked about yet is not profiled: its
    # signature's shared profile may answer for it
    assert profiling_tasks(recs, [JobId("k")], nodes, {}, 10.0, {JobId("q")}) == (
        ProfilingTask(JobId("q"), B, ServerId("b1"), 1),)


def test_a_job_is_asked_for_again_once_it_has_a_profile_its_estimate_lacks() -> None:
    on_a = estimate("k")  # by type: A alone (its first profile)
    fresh, plain = record("j"), record("p", s=0)
    first = msgspec.structs.replace(record("k"), profiled=(A,))
    both = msgspec.structs.replace(record("k"), profiled=(A, B))
    assert list(to_estimate([fresh, plain, first], {JobId("k"): on_a}, {A, B})) == ["j"]
    # the second profiling run reported: asked again, until the estimate has B
    assert list(to_estimate([both], {JobId("k"): on_a}, {A, B})) == ["k"]
    with_b = msgspec.structs.replace(on_a, by_type={**on_a.by_type, B: on_a.by_type[A]})
    assert to_estimate([both], {JobId("k"): with_b}, {A, B}) == {}
    # a profiled type with no alive server is no reason to ask
    assert to_estimate([both], {JobId("k"): on_a}, {A}) == {}


def test_a_new_job_is_asked_about_at_once_and_others_once_per_resend_interval() -> None:
    j, k = JobId("j"), JobId("k")
    assert not ask_now([], set(), 100.0, 0.0, 0.5)  # nothing to ask
    assert ask_now([j, k], {k}, 100.0, 99.9, 0.5)  # j never asked: at once
    assert not ask_now([k], {k}, 100.0, 99.9, 0.5)  # k asked 0.1 s ago
    assert ask_now([k], {k}, 100.0, 99.5, 0.5)  # a resend interval since


def test_task_times_are_wall_seconds_of_the_emulated_executors() -> None:
    rec = record("j", s=4, total=1000)
    job = tr.task_job(rec, estimate("j", agg=100.0, dist=80.0), {A}, 0, time_scale=60.0)
    assert isinstance(job, TaskJob)
    # T^c = 32 / 100 s of the jobs' time, T^s = 32 / 80 - T^c; 60 times faster
    assert job.compute_s == {A: pytest.approx(0.32 / 60)}
    assert job.sync_s == {A: pytest.approx((0.4 - 0.32) / 60)}
    snap, _ = tr.task_snapshot(1.0, {rec.job_id: rec}, {rec.job_id: estimate("j")},
                               [node("s", A, 1)], tr.Progress(tr.TaskState()), 60.0)
    assert snap.jobs[0].compute_s == job.compute_s


def test_hops_up_tells_a_task_policy_the_executors_time_scale() -> None:
    assert scheduler_settings({}).task_time_scale == 1.0
    assert scheduler_settings({"HOPS_TASK_TIME_SCALE": "60"}).task_time_scale == 60.0

    def env(config: StackConfig) -> dict[str, str]:
        (sched,) = [c for c in components(config) if c.name == "scheduler"]
        return dict(sched.env)

    emulated = env(StackConfig(policy="hare-eft", time_scale=30.0))
    assert (emulated["HOPS_POLICY"], emulated["HOPS_TASK_TIME_SCALE"]) == ("hare-eft", "30")
    assert "HOPS_TASK_TIME_SCALE" not in env(StackConfig(policy="hare-eft", executor="real"))
    assert "HOPS_POLICY" not in env(StackConfig())



def test_a_server_holds_each_gpu_at_a_round_whose_job_has_one_not_applied() -> None:
    """Every entry is sent; the server that takes the revision may start a
    GPU's entries only up to its first of a round whose job has an earlier
    round not applied, and more once the leader's resend counts it applied."""
    seqs = replan(TaskSnapshot(0.0, JOBS, GPUS), task_policy("hare-eft"))

    def startable(applied: dict[JobId, int]) -> dict[tuple[str, int], list[tuple[str, int]]]:
        out: dict[tuple[str, int], list[tuple[str, int]]] = {}
        for m in sequence_messages(seqs, frozenset(), term=1, at=0.0, specs=SPECS,
                                   applied=applied):
            f = Follower(m.server_id, max(g.gpu_index for g in m.gpus) + 1)
            assert f.offer(m) == "taken"
            for g in m.gpus:  # the GPU runs in order: it stops at its first held entry
                cut = next((i for i, e in enumerate(g.entries) if not f.may_start(e)),
                           len(g.entries))
                out[(m.server_id, g.gpu_index)] = [(e.job_id, e.round) for e in g.entries[:cut]]
        return out

    full = {(m.server_id, g.gpu_index): [(e.job_id, e.round) for e in g.entries]
            for m in sequence_messages(seqs, frozenset(), term=1, at=0.0, specs=SPECS)
            for g in m.gpus}
    assert any(r > 0 for es in full.values() for _, r in es)  # the plan holds later rounds
    first = startable({})
    for gpu, es in full.items():
        # each GPU's prefix up to its first entry of a round after round 0
        cut = next((i for i, (_, r) in enumerate(es) if r > 0), len(es))
        assert first[gpu] == es[:cut]
    later = startable({JobId(j.id): 1 for j in JOBS})
    assert any(r == 1 for es in later.values() for _, r in es)
    assert all(r <= 1 for es in later.values() for _, r in es)
