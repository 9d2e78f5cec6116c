"""One plan of HiveD's layer (:class:`.layer.HivedLayer`), over the state
the previous plan left (Zhao et al., OSDI'20, §3.1-§3.3).

The steps, in order: servers the cluster no longer lists make their cells
doomed (§4 "Handling faulty hardware"); jobs that ended, stopped or never
started give their cells back; GPUs held outside the cells (profiling runs)
are kept from every allocation; the inner policy plans each tenant's jobs on
the tenant's virtual cluster (:mod:`.view`); a round's first plan releases
the cells of guaranteed jobs that do not keep their place; profiling runs and
guaranteed assignments are bound to physical cells by buddy allocation
(Algorithm 1), preempting opportunistic jobs in a first plan only (§3.3);
jobs profiled outside the cells (:mod:`.profiling`) and opportunistic jobs
(:mod:`.opportunistic`) follow. The result is the plan and the layer's new
state (:class:`.state.HivedState`). Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from scheduling.cells import Allocation, CellModel, Cells, Refusal, VirtualSlot
from scheduling.layers.base import annotate, merge_reasons
from scheduling.layers.hived.opportunistic import share
from scheduling.layers.hived.profiling import (
    HOLD,
    PROF,
    bind_task,
    outside_types,
    prof_id,
    profile_outside,
    reconcile_profiling,
    virtual_runs,
)
from scheduling.layers.hived.state import HivedState
from scheduling.layers.hived.view import config_type, tenant_snapshot, unavailable_holds
from scheduling.layers.hived.why import round_whys, vc_left
from scheduling.layers.profiling_first import ProfilingSettings
from scheduling.policy import Policy
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.explain import Why
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import Assignment, JobState, LayerRecord, Plan, ProfilingTask, Snapshot


class HivedLayer(Protocol):
    """What a round reads of the layer that builds it
    (:class:`scheduling.layers.hived.layer.HivedLayer`), named by its shape so
    that the layer can build rounds without the two importing each other."""

    name: str
    model: CellModel
    profiling: ProfilingSettings
    opportunistic: bool
    r_num: int

    def vc(self, tenant: str, cluster: Cluster) -> Cluster | None: ...
    def slots(self, tenant: str, cluster: Cluster
              ) -> dict[tuple[GpuType, VirtualSlot], ServerId]: ...
    def slot_of(self, tenant: str, cluster: Cluster, sid: ServerId) -> VirtualSlot: ...


def held_outside(refusal: Refusal) -> bool:
    """Whether a refusal names GPUs held outside the cells (a profiling
    run), which a guaranteed job waits for instead of stopping."""
    return any(v.startswith(HOLD) for v in refusal.victims)


class HivedRound:
    """One plan of the layer, over the restored state."""

    def __init__(self, layer: HivedLayer, snapshot: Snapshot, inner: Policy, cells: Cells,
                 virtual: dict[JobId, Configuration]) -> None:
        self.layer, self.snap, self.inner, self.cells = layer, snapshot, inner, cells
        self.virtual = virtual
        self.first = snapshot.first_plan
        self.jobs = {j.id: j for j in snapshot.jobs}
        self.inner_plans: list[Plan] = []
        self.kept: dict[JobId, Assignment] = {}  # first plan: running jobs that keep their GPUs
        self.new: dict[JobId, Assignment] = {}
        self.removed: list[JobId] = []
        self.held_back: list[JobId] = []
        self.notes: list[str] = []
        self.preempted: list[JobId] = []
        self.beyond: list[JobId] = []  # jobs no cell of their tenant can ever hold
        self.vtasks: list[tuple[str, Cluster, ProfilingTask]] = []  # on virtual servers
        self.tasks: list[ProfilingTask] = []  # on physical servers
        self.outside: list[JobState] = []  # what to profile outside the cells
        # For the layer's reasons (.why): refusals, each tenant's VC after its
        # inner plan, each job's sizes its cells can hold.
        self.refused: dict[JobId, str] = {}
        self.left: dict[str, dict[GpuType, int]] = {}
        self.all_sizes: dict[JobId, tuple[int, ...]] = {}

    # -- the steps ------------------------------------------------------

    def run(self) -> tuple[Plan, bytes]:
        self.health()
        self.reconcile()
        reconcile_profiling(self.cells, self.snap)
        self.hold_physical()
        wanted = self.plan_tenants()
        self.cells.pin()  # a job placed again where it was keeps its GPUs
        if self.first:
            self.release_unkept(wanted)
        for tenant, _, task in self.vtasks:
            self.profile(tenant, task)
        for tenant, vc, a in wanted:
            if a.job_id not in self.kept:
                self.guaranteed(tenant, vc, a)
        self.cells.settle()
        if self.first:
            self.keep_opportunistic()
        self.tasks += profile_outside(self.cells, self.snap, self.outside,
                                      self.layer.profiling)
        self.place_opportunistic()
        for holder in [j for j in sorted(self.cells.jobs) if j.startswith(HOLD)]:
            self.cells.release(holder)
        assignments = self.fit([*self.kept.values(), *self.new.values()])
        state = HivedState(self.cells.snapshot(), {str(k): v for k, v in sorted(
            self.virtual.items())})
        raw = msgspec.json.encode(state)
        reasons = merge_reasons([p.reasons for p in self.inner_plans], self.inner.name)
        plan = Plan(tuple(assignments), tuple(self.tasks), reasons)
        record = LayerRecord(self.layer.name, held_back=tuple(self.held_back),
                             removed=tuple(self.removed), note=self.note(), state=raw,
                             why=self.whys(assignments))
        return annotate(plan, record), raw

    def health(self) -> None:
        """A server of the cells that the cluster no longer lists is bad
        (§4 "Handling faulty hardware": its cells become doomed)."""
        present = self.snap.cluster.by_id
        for server in sorted(self.cells.tree.node_of):
            self.cells.set_health(server, server in present)

    def reconcile(self) -> None:
        """Jobs that ended, stopped or never started (a placer refusal)
        give their cells back; so does one running elsewhere than its cells."""
        for jid in sorted(self.cells.jobs):
            if jid.startswith(PROF):
                continue  # profiling runs: reconcile_profiling
            job = self.jobs.get(JobId(jid))
            where = Configuration.of(self.cells.allocation(jid).servers())
            if job is None or job.phase != "running" or job.current is None or (
                    job.current.gpus_only != where):
                self.cells.release(jid)
        for jid in sorted(self.virtual):
            held = self.cells.jobs.get(jid)
            if held is None or held.opportunistic:
                del self.virtual[jid]

    def hold_physical(self) -> None:
        """GPUs the snapshot holds that no job of the cells explains (the
        profiling runs; in a later plan also running jobs outside the cells)
        are kept from every allocation of this plan."""
        explained: Counter[ServerId] = Counter()
        for jid in self.cells.jobs:
            if not self.first or jid.startswith(PROF):
                explained.update(self.cells.allocation(jid).servers())
        for sid, gpus in sorted(self.snap.held.items()):
            if gpus - explained[sid] > 0:
                self.cells.hold(sid, gpus - explained[sid], HOLD + sid)

    def sizes(self, job: JobState) -> tuple[int, ...]:
        tenant = job.spec.tenant
        types = sorted(self.layer.model.reservations.get(tenant, {}))
        return tuple(n for n in job.spec.requirement_set(self.layer.r_num)
                     if any(self.cells.fits(tenant, t, n) for t in types))

    def plan_tenants(self) -> list[tuple[str, Cluster, Assignment]]:
        """The inner policy on each tenant's VC view, tenants in name order."""
        model = self.layer.model
        by_tenant: dict[str, list[JobState]] = {}
        for job in self.snap.jobs:
            if job.spec.tenant not in model.low_priority:
                self.held_back.append(job.id)
                self.notes.append(f"{job.id}: unknown tenant {job.spec.tenant}")
            else:
                by_tenant.setdefault(job.spec.tenant, []).append(job)
        out: list[tuple[str, Cluster, Assignment]] = []
        for tenant in sorted(by_tenant):
            vc = self.layer.vc(tenant, self.snap.cluster)
            sizes = {j.id: self.sizes(j) for j in by_tenant[tenant]} if vc else {}
            self.all_sizes.update(sizes)
            mine = [j for j in by_tenant[tenant] if sizes.get(j.id)]
            self.beyond += [j.id for j in by_tenant[tenant] if not sizes.get(j.id)
                            and j.phase == "queued"]
            self.to_profile_outside(by_tenant[tenant], {j.id for j in mine}, vc)
            if vc is None or not mine:
                continue
            held = unavailable_holds(self.cells, tenant,
                                     self.layer.slots(tenant, self.snap.cluster))
            runs = virtual_runs(self.cells, self.virtual, tenant)
            view = tenant_snapshot(self.snap, vc, mine, self.virtual, held, sizes, runs)
            vplan = self.inner.plan(view)
            self.inner_plans.append(vplan)
            self.left[tenant] = vc_left(view, vplan)
            out += [(tenant, vc, a) for a in vplan.assignments]
            self.vtasks += [(tenant, vc, t) for t in vplan.profiling]
        return out

    def to_profile_outside(self, jobs: Sequence[JobState], in_vc: set[JobId],
                           vc: Cluster | None) -> None:
        reserved = tuple(t.name for t in vc.gpu_types) if vc is not None else ()
        for job in jobs:
            types = outside_types(job, job.id in in_vc, reserved, self.layer.opportunistic)
            if types:
                self.outside.append(msgspec.structs.replace(job, unprofiled=types))

    def release_unkept(self, wanted: Sequence[tuple[str, Cluster, Assignment]]) -> None:
        """First plan: a running guaranteed job the inner policy left where
        it was keeps its cells and GPUs; every other guaranteed job's cells
        are released before anything is allocated."""
        for _, _, a in wanted:
            job = self.jobs[a.job_id]
            if self.virtual.get(a.job_id) == a.config and job.current is not None:
                self.kept[a.job_id] = msgspec.structs.replace(a, config=job.current)
        for jid in sorted(self.cells.jobs):
            if not (self.cells.jobs[jid].opportunistic or jid.startswith(PROF)
                    or JobId(jid) in self.kept):
                self.cells.release(jid)
                self.virtual.pop(JobId(jid), None)

    def guaranteed(self, tenant: str, vc: Cluster, a: Assignment) -> None:
        """Bind a virtual assignment to physical cells, preempting
        opportunistic jobs in a first plan (§3.3)."""
        jid, job = a.job_id, self.jobs[a.job_id]
        if job.phase == "running" and not self.first:
            if self.virtual.get(jid) != a.config:  # a later plan only adds
                self.refuse(jid, "moved in a later plan")
            return None
        gpu = config_type(a.config, vc)
        if gpu is None:
            return self.refuse(jid, "mixes GPU types")
        if jid in self.cells.jobs:  # running opportunistically, now within its cells
            self.cells.release(jid)
        got = self.preempting(lambda: self.bind(tenant, gpu, a))
        if isinstance(got, Refusal) and got.reason == "preempt" and (
                held_outside(got) or not self.first):
            return self.refuse(jid, "its cell has GPUs busy outside the cells (profiling)"
                               if held_outside(got)
                               else "its cell's opportunistic jobs stop at the next first plan")
        if not isinstance(got, Allocation):
            return self.refuse(jid, got.reason)
        self.virtual[jid] = a.config
        self.new[jid] = msgspec.structs.replace(a, config=Configuration.of(got.servers()))
        return None

    def preempting(self, attempt: Callable[[], Allocation | Refusal]) -> Allocation | Refusal:
        """``attempt``, and in a first plan ``attempt`` again after stopping
        the opportunistic jobs its refusal names (§3.3: strict priority); a
        refusal for GPUs held outside the cells comes back as it is."""
        got = attempt()
        if isinstance(got, Refusal) and got.reason == "preempt" and self.first and (
                not held_outside(got)):
            for victim in got.victims:
                self.cells.release(victim)
                self.preempted.append(JobId(victim))
            got = attempt()
        return got

    def slot_of(self, tenant: str, sid: ServerId) -> VirtualSlot:
        return self.layer.slot_of(tenant, self.snap.cluster, sid)

    def bind(self, tenant: str, gpu: GpuType, a: Assignment) -> Allocation | Refusal:
        """The assignment's GPUs on each virtual server, in the physical cell
        bound to that server's virtual cell (one to one, so whatever the
        view allowed can be bound)."""
        parts = [(self.slot_of(tenant, sid), g) for sid, g in a.config.parts]
        return self.cells.allocate_on(tenant, gpu, parts, a.job_id)

    def profile(self, tenant: str, task: ProfilingTask) -> None:
        """Bind a profiling run the inner policy placed in the tenant's VC
        (Hops §3.2 inside HiveD §3.1), preempting opportunistic jobs in a
        first plan as a guaranteed job does (§3.3)."""
        slot = self.slot_of(tenant, task.server)
        got = self.preempting(lambda: bind_task(self.cells, tenant, slot, task))
        if not isinstance(got, Allocation):
            self.notes.append(f"{task.job_id}: profiling on {task.gpu_type} waits: {got.detail}")
            return None
        self.virtual[JobId(prof_id(task.job_id, task.gpu_type))] = Configuration.of(
            {task.server: task.gpus})
        ((sid, _),) = got.servers().items()
        self.tasks.append(msgspec.structs.replace(task, server=sid))
        return None

    def refuse(self, jid: JobId, why: str) -> None:
        self.removed.append(jid)
        self.refused[jid] = why
        self.notes.append(f"{jid}: {why}")

    def keep_opportunistic(self) -> None:
        """First plan: running opportunistic jobs not preempted keep their GPUs."""
        for jid, held in sorted(self.cells.jobs.items()):
            job = self.jobs.get(JobId(jid))
            if held.opportunistic and job is not None and job.current is not None and (
                    JobId(jid) not in self.new):
                self.kept[JobId(jid)] = Assignment(JobId(jid), job.current)

    def place_opportunistic(self) -> None:
        """Waiting jobs of every tenant on idle GPUs, by weighted max-min."""
        queues: dict[str, list[JobState]] = {}
        for job in self.snap.jobs:
            tenant = job.spec.tenant
            waiting = job.phase == "queued" or (self.first and job.phase == "running")
            if (not waiting or tenant not in self.layer.model.low_priority
                    or job.id in self.new or job.id in self.kept or job.id in self.cells.jobs):
                continue
            queues.setdefault(tenant, []).append(job)
        if not self.layer.opportunistic:
            self.held_back += [j for j in self.beyond if j not in self.held_back]
            return
        usage: Counter[str] = Counter()
        for held in self.cells.jobs.values():
            if held.opportunistic and held.tenant:
                usage[held.tenant] += held.gpus
        placed = share(self.cells, queues, self.snap.estimates, usage, self.layer.r_num)
        for jid, config in placed.items():
            self.new[jid] = Assignment(jid, config)

    def fit(self, assignments: Sequence[Assignment]) -> list[Assignment]:
        """The assignments that fit the GPUs the snapshot leaves free, in
        order (a guard: the cells and the holds make them all fit)."""
        free = self.snap.free_gpus()
        for task in self.tasks:
            free[task.server] -= task.gpus  # bound in the cells: they fit
        out: list[Assignment] = []
        for a in assignments:
            running = self.jobs[a.job_id].phase == "running"
            if not self.first and running:
                continue  # a later plan only adds
            if all(free.get(s, 0) >= g for s, g in a.config.parts):
                for s, g in a.config.parts:
                    free[s] -= g
                out.append(a)
            else:
                self.cells.release(a.job_id)
                self.virtual.pop(a.job_id, None)
                self.refuse(a.job_id, "its GPUs are held")
        return out

    def whys(self, assignments: Sequence[Assignment]) -> dict[JobId, Why]:
        """The layer's own reason for each job it did not place (.why)."""
        vcs = {t: self.layer.vc(t, self.snap.cluster) for t in self.layer.model.low_priority}
        return round_whys(self.layer.name, self.snap, vcs, {a.job_id for a in assignments},
                          self.held_back, self.refused, self.preempted, self.left,
                          self.all_sizes)

    def note(self) -> str:
        opp = sum(1 for j in self.new if j in self.cells.jobs and self.cells.jobs[j].opportunistic)
        head = f"{len(self.new) - opp} guaranteed and {opp} opportunistic placed"
        if self.preempted:
            head += f"; preempted {', '.join(self.preempted)}"
        return "; ".join([head, *self.notes])
