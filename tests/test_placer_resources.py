"""The placer books CPU cores and memory beside GPU indices: a start fits in
every resource of each of its servers or is refused naming the server and
the resource; what a stopped placement held is free again; GPU-only plans
are booked as before."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.booking import book, held_ledger
from services.placer.commands import Want
from services.placer.diff import diff
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.records import JobRecord, Placement
from shared.resources import RESOURCE_NAMES, Resources, total
from shared.snapshot import Assignment, Plan

A, B, C = ServerId("a"), ServerId("b"), ServerId("c")
CAP = {A: Resources(gpus=4, cores=8, memory_mb=16_384),
       B: Resources(gpus=4, cores=8, memory_mb=16_384)}


def config(parts: Mapping[str, int], cores: Mapping[str, int] | None = None,
           memory_mb: Mapping[str, int] | None = None) -> Configuration:
    extras = {ServerId(s): Resources(cores=(cores or {}).get(s, 0),
                                     memory_mb=(memory_mb or {}).get(s, 0)) for s in parts}
    return Configuration.of(parts).with_extras(extras)


def placement(job: str, cfg: Configuration, mode: str = "run") -> Placement:
    idx: dict[ServerId, tuple[int, ...]] = {s: tuple(range(g)) for s, g in cfg.parts}
    return Placement(job_id=JobId(job), configuration=cfg, gpu_indices=idx,
                     mode=mode)  # type: ignore[arg-type]


def want(job: str, cfg: Configuration, mode: str = "run") -> Want:
    return Want(JobId(job), cfg, mode)  # type: ignore[arg-type]


def record(job: str) -> JobRecord:
    spec = JobSpec(JobId(job), "resnet18-cifar10", 32, 1000, 10**9, requirements=(1, 2, 4))
    return JobRecord(spec=spec, submitted_at=0.0, phase="queued")


def test_a_start_that_fits_books_its_cores_and_the_next_is_refused_naming_them() -> None:
    starts, problems = book([want("x", config({A: 1}, {A: 6})),
                             want("y", config({A: 1}, {A: 4})),
                             want("z", config({A: 1, B: 1}, {A: 2, B: 2}))], {}, CAP, "k")
    assert [s.job_id for s in starts] == ["x", "z"] and not [s for s in starts if s.resize]
    x = starts[0]
    assert x.placement.configuration.demand_on(A) == Resources(gpus=1, cores=6)
    assert [lc.configuration for lc in x.launches] == [config({A: 1}, {A: 6})]
    assert x.placement.gpu_indices == {A: (0,)} and starts[1].placement.gpu_indices[A] == (1,)
    assert [(p.job_id, p.code, p.error) for p in problems] == [
        ("y", "conflict", "job y: a has 2 CPU cores free of 8, 4 needed")]


def test_memory_and_cores_held_by_placements_that_stay_count() -> None:
    held = {JobId("h"): placement("h", config({A: 1}, {A: 3}, {A: 10_000}))}
    starts, problems = book([want("m", config({A: 1}, {A: 1}, {A: 8_000})),
                             want("n", config({A: 1}, {A: 5}, {A: 6_000}))], held, CAP, "k")
    assert [s.job_id for s in starts] == ["n"]
    assert starts[0].placement.gpu_indices == {A: (1,)}  # h holds GPU 0
    assert [(p.code, p.error) for p in problems] == [
        ("conflict", "job m: a has 6384 MiB free of 16384, 8000 needed")]
    ledger = held_ledger(held, CAP)
    assert ledger.free(A) == Resources(gpus=3, cores=5, memory_mb=6_384)


def test_gpus_are_checked_first_with_the_same_message() -> None:
    _, problems = book([want("g", config({A: 5}, {A: 1}))], {}, CAP, "k")
    assert [(p.code, p.error) for p in problems] == [
        ("conflict", "job g: a has 4 free GPUs, the plan needs 5")]


def test_a_server_that_declares_no_cores_takes_no_start_that_needs_some() -> None:
    gpus_only = {A: Resources(gpus=4)}
    starts, problems = book([want("p", Configuration.of({A: 1}), "profile"),
                             want("r", config({A: 1}, {A: 1}))], {}, gpus_only, "k")
    assert [(s.job_id, s.placement.mode) for s in starts] == [("p", "profile")]
    assert [p.error for p in problems] == ["job r: a has 0 CPU cores free of 0, 1 needed"]


def test_what_a_stopped_placement_held_is_free_again() -> None:
    current = {JobId("old"): placement("old", config({A: 2}, {A: 8})),
               JobId("mv"): placement("mv", config({B: 1}, {B: 8}))}
    jobs = {JobId(j): record(j) for j in ("old", "mv", "new")}
    plan = Plan(assignments=(Assignment(JobId("new"), config({A: 1}, {A: 8})),
                             Assignment(JobId("mv"), config({B: 2}, {B: 8}))))
    later = diff(current, plan, False, jobs, CAP, "p")  # a later plan stops nothing else
    assert [s.job_id for s in later.stops] == ["mv"]  # the resize frees its own cores
    assert [s.job_id for s in later.starts] == ["mv"]
    assert [p.error for p in later.problems] == ["job new: a has 0 CPU cores free of 8, 8 needed"]
    first = diff(current, plan, True, jobs, CAP, "p")  # "old" is not in it: stopped
    assert sorted(s.job_id for s in first.stops) == ["mv", "old"]
    assert sorted(s.job_id for s in first.starts) == ["mv", "new"] and first.problems == ()


def test_gpu_only_plans_book_as_before() -> None:
    current = {JobId("h"): placement("h", Configuration.of({A: 2}))}
    starts, problems = book([want("g", Configuration.of({A: 2})),
                             want("f", Configuration.of({A: 1}))], current,
                            {A: Resources(gpus=4)}, "k")
    assert [(s.job_id, s.placement.gpu_indices) for s in starts] == [("g", {A: (2, 3)})]
    assert [p.error for p in problems] == ["job f: a has 0 free GPUs, the plan needs 1"]
    assert starts[0].placement.configuration.extras == ()


# --- no server is ever over-allocated in any resource -----------------------------------

vectors = st.builds(Resources, gpus=st.integers(1, 6), cores=st.integers(0, 12),
                    memory_mb=st.integers(0, 8))
servers = st.sampled_from([A, B, C, ServerId("gone")])


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[ServerId, Resources], dict[JobId, Placement],
                                    list[Want]]:
    capacity = {s: draw(vectors) for s in (A, B, C)}
    current: dict[JobId, Placement] = {}
    left = dict(capacity)
    for n in range(draw(st.integers(0, 4))):  # placements that fit, as the placer leaves them
        s = draw(st.sampled_from([A, B, C]))
        g = draw(st.integers(0, left[s].gpus))
        if g:
            extra = Resources(cores=draw(st.integers(0, left[s].cores)),
                              memory_mb=draw(st.integers(0, left[s].memory_mb)))
            first = capacity[s].gpus - left[s].gpus
            cfg = Configuration.of({s: g}).with_extras({s: extra})
            current[JobId(f"h{n}")] = Placement(
                job_id=JobId(f"h{n}"), configuration=cfg,
                gpu_indices={s: tuple(range(first, first + g))},
                mode=draw(st.sampled_from(["run", "profile"])))
            left[s] = left[s].minus(cfg.demand_on(s))
    wants = []
    for n in range(draw(st.integers(0, 6))):
        parts = draw(st.dictionaries(servers, st.integers(1, 4), min_size=1, max_size=2))
        extras = {s: Resources(cores=draw(st.integers(0, 8)), memory_mb=draw(st.integers(0, 6)))
                  for s in parts}
        cfg = Configuration.of(parts).with_extras(extras)
        mode = draw(st.sampled_from(["run", "profile"]))
        wants.append(Want(JobId(f"w{n}"), cfg if mode == "run" else cfg.gpus_only,
                          mode))  # type: ignore[arg-type]
    return capacity, current, wants


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_starts_booked_never_over_allocate_a_server(
    case: tuple[dict[ServerId, Resources], dict[JobId, Placement], list[Want]],
) -> None:
    capacity, current, wants = case
    starts, problems = book(wants, current, capacity, "p")
    assert len(starts) + len(problems) == len(wants)
    held: dict[ServerId, list[Resources]] = {s: [] for s in capacity}
    indices: dict[ServerId, list[int]] = {s: [] for s in capacity}
    for p in current.values():
        for s, d in p.configuration.demands().items():
            held[s].append(d)
            indices[s].extend(p.gpu_indices[s])
    for start in starts:
        for launch in start.launches:
            s = launch.server
            held[s].append(start.placement.configuration.demand_on(s) if start.placement.mode
                           == "run" else Resources(gpus=len(launch.gpu_indices)))
            indices[s].extend(launch.gpu_indices)
    for s, cap in capacity.items():
        used = total(held[s])
        for r in RESOURCE_NAMES:
            assert used[r] <= cap[r], (s, r, used, cap)
        assert len(indices[s]) == len(set(indices[s])) == used.gpus
        assert all(0 <= i < cap.gpus for i in indices[s])
    for problem in problems:  # each refusal: a server not alive or a resource it lacks
        assert problem.code in ("conflict", "unknown_server"), problem
