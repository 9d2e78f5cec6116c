"""Named resources (shared/resources.py): the Ledger never over-allocates a
server in any resource; configurations carry their extras on the wire and in
equality; snapshots say what is free in every resource; the plan check names
what a plan over-allocates; the live snapshot holds the extras it holds GPUs of."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.check import plan_overallocation
from scheduling.layers.base import without_extras
from scheduling.live.clock import Inflight
from scheduling.live.snapshot import build_snapshot
from scheduling.live.state import new_record
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord, Placement
from shared.resources import (
    NOTHING,
    RESOURCE_NAMES,
    Ledger,
    OverAllocation,
    ResourceName,
    Resources,
)
from shared.snapshot import Assignment, JobState, Plan, ProfilingTask, Snapshot
from tests.helpers import state

SERVERS = [ServerId(s) for s in ("s0", "s1", "s2")]
HOLDERS = ["h0", "h1", "h2", "h3"]

vectors = st.builds(Resources, st.integers(0, 8), st.integers(0, 32), st.integers(0, 4096))
demands = st.dictionaries(st.sampled_from(SERVERS), vectors, max_size=3)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("book"), st.sampled_from(HOLDERS), demands),
        st.tuples(st.just("release"), st.sampled_from(HOLDERS), st.just({})),
    ),
    max_size=30,
)
capacities = st.fixed_dictionaries({s: vectors for s in SERVERS})


def view(ledger: Ledger) -> tuple[dict[ServerId, Resources], dict[str, dict[ServerId, Resources]]]:
    return ({s: ledger.used(s) for s in SERVERS}, {h: ledger.held_by(h) for h in HOLDERS})


@settings(max_examples=300, deadline=None)
@given(capacities, ops)
def test_the_ledger_never_over_allocates_and_keeps_what_each_holder_holds(
    capacity: dict[ServerId, Resources], sequence: list[tuple[str, str, dict[ServerId, Resources]]]
) -> None:
    ledger = Ledger(capacity)
    model: dict[str, dict[ServerId, Resources]] = {}  # what each holder should hold
    for op, holder, want in sequence:
        before = view(ledger)
        if op == "release":
            assert ledger.release(holder) == model.pop(holder, {})
        else:
            try:
                ledger.book(holder, want)
            except OverAllocation as e:
                assert view(ledger) == before  # a refused booking changes nothing
                assert ledger.refusal(want, holder) is not None and holder in str(e)
                continue
            # Booking again replaces what the holder held.
            model[holder] = {s: d for s, d in want.items() if not d.is_zero}
            if not model[holder]:
                del model[holder]
        for h in HOLDERS:
            assert ledger.held_by(h) == model.get(h, {})
        for s in SERVERS:
            used = ledger.used(s)
            assert used.fits_in(capacity[s])
            assert used == sum((m.get(s, NOTHING) for m in model.values()), NOTHING)
            assert ledger.free(s) == capacity[s].minus(used)


@settings(max_examples=200, deadline=None)
@given(capacities, demands, demands)
def test_a_release_restores_free_exactly(
    capacity: dict[ServerId, Resources],
    other: dict[ServerId, Resources],
    want: dict[ServerId, Resources],
) -> None:
    ledger = Ledger(capacity)
    if ledger.refusal(other) is None:
        ledger.book("other", other)
    free = {s: ledger.free(s) for s in SERVERS}
    if ledger.refusal(want, "h") is None:
        ledger.book("h", want)
        for s, d in want.items():
            assert ledger.free(s) == free[s].minus(d)
        ledger.release("h")
    assert {s: ledger.free(s) for s in SERVERS} == free


def test_the_ledger_names_server_and_resource_and_rebooking_replaces() -> None:
    ledger = Ledger({SERVERS[0]: Resources(gpus=4, cores=8)})
    ledger.book("a", {SERVERS[0]: Resources(gpus=2, cores=6)})
    with pytest.raises(OverAllocation, match="b: s0 has 2 CPU cores free of 8, 4 needed"):
        ledger.book("b", {SERVERS[0]: Resources(gpus=1, cores=4)})
    # "a" may grow into what it holds itself: its old booking is replaced.
    ledger.book("a", {SERVERS[0]: Resources(gpus=4, cores=8)})
    assert ledger.used(SERVERS[0]) == Resources(gpus=4, cores=8)
    assert ledger.refusal({ServerId("nowhere"): Resources(gpus=1)}) == "server nowhere is unknown"
    with pytest.raises(OverAllocation, match="GPUs"):
        ledger.book("c", {SERVERS[0]: Resources(gpus=1)})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Resources(cores=-1), "cores must be an integer >= 0"),
        (lambda: Resources(memory_mb=True), "memory_mb must be an integer"),
        (lambda: Configuration.of({"a": 2}).with_extras({ServerId("b"): Resources(cores=1)}),
         "b is not one of its servers"),
        (lambda: Configuration(((ServerId("a"), 2),), (Resources(cores=1),) * 2),
         "2 extras for 1 servers"),
        (lambda: Configuration(((ServerId("a"), 2),), (Resources(gpus=1),)),
         "GPUs belong in parts"),
        (lambda: Snapshot(now=0.0, cluster=cores_cluster(8), jobs=(),
                          held_extras={ServerId("n0"): Resources(gpus=1)}),
         "they belong in held"),
    ],
)
def test_extras_are_validated(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_extras_travel_count_in_equality_and_leave_gpu_only_encoding_alone() -> None:
    gpus = Configuration.of({"b": 1, "a": 2})
    assert msgspec.json.encode(gpus) == b'{"parts":[["a",2],["b",1]]}'  # no extras key
    cores = gpus.with_extras({ServerId("a"): Resources(cores=4, memory_mb=1024)})
    wire = msgspec.json.encode(cores)
    assert b'"extras":[{"cores":4,"memory_mb":1024},{}]' in wire
    assert msgspec.json.decode(wire, type=Configuration) == cores
    assert msgspec.json.decode(msgspec.json.encode(gpus), type=Configuration) == gpus
    assert cores != gpus and len({cores, gpus, cores.gpus_only}) == 2
    assert hash(cores.gpus_only) == hash(gpus) and cores.gpus_only == gpus
    same = Configuration.of({"a": 2, "b": 1}).with_extras(
        {ServerId("a"): Resources(cores=4, memory_mb=1024)}
    )
    assert same == cores and hash(same) == hash(cores)
    assert cores.demands() == {
        "a": Resources(gpus=2, cores=4, memory_mb=1024), "b": Resources(gpus=1)
    }
    assert gpus.with_extras({ServerId("a"): NOTHING}) is not gpus
    assert gpus.with_extras({ServerId("a"): NOTHING}) == gpus  # all zero: GPUs only


def cores_cluster(cores: int, servers: int = 2, gpus: int = 4) -> Cluster:
    t = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
    return Cluster(
        gpu_types=(t,),
        servers=tuple(
            Server(ServerId(f"n{i}"), t.name, gpus, memory_gb=1, cores=cores)
            for i in range(servers)
        ),
    )


def with_cores(parts: dict[str, int], per_gpu: int) -> Configuration:
    config = Configuration.of(parts)
    return config.with_extras({s: Resources(cores=per_gpu * g) for s, g in config.parts})


def test_free_resources_take_held_gpus_and_extras_off_capacity() -> None:
    snap = Snapshot(
        now=0.0, cluster=cores_cluster(8), jobs=(),
        held={ServerId("n0"): 3, ServerId("n1"): 9},
        held_extras={ServerId("n0"): Resources(cores=6, memory_mb=2048)},
    )
    assert snap.free_resources() == {
        "n0": Resources(gpus=1, cores=2, memory_mb=0),  # clamped at zero
        "n1": Resources(gpus=0, cores=8, memory_mb=1024),
    }
    assert snap.free_gpus() == {"n0": 1, "n1": 0}
    assert msgspec.json.decode(msgspec.json.encode(snap), type=Snapshot) == snap
    gpu_only = Snapshot(now=0.0, cluster=cores_cluster(0), jobs=())
    assert set(gpu_only.free_resources().values()) == {Resources(gpus=4, memory_mb=1024)}


def test_the_plan_check_names_the_first_over_allocation() -> None:
    jobs = (state("x", [2]), state("y", [2]), state("p", [1], phase="profiling"))
    snap = Snapshot(now=0.0, cluster=cores_cluster(8), jobs=jobs)

    def plan(x: Configuration, y: Configuration | None = None, profile: int = 0) -> Plan:
        runs = [Assignment(JobId("x"), x)] + ([Assignment(JobId("y"), y)] if y else [])
        tasks = [ProfilingTask(JobId("p"), GpuType("A"), ServerId("n0"), profile)] * bool(profile)
        return Plan(tuple(runs), tuple(tasks))

    fits = plan(with_cores({"n0": 2}, 2), with_cores({"n0": 2}, 2))
    assert plan_overallocation(snap, fits) is None
    # Each job fits on its own; together they need 10 of the 8 cores of n0.
    why = plan_overallocation(snap, plan(with_cores({"n0": 2}, 2), with_cores({"n0": 2}, 3)))
    assert why == "job y: n0 has 4 CPU cores free of 8, 6 needed"
    why = plan_overallocation(snap, plan(Configuration.of({"n0": 4}), None, 1))
    assert why == "profiling p on n0: n0 has 0 GPUs free of 4, 1 needed"
    twice = Plan((Assignment(JobId("x"), Configuration.of({"n0": 1})),) * 2)
    assert plan_overallocation(snap, twice) == "job x is planned twice"


def test_a_later_plan_checks_against_what_running_jobs_hold() -> None:
    running = with_cores({"n0": 2}, 3)
    jobs = (JobState(spec=state("r", [2]).spec, phase="running", current=running),
            state("q", [2]))
    later = Snapshot(
        now=0.0, cluster=cores_cluster(8), jobs=jobs, held={ServerId("n0"): 2},
        held_extras={ServerId("n0"): Resources(cores=6)}, first_plan=False,
    )
    keep = Assignment(JobId("r"), running)  # keeps what it holds: books nothing again
    fits = Plan((keep, Assignment(JobId("q"), with_cores({"n0": 2}, 1))))
    assert plan_overallocation(later, fits) is None
    over = Plan((keep, Assignment(JobId("q"), with_cores({"n0": 2}, 2))))
    assert plan_overallocation(later, over) == "job q: n0 has 2 CPU cores free of 8, 4 needed"
    # The policy beneath a layer sees the running job's GPUs only.
    (shown, _) = without_extras(later).jobs
    assert shown.current == Configuration.of({"n0": 2})
    assert without_extras(later).held_extras == later.held_extras


def test_the_live_snapshot_holds_the_extras_of_what_it_holds() -> None:
    t = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
    nodes = [NodeRecord(server=Server(ServerId("a0"), t.name, 4, cores=16), gpu_type=t, order=0)]
    spec = JobSpec(JobId("run"), "m", 32, 10_000_000, 1000, requirements=(2,))
    cores = with_cores({"a0": 2}, 4)
    rec = msgspec.structs.replace(new_record(spec, 0.0), phase="running", configuration=cores)
    ended = JobSpec(JobId("done"), "m", 32, 10_000_000, 1000, requirements=(1,))
    done = msgspec.structs.replace(new_record(ended, 0.0), phase="finished")
    allocs = {
        JobId("run"): Placement(job_id=JobId("run"), configuration=cores, gpu_indices={}),
        JobId("done"): Placement(job_id=JobId("done"), configuration=with_cores({"a0": 1}, 2),
                                 gpu_indices={}),  # not yet released
    }
    records = {JobId("run"): rec, JobId("done"): done}

    def built(first: bool, allocs: dict[JobId, Placement]) -> Snapshot:
        return build_snapshot(10.0, records, nodes, allocs, {}, {}, Inflight(60.0), first).snapshot

    # A first plan: the running job has no estimate, so it keeps its GPUs and cores.
    assert built(True, allocs).held_extras == {"a0": Resources(cores=10)}
    assert built(False, allocs).held == {"a0": 3}
    assert built(False, allocs).free_resources() == {"a0": Resources(gpus=1, cores=6)}
    gpu_only = {j: msgspec.structs.replace(a, configuration=a.configuration.gpus_only)
                for j, a in allocs.items()}
    records[JobId("run")] = msgspec.structs.replace(rec, configuration=cores.gpus_only)
    assert built(False, gpu_only).held_extras == {}


@given(st.sets(st.sampled_from(RESOURCE_NAMES)), st.integers(0, 5))
def test_short_of_names_exactly_the_resources_wanted_beyond_capacity(
    over: set[ResourceName], less: int
) -> None:
    capacity = Resources(gpus=4, cores=8, memory_mb=1024)
    want = Resources(*(capacity[n] + 1 if n in over else max(0, capacity[n] - less)
                       for n in RESOURCE_NAMES))
    assert set(want.short_of(capacity)) == over
    assert want.fits_in(capacity) == (not over)


placements = st.lists(
    st.dictionaries(st.sampled_from(["n0", "n1"]), st.tuples(st.integers(1, 4), st.integers(0, 6)),
                    min_size=1, max_size=2),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(placements, st.dictionaries(st.sampled_from(["n0", "n1"]), st.integers(0, 5)),
       st.dictionaries(st.sampled_from(["n0", "n1"]), st.integers(0, 10)))
def test_the_plan_check_refuses_exactly_the_plans_beyond_what_is_free(
    parts: list[dict[str, tuple[int, int]]], held: dict[str, int], held_cores: dict[str, int]
) -> None:
    configs = [
        Configuration.of({s: g for s, (g, _) in p.items()}).with_extras(
            {ServerId(s): Resources(cores=c) for s, (_, c) in p.items()}
        )
        for p in parts
    ]
    jobs = tuple(state(f"j{i}", [c.total_gpus]) for i, c in enumerate(configs))
    snap = Snapshot(
        now=0.0, cluster=cores_cluster(8), jobs=jobs,
        held={ServerId(s): g for s, g in held.items()},
        held_extras={ServerId(s): Resources(cores=c) for s, c in held_cores.items()},
    )
    plan = Plan(tuple(Assignment(j.id, c) for j, c in zip(jobs, configs, strict=True)))
    wanted = {s: sum((c.demand_on(s) for c in configs), NOTHING) for s in snap.free_resources()}
    fits = all(wanted[s].fits_in(free) for s, free in snap.free_resources().items())
    why = plan_overallocation(snap, plan)
    assert (why is None) == fits, why
    if why is not None:
        assert "GPUs" in why or "CPU cores" in why
