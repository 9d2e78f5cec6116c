"""From the live system's records to the planner's :class:`Snapshot`, and the
queue view (from the last plan's reasons).

The leader builds a snapshot the way the simulator does
(``simulator/engine.py``), from three KV buckets instead of its own state:

- the cluster is the *alive* nodes of ``hops_nodes``, ordered by
  ``(order, id)`` (adjacency follows that order, §3.4);
- every job that is not final becomes a :class:`JobState`, but a queued
  job that fits no GPU type of the alive nodes, a CPU job whose cores no
  alive server has, or a CPU job under a policy that does not schedule
  cores (it is held, reason ``unschedulable``, and waits for capacity to
  return, :func:`scheduling.live.admission.hold_problem`): ``submitted`` and
  ``profiling`` jobs are ``profiling`` with the alive GPU types they still
  need (types profiled, being profiled or given up are left out, see
  :class:`scheduling.live.clock.Inflight`), and so is a job
  whose profiling run still holds its GPU in ``hops_alloc``; a ``running``
  job on alive servers is ``running`` with its placement from ``hops_alloc``
  (or its record) and the throughput it made since that configuration took
  effect (:mod:`scheduling.live.samples`); any other job is ``queued``. A
  CPU job is never ``profiling``: it has no GPU type to be profiled on;
- a job whose start a plan issued but the placer has not booked yet is
  ``running`` there, as a simulated job is from the plan that starts it:
  otherwise a first plan made while the placer is still starting it would
  see it queued and might move it, the next one again, and so on;
- ``held`` has every GPU the plan must not use: profiling runs, placements
  of jobs the planner does not replan (ended, unknown, on a lost node) and
  profiling tasks issued but not yet booked; a plan later in the round
  (``first_plan=False``) also holds the GPUs of running jobs, starts
  issued but not yet booked included; and the GPUs of drained nodes
  (:mod:`scheduling.live.drain`);
- ``held_extras`` has the cores and memory (``Configuration.extras``) of
  the same configurations whose GPUs ``held`` has;
- ``layer_state`` is each stateful layer's state after the last published
  plan (HiveD's bindings), which the leader keeps in object store ``hops_state``.

A running job without an estimate (the estimator lost its data or did not
answer) cannot be planned; rather than letting the first plan stop it, its
GPUs are held and the published plan keeps it where it is (``sticky``).
CPU jobs have no estimates (nothing to estimate on a GPU type): they are
planned without one, but under a policy that does not schedule cores,
where a running one is kept where it is (a leader restarted under another
policy does not stop CPU work it cannot plan).
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import msgspec

from scheduling.assemble import Holder, assemble, hidden
from scheduling.live.admission import hold_problem
from scheduling.live.clock import Inflight
from scheduling.live.drain import drain_held
from scheduling.live.reuse import reused_types
from scheduling.live.samples import Throughputs
from scheduling.live.state import PROFILING_PHASES, Facts, LiveJobRecord
from scheduling.policies.hops.window import order_queue
from scheduling.profiling import busy_types
from scheduling.profiling import profiling_step as core_step
from shared.cluster import Cluster, GpuTypeSpec
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.events import EstimateRequest
from shared.ids import GpuType, JobId, ServerId
from shared.job import R_NUM, JobSpec
from shared.records import NodeRecord, Placement, QueueEntry, QueueView
from shared.snapshot import Assignment, JobState, Plan, PlanReasons, Snapshot
from shared.wire import HELD, UNKNOWN_TENANT, UNSCHEDULABLE


def cluster_of(nodes: Iterable[NodeRecord], name: str = "live") -> Cluster:
    """The alive nodes as a cluster; a GPU type's spec comes from its first node."""
    alive = sorted((n for n in nodes if n.alive), key=lambda n: (n.order, n.server.id))
    types: dict[GpuType, GpuTypeSpec] = {}
    for n in alive:
        types.setdefault(n.server.gpu_type, n.gpu_type)
    return Cluster(
        gpu_types=tuple(types.values()), servers=tuple(n.server for n in alive), name=name
    )


def busy_types_of(cluster: Cluster, allocs: Mapping[JobId, Placement]) -> frozenset[GpuType]:
    """The alive GPU types every GPU of which a running job has booked."""
    running: Counter[ServerId] = Counter()
    for alloc in allocs.values():
        if alloc.mode == "run":
            running.update(alloc.configuration.as_dict())
    return busy_types(cluster, running)


def profiling_step(
    rec: LiveJobRecord,
    need: frozenset[GpuType],
    busy: frozenset[GpuType],
    profiling: bool,
    starting: bool,
) -> tuple[frozenset[GpuType], frozenset[GpuType]]:
    """For a job that needs profiles on ``need``: the types it goes back to
    profiling for (a waiting job, no start in flight, lacking a type that is
    no longer ``busy``), and the types its profiles must cover for it to be
    queued (``need`` less the busy ones it lacks, once profiled on some type
    with no profiling run in flight); see :mod:`.profiling`."""
    if rec.spec.kind == "cpu":
        return frozenset(), frozenset()  # nothing to profile: queued from submission
    lacking = need - set(rec.profiled)
    step = core_step(rec.phase == "queued", set(rec.profiled) & need, lacking, busy, profiling,
                     starting)
    return step.back, need - step.skip


def server_types(nodes: Iterable[NodeRecord]) -> dict[ServerId, GpuType]:
    """Every registered server's GPU type, alive or not."""
    return {n.server.id: n.server.gpu_type for n in nodes}


def facts(
    nodes: Sequence[NodeRecord], progress: float = 0.0, given_up: Iterable[GpuType] = ()
) -> Facts:
    """What :func:`scheduling.live.state.apply_event` needs to know about the nodes:
    the job must be profiled on every alive GPU type but those ``given_up``."""
    required = frozenset(t.name for t in cluster_of(nodes).gpu_types) - set(given_up)
    return Facts(server_types(nodes), required, progress)


def topology(nodes: Iterable[NodeRecord]) -> tuple[tuple[ServerId, GpuType, int, int], ...]:
    """What planning depends on in the nodes (alive servers, their types,
    sizes and order; drain states are :func:`scheduling.live.drain.drain_states`);
    heartbeat times are left out."""
    return tuple(
        (n.server.id, n.server.gpu_type, n.server.gpus, n.order)
        for n in sorted(nodes, key=lambda n: n.server.id)
        if n.alive
    )


def node_update(nodes: dict[str, NodeRecord], key: str, value: bytes | None) -> None:
    """``nodes`` after a change of key ``key`` of ``hops_nodes`` (``None``:
    deleted); a value that does not decode changes nothing."""
    if value is None:
        nodes.pop(key, None)
        return
    with contextlib.suppress(msgspec.DecodeError):
        nodes[key] = msgspec.json.decode(value, type=NodeRecord)


def estimate_targets(records: Mapping[JobId, LiveJobRecord]) -> list[JobSpec]:
    """Jobs the planner needs estimates for: waiting or running GPU jobs (a
    CPU job runs on no GPU type, which is all the estimators estimate), and
    the GPU jobs still being profiled, whose signatures' shared profiles the
    reply names (:mod:`.reuse`)."""
    return [
        r.spec for r in records.values()
        if not r.final and r.spec.kind == "gpu"
    ]


def estimate_requests(
    records: Mapping[JobId, LiveJobRecord], cluster: Cluster, chunk: int
) -> list[EstimateRequest]:
    """The estimate requests for :func:`estimate_targets`, ``chunk`` jobs each
    (none without servers: there is nothing to estimate for)."""
    specs = estimate_targets(records) if cluster.servers else []
    return [
        EstimateRequest(jobs=tuple(specs[i : i + chunk]), cluster=cluster)
        for i in range(0, len(specs), chunk)
    ]


class Built(NamedTuple):
    snapshot: Snapshot
    sticky: dict[JobId, Configuration]


class _Context(NamedTuple):
    """What every job's state is built from, besides its record and placement."""

    now: float
    cluster: Cluster
    estimates: Mapping[JobId, JobEstimate]
    progress: Mapping[JobId, float]
    inflight: Inflight
    first: bool
    throughputs: Throughputs
    schedules_cores: bool
    shared: Mapping[JobId, frozenset[GpuType]]


def build_snapshot(
    now: float,
    records: Mapping[JobId, LiveJobRecord],
    nodes: Iterable[NodeRecord],
    allocs: Mapping[JobId, Placement],
    estimates: Mapping[JobId, JobEstimate],
    progress: Mapping[JobId, float],
    inflight: Inflight,
    first_plan: bool,
    r_num: int = R_NUM,
    layer_state: Mapping[str, bytes] | None = None,
    *,
    throughputs: Throughputs | None = None,
    schedules_cores: bool = True,
    shared: Mapping[JobId, frozenset[GpuType]] | None = None,
) -> Built:
    """See the module docstring; ``layer_state`` is each stateful layer's
    state after the last published plan (``Snapshot.layer_state``),
    ``throughputs`` the running jobs' heartbeats, and ``schedules_cores``
    whether the policy plans CPU jobs, ``shared`` the types each job takes
    from its signature's shared profiles (:mod:`.reuse`). What is held, by whom, and who is
    shown are :func:`scheduling.assemble.assemble`'s rules, the simulator's."""
    nodes = list(nodes)
    cluster = cluster_of(nodes)
    alive = [n for n in nodes if n.alive]
    ctx = _Context(now, cluster, estimates, progress, inflight, first_plan,
                   throughputs or Throughputs(), schedules_cores, shared or {})
    holders = [
        _job(ctx, rec, allocs.get(rec.job_id))
        for rec in sorted(records.values(), key=lambda r: (r.spec.submit_time, r.job_id))
        # held: it fits no alive server, or the policy (state.hold), or a user;
        # in any phase, while its tenant is unknown (state.hold_tenant)
        if not rec.final and not _tenant_held(rec, allocs, inflight) and not (
            rec.phase == "queued" and (
                _user_held(rec, allocs, inflight)
                or hold_problem(rec.spec, alive, r_num, schedules_cores)))
    ]
    unbooked = inflight.unbooked_profiling(allocs)
    runs = unbooked + Counter(
        {s: g for a in allocs.values() if a.mode == "profile"
         for s, g in a.configuration.parts})
    built = assemble(
        now, cluster, holders, estimates, first_plan=first_plan, plans_cores=schedules_cores,
        pinned=[a.configuration for job_id, a in allocs.items()
                if (owner := records.get(job_id)) is None or owner.final],
        pinned_gpus=unbooked + drain_held(alive, holders), profiling=runs, layer_state=layer_state,
        bandwidth_gbps={n.server.id: n.memory_bandwidth_gbps for n in alive
                        if n.memory_bandwidth_gbps > 0},
    )
    return Built(built.snapshot, built.sticky)


def _user_held(rec: LiveJobRecord, allocs: Mapping[JobId, Placement],
               inflight: Inflight) -> bool:
    """A queued job a user holds, with nothing booked or starting for it
    (those keep their holder until the placer is done, so nothing is
    booked twice)."""
    return rec.held and rec.job_id not in allocs and rec.job_id not in inflight.starts


def _profiling_job(ctx: _Context, rec: LiveJobRecord, alloc: Placement | None,
                   done: float) -> Holder:
    """A job being profiled, or whose last profiling run still holds its GPU
    (it waits for that run to end)."""
    busy = ctx.inflight.profiling_types(rec.job_id) | ctx.inflight.given_up(rec.job_id)
    if alloc is not None and alloc.mode == "profile":
        by_id = ctx.cluster.by_id
        busy |= {by_id[s].gpu_type for s in alloc.configuration.servers if s in by_id}
    busy |= reused_types(rec, ctx.shared.get(rec.job_id, frozenset()), ctx.cluster)
    need = tuple(
        t.name for t in ctx.cluster.gpu_types if t.name not in rec.profiled and t.name not in busy
    )
    need = need if rec.phase in PROFILING_PHASES else ()
    state = JobState(spec=rec.spec, phase="profiling", done_samples=done, unprofiled=need)
    return Holder(state, alloc.configuration if alloc is not None else None)


def _job(ctx: _Context, rec: LiveJobRecord, alloc: Placement | None) -> Holder:
    run_alloc = alloc.configuration if alloc is not None and alloc.mode == "run" else None
    booked = alloc.configuration if alloc is not None else None
    done = max(rec.samples_done, ctx.progress.get(rec.job_id, 0.0))
    profiling_run = alloc is not None and alloc.mode == "profile"
    if rec.spec.kind != "cpu" and (rec.phase in PROFILING_PHASES or profiling_run):
        return _profiling_job(ctx, rec, alloc, done)
    current = (run_alloc or rec.configuration) if rec.phase == "running" else None
    starting = current is None and rec.job_id in ctx.inflight.starts
    if starting:  # started by a plan, not booked yet: it runs there, as in the simulator
        current = ctx.inflight.starts[rec.job_id][0]
    base = JobState(
        spec=rec.spec,
        phase="queued",
        wait_s=rec.wait_s + (max(0.0, ctx.now - rec.since) if rec.phase == "queued" else 0.0),
        attained_gpu_s=rec.attained_gpu_s + _running_gpu_s(rec, ctx.now),
        done_samples=done,
        attained_by_type=dict(rec.run_s_by_type),
        restarts=rec.restarts,
        restart_s=ctx.throughputs.restart_s(rec.job_id),
    )
    if current is None or not all(s in ctx.cluster.by_id for s in current.servers):
        # Not running, or on a lost server: waiting. A job the planner does
        # not see keeps all it holds (its part on alive servers included).
        keeps = hidden(base, ctx.first, rec.job_id in ctx.estimates, ctx.schedules_cores)
        return Holder(base, (booked or current) if keeps else booked)
    state = msgspec.structs.replace(base, phase="running", current=current)
    seen = not hidden(state, ctx.first, rec.job_id in ctx.estimates, ctx.schedules_cores)
    if rec.phase == "running" and seen:  # a start in flight has measured nothing yet
        rate, since = ctx.throughputs.measured(rec.job_id, rec.since)
        state = msgspec.structs.replace(state, throughput=rate, throughput_since=since)
    return Holder(state, booked or current)


def _running_gpu_s(rec: LiveJobRecord, now: float) -> float:
    if rec.phase != "running" or rec.configuration is None:
        return 0.0
    return max(0.0, now - rec.since) * rec.configuration.total_gpus


def with_sticky(plan: Plan, sticky: Mapping[JobId, Configuration]) -> Plan:
    """``plan`` keeping the sticky jobs where they are (see the module docstring)."""
    if not sticky:
        return plan
    kept = tuple(Assignment(job_id, config) for job_id, config in sorted(sticky.items()))
    return Plan(plan.assignments + kept, plan.profiling, plan.reasons)


def without_layer_state(plan: Plan) -> Plan:
    """``plan`` as published: the layers' states stay in ``hops_state``
    (they may be large, and no consumer of the plan reads them)."""
    layers = plan.reasons.layers
    if not any(r.state for r in layers):
        return plan
    stripped = tuple(msgspec.structs.replace(r, state=b"") for r in layers)
    reasons = msgspec.structs.replace(plan.reasons, layers=stripped)
    return msgspec.structs.replace(plan, reasons=reasons)


def _tenant_held(rec: LiveJobRecord, allocs: Mapping[JobId, Placement],
                 inflight: Inflight) -> bool:
    """A waiting job held because the tenants file does not name its tenant
    (reason ``unknown_tenant``), with nothing booked or starting for it."""
    return (rec.phase != "running" and rec.reason.startswith(UNKNOWN_TENANT)
            and rec.job_id not in allocs and rec.job_id not in inflight.starts)


def _finite(x: float) -> float:
    if math.isnan(x):
        return 0.0
    return max(-1e300, min(1e300, x))


def queue_view(
    reasons: PlanReasons,
    records: Mapping[JobId, LiveJobRecord],
    at: float,
    leader: str,
    term: int,
) -> QueueView:
    """The waiting jobs as the last plan (made at ``at``) ranked them, read
    from its own reasons, whatever the policy: priority, latency ratio and
    whether its service window holds them (Sia and Gavel have no window).
    Waiting jobs the plan did not rank (profiling, without an estimate, or
    arrived since) follow in submission order with priority 0, outside the
    window (a job a user holds with the reason ``held``); jobs held as
    ``unschedulable`` and running ones are left out."""
    waiting = sorted(
        (r for r in records.values() if _waiting(r)),
        key=lambda r: (r.spec.submit_time, r.job_id),
    )
    ranked = {
        r.job_id: reasons.priorities[r.job_id]
        for r in waiting
        if r.phase == "queued" and r.job_id in reasons.priorities
    }
    order = order_queue(ranked, {jid: records[jid].spec.submit_time for jid in ranked})
    window = set(reasons.window)
    entries = [
        QueueEntry(
            job_id=jid,
            priority=_finite(ranked[jid]),
            latency_ratio=_finite(reasons.latency_ratios.get(jid, 0.0)),
            in_window=jid in window,
        )
        for jid in order
    ]
    entries += [
        QueueEntry(job_id=r.job_id, priority=0.0, latency_ratio=0.0, in_window=False,
                   phase=r.phase, reason=_queue_reason(r))
        for r in waiting
        if r.job_id not in ranked
    ]
    return QueueView(entries=tuple(entries), at=at, leader=leader, term=term)


def _queue_reason(rec: LiveJobRecord) -> str:
    """Why an unranked waiting job waits, as the queue shows it: ``held``
    (a user's hold), the ``unknown_tenant`` reason naming the tenant, or none."""
    if rec.held:
        return HELD
    return rec.reason if rec.reason.startswith(UNKNOWN_TENANT) else ""


def _waiting(rec: LiveJobRecord) -> bool:
    return not rec.final and rec.phase != "running" and not rec.reason.startswith(UNSCHEDULABLE)
