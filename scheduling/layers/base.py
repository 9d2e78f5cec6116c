"""A layer wraps an inner policy: it may show the inner policy a restricted
snapshot (fewer GPUs, fewer jobs, or several calls over parts of the cluster)
and adjust and annotate the plan that comes back.

The shape is HiveD's (Zhao et al., "HiveD: Sharing a GPU Cluster for Deep
Learning with Guarantees", OSDI'20): its ``SchedulerAlgorithm`` decides which
cells a virtual cluster may use and hands each VC's jobs to an intra-VC
scheduler beneath it. Here the intra-VC scheduler is any :class:`.Policy`, and
a layer wrapped around a policy is a policy again (:class:`Layered`), so layers
stack and the simulator and the live leader call one ``plan(snapshot)``
whatever the stack (AdaptDL's one ``optimize(jobs, nodes, base_allocations)``).

What a layer can do, with the pure helpers below:

- restrict servers or GPUs: :func:`hold` (the inner policy sees them held);
- attach CPU cores or memory to the GPU-only configurations of the policy
  beneath: show it :func:`without_extras` and check the result with
  :func:`scheduling.check.plan_overallocation`;
- hold jobs back: :func:`hold_back` (the inner policy does not see them);
- restrict servers per job or per tenant: call the inner policy once per
  group of jobs on a view of the group's servers (:func:`plan_groups`, the
  way HiveD runs one intra-VC scheduler per virtual cluster);
- post-process the plan: :func:`drop` removes assignments, and every layer
  leaves a :class:`~shared.snapshot.LayerRecord` in the plan's reasons
  (:func:`annotate`).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol, Self

import msgspec

from scheduling.policy import Policy
from shared.ids import JobId, ServerId
from shared.snapshot import LayerRecord, Plan, PlanReasons, Snapshot


class Layer(Protocol):
    """One layer: plan ``snapshot`` by calling ``inner`` (any number of
    times, on any view of ``snapshot``) and return the plan to carry out."""

    name: str

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan: ...


class Layered:
    """``layer`` around ``inner``: a :class:`.Policy` with the inner policy's
    name, so that reasons and errors still name the policy that decided."""

    def __init__(self, layer: Layer, inner: Policy) -> None:
        self.layer = layer
        self.inner = inner
        self.name = inner.name

    def plan(self, snapshot: Snapshot) -> Plan:
        return self.layer.plan(snapshot, self.inner)


class LayeredPolicy:
    """Base of a policy that layers wrap while it stays itself: ``plan``
    runs :meth:`plan_inner` inside :attr:`layers` (the first innermost), and
    :meth:`wrapped` returns a copy with more layers. The registry builds
    every policy this way, so the mechanism gets, say, a ``HopsPolicy``
    with its settings and its layers; a policy constructed bare has none."""

    name: str
    layers: tuple[Layer, ...] = ()

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        """The policy's own decision, on the snapshot its layers show it."""
        raise NotImplementedError

    def plan(self, snapshot: Snapshot) -> Plan:
        return stack(_Bare(self), *self.layers).plan(snapshot)

    def wrapped(self, *layers: Layer) -> Self:
        """A copy of this policy inside ``layers`` too (outside its own)."""
        new = copy.copy(self)
        new.layers = (*self.layers, *layers)
        return new


class _Bare:
    """A layered policy without its layers: what the innermost layer calls."""

    def __init__(self, policy: LayeredPolicy) -> None:
        self.policy = policy
        self.name = policy.name

    def plan(self, snapshot: Snapshot) -> Plan:
        return self.policy.plan_inner(snapshot)


def stack(inner: Policy, *layers: Layer) -> Policy:
    """``inner`` wrapped in ``layers``, the first innermost."""
    policy = inner
    for layer in layers:
        policy = Layered(layer, policy)
    return policy


def hold(snapshot: Snapshot, gpus: Mapping[ServerId, int]) -> Snapshot:
    """``snapshot`` with ``gpus`` more held on each server: no plan of the
    inner policy may use them."""
    held = Counter(snapshot.held)
    held.update({sid: g for sid, g in gpus.items() if g > 0})
    return msgspec.structs.replace(snapshot, held=dict(held))


def hold_servers(snapshot: Snapshot, servers: Collection[ServerId]) -> Snapshot:
    """``snapshot`` with every GPU of ``servers`` held: in a first plan a
    running job there cannot keep its configuration, as on a server that
    went down."""
    return hold(snapshot, {s.id: s.gpus for s in snapshot.cluster.servers if s.id in servers})


def hold_back(snapshot: Snapshot, jobs: Collection[JobId]) -> Snapshot:
    """``snapshot`` without ``jobs``: in a first plan a running job held back
    gets nothing this round, as any job a plan leaves out."""
    return msgspec.structs.replace(
        snapshot,
        jobs=tuple(j for j in snapshot.jobs if j.id not in jobs),
        estimates={k: v for k, v in snapshot.estimates.items() if k not in jobs},
    )


def without_extras(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` as a GPU-only policy plans it: running jobs' configurations
    without their cores and memory, so that the policy, whose candidates hold
    GPUs only, recognises a job's current configuration among them. A layer
    that attaches extras to the plan shows its inner policy this view."""
    if not any(j.current is not None and j.current.extras for j in snapshot.jobs):
        return snapshot
    jobs = tuple(
        msgspec.structs.replace(j, current=j.current.gpus_only)
        if j.current is not None and j.current.extras else j
        for j in snapshot.jobs
    )
    return msgspec.structs.replace(snapshot, jobs=jobs)


def drop(plan: Plan, keep: Callable[[JobId], bool]) -> tuple[Plan, tuple[JobId, ...]]:
    """``plan`` with the assignments and profiling tasks of the jobs ``keep``
    refuses removed, and the ids of the jobs whose assignment went."""
    removed = tuple(a.job_id for a in plan.assignments if not keep(a.job_id))
    return (
        msgspec.structs.replace(
            plan,
            assignments=tuple(a for a in plan.assignments if keep(a.job_id)),
            profiling=tuple(t for t in plan.profiling if keep(t.job_id)),
        ),
        removed,
    )


def annotate(plan: Plan, record: LayerRecord) -> Plan:
    """``plan`` with ``record`` in front of the inner layers' records (the
    outermost layer comes first)."""
    reasons = msgspec.structs.replace(plan.reasons, layers=(record, *plan.reasons.layers))
    return msgspec.structs.replace(plan, reasons=reasons)


def plan_groups(
    snapshot: Snapshot,
    groups: Sequence[tuple[Collection[JobId], Collection[ServerId]]],
    inner: Policy,
) -> Plan:
    """One inner call per group ``(jobs, servers)``: the group's jobs on the
    group's servers, less what earlier groups took (HiveD's intra-VC
    scheduling, one call per virtual cluster). Jobs in no group are held
    back. The reasons are merged; the first group's policy name stays."""
    taken: Counter[ServerId] = Counter()
    plans: list[Plan] = []
    everyone = {j.id for j in snapshot.jobs}
    for jobs, servers in groups:
        others = {s.id for s in snapshot.cluster.servers if s.id not in servers}
        view = hold_back(hold_servers(hold(snapshot, taken), others), everyone - set(jobs))
        plan = inner.plan(view)
        plans.append(plan)
        for a in plan.assignments:
            taken.update(a.config.as_dict())
        for t in plan.profiling:
            taken[t.server] += t.gpus
    return Plan(
        tuple(a for plan in plans for a in plan.assignments),
        tuple(t for plan in plans for t in plan.profiling),
        _merged([p.reasons for p in plans], inner.name),
    )


def merge_reasons(reasons: Sequence[PlanReasons], policy: str) -> PlanReasons:
    """The reasons of several inner calls as one (the first call's policy
    name; ``policy`` when there was no call)."""
    return _merged(reasons, policy)


def _merged(reasons: Sequence[PlanReasons], policy: str) -> PlanReasons:
    if not reasons:
        return PlanReasons(policy=policy)
    return PlanReasons(
        policy=reasons[0].policy,
        priorities={k: v for r in reasons for k, v in r.priorities.items()},
        latency_ratios={k: v for r in reasons for k, v in r.latency_ratios.items()},
        window=tuple(j for r in reasons for j in r.window),
        admitted_by_adjustment=tuple(j for r in reasons for j in r.admitted_by_adjustment),
        passes=tuple(p for r in reasons for p in r.passes),
        unplaceable=tuple(j for r in reasons for j in r.unplaceable),
        layers=tuple(rec for r in reasons for rec in r.layers),
        why={k: v for r in reasons for k, v in r.why.items()},
    )
