"""The rules an executor follows on Hare's task sequences (executor/tasks.py):
which revision it takes, what each GPU runs next, when an entry starts and
how long it runs by the world model, as the task simulator counts it."""

from __future__ import annotations

import copy

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.tasks import (
    FAILURE_WORDS_MAX,
    MOVES_STARTED,
    STALE_REVISION,
    STALE_TERM,
    Follower,
    Refused,
    TaskTimes,
    entry_run,
    key_of,
    sequence_times,
    switch_cost,
    task_job_failed,
    task_times,
)
from shared.configuration import Configuration
from shared.events import TaskSequence
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, RoundsApplied, TaskEntry
from shared.specs import cluster_from_doc
from shared.wire import INVALID
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.hare import SWITCH_S, ps_sync_time, step_sync_time
from world.truth import GroundTruth

S = ServerId("rtx3090-sugon-0")
J1, J2 = JobId("j1"), JobId("j2")
MODEL = "resnet18-cifar10"


def spec(job: JobId, s: int = 4, model: str = MODEL) -> JobSpec:
    return JobSpec(job, model, 256, 11_181_642, 10_000, requirements=(1,), sync_scale=s)


def entry(job: JobId, round_: int, lo: int, hi: int, start: float, end: float) -> TaskEntry:
    return TaskEntry(job, round_, lo, hi, start, end)


def seq(term: int, revision: int, *gpus: tuple[int, tuple[TaskEntry, ...]],
        server: ServerId = S) -> TaskSequence:
    jobs = sorted({e.job_id for _, es in gpus for e in es})
    return TaskSequence(term=term, revision=revision, server_id=server, at=0.0,
                        gpus=tuple(GpuTasks(i, es) for i, es in gpus),
                        specs=tuple(spec(j) for j in jobs))


# GPU 0: round 0 of j1 and j2 interleaved within the round, then j1's round 1.
E1 = entry(J1, 0, 0, 2, 0.0, 1.0)
E2 = entry(J2, 0, 0, 1, 1.0, 1.5)
E3 = entry(J1, 0, 2, 4, 1.5, 2.5)
E4 = entry(J1, 1, 0, 4, 3.0, 5.0)
LATE_E1 = entry(J1, 0, 0, 2, 1.5, 2.5)  # E1 behind E2
REV1 = seq(2, 1, (0, (E1, E2, E3, E4)), (1, (entry(J2, 0, 1, 4, 0.0, 1.5),)))


def follower(gpus: int = 2) -> Follower:
    return Follower(S, gpus)


def state(f: Follower) -> tuple[object, ...]:
    return (f.term, f.held, f.entries, f.specs, dict(f.running), dict(f.done), dict(f.applied))


# --- the world model's times -------------------------------------------------------------


def test_task_times_are_the_world_models_over_the_time_scale() -> None:
    truth = GroundTruth(cluster_arg("paper-physical"), builtin_catalog())
    gpu_type = truth.cluster.by_id[S].gpu_type
    rate = truth.single_gpu_throughput(MODEL, gpu_type)
    times = task_times(truth, spec(J1), gpu_type, 10.0)
    assert times.compute_s == pytest.approx(256 / rate / 10)
    # T^s: a synchronised step on two GPUs of the server less one GPU, the
    # quantity the leader estimates; not the testbed's parameter server
    one, two = (truth.iteration_time(MODEL, Configuration.of({S: n})) for n in (1, 2))
    assert times.sync_s == pytest.approx((two - one) / 10)
    assert times.sync_s != pytest.approx(ps_sync_time(11_181_642) / 10)
    assert task_times(truth, spec(J1), gpu_type, 1.0).compute_s == pytest.approx(256 / rate)
    with pytest.raises(ValueError):
        task_times(truth, spec(J1), gpu_type, 0.0)


RTX = {"name": "RTX3090", "link_bandwidth": 3e7, "net_bandwidth": 1e9}


def test_the_sync_time_follows_the_clusters_links() -> None:
    """The example cluster's 30 MB/s links make a step's all-reduce cost
    far more than on the paper's; a type with one GPU in all has none."""
    slow = GroundTruth(cluster_arg("examples/cluster-hare.yaml"), builtin_catalog())
    fast = GroundTruth(cluster_arg("paper-physical"), builtin_catalog())
    rtx = GpuType("RTX3090")
    assert step_sync_time(slow, MODEL, rtx) > 10 * step_sync_time(fast, MODEL, rtx) > 0
    lone = GroundTruth(cluster_from_doc({
        "name": "lone", "gpu_types": [RTX],
        "servers": [{"id": "a", "gpu_type": "RTX3090", "gpus": 1}]}), builtin_catalog())
    assert step_sync_time(lone, MODEL, rtx) == 0.0
    pair = GroundTruth(cluster_from_doc({
        "name": "pair", "gpu_types": [RTX],
        "servers": [{"id": s, "gpu_type": "RTX3090", "gpus": 1} for s in "ab"]}),
        builtin_catalog())
    across = Configuration.of({ServerId("a"): 1, ServerId("b"): 1})
    assert step_sync_time(pair, MODEL, rtx) == pytest.approx(
        pair.iteration_time(MODEL, across)
        - pair.iteration_time(MODEL, Configuration.of({ServerId("a"): 1})))


def test_a_job_the_gpus_cannot_run_is_refused_as_invalid() -> None:
    truth = GroundTruth(cluster_arg("paper-physical"), builtin_catalog())
    gpu_type = truth.cluster.by_id[S].gpu_type
    got = sequence_times(truth, (spec(J1), spec(J2, model="no-such-model")), gpu_type, 1.0)
    assert isinstance(got, Refused) and got.code == INVALID and "j2" in got.reason
    ok = sequence_times(truth, (spec(J1),), gpu_type, 1.0)
    assert isinstance(ok, dict) and set(ok) == {J1}


# --- when an entry runs ------------------------------------------------------------------


def test_switch_cost_only_between_jobs() -> None:
    assert switch_cost(None, J1, SWITCH_S) == 0.0  # a GPU's first entry
    assert switch_cost(J1, J1, SWITCH_S) == 0.0
    assert switch_cost(J2, J1, SWITCH_S) == SWITCH_S == 3.1e-3


def test_an_entry_starts_after_the_gpu_is_free_and_not_before_its_planned_start() -> None:
    times = TaskTimes(compute_s=0.25, sync_s=0.1)
    early = entry_run(E2, times, free=0.5, last_job=J1, switch_s=0.01)
    assert early.begin == 1.0  # waits for its planned start (the round's barrier)
    assert early.compute_start == pytest.approx(1.01)  # then switches: the simulator's order
    assert early.compute_end == pytest.approx(1.26)
    assert early.reported == pytest.approx(1.36)
    late = entry_run(E3, times, free=2.0, last_job=J1, switch_s=0.01)
    assert (late.begin, late.switch_s) == (2.0, 0.0)  # same job: no switch
    assert late.compute_end == pytest.approx(2.5)  # (hi - lo) = 2 micro-batches


def test_a_gpu_runs_its_entries_in_order_interleaving_two_jobs() -> None:
    times = TaskTimes(compute_s=0.25, sync_s=0.1)
    f = follower()
    assert f.offer(REV1) == "taken"
    free, last, ran = 0.0, None, []
    while (e := f.head(0)) is not None:
        run = entry_run(e, times, free, last, 0.01)
        f.start(0, e)
        f.finish(0)
        ran.append((key_of(e), run.switch_s))
        free, last = run.compute_end, e.job_id
    assert ran == [((J1, 0, 0), 0.0), ((J2, 0, 0), 0.01), ((J1, 0, 2), 0.01),
                   ((J1, 1, 0), 0.0)]


# --- which revision it takes -------------------------------------------------------------


def test_a_resend_is_a_no_op() -> None:
    f = follower()
    assert f.offer(REV1) == "taken"
    f.start(0, E1)
    before = state(f)
    assert f.offer(copy.deepcopy(REV1)) == "resend"
    assert state(f) == before


def test_an_older_term_is_refused_and_changes_nothing() -> None:
    f = follower()
    f.offer(REV1)
    before = state(f)
    got = f.offer(seq(1, 9, (0, (E1,))))
    assert isinstance(got, Refused) and got.code == STALE_TERM
    assert "term 1" in got.reason
    assert state(f) == before


def test_a_revision_not_newer_is_refused() -> None:
    f = follower()
    f.offer(seq(2, 3, (0, (E1,))))
    before = state(f)
    got = f.offer(seq(2, 2, (0, (E1, E2))))
    assert isinstance(got, Refused) and got.code == STALE_REVISION
    assert state(f) == before


def test_a_sequence_moving_a_running_entry_is_refused() -> None:
    f = follower()
    f.offer(REV1)
    f.start(0, E1)
    before = state(f)
    first = entry(J2, 0, 0, 1, 0.0, 0.5)
    moved = f.offer(seq(2, 2, (0, (first, entry(J1, 0, 0, 2, 0.5, 1.5), E3))))  # before it
    assert isinstance(moved, Refused) and moved.code == MOVES_STARTED
    elsewhere = f.offer(seq(2, 2, (1, (E1,))))  # to another GPU
    assert isinstance(elsewhere, Refused) and elsewhere.code == MOVES_STARTED
    assert state(f) == before
    # Keeping it first and changing what follows is taken: it runs on.
    e3 = entry(J1, 0, 2, 4, 1.0, 2.0)
    assert f.offer(seq(2, 2, (0, (E1, e3, entry(J2, 0, 0, 1, 2.0, 2.5))))) == "taken"
    assert f.running == {0: key_of(E1)}
    f.finish(0)
    assert f.head(0) == e3


def test_a_done_entry_is_never_run_again() -> None:
    f = follower()
    f.offer(REV1)
    f.start(0, E1)
    f.finish(0)
    assert f.head(0) == E2
    # The leader has not the report yet: its next revision lists E1 still.
    assert f.offer(seq(2, 2, (0, (E1, E2, E3)))) == "taken"
    assert f.head(0) == E2
    moved = f.offer(seq(2, 3, (1, (E1,)), (0, (E2,))))
    assert isinstance(moved, Refused) and moved.code == MOVES_STARTED
    # Once the report is in, it is dropped, and forgotten.
    assert f.offer(seq(2, 4, (0, (E2, E3)))) == "taken"
    assert key_of(E1) not in f.done


def test_a_new_term_keeps_the_done_entries_it_lists_on_the_same_gpu() -> None:
    f = follower()
    f.offer(REV1)
    for e in (E1, E2):
        f.start(0, e)
        f.finish(0)
    # A new leader without E1's report moves it; with E2's not yet in, keeps it.
    assert f.offer(seq(3, 1, (1, (E1,)), (0, (E2, E3)))) == "taken"
    assert f.held == (3, 1) and f.term == 3
    assert f.done == {key_of(E2): 0}
    assert f.head(0) == E3
    stale = f.offer(seq(2, 9, (0, (E3,))))  # the deposed leader
    assert isinstance(stale, Refused) and stale.code == STALE_TERM


def test_a_higher_term_raises_the_term_seen_even_when_refused() -> None:
    f = follower()
    f.offer(REV1)
    f.start(0, E1)
    refused = f.offer(seq(3, 1, (0, (E2, LATE_E1))))  # moves the running entry
    assert isinstance(refused, Refused) and refused.code == MOVES_STARTED
    assert f.term == 3 and f.held == (2, 1)
    old = f.offer(seq(2, 2, (0, (E1, E2))))
    assert isinstance(old, Refused) and old.code == STALE_TERM


def test_a_revision_dropping_the_running_entrys_job_abandons_the_entry() -> None:
    f = follower()
    f.offer(REV1)
    f.start(0, E1)
    # j1 is cancelled: the leader's next revision names j2 alone
    assert f.offer(seq(2, 2, (0, (E2,)), (1, (entry(J2, 0, 1, 4, 0.0, 1.5),)))) == "taken"
    assert not f.runs(0, key_of(E1)) and f.running == {}
    assert key_of(E1) not in f.done  # abandoned, not done: never reported
    assert f.head(0) == E2
    # while its job is still named, moving the running entry is refused
    g = follower()
    g.offer(REV1)
    g.start(0, E1)
    moved = g.offer(seq(2, 2, (0, (E2, LATE_E1))))
    assert isinstance(moved, Refused) and moved.code == MOVES_STARTED
    assert g.runs(0, key_of(E1))


def test_an_entry_waits_for_its_jobs_earlier_rounds_on_the_server() -> None:
    f = follower()
    f.offer(REV1)
    # E4 (j1's round 1) waits for j1's round 0 on both GPUs, not for j2's
    assert sorted(f.barrier(E4)) == [key_of(E1), key_of(E3)]
    assert f.barrier(E1) == [] and f.barrier(E2) == []


def counted(msg: TaskSequence, **rounds: int) -> TaskSequence:
    return msgspec.structs.replace(msg, applied=tuple(
        RoundsApplied(JobId(j), n) for j, n in sorted(rounds.items())))


def test_an_entry_waits_until_its_jobs_earlier_rounds_are_applied() -> None:
    """The round's barrier across servers: E4 (j1's round 1) may start only
    once the leader counts j1's round 0 applied, which its resend of the
    held revision says; counts only grow, and only the held revision's count."""
    f = follower()
    assert f.offer(counted(REV1, j1=0, j2=0)) == "taken"
    assert f.may_start(E1) and f.may_start(E3) and not f.may_start(E4)
    assert not f.note_applied(counted(REV1, j1=0, j2=0))  # a plain resend: no news
    other = msgspec.structs.replace(counted(REV1, j1=1), revision=9)
    assert not f.note_applied(other) and not f.may_start(E4)  # not the revision held
    assert f.offer(counted(REV1, j1=1)) == "resend"  # the runner's path: note_applied
    assert f.note_applied(counted(REV1, j1=1, j2=0)) and f.may_start(E4)
    assert not f.note_applied(counted(REV1, j1=0)) and f.may_start(E4)  # a late resend
    assert f.applied == {J1: 1, J2: 0}


def test_a_job_the_leader_does_not_count_is_not_held_and_a_dropped_job_is_forgotten() -> None:
    f = follower()
    assert f.offer(REV1) == "taken"  # no counts: as before the leader sent any
    assert f.may_start(E4)
    rev2 = counted(seq(2, 2, (0, (E1, E2, E3, E4))), j1=0, j2=3)
    assert f.offer(rev2) == "taken" and not f.may_start(E4)
    rev3 = counted(seq(2, 3, (0, (E1, E3, E4))), j1=0)
    assert f.offer(rev3) == "taken"
    assert f.applied == {J1: 0}  # j2 left the sequences: its count with it


def test_another_servers_sequence_or_a_gpu_it_lacks_is_invalid() -> None:
    f = follower(gpus=1)
    other = f.offer(seq(2, 1, (0, (E1,)), server=ServerId("rtx3090-sugon-1")))
    assert isinstance(other, Refused) and other.code == INVALID
    past = f.offer(REV1)  # GPU 1 on a one-GPU server
    assert isinstance(past, Refused) and past.code == INVALID and "[1]" in past.reason
    assert f.held is None and f.term == 0


def test_a_restarted_executor_runs_the_entry_it_was_running_again() -> None:
    f = follower()
    f.offer(REV1)
    f.start(0, E1)  # killed here: nothing reported
    again = follower()  # holds nothing
    assert again.offer(seq(2, 7, (0, (E1, E2)))) == "taken"
    assert again.head(0) == E1


def test_start_must_be_the_head() -> None:
    f = follower()
    f.offer(REV1)
    with pytest.raises(ValueError):
        f.start(0, E2)


# --- properties --------------------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> dict[int, list[TaskEntry]]:
    """Each of 1-3 GPUs: entries of 1-3 jobs (S = 4), one round each, back to back."""
    out: dict[int, list[TaskEntry]] = {}
    taken: dict[tuple[JobId, int], int] = {}
    for gpu in range(draw(st.integers(1, 3))):
        t, es = 0.0, []
        for _ in range(draw(st.integers(0, 5))):
            job = JobId(draw(st.sampled_from(["a", "b", "c"])))
            round_ = gpu  # rounds grow with the GPU: no round waits on a later one
            lo = taken.get((job, round_), 0)
            if lo >= 4:
                continue
            hi = draw(st.integers(lo + 1, 4))
            taken[(job, round_)] = hi
            d = draw(st.floats(0.0, 2.0))
            es.append(entry(job, round_, lo, hi, t, t + d))
            t += d
        out[gpu] = es
    return out


@given(plan=plans(), steps=st.lists(st.integers(0, 5), max_size=60),
       compute=st.floats(0.01, 1.0), switch=st.floats(0.0, 0.1))
@settings(max_examples=300)
def test_every_entry_runs_once_in_order_whatever_the_leader_resends(
        plan: dict[int, list[TaskEntry]], steps: list[int], compute: float,
        switch: float) -> None:
    """A leader resends, replans (listing the entries not yet reported, in
    the same order) and a deposed leader speaks up, while the GPUs run: each
    entry runs exactly once, each GPU's in its order, none starting before
    its planned start nor before the GPU's previous one ends, a switch paid
    exactly between different jobs."""
    f = follower(gpus=len(plan))
    reported: set[tuple[JobId, int, int]] = set()
    revision = 1

    def current(term: int = 2) -> TaskSequence:
        return seq(term, revision, *((g, tuple(e for e in es if key_of(e) not in reported))
                                     for g, es in plan.items()))

    assert f.offer(current()) == "taken"
    ran: dict[int, list[tuple[TaskEntry, float, float, float]]] = {g: [] for g in plan}
    clock = {g: 0.0 for g in plan}
    last: dict[int, JobId | None] = dict.fromkeys(plan)
    times = TaskTimes(compute, 0.05)
    for step in [*steps, *([3, 4, 5] * 30)]:  # then every GPU runs to its end
        gpu = step % len(plan)
        if step == 0:
            revision += 1
            assert f.offer(current()) == "taken"
        elif step == 1:
            assert f.offer(current()) in ("resend", "taken")
            stale = f.offer(current(term=1))
            assert isinstance(stale, Refused) and stale.code == STALE_TERM
        elif step == 2:
            reported.update(f.done)  # the reports reach the leader
        elif gpu in f.running:
            f.finish(gpu)
        elif (e := f.head(gpu)) is not None:
            run = entry_run(e, times, clock[gpu], last[gpu], switch)
            f.start(gpu, e)
            ran[gpu].append((e, run.begin, run.switch_s, run.compute_start))
            clock[gpu], last[gpu] = run.compute_end, e.job_id
    for gpu, es in plan.items():
        assert [r[0] for r in ran[gpu]] == es  # every entry, once, in the GPU's order
        prev: TaskEntry | None = None
        end = 0.0
        for e, begin, paid, start in ran[gpu]:
            assert begin >= e.start_s and begin >= end
            assert paid == (switch if prev is not None and prev.job_id != e.job_id else 0.0)
            assert start == begin + paid
            end, prev = start + (e.hi - e.lo) * compute, e


# --- a job whose task failed --------------------------------------------------------------


def test_a_failed_task_fails_its_job_with_the_code_and_the_scripts_words() -> None:
    failed = task_job_failed(J1, "task_failed", "job j1 round 1: RuntimeError: boom\n  at x",
                             S, 1, 7.5)
    assert (failed.job_id, failed.at, failed.exit_code) == (J1, 7.5, None)
    assert failed.reason == (f"task_failed: job j1 round 1: RuntimeError: boom at x "
                             f"(server {S}, GPU 1)")


def test_a_failed_tasks_words_are_bounded() -> None:
    words = "RuntimeError: " + "x" * 100_000
    reason = task_job_failed(J1, "task_failed", words, S, 0, 0.0).reason
    said = reason.removeprefix("task_failed: ").removesuffix(f" (server {S}, GPU 0)")
    assert len(said) == FAILURE_WORDS_MAX and said.endswith("…")
    assert said.startswith("RuntimeError: xxx")
    short = task_job_failed(J1, "task_failed", "x" * FAILURE_WORDS_MAX, S, 0, 0.0).reason
    assert "…" not in short  # at the bound: kept whole
