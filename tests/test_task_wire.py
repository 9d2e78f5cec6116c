"""``task_sequence`` and ``task_done`` (shared/events.py, shared/sequence.py):
a revision of the live sequences travels and comes back whole; malformed or
forged messages are refused as they are decoded, or by the follower's and
the leader's checks, each with its reason."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from scheduling.live.tasks import (
    TaskSnapshot,
    done_key,
    done_problem,
    gpu_id,
    planned_tasks,
    replan,
    sequence_messages,
)
from scheduling.policies.hare.model import Gpu, TaskJob
from scheduling.policies.hare.names import task_policy
from shared import events as ev
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry, TaskKey, follow_problem

V100 = GpuType("V100")
A, B = ServerId("a"), ServerId("b")
JOBS = (TaskJob(JobId("j1"), 0.0, 3, 3, {V100: 1.0}, {V100: 0.1}),
        TaskJob(JobId("j2"), 0.0, 2, 1, {V100: 0.5}))
GPUS = (Gpu(gpu_id(A, 0), V100), Gpu(gpu_id(A, 1), V100), Gpu(gpu_id(B, 0), V100))


def spec(job: str, s: int) -> JobSpec:
    return JobSpec(JobId(job), "resnet50", 32, 25_557_032, 1_000, requirements=(1,),
                   sync_scale=s)


SPECS = {JobId("j1"): spec("j1", 3), JobId("j2"): spec("j2", 1)}


def sequence(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "task_sequence", "term": 2, "revision": 5, "server_id": "a", "at": 1.0,
        "gpus": [{"gpu_index": 0, "entries": [
            {"job_id": "j1", "round": 0, "lo": 0, "hi": 2, "start_s": 0.0, "end_s": 2.0},
            {"job_id": "j2", "round": 0, "lo": 0, "hi": 1, "start_s": 2.0, "end_s": 2.5}]}],
        "specs": [msgspec.to_builtins(SPECS[JobId("j1")]),
                  msgspec.to_builtins(SPECS[JobId("j2")])],
    }
    body.update(over)
    return body


def entries(*e: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"gpu_index": 0, "entries": list(e)}]


def entry(job: str = "j1", rnd: int = 0, lo: int = 0, hi: int = 1, start: float = 0.0,
          end: float = 1.0) -> dict[str, Any]:
    return {"job_id": job, "round": rnd, "lo": lo, "hi": hi, "start_s": start, "end_s": end}


def test_a_replans_size_is_its_jobs_tasks_within_the_horizon() -> None:
    snap = TaskSnapshot(now=0.0, jobs=JOBS, gpus=GPUS)
    assert planned_tasks(snap, 4) == 3 * 3 + 1 * 2  # every round left: 3 of S=3, 2 of S=1
    assert planned_tasks(snap, 1) == 3 + 1
    done = msgspec.structs.replace(JOBS[0], done_rounds=2)  # one round left
    assert planned_tasks(msgspec.structs.replace(snap, jobs=(done, JOBS[1])), 4) == 3 + 2


def test_a_revision_travels_per_server_and_comes_back() -> None:
    seqs = replan(TaskSnapshot(0.0, JOBS, GPUS), task_policy("hare-eft"))
    msgs = sequence_messages(seqs, frozenset(), term=7, at=3.0, specs=SPECS)
    assert [m.server_id for m in msgs] == ["a", "b"]
    assert all(m.term == 7 and m.revision == 1 and m.policy == "hare-eft" for m in msgs)
    for m in msgs:
        assert ev.decode_task_event(ev.encode(m)) == m
    sent = {(m.server_id, g.gpu_index): [(e.job_id, e.round, e.lo, e.hi) for e in g.entries]
            for m in msgs for g in m.gpus}
    assert sent == {(gpu.rpartition(":")[0], int(gpu.rpartition(":")[2])):
                    [(e.job, e.round, e.lo, e.hi) for e in es] for gpu, es in seqs.gpus.items()}
    # Entries reported done are not sent again.
    first = seqs.gpus[gpu_id(A, 0)][0]
    again = sequence_messages(seqs, frozenset({first.key}), term=7, at=4.0,
                              specs=SPECS)
    assert first.key not in {(e.job_id, e.round, e.lo) for g in again[0].gpus if g.gpu_index == 0
                             for e in g.entries}


def test_a_revision_sends_its_held_rounds_with_each_jobs_rounds_applied() -> None:
    """Every entry not done travels, later rounds too; each message lists the
    rounds applied of every job it names, which the server holds them by."""
    seqs = replan(TaskSnapshot(0.0, JOBS, GPUS), task_policy("hare-eft"))
    applied = {JobId("j1"): 1}  # j2 has none applied: absent means 0
    msgs = sequence_messages(seqs, frozenset(), term=7, at=3.0, specs=SPECS, applied=applied)
    sent = {(e.job_id, e.round, e.lo) for m in msgs for g in m.gpus for e in g.entries}
    assert sent == {e.key for _, es in seqs.gpus.items() for e in es}
    assert max(r for _, r, _ in sent) == 2  # j1's rounds 1 and 2 wait, yet are sent
    for m in msgs:
        named = sorted({e.job_id for g in m.gpus for e in g.entries})
        assert [(a.job_id, a.rounds) for a in m.applied] == [
            (j, applied.get(j, 0)) for j in named]
        assert ev.decode_task_event(ev.encode(m)) == m


@pytest.mark.parametrize(("body", "why"), [
    (sequence(term=0), "term and revision must be >= 1"),
    (sequence(revision=0), "term and revision must be >= 1"),
    (sequence(server_id="a.b"), "server id"),
    (sequence(gpus=[{"gpu_index": 0}, {"gpu_index": 0}]), "must be distinct"),
    (sequence(gpus=[{"gpu_index": -1}]), "must be distinct and >= 0"),
    (sequence(gpus=entries(entry(lo=1, hi=1))), "need 0 <= lo < hi"),
    (sequence(gpus=entries(entry(rnd=-1))), "round -1 < 0"),
    (sequence(gpus=entries(entry(job="j*"))), "job id"),
    (sequence(gpus=entries(entry(job="j3"))), "job j3 has entries but no spec"),
    (sequence(gpus=entries(entry(job="j2", hi=2))), "but the job has S = 1 per round"),
    (sequence(specs=[msgspec.to_builtins(SPECS[JobId("j1")])] * 2), "a job has two specs"),
    (sequence(specs=[msgspec.to_builtins(spec("j1", 3)),
                     msgspec.to_builtins(JobSpec(JobId("j2"), "m", 1, 1, 1, requirements=(1,)))]),
     "is not relaxed-sync"),
    (sequence(gpus=entries(entry(start=2.0, end=1.0))), "before it starts"),
    (sequence(gpus=entries(entry(start="inf", end="inf"))), "finite"),
    (sequence(gpus=entries(entry(), entry(lo=1, hi=2, start=0.5, end=1.5))), "one at a time"),
    (sequence(gpus=entries(entry(rnd=1), entry(rnd=0, lo=1, hi=2, start=1.0, end=2.0))),
     "cannot wait on a later one"),
    (sequence(gpus=[{"gpu_index": 0, "entries": [entry(lo=0, hi=2)]},
                    {"gpu_index": 1, "entries": [entry(lo=1, hi=3)]}]), "assigned twice"),
    (sequence(applied=[{"job_id": "j1", "rounds": -1}]), "-1 rounds applied"),
    (sequence(applied=[{"job_id": "j1", "rounds": 1}, {"job_id": "j1", "rounds": 2}]),
     "two counts of rounds applied"),
    (sequence(applied=[{"job_id": "j 1", "rounds": 1}]), "job id"),
])
def test_malformed_or_forged_sequences_are_refused(body: dict[str, Any], why: str) -> None:
    with pytest.raises(ev.WireError, match=why) as info:
        ev.decode_task_event(json.dumps(body).encode())
    assert info.value.code == ev.INVALID


@pytest.mark.parametrize(("over", "why"), [
    ({"lo": 2, "hi": 2}, "need 0 <= lo < hi"),
    ({"gpu_index": -1}, "gpu_index must be >= 0"),
    ({"ended_at": 0.5}, "before it starts"),
    ({"term": 0}, "term and revision"),
    ({"job_id": ""}, "job id must not be empty"),
])
def test_malformed_task_reports_are_refused(over: dict[str, Any], why: str) -> None:
    body = {"type": "task_done", "term": 2, "revision": 1, "job_id": "j1", "round": 0, "lo": 0,
            "hi": 2, "server_id": "a", "gpu_index": 0, "started_at": 1.0, "ended_at": 2.0,
            "at": 2.0, **over}
    with pytest.raises(ev.WireError, match=why) as info:
        ev.decode_task_event(json.dumps(body).encode())
    assert info.value.code == ev.INVALID


def test_the_leader_counts_only_reports_of_its_own_entries() -> None:
    seqs = replan(TaskSnapshot(0.0, JOBS, GPUS), task_policy("hare-eft"))
    e = seqs.gpus[gpu_id(A, 0)][0]

    def report(server: str = "a", index: int = 0, hi: int = e.hi) -> ev.TaskDone:
        return ev.TaskDone(term=1, revision=1, job_id=e.job, round=e.round, lo=e.lo, hi=hi,
                           server_id=ServerId(server), gpu_index=index, started_at=0.0,
                           ended_at=1.0, at=1.0)

    assert done_problem(seqs, report()) is None and done_key(report()) == e.key
    assert "has no entry" in (done_problem(seqs, report(server="b")) or "")
    assert "has no entry" in (done_problem(seqs, report(index=1)) or "")
    assert f"not {e.lo}..{e.hi}" in (done_problem(seqs, report(hi=e.hi + 1)) or "")


def test_a_follower_refuses_old_terms_old_revisions_and_moved_started_entries() -> None:
    running: dict[int, TaskKey] = {0: (JobId("j1"), 0, 0)}
    done: dict[TaskKey, int] = {(JobId("j2"), 0, 0): 1}
    gpus = (GpuTasks(0, (TaskEntry(JobId("j1"), 0, 0, 2, 0.0, 2.0),
                         TaskEntry(JobId("j1"), 1, 0, 1, 2.1, 3.0))),
            GpuTasks(1, (TaskEntry(JobId("j2"), 0, 0, 1, 0.0, 0.5),)))
    assert follow_problem(4, (4, 2), 4, 3, gpus, running, done) is None
    assert "not the leader lease's term 4" in (follow_problem(4, (4, 2), 3, 9, gpus, running,
                                                              done) or "")
    assert "not newer" in (follow_problem(4, (4, 3), 4, 3, gpus, running, done) or "")
    swapped = (GpuTasks(0, gpus[0].entries[::-1]), gpus[1])
    assert "runs entry" in (follow_problem(4, None, 4, 3, swapped, running, done) or "")
    moved = (gpus[0], GpuTasks(2, gpus[1].entries))
    assert "moves it to GPU 2" in (follow_problem(4, None, 4, 3, moved, running, done) or "")
    assert "puts nothing first" in (follow_problem(4, None, 4, 3, (gpus[1],), running, done)
                                    or "")
