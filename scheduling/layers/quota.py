"""Kueue-style nominal quota per tenant and GPU type, the baseline HiveD
argues against (§1-§2: "tenants use quota, the number of GPUs, to reserve
resources"; Kueue's ClusterQueue ``nominalQuota`` per resource flavor).

Kueue admits a workload when its request fits its queue's unused quota, and
the scheduler below places admitted pods anywhere. Here the layer first
admits in queue order (running jobs first) by each job's smallest
requirement: a job that fits no type its tenant may still use stays pending
(held back, unseen by the inner policy). The inner policy is the scheduler
below: it plans the admitted jobs of every tenant on the physical cluster,
and since it may scale a job up, the layer admits its assignments again,
exactly, in order (jobs keeping their configuration first, then plan
order), dropping each that would take its tenant beyond its quota of the
GPU type. Dropped jobs are held back and the
inner policy plans again on what they leave (at most ``REPLANS`` times), so
the GPUs a dropped job was given go to others, as Kueue's queue moves on to
the next workload. Quotas are counts: where the admitted jobs sit is the
inner policy's choice, which is how other tenants' small jobs fragment a
tenant's nodes (the sharing anomaly of §2, Figure 1).

With ``borrow`` (Kueue's cohort borrowing), a second phase plans the jobs
left out on the GPUs left free, admitting an assignment while the type's
GPUs in use stay within the sum of all tenants' quotas of it. Borrowed GPUs
are reclaimed at a round's first plan: the nominal phase plans first, with
every job, so an owner's jobs within its quota take the GPUs before any
borrower's, and a borrowing job left without GPUs is preempted (left out
of the plan; the mechanism keeps its progress). A plan later in the round
only adds, so reclaiming waits for the next first plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from scheduling.cells import CellModel
from scheduling.explain.records import quota_why
from scheduling.layers.base import annotate, hold, hold_back, merge_reasons
from scheduling.layers.traits import PolicyTraits, TenantAdmission
from scheduling.policy import Policy
from shared.configuration import Configuration
from shared.explain import Why
from shared.ids import GpuType, JobId, ServerId
from shared.job import R_NUM
from shared.snapshot import Assignment, LayerRecord, Plan, Snapshot

REPLANS = 3
Usage = Counter[tuple[str, GpuType]]


def quotas_of(model: CellModel) -> dict[str, dict[GpuType, int]]:
    """Each tenant's reserved GPUs per type: the same cells as HiveD's."""
    out: dict[str, dict[GpuType, int]] = {}
    for tenant, chains in sorted(model.reservations.items()):
        out[tenant] = {g: sum(n * model.chains[g].sizes[lv - 1]
                              for lv, n in enumerate(counts, start=1))
                       for g, counts in sorted(chains.items())}
    return out


class QuotaLayer:
    """Nominal quota (``quota``) or quota with borrowing (``quota-borrow``)."""

    def __init__(self, quotas: Mapping[str, Mapping[GpuType, int]], borrow: bool = False,
                 r_num: int = R_NUM) -> None:
        self.quotas = {t: dict(q) for t, q in quotas.items()}
        self.borrow = borrow
        self.r_num = r_num
        self.name = "quota-borrow" if borrow else "quota"
        self.total: Counter[GpuType] = Counter()
        for q in self.quotas.values():
            self.total.update(q)

    @classmethod
    def traits(cls, borrow: bool) -> PolicyTraits:
        """Built with the cells (their reservations are the quotas); a job
        beyond its tenant's quota runs only when it may ``borrow``."""
        return PolicyTraits(needs_cells=True, admission=TenantAdmission(beyond=borrow, quota=True))

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        usage = self._running(snapshot)
        plans: list[Plan] = []
        whys: dict[JobId, Why] = {}
        admitted, removed, pending = self._phase(snapshot, inner, usage, self._own, plans, whys)
        if self.borrow:
            taken: Counter[ServerId] = Counter()
            for a in admitted:
                if _moves(snapshot, a):
                    taken.update(a.config.as_dict())
            view = hold_back(hold(snapshot, taken), {a.job_id for a in admitted})
            more, removed, pending = self._phase(view, inner, usage, self._cohort, plans, whys)
            admitted += more
        reasons = merge_reasons([p.reasons for p in plans], inner.name)
        plan = Plan(tuple(admitted), (), reasons)
        note = f"{len(admitted)} admitted within quota" + (" or borrowed" if self.borrow else "")
        record = LayerRecord(self.name, held_back=tuple(pending), removed=tuple(removed),
                             note=note, why={j: whys[j] for j in (*pending, *removed) if j in whys})
        return annotate(plan, record)

    def _running(self, snapshot: Snapshot) -> Usage:
        """A later plan: the running jobs' GPUs count against their quotas."""
        usage: Usage = Counter()
        if not snapshot.first_plan:
            for j in snapshot.jobs:
                if j.phase == "running" and j.current is not None:
                    usage[(j.spec.tenant, _type(snapshot, j.current))] += j.current.total_gpus
        return usage

    def _own(self, usage: Usage, tenant: str, gpu: GpuType, gpus: int) -> bool:
        return usage[(tenant, gpu)] + gpus <= self.quotas.get(tenant, {}).get(gpu, 0)

    def _cohort(self, usage: Usage, tenant: str, gpu: GpuType, gpus: int) -> bool:
        used = sum(v for (_, g), v in usage.items() if g == gpu)
        return used + gpus <= self.total[gpu]

    def _phase(self, snapshot: Snapshot, inner: Policy, usage: Usage,
               admits: Callable[[Usage, str, GpuType, int], bool],
               plans: list[Plan], whys: dict[JobId, Why]
               ) -> tuple[list[Assignment], list[JobId], list[JobId]]:
        """Admit by queue order, plan, admit the plan in order, hold back
        the dropped and plan again; ``whys`` gets each held job's reason."""
        pending = self._pending(snapshot, usage, admits, whys)
        view, removed = hold_back(snapshot, pending), set()
        for _ in range(REPLANS):
            plan = inner.plan(view)
            trial = Counter(usage)
            admitted, dropped = _admit(snapshot, plan.assignments, trial, admits,
                                       self._reason(whys))
            if not dropped:
                break
            removed |= set(dropped)
            view = hold_back(view, removed)
        plans.append(plan)
        usage.clear()
        usage.update(trial)
        planned = {a.job_id for a in admitted}
        return admitted, sorted(removed - planned), sorted(pending)

    def _pending(self, snapshot: Snapshot, usage: Usage,
                 admits: Callable[[Usage, str, GpuType, int], bool],
                 whys: dict[JobId, Why]) -> set[JobId]:
        """Kueue's admission before placement: in queue order (running jobs
        first), a job stays pending, unseen by the inner policy, once its
        smallest requirement fits no type its tenant may still use. The
        plan is admitted again exactly, since the inner policy may scale a
        job up."""
        trial = Counter(usage)
        pending: set[JobId] = set()
        types = [t.name for t in snapshot.cluster.gpu_types]
        for job in sorted(snapshot.jobs, key=lambda j: j.phase != "running"):
            if job.phase != "queued" and not (snapshot.first_plan and job.phase == "running"):
                continue
            gpus = job.spec.requirement_set(self.r_num)[0]
            fits = [g for g in types if admits(trial, job.spec.tenant, g, gpus)]
            if fits:
                trial[(job.spec.tenant, fits[0])] += gpus
            else:
                pending.add(job.id)
                if types:  # the type where its tenant has the most room left
                    g = max(types, key=lambda t: (self._room(trial, job.spec.tenant, t), t))
                    self._reason(whys)(job.id, job.spec.tenant, g, gpus, trial)
        return pending

    def _limit(self, usage: Usage, tenant: str, gpu: GpuType) -> tuple[int, int]:
        """The quota that holds ``tenant`` on ``gpu`` (its own, or with
        borrowing the cohort's) and what counts against it."""
        if self.borrow and self.quotas.get(tenant, {}).get(gpu, 0) <= usage[(tenant, gpu)]:
            return self.total[gpu], sum(v for (_, g), v in usage.items() if g == gpu)
        return self.quotas.get(tenant, {}).get(gpu, 0), usage[(tenant, gpu)]

    def _room(self, usage: Usage, tenant: str, gpu: GpuType) -> int:
        quota, used = self._limit(usage, tenant, gpu)
        return quota - used

    def _reason(self, whys: dict[JobId, Why]) -> Callable[[JobId, str, GpuType, int, Usage],
                                                          None]:
        """A function that writes one held job's Quota reason into ``whys``."""
        def note(job: JobId, tenant: str, gpu: GpuType, gpus: int, usage: Usage) -> None:
            quota, used = self._limit(usage, tenant, gpu)
            whys[job] = quota_why(self.name, tenant, gpu, quota, used, gpus)
        return note


def _type(snapshot: Snapshot, config: Configuration) -> GpuType:
    return snapshot.cluster.by_id[config.servers[0]].gpu_type


def _moves(snapshot: Snapshot, a: Assignment) -> bool:
    """Whether the assignment books GPUs (not a running job of a later plan
    keeping its configuration, whose GPUs are held already)."""
    if snapshot.first_plan:
        return True
    return not any(j.id == a.job_id and j.phase == "running" for j in snapshot.jobs)


def _admit(snapshot: Snapshot, assignments: Sequence[Assignment], usage: Usage,
           admits: Callable[[Usage, str, GpuType, int], bool],
           reason: Callable[[JobId, str, GpuType, int, Usage], None] | None = None,
           ) -> tuple[list[Assignment], list[JobId]]:
    jobs = {j.id: j for j in snapshot.jobs}
    keeping = [a for a in assignments if jobs[a.job_id].current == a.config]
    order = keeping + [a for a in assignments if jobs[a.job_id].current != a.config]
    admitted: list[Assignment] = []
    dropped: list[JobId] = []
    for a in order:
        job = jobs[a.job_id]
        if not snapshot.first_plan and job.phase == "running":
            continue  # counted already
        key = (job.spec.tenant, _type(snapshot, a.config))
        if admits(usage, key[0], key[1], a.config.total_gpus):
            usage[key] += a.config.total_gpus
            admitted.append(a)
        else:
            dropped.append(a.job_id)
            if reason is not None:
                reason(a.job_id, key[0], key[1], a.config.total_gpus, usage)
    return admitted, dropped
