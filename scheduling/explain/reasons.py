"""Every waiting job's primary reason in one plan (docs/explain.md, "Reasons").

A job of the snapshot is running after the plan when the plan assigns it,
or, in a plan later in the round (``first_plan`` false), when it was
running already (such a plan only adds). Every other job gets exactly one
:class:`shared.explain.Why`, the first that applies of:

1. ``Profiling``: still being profiled (``types``: the types that remain);
2. a layer's own reason (``LayerRecord.why``, outermost layer first:
   ``TenantCells``, ``Quota``, ``Cores``): the layer kept the job from the
   policy or removed its assignment, so the policy's view does not apply;
3. ``NoEstimate``: a GPU job that the snapshot has no estimate of (the
   live estimators know no profile of it, or did not answer): no policy
   places a job without one, and whether it fits says nothing;
4. ``WaitingForPlan``: a later plan that did not rank the job (it arrived
   after the round's first plan; ``next_plan_at``: when the next runs);
5. capacity, on the GPUs free before the plan (``Snapshot.free_gpus``; in
   a first plan the running jobs' GPUs count as free, since every running
   job is replanned): ``Unschedulable`` (no type it runs on),
   ``NodeDrained`` (it would fit if the ``drained`` servers were free),
   ``Resources`` (not even all free GPUs of one type reach its smallest
   requirement) or ``Fragmentation`` (they do, in no shape it accepts); a
   CPU job short of cores on every server: ``Cores``;
6. ``OutsideWindow``: ranked outside the policy's service window (§3.6);
7. ``Priority``: it fitted before the plan and the plan gave the GPUs to
   others: up to three of the highest-priority jobs that took GPUs of a
   type it runs on, with their latency ratios (Eq. 8); when it would still
   fit after the plan, the plan preferred others and no one is named.

Capacity comes before the window and priority because it says what the
user can change (a smaller requirement set, another type) whatever the
others do. Pure: a function of the snapshot and the plan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import msgspec

from scheduling.explain.capacity import SIGMA, Demand, before, cores_short, free_cores
from scheduling.policies.hops.steady import Room
from scheduling.policies.hops.window import order_queue
from shared.explain import Why
from shared.ids import GpuType, JobId, ServerId
from shared.job import R_NUM
from shared.snapshot import JobState, Plan, Snapshot

NAMED = 3  # jobs a Priority reason names
NO_ESTIMATE = ("no throughput estimate: the estimators know no profile of it, its own or its "
               "signature's, so no plan can place it")


def running_after(snapshot: Snapshot, plan: Plan) -> set[JobId]:
    """The jobs of ``snapshot`` that run once ``plan`` is carried out."""
    out = {a.job_id for a in plan.assignments}
    if not snapshot.first_plan:
        out |= {j.spec.id for j in snapshot.jobs if j.phase == "running"}
    return out


def layer_whys(plan: Plan) -> dict[JobId, Why]:
    """The layers' own reasons, the outermost layer's first, each naming its layer."""
    out: dict[JobId, Why] = {}
    for record in plan.reasons.layers:
        for jid, why in record.why.items():
            if jid not in out:
                out[jid] = why if why.layer else msgspec.structs.replace(why, layer=record.name)
    return out


class _Explainer:
    """The per-plan facts every job's reason reads, computed once."""

    def __init__(self, snapshot: Snapshot, plan: Plan, drained: Collection[ServerId],
                 next_plan_at: float, r_num: int, sigma: float) -> None:
        self.snap, self.plan, self.r_num, self.sigma = snapshot, plan, r_num, sigma
        self.next_plan_at = next_plan_at
        cluster = snapshot.cluster
        self.types = tuple(dict.fromkeys(s.gpu_type for s in cluster.servers))
        self.type_of = {s.id: s.gpu_type for s in cluster.servers}
        free = snapshot.free_gpus()
        self.free = Room(cluster, free)
        gone = set(drained)
        self.drained = Room(cluster, {s.id: s.gpus if s.id in gone else free[s.id]
                                      for s in cluster.servers}) if gone else None
        self.layers = layer_whys(plan)
        reasons = plan.reasons
        self.prio = reasons.priorities
        self.unplaceable = set(reasons.unplaceable)
        self.window = set(reasons.window) | set(reasons.admitted_by_adjustment)
        self._ranks: dict[JobId, int] | None = None
        self._cores: dict[ServerId, int] | None = None
        self.after, self.takers = self._taken(free)

    def _taken(self, free: Mapping[ServerId, int]
               ) -> tuple[Room, list[tuple[JobId, frozenset[GpuType]]]]:
        """The GPUs free after the plan, and the jobs the plan gives GPUs
        with the types they take, highest priority first."""
        left = dict(free)
        running = {j.spec.id for j in self.snap.jobs if j.phase == "running"}
        types: dict[JobId, set[GpuType]] = {}
        for a in self.plan.assignments:
            if not self.snap.first_plan and a.job_id in running:
                continue  # keeps what it holds (a change of cores in place)
            for sid, gpus in a.config.parts:
                if gpus and sid in left:
                    left[sid] -= gpus
                    types.setdefault(a.job_id, set()).add(self.type_of[sid])
        for task in self.plan.profiling:
            if task.server in left:
                left[task.server] -= task.gpus
        order = [(j, frozenset(types[j])) for j in sorted(types, key=self._key)]
        return Room(self.snap.cluster, left), order

    def _key(self, jid: JobId) -> tuple[float, str]:
        return (-self.prio.get(jid, float("-inf")), jid)

    def why(self, job: JobState) -> Why:
        jid = job.spec.id
        if job.phase == "profiling":
            return Why(code="Profiling", types=job.unprofiled,
                       message="profiling on " + (", ".join(job.unprofiled) or "its GPU types"))
        layer = self.layers.get(jid)
        if layer is not None:
            return layer
        if job.spec.kind == "cpu":
            return self._cpu(job)
        if jid not in self.snap.estimates:  # no policy places a GPU job without one
            return Why(code="NoEstimate", message=NO_ESTIMATE)
        if not self.snap.first_plan and jid not in self.prio and jid not in self.unplaceable:
            return Why(code="WaitingForPlan", next_plan_at=self.next_plan_at,
                       message="this plan did not consider it; the next one will")
        demand = Demand(job, self.snap.estimates.get(jid), self.types, self.r_num,
                        self.sigma)
        capacity = before(demand, self.free, self.drained)
        if capacity is not None:
            return capacity
        if self.window and jid in self.prio and jid not in self.window:
            return Why(code="OutsideWindow", rank=self.ranks()[jid], window=len(self.window),
                       message="ranked outside the service window")
        return self._priority(job, demand)

    def ranks(self) -> dict[JobId, int]:
        if self._ranks is None:
            submit = {j.spec.id: j.spec.submit_time for j in self.snap.jobs}
            order = order_queue(self.prio, {j: submit.get(j, 0.0) for j in self.prio})
            self._ranks = {j: i for i, j in enumerate(order, start=1)}
        return self._ranks

    def _priority(self, job: JobState, demand: Demand) -> Why:
        if demand.fits(self.after):
            return Why(code="Priority", message="it would fit, but the plan preferred other jobs")
        wanted = set(demand.types)
        first: list[JobId] = []  # the first takers of its types, highest priority first
        for jid, types in self.takers:
            if jid != job.id and not wanted.isdisjoint(types):
                first.append(jid)
                if len(first) == NAMED:
                    break
        mine = self.prio.get(job.id)
        higher = [j for j in first if mine is None or self.prio.get(j, float("-inf")) >= mine]
        named = tuple(higher or first)
        if not named:
            return Why(code="Priority", message="the GPUs it needs went to profiling runs")
        ratios = tuple(self.plan.reasons.latency_ratios.get(j, 0.0) for j in named)
        return Why(code="Priority", jobs=named, ratios=ratios,
                   message="higher-priority jobs took the GPUs it needs")

    def _cpu(self, job: JobState) -> Why:
        if self._cores is None:
            self._cores = free_cores(self.snap)
        short = cores_short(job, self._cores)
        if short is not None:
            return short
        return Why(code="Priority", message="the plan gave the cores it needs to other jobs")


def explain(snapshot: Snapshot, plan: Plan, *, drained: Collection[ServerId] = (),
            next_plan_at: float = 0.0, r_num: int = R_NUM,
            sigma: float = SIGMA) -> dict[JobId, Why]:
    """The primary reason of every job of ``snapshot`` that ``plan`` does
    not run (the module docstring gives the order). ``r_num`` and ``sigma``
    are the policy's (§2.2, Eq. 10)."""
    running = running_after(snapshot, plan)
    waiting = [j for j in snapshot.jobs if j.spec.id not in running]
    if not waiting:
        return {}
    ctx = _Explainer(snapshot, plan, drained, next_plan_at, r_num, sigma)
    return {j.spec.id: ctx.why(j) for j in waiting}


def with_reasons(snapshot: Snapshot, plan: Plan, *, drained: Collection[ServerId] = (),
                 next_plan_at: float = 0.0, r_num: int = R_NUM,
                 sigma: float = SIGMA) -> Plan:
    """``plan`` with :func:`explain`'s reasons in ``plan.reasons.why``; its
    assignments, profiling runs and the rest of its reasons unchanged."""
    why = explain(snapshot, plan, drained=drained, next_plan_at=next_plan_at, r_num=r_num,
                  sigma=sigma)
    return msgspec.structs.replace(
        plan, reasons=msgspec.structs.replace(plan.reasons, why=why))
