"""Per-GPU task sequences (scheduling/policies/hare/sequences.py) and their
live replanning (scheduling/live/tasks.py): Fig. 1c's interleaving, and the
invariants as properties of online runs driven by every task policy."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import defaultdict

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.hare.workload import HareWorkload, cluster_gpus, generate
from scheduling.live.tasks import (
    LiveTaskSettings,
    TaskSnapshot,
    assumed_started,
    gpu_id,
    remaining,
    replan,
    sequence_messages,
    split_gpu_id,
)
from scheduling.policies.hare.model import Gpu, GpuId, TaskJob, TaskPolicy
from scheduling.policies.hare.names import TASK_POLICIES, task_policy
from scheduling.policies.hare.sequences import Entry, EntryKey, Sequences, coalesce, empty, keep
from shared import events as ev
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from simulator.tasks import TaskSimSettings, simulate
from world.hare import cluster_shape, task_models

G1, G2, G3 = GpuType("gpu1"), GpuType("gpu2"), GpuType("gpu3")
V100, K80 = GpuType("V100"), GpuType("K80")
TOL = 1e-9
A00: EntryKey = (JobId("a"), 0, 0)


def entries(seqs: Sequences, gpu: str) -> list[tuple[str, int, int, int, float, float]]:
    return [(e.job, e.round, e.lo, e.hi, e.start_s, e.end_s) for e in seqs.gpus[GpuId(gpu)]]


# --- Fig. 1c -----------------------------------------------------------------------------

# hare.md §1, Fig. 1: three jobs on three heterogeneous GPUs, J3 synchronising
# every two tasks. The figure's table of batch times is an image the text does
# not carry; these times give its shape: J2 is fastest on GPU1, J3 on GPU3 and
# GPU2, J1 on GPU3.
FIG1_JOBS = (
    TaskJob(JobId("J1"), 0.0, 1, 2, {G1: 2.0, G2: 2.0, G3: 0.5}),
    TaskJob(JobId("J2"), 0.0, 3, 1, {G1: 1.0, G2: 3.0, G3: 3.0}),
    TaskJob(JobId("J3"), 0.0, 2, 2, {G1: 3.0, G2: 1.0, G3: 0.5}),
)
FIG1_GPUS = (Gpu(gpu_id(ServerId("s"), 0), G1), Gpu(gpu_id(ServerId("s"), 1), G2),
             Gpu(gpu_id(ServerId("s"), 2), G3))


def finishes(seqs: Sequences) -> dict[str, float]:
    out: dict[str, float] = {}
    for _, e in seqs.entries():
        out[e.job] = max(out.get(e.job, 0.0), e.done_s)
    return out


def test_fig1c_interleaves_two_jobs_on_one_gpu_within_a_round() -> None:
    seqs = replan(TaskSnapshot(0.0, FIG1_JOBS, FIG1_GPUS), task_policy("hare-eft"))
    assert seqs.revision == 1 and seqs.policy == "hare-eft"
    assert entries(seqs, "s:0") == [("J2", 0, 0, 1, 0.0, 1.0), ("J2", 1, 0, 1, 1.0, 2.0),
                                    ("J2", 2, 0, 1, 2.0, 3.0)]
    assert entries(seqs, "s:1") == [("J3", 0, 0, 1, 0.0, 1.0), ("J3", 1, 1, 2, 1.5, 2.5)]
    # GPU3 runs both of J1's micro-batches (one entry), then J3's second of
    # round 0: J1 runs inside J3's round 0, [0, 1.5), while GPU2 computes.
    assert entries(seqs, "s:2") == [("J1", 0, 0, 2, 0.0, 1.0), ("J3", 0, 1, 2, 1.0, 1.5),
                                    ("J3", 1, 0, 1, 1.5, 2.0)]
    # JCTs 1 + 3 + 2.5 against 19 for the job-level FIFO (Fig. 1a/b's kind).
    finish = finishes(seqs)
    fifo = finishes(replan(TaskSnapshot(0.0, FIG1_JOBS, FIG1_GPUS), task_policy("gavel-fifo")))
    assert finish == {"J1": 1.0, "J2": 3.0, "J3": 2.5} and sum(fifo.values()) == 19.0
    # The simulator runs the same core: the same finishes.
    sim = simulate(FIG1_JOBS, FIG1_GPUS, task_policy("hare-eft"), TaskSimSettings(switch_s=0.0))
    assert {j.id: j.finish_s for j in sim.jobs} == finish


# --- the invariants ----------------------------------------------------------------------


def check_exactly_once(seqs: Sequences, jobs: dict[JobId, TaskJob],
                       applied: dict[JobId, int]) -> None:
    """Each round planned, from the first not applied, has its S micro-batches
    exactly once across the GPUs; the rounds planned are consecutive."""
    cover: dict[tuple[JobId, int], list[int]] = defaultdict(list)
    for _, e in seqs.entries():
        assert e.rounds == 1, f"live entry {e.key} covers {e.rounds} rounds"
        assert e.round >= applied[e.job], f"entry {e.key} of a round already applied"
        cover[(e.job, e.round)].extend(range(e.lo, e.hi))
    for (job, rnd), got in cover.items():
        s = jobs[job].tasks_per_round
        assert sorted(got) == list(range(s)), f"round {rnd} of {job} covers {sorted(got)}"
    for job in {j for j, _ in cover}:
        rounds = sorted(r for j, r in cover if j == job)
        assert rounds == list(range(rounds[0], rounds[0] + len(rounds))), (job, rounds)


def check_rounds_and_gpus(seqs: Sequences) -> None:
    """A job's round r + 1 starts once round r is done (synchronised), by the
    plan; a GPU's entries do not overlap and run in their order."""
    done: dict[tuple[JobId, int], float] = {}
    for _, e in seqs.entries():
        done[e.unit] = max(done.get(e.unit, -math.inf), e.done_s)
    for gpu, es in seqs.gpus.items():
        for e in es:
            before = done.get((e.job, e.round - 1), -math.inf)
            assert e.start_s >= before - TOL, f"{e.key} on {gpu} starts before round {e.round - 1}"
        for a, b in itertools.pairwise(es):
            assert b.start_s >= a.end_s - TOL, f"{a.key} and {b.key} overlap on {gpu}"


def check_started_kept(prev: Sequences, new: Sequences, started: set[EntryKey],
                       applied: dict[JobId, int]) -> None:
    """Every started entry still live is on the same GPU, unchanged, with
    nothing new before it and the started ones in the same order."""
    old = {e.key for _, e in prev.entries()}
    for gpu, es in prev.gpus.items():
        want = [e for e in es if e.key in started and e.job in applied
                and e.next_round > applied[e.job]]
        got = list(new.gpus[gpu])
        assert [e for e in got if e.key in started] == want, f"started entries moved on {gpu}"
        if want:
            last = got.index(want[-1])
            assert all(e.key in old for e in got[:last]), f"new entry before a started one on {gpu}"


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[TaskJob, ...], tuple[Gpu, ...]]:
    n_v, n_k = draw(st.integers(1, 3)), draw(st.integers(0, 2))
    pool = tuple(Gpu(gpu_id(ServerId(f"n{i // 2}"), i % 2), V100 if i < n_v else K80)
                 for i in range(n_v + n_k))
    jobs = tuple(
        TaskJob(JobId(f"j{i}"), draw(st.sampled_from([0.0, 0.3, 1.0, 2.2, 4.0])),
                draw(st.integers(1, 7)), draw(st.integers(1, n_v)),
                {V100: draw(st.sampled_from([0.4, 1.0])), K80: draw(st.sampled_from([0.9, 2.5]))},
                dict.fromkeys((V100, K80), draw(st.sampled_from([0.0, 0.2]))),
                weight=draw(st.sampled_from([1.0, 2.0])))
        for i in range(draw(st.integers(1, 4))))
    return jobs, pool


def applied_rounds(seqs: Sequences, job: TaskJob, start: int, now: float) -> int:
    """The job's rounds whose every micro-batch is done and synchronised by
    ``now`` (the plan is the truth here): what its aggregator has applied."""
    r = start
    while r < job.rounds:
        mine = [e for _, e in seqs.entries() if e.unit == (job.id, r)]
        if sum(e.hi - e.lo for e in mine) < job.tasks_per_round or any(
                e.done_s > now for e in mine):
            return r
        r += 1
    return r


def run_online(jobs: tuple[TaskJob, ...], pool: tuple[Gpu, ...], policy: TaskPolicy,
               horizon: int) -> list[Entry]:
    """The leader's loop with the plan as the truth: replan at every arrival
    and every entry's end, checking the invariants each time; the entries
    run, in order."""
    cfg = LiveTaskSettings(horizon_rounds=horizon)
    by_id = {j.id: j for j in jobs}
    specs = {j.id: JobSpec(j.id, j.model or "m", 32, 1, j.rounds, requirements=(1,),
                           sync_scale=j.tasks_per_round) for j in jobs}
    applied = dict.fromkeys(by_id, 0)
    seqs: Sequences | None = None
    done: set[EntryKey] = set()
    ran: list[Entry] = []
    now = 0.0
    for _ in range(500):
        if seqs is not None:
            for _, e in seqs.entries():
                if e.end_s <= now and e.key not in done:
                    done.add(e.key)
                    ran.append(e)
            for j in jobs:
                applied[j.id] = applied_rounds(seqs, j, applied[j.id], now)
        live = tuple(msgspec.structs.replace(j, done_rounds=applied[j.id]) for j in jobs
                     if j.arrival_s <= now and applied[j.id] < j.rounds)
        if not live and all(j.arrival_s <= now for j in jobs):
            return ran
        snap = TaskSnapshot(now, live, pool, frozenset(done))
        prev = seqs or empty((g.id for g in pool), now)
        seqs = replan(snap, policy, seqs, cfg)
        assert seqs.revision == prev.revision + 1
        check_exactly_once(seqs, by_id, applied)
        check_rounds_and_gpus(seqs)
        check_started_kept(prev, seqs, assumed_started(prev, done),
                           {j.id: j.done_rounds for j in live})
        # What the servers would get passes the wire's own checks.
        for msg in sequence_messages(seqs, done, term=1, at=now, specs=specs):
            assert ev.decode_task_event(ev.encode(msg)) == msg
        events = [j.arrival_s for j in jobs if j.arrival_s > now]
        events += [e.end_s for _, e in seqs.entries() if e.key not in done and e.end_s > now]
        events += [e.done_s for _, e in seqs.entries() if e.done_s > now]
        now = min(events)
    raise AssertionError("the run did not finish in 500 replans")


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(workloads(), st.sampled_from(TASK_POLICIES), st.integers(1, 3))
def test_online_replans_keep_the_invariants(
        w: tuple[tuple[TaskJob, ...], tuple[Gpu, ...]], name: str, horizon: int) -> None:
    jobs, pool = w
    ran = run_online(jobs, pool, task_policy(name), horizon)
    # Every micro-batch of every round ran exactly once, in all.
    runs = [(e.job, e.round, m) for e in ran for m in range(e.lo, e.hi)]
    want = {(j.id, r, m) for j in jobs for r in range(j.rounds) for m in range(j.tasks_per_round)}
    assert len(runs) == len(want) and set(runs) == want


# --- the checkers and the core's pieces fail where they should ----------------------------


def _entry(job: str, rnd: int, lo: int, hi: int, start: float, end: float) -> Entry:
    return Entry(JobId(job), rnd, lo, hi, start, end, end)


def test_the_invariant_checkers_catch_broken_sequences() -> None:
    jobs = {JobId("a"): TaskJob(JobId("a"), 0.0, 2, 2, {V100: 1.0})}
    ok = Sequences(1, 0.0, "x", {
        GpuId("g0"): (_entry("a", 0, 0, 1, 0, 1), _entry("a", 1, 0, 1, 1, 2)),
        GpuId("g1"): (_entry("a", 0, 1, 2, 0, 1), _entry("a", 1, 1, 2, 1, 2))})
    check_exactly_once(ok, jobs, {JobId("a"): 0})
    check_rounds_and_gpus(ok)
    twice = msgspec.structs.replace(ok, gpus={**ok.gpus, GpuId("g1"): (
        _entry("a", 0, 0, 2, 0, 1), _entry("a", 1, 1, 2, 1, 2))})
    with pytest.raises(AssertionError, match="covers"):
        check_exactly_once(twice, jobs, {JobId("a"): 0})
    early = msgspec.structs.replace(ok, gpus={**ok.gpus, GpuId("g1"): (
        _entry("a", 0, 1, 2, 0, 1), _entry("a", 1, 1, 2, 0.5, 2))})
    with pytest.raises(AssertionError, match="starts before round 0"):
        check_rounds_and_gpus(early)
    moved = msgspec.structs.replace(ok, gpus={GpuId("g0"): ok.gpus[GpuId("g1")],
                                              GpuId("g1"): ok.gpus[GpuId("g0")]})
    with pytest.raises(AssertionError, match="started entries moved"):
        check_started_kept(ok, moved, {A00}, {JobId("a"): 0})


def test_keep_holds_whole_rounds_under_way_and_drops_the_rest() -> None:
    g0, g1 = GpuId("g0"), GpuId("g1")
    seqs = Sequences(3, 0.0, "x", {
        g0: (_entry("a", 0, 0, 1, 0, 1), _entry("b", 0, 0, 1, 1, 2), _entry("a", 1, 0, 1, 2, 3)),
        g1: (_entry("b", 0, 1, 2, 0, 1), _entry("a", 0, 1, 2, 1, 2))})
    kept = keep(seqs, {A00})
    # a's round 0 is under way: its unstarted slot on g1 stays too; b and a's
    # round 1 have not started and go back to the policy.
    assert kept.gpus == {g0: (seqs.gpus[g0][0],), g1: (seqs.gpus[g1][1],)}
    assert kept.revision == 3
    assert assumed_started(seqs, {A00}) == {("a", 0, 0), ("b", 0, 0), ("b", 0, 1)}
    assert remaining(seqs, {A00})[g0] == seqs.gpus[g0][1:]


def test_a_head_waiting_on_an_earlier_round_is_not_started() -> None:
    """Found by the property: GPU k's next entry is round 2 of c while c's
    round 1 waits on GPU v behind another job. Round 2 cannot have started,
    so it is not kept; had it been, round 1 (not started) would have been
    dropped and never planned again. ``keep`` itself also keeps every
    earlier round of a round it keeps."""
    v, k = GpuId("v"), GpuId("k")
    seqs = Sequences(2, 0.9, "x", {
        v: (_entry("a", 0, 0, 1, 0.8, 1.2), _entry("c", 1, 0, 1, 1.2, 1.6)),
        k: (_entry("c", 0, 0, 1, 0.0, 0.9), _entry("c", 2, 0, 1, 1.8, 2.7))})
    done = {(JobId("c"), 0, 0)}
    assert assumed_started(seqs, done) == {(JobId("c"), 0, 0), (JobId("a"), 0, 0)}
    kept = keep(seqs, {(JobId("c"), 2, 0)})
    assert kept.gpus == {v: (seqs.gpus[v][1],), k: seqs.gpus[k]}


def test_a_gpu_may_run_its_next_entry_while_the_one_before_synchronises() -> None:
    """Found by the parity bench: a GPU takes its next entry as soon as one
    has computed, and reports that one only once its gradients are sent.
    A replan that moved the next entry (b's round 2) made the server
    abandon it, or refuse the revision. Entries after the first not done
    count as started while planned to start by ``by`` and of an open round;
    the walk stops at the first that cannot have begun."""
    g = GpuId("g")
    seqs = Sequences(4, 1.0, "x", {g: (
        _entry("a", 0, 0, 1, 0.0, 0.1),   # computed, its gradients on the way
        _entry("b", 2, 0, 1, 0.1, 0.6),   # b's rounds 0-1 done: may run now
        _entry("c", 0, 0, 1, 0.6, 0.9),   # planned after the replan's time
        _entry("b", 3, 0, 1, 0.9, 1.4))})
    a0, b2, c0 = (JobId("a"), 0, 0), (JobId("b"), 2, 0), (JobId("c"), 0, 0)
    assert assumed_started(seqs, set()) == {a0}  # no time given: the first alone
    assert assumed_started(seqs, set(), 0.5) == {a0, b2}
    assert assumed_started(seqs, set(), 5.0) == {a0, b2, c0}  # b3 waits for b2's barrier
    assert assumed_started(seqs, {a0, b2}, 0.5) == {a0, b2, c0}  # the next one may run
    snap = TaskSnapshot(0.5, (TaskJob(JobId("b"), 0.0, 4, 1, {V100: 0.5}, done_rounds=2),
                              TaskJob(JobId("a"), 0.0, 1, 1, {V100: 0.1}),
                              TaskJob(JobId("c"), 0.0, 1, 1, {V100: 0.3})),
                        (Gpu(g, V100),), frozenset())
    kept = replan(snap, task_policy("hare-eft"), seqs).gpus[g]
    assert [e.key for e in kept[:2]] == [a0, b2]
    with pytest.raises(ValueError, match="start_margin_s"):
        LiveTaskSettings(start_margin_s=-1.0)


def test_coalesce_merges_adjacent_micro_batches_of_one_round_only() -> None:
    a = (_entry("a", 0, 0, 1, 0, 1), _entry("a", 0, 1, 2, 1, 2), _entry("a", 1, 2, 3, 2, 3),
         _entry("a", 1, 0, 1, 3, 4))
    assert [(e.round, e.lo, e.hi, e.start_s, e.end_s) for e in coalesce(a)] == [
        (0, 0, 2, 0, 2), (1, 2, 3, 2, 3), (1, 0, 1, 3, 4)]


def test_live_gpu_ids_and_refusals() -> None:
    assert split_gpu_id(gpu_id(ServerId("rack:a"), 3)) == ("rack:a", 3)
    for bad in ("g0", ":1", "s:x"):
        with pytest.raises(ValueError, match="not a live GPU id"):
            split_gpu_id(GpuId(bad))
    with pytest.raises(ValueError, match="horizon_rounds"):
        LiveTaskSettings(horizon_rounds=0)
    with pytest.raises(ValueError, match="lo < hi"):
        Entry(JobId("a"), 0, 1, 1, 0.0, 1.0, 1.0)
    # A started round on a GPU that left the snapshot is refused, not replanned;
    # a GPU that leaves with nothing started is simply no longer planned on.
    first = replan(TaskSnapshot(0.0, FIG1_JOBS, FIG1_GPUS), task_policy("hare-eft"))
    with pytest.raises(ValueError, match="GPUs the problem lacks"):
        replan(TaskSnapshot(0.5, FIG1_JOBS, FIG1_GPUS[:2]), task_policy("hare-eft"), first)
    idle = Gpu(gpu_id(ServerId("t"), 0), K80)
    with_idle = replan(TaskSnapshot(0.0, FIG1_JOBS, (*FIG1_GPUS, idle)), task_policy("hare-eft"))
    assert with_idle.gpus[idle.id] == ()
    after = replan(TaskSnapshot(0.5, FIG1_JOBS, FIG1_GPUS), task_policy("hare-eft"), with_idle)
    assert idle.id not in after.gpus and after.revision == 2


def test_a_replan_keeps_the_running_entries_and_resequences_the_rest() -> None:
    """At 0.5 a new job arrives: the entries running on each GPU (the heads)
    and the rest of their rounds stay; the rounds not started are planned
    again, after them, under revision 2."""
    policy = task_policy("hare-eft")
    first = replan(TaskSnapshot(0.0, FIG1_JOBS, FIG1_GPUS), policy)
    late = TaskJob(JobId("J4"), 0.5, 1, 1, {G1: 0.2, G2: 0.2, G3: 0.2}, weight=5.0)
    second = replan(TaskSnapshot(0.5, (*FIG1_JOBS, late), FIG1_GPUS), policy, first)
    assert second.revision == 2 and second.now == 0.5
    for gpu in first.gpus:
        assert second.gpus[gpu][0] == first.gpus[gpu][0]  # the heads may be running
    assert any(e.job == "J4" for _, e in second.entries())
    assert all(e.start_s >= 0.5 for _, e in second.entries() if e.job == "J4")


# --- the simulator's results did not move ------------------------------------------------

# Pinned with the simulator before it ran the sequences core (commit fc55e21):
# seed 2, 10 jobs on the testbed at load 1.5, macro budget 40 (so macro-tasks
# of several rounds), every task recorded. Weighted JCT in hours, and the
# first 16 hex digits of the SHA-256 of the whole result as JSON. The LP
# policies depend on the solver (HiGHS), as tests/test_pinned_summaries.py says.
PINNED_RUNS = {
    "hare": (10.686380670489902, "9261f3d219a41587"),
    "hare-eft": (6.666674347753125, "53dbbfcc339904b6"),
    "gavel-fifo": (9.13693097106471, "bb659e81104bc500"),
    "srtf": (7.034719618667859, "c3aaa523e19ac269"),
    "homo": (11.883659529893604, "a9af337d75574fc1"),
    "allox": (8.295263961544908, "cf77b4f3f29c13fb"),
    "hare:ties=order": (10.397337944289346, "eb4ff8e87a938bee"),
}


@pytest.mark.parametrize("name", sorted(PINNED_RUNS))
def test_the_simulator_on_the_core_gives_the_pinned_results(name: str) -> None:
    pool = cluster_gpus(cluster_shape("testbed"))
    jobs = generate(HareWorkload(jobs=10, load=1.5), task_models(), len(pool),
                    np.random.default_rng(2))
    r = simulate(jobs, pool, task_policy(name), TaskSimSettings(budget=40, record=True))
    digest = hashlib.sha256(msgspec.json.encode(r)).hexdigest()[:16]
    assert (r.weighted_jct_h, digest) == PINNED_RUNS[name]
