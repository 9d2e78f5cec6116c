"""CPU cores as a scheduled resource: the core layer around any GPU policy
(CODA, Zhao et al. ICDCS'20, and its baselines).

The inner policy plans GPUs only. Around it the layer

1. keeps the CPU jobs from it and decides each GPU job's cores per GPU
   (:class:`~.rules.CoreRule`: CODA's adaptive allocator, §V-B, or a
   baseline's request);
2. shows it only the GPUs that have cores beside them: on each server, the
   GPUs the cores GPU jobs may take can serve at the smallest per-GPU
   demand; the rest are held (:func:`~scheduling.layers.base.hold`);
3. attaches the cores to each assignment (``Configuration.extras``) and
   drops an assignment its servers cannot give them to (the GPUs it was
   given stay for a later plan of the round);
4. places the CPU jobs in the cores left, best fit, in the rule's order.

Under CODA's multi-array scheme (§V-C) each server's cores are split into a
GPU array, ``reserve`` cores for GPU jobs sized from the settled cores per
GPU of past jobs, and a CPU array. GPU jobs never take CPU-array cores. CPU
jobs use their array and may borrow reserved cores that GPU jobs leave
idle; when GPU jobs need them back, the youngest borrower is stopped at a
round's first plan and served first when cores free up (a plan later in
the round only adds, so reclaiming waits for the next first plan, as
HiveD's opportunistic jobs do). GPU jobs of ``large_job_gpus`` or more are
planned on the large sub-array first, the others on the small one, and
what neither placed overflows onto the rest (:mod:`.subarrays`). CODA's
settings are :class:`~.settings.CodaSettings`.

A CPU job's wait is bounded: one that has waited ``cpu_wait_bound_s`` is
served before every other and, while it does not fit, no later CPU job
takes the CPU array's cores, which only CPU jobs hold and which free up as
they end (Slurm's reservation for the top job of its backfill). The layer's
record names the oldest waiting CPU job and its wait.

While a job's climb (§V-B-2) is on, the plan asks to be called again after
one sampling period (``Plan.wake_after_s``): a running job's next value is
an in-place change (same GPUs, other cores), never a restart.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from scheduling.cores.allocator import Climb, ClimbSettings, begin, observe, start_point
from scheduling.cores.cpu_side import CpuSide
from scheduling.cores.pool import gpus_usable
from scheduling.cores.rules import CoreRule
from scheduling.cores.settings import CodaSettings as CodaSettings
from scheduling.cores.state import CoreState, decode, encode, history_key, remember
from scheduling.cores.subarrays import plan_subarrays
from scheduling.explain.records import cores_why
from scheduling.layers.base import annotate, hold, hold_back
from scheduling.layers.traits import PolicyTraits
from scheduling.policy import Policy
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.resources import Resources
from shared.snapshot import Assignment, JobState, LayerRecord, Plan, Snapshot


class CoreLayer:
    """The core layer with ``rule``; ``coda`` (CODA only) turns on the
    adaptive allocator and the multi-array scheme."""

    def __init__(self, rule: CoreRule, coda: CodaSettings | None = None) -> None:
        self.rule = rule
        self.climb: ClimbSettings | None = coda
        self.coda = coda
        self.name = rule.name

    @classmethod
    def traits(cls) -> PolicyTraits:
        """It plans CPU cores beside the GPUs, so CPU jobs may run."""
        return PolicyTraits(schedules_cores=True)

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        if snapshot.cluster.servers and not any(s.cores for s in snapshot.cluster.servers):
            raise ValueError(f"policy {self.name} schedules CPU cores, but no server of "
                             f"cluster {snapshot.cluster.name} declares any (give each "
                             "server its cores)")
        r = _Round(self, snapshot, decode(snapshot.layer_state.get(self.name, b"")))
        return r.run(inner)


class _Round(CpuSide):
    """One call of the layer: the books of cores per server, and the plan."""

    layer: CoreLayer

    def __init__(self, layer: CoreLayer, snapshot: Snapshot, state: CoreState) -> None:
        self.layer, self.snap = layer, snapshot
        self.climbs = dict(state.climbs)
        self.paused = dict(state.paused)
        self.history = dict(state.history)
        self.borrowers = dict(state.borrowers)
        self.head = list(state.head)
        self.retunes = dict(state.retunes)
        self.large_gpus = state.large_gpus
        self.first = snapshot.first_plan
        self.cpu = [j for j in snapshot.jobs if j.spec.kind == "cpu"]
        self.gpu = [j for j in snapshot.jobs if j.spec.kind != "cpu"]
        self.servers = [s.id for s in snapshot.cluster.servers]
        self.total = self._total()
        self.reserve = self._reserve()
        self.kept_cpu: dict[JobId, Configuration] = {}
        self.gpu_cores: Counter[ServerId] = Counter()  # held by GPU jobs
        self.array_cores: Counter[ServerId] = Counter()  # CPU jobs in their array
        self.borrowed: Counter[ServerId] = Counter()  # CPU jobs on reserved cores
        self.notes: list[str] = []
        self.no_cores: dict[JobId, int] = {}  # GPU jobs dropped: cores per GPU they lacked

    # ---------------------------------------------------------------- books

    def _total(self) -> dict[ServerId, int]:
        """Cores each server offers the plan: capacity less what is held
        outside it (in a later plan ``held_extras`` counts the running jobs
        too; they are booked back below)."""
        free = self.snap.free_resources()
        out = {s: free[s].cores for s in self.servers}
        if not self.first:
            for j in self.snap.jobs:
                if j.phase == "running" and j.current is not None:
                    for s in j.current.servers:
                        out[s] = out.get(s, 0) + j.current.cores_on(s)
        return out

    def _reserve(self) -> dict[ServerId, int] | None:
        coda = self.layer.coda
        if coda is None:
            return None
        per_gpu = coda.reserve_per_gpu or self._history_per_gpu()
        return {s.id: min(self.total.get(s.id, 0), math.ceil(per_gpu * s.gpus))
                for s in self.snap.cluster.servers}

    def _history_per_gpu(self) -> float:
        """The mean cores per GPU past jobs settled on and paused ones want
        (the demand a climb blocked for lack of cores did not get to settle)."""
        settled = [v for values in self.history.values() for v in values]
        settled += [c.current for c in self.paused.values()]
        if settled:
            return sum(settled) / len(settled)
        climb = self.layer.climb or ClimbSettings()
        return float(climb.start_cv)

    def gpu_room(self, s: ServerId) -> int:
        used = self.gpu_cores[s] + self.array_cores[s] + self.borrowed[s]
        left = self.total.get(s, 0) - used
        if self.reserve is None:
            return max(0, left)
        borrowed = 0 if self.first else self.borrowed[s]  # stopped only at first plans
        return max(0, min(left + (self.borrowed[s] if self.first else 0),
                          self.reserve[s] - self.gpu_cores[s] - borrowed))

    def cpu_room(self, s: ServerId) -> int:
        left = self.total.get(s, 0) - self.gpu_cores[s] - self.array_cores[s] - self.borrowed[s]
        if self.reserve is None:
            return max(0, left)
        return max(0, min(left, self.total.get(s, 0) - self.reserve[s] - self.array_cores[s]))

    def borrowable(self, s: ServerId) -> int:
        if self.reserve is None:
            return 0
        left = self.total.get(s, 0) - self.gpu_cores[s] - self.array_cores[s] - self.borrowed[s]
        return max(0, min(left, self.reserve[s] - self.gpu_cores[s] - self.borrowed[s]))

    # ----------------------------------------------------------------- plan

    def run(self, inner: Policy) -> Plan:
        self._keep_cpu()
        if not self.first:
            self._keep_gpu()
        per_gpu = self._per_gpu()
        order = self.layer.rule.order(self._waiting_cpu(), self.snap)
        waiting_gpu = [j for j in self.gpu if j.phase != "running" or self.first]
        ahead = self.layer.rule.ahead(order, waiting_gpu, self.snap)
        cpu_plan = self._place_cpu([j for j in order if j.id in ahead])
        gpu_plan = self._plan_gpus(inner, per_gpu)
        gpu_assignments = self._attach(gpu_plan, per_gpu)
        stopped = self._reclaim() if self.first else []
        cpu_plan += self._place_cpu([j for j in order if j.id not in ahead])
        retuned = [] if self.first else self._retunes(per_gpu)
        current = {j.id: j.current for j in self.cpu}
        kept = [Assignment(j, c) for j, c in self.kept_cpu.items()
                if self.first or c != current.get(j)]  # later: the throttled
        assignments = (*gpu_assignments, *retuned, *kept, *cpu_plan)
        return self._finish(gpu_plan, assignments, stopped)

    def _keep_gpu(self) -> None:
        for j in self.gpu:
            if j.phase == "running" and j.current is not None:
                for s in j.current.servers:
                    self.gpu_cores[s] += j.current.cores_on(s)

    def _per_gpu(self) -> dict[JobId, int]:
        """Each GPU job's cores per GPU this plan: the rule's, or under the
        allocator its climb's next value (a sample taken a period after the
        last change moves it)."""
        out: dict[JobId, int] = {}
        for j in self.gpu:
            if self.layer.climb is not None:
                out[j.id] = self._climb(j, self.layer.climb)
            else:
                out[j.id] = self.layer.rule.per_gpu(j, self.snap)
        return out

    def _climb(self, job: JobState, settings: ClimbSettings) -> int:
        if job.id in self.paused and job.phase == "running":
            # Try again for the value it wanted: _attach or _retunes pause it
            # again while its servers still lack the cores.
            self.climbs[job.id] = self.paused.pop(job.id)
        climb = self.climbs.get(job.id)
        if climb is None:
            key = history_key(job.spec.tenant, job.spec.category)
            start = start_point(job.spec.category, job.spec.hints,
                                self.history.get(key, ()), settings)
            if job.phase != "running":
                return start
            climb = begin(start, self._max_per_gpu(), settings)
        elif not climb.settled and self._sampled(job, climb, settings):
            climb = observe(climb, job.throughput, settings)
            if climb.settled:
                remember(self.history, history_key(job.spec.tenant, job.spec.category),
                         climb.current)
        self.climbs[job.id] = climb
        return climb.current

    def _sampled(self, job: JobState, climb: Climb, settings: ClimbSettings) -> bool:
        """Whether ``job`` has run a whole period on the value being tried."""
        cur = job.current
        if job.phase != "running" or cur is None or job.throughput <= 0:
            return False
        at_value = all(cur.cores_on(s) == climb.current * g for s, g in cur.parts)
        return at_value and self.snap.now - job.throughput_since >= settings.period_s - 1e-9

    def _max_per_gpu(self) -> int:
        return max((s.cores for s in self.snap.cluster.servers), default=1)

    # ------------------------------------------------------------ GPU side

    def _plan_gpus(self, inner: Policy, per_gpu: Mapping[JobId, int]) -> Plan:
        """The inner policy's plan of the GPU jobs on the GPUs that have
        cores beside them (at the smallest per-GPU demand among them)."""
        # Under the allocator a job takes down to one core per GPU (_attach).
        smallest = 1 if self.layer.climb is not None else \
            min((per_gpu[j.id] for j in self.gpu), default=1)
        free = self.snap.free_gpus()
        usable = gpus_usable(free, {s: self.gpu_room(s) for s in self.servers}, smallest)
        view = hold(self.snap, {s: free[s] - usable[s] for s in self.servers})
        view = hold_back(view, {j.id for j in self.cpu})
        coda = self.layer.coda
        if coda is None or not coda.subarrays:
            return inner.plan(view)
        plan, self.large_gpus = plan_subarrays(inner, view, self.snap.cluster.servers, self.gpu,
                                               self.large_gpus, coda.large_job_gpus)
        return plan

    def _attach(self, plan: Plan, per_gpu: Mapping[JobId, int]) -> list[Assignment]:
        """The plan's assignments with their cores. Running jobs that keep
        their GPUs go first. A baseline's assignment gets its request or is
        dropped (its GPUs stay for a later plan of the round). Under the
        allocator every assignment first gets one core per GPU, so that no
        job loses its GPUs to another's extra cores, then each as many more
        as its value asks and its servers have; a job held below its value
        pauses its climb (:meth:`_squeezed`)."""
        held = {j.id: j.current.parts for j in self.gpu
                if j.phase == "running" and j.current is not None}
        order = sorted(plan.assignments, key=lambda a: held.get(a.job_id) != a.config.parts)
        floor = 1 if self.layer.climb is not None else 0
        booked: list[tuple[Assignment, int]] = []
        for a in order:
            k = per_gpu.get(a.job_id, 1)
            if self._book(a, floor or k):
                booked.append((a, floor or k))
            else:
                self.notes.append(f"{a.job_id}: no cores")
                self.no_cores[a.job_id] = floor or k
        out: list[Assignment] = []
        for a, got in booked:
            k = per_gpu.get(a.job_id, 1)
            if got < k:
                more = min(k - got, min(self.gpu_room(s) // g for s, g in a.config.parts))
                self._book(a, more)
                got += more
                if got < k:
                    self._squeezed(a.job_id, k, got)
            extras = {s: Resources(cores=got * g) for s, g in a.config.parts}
            out.append(msgspec.structs.replace(a, config=a.config.with_extras(extras)))
            if self.layer.climb is not None and a.job_id not in self.climbs:
                # It starts now, at what its servers give: its climb
                # samples from its first period.
                self.climbs[a.job_id] = begin(got, self._max_per_gpu(), self.layer.climb)
        return out

    def _book(self, a: Assignment, per_gpu: int) -> bool:
        """Book ``per_gpu`` cores per GPU of ``a`` where every server has them."""
        want = {s: per_gpu * g for s, g in a.config.parts}
        if any(c > self.gpu_room(s) for s, c in want.items()):
            return False
        for s, c in want.items():
            self.gpu_cores[s] += c
        return True

    def _squeezed(self, job: JobId, k: int, got: int) -> None:
        """``job`` holds ``got`` cores per GPU of the ``k`` its climb wants:
        the climb pauses there (a new job's starts from what it got)."""
        climb = self.climbs.get(job)
        if climb is not None and k > climb.best:
            self._pause(job, msgspec.structs.replace(climb, current=k),
                        msgspec.structs.replace(climb, phase="settled", current=got,
                                                best=min(got, climb.best)))
        elif climb is not None:
            self.climbs[job] = msgspec.structs.replace(climb, phase="settled", current=got,
                                                       best=got)

    def _retunes(self, per_gpu: Mapping[JobId, int]) -> list[Assignment]:
        """In a later plan: running GPU jobs whose climb moved get their new
        cores in place, where the servers have them (else the climb settles
        on its best value, which the job holds or held)."""
        out: list[Assignment] = []
        for j in self.gpu:
            cur = j.current
            if j.phase != "running" or cur is None or per_gpu[j.id] * cur.total_gpus == \
                    cur.total_cores:
                continue
            want = {s: per_gpu[j.id] * g for s, g in cur.parts}
            more = {s: want[s] - cur.cores_on(s) for s in want}
            if any(m > self.gpu_room(s) for s, m in more.items() if m > 0):
                self._settle(j)
                continue
            for s, m in more.items():
                self.gpu_cores[s] += m
            self.retunes[j.id] = self.retunes.get(j.id, 0) + 1
            extras = {s: Resources(cores=c) for s, c in want.items()}
            out.append(Assignment(j.id, cur.gpus_only.with_extras(extras)))
        return out

    def _settle(self, job: JobState) -> None:
        """No room for the value its climb wants: it stays at its best and
        the climb pauses."""
        climb = self.climbs.get(job.id)
        if climb is not None and not climb.settled:
            self._pause(job.id, climb,
                        msgspec.structs.replace(climb, phase="settled", current=climb.best))

    def _pause(self, job: JobId, wanted: Climb, now: Climb) -> None:
        self.paused[job] = wanted
        self.climbs[job] = now

    # --------------------------------------------------------------- finish

    def _finish(self, gpu_plan: Plan, assignments: Sequence[Assignment],
                stopped: Sequence[JobId]) -> Plan:
        climbing = any(not c.settled for j, c in self.climbs.items()
                       if j in {g.id for g in self.gpu})
        live = {j.id for j in self.snap.jobs}
        state = CoreState(
            climbs={j: c for j, c in self.climbs.items() if j in live},
            history=self.history,
            borrowers=self.borrowers,
            head=tuple(j for j in self.head if j in live),
            large_gpus=self.large_gpus,
            retunes={j: n for j, n in self.retunes.items() if j in live},
            paused={j: c for j, c in self.paused.items() if j in live},
        )
        placed = {a.job_id for a in assignments}
        waits = [j.wait_s for j in self._waiting_cpu() if j.id not in placed]
        note = "; ".join([*self.notes, f"{len(waits)} CPU job(s) waiting"
                          + (f", longest {max(waits):.0f} s" if waits else "")])
        why = self.cpu_whys(self.layer.name, placed, stopped)
        why.update({j: cores_why(self.layer.name, f"its servers lack the {k} cores per GPU it "
                                 "needs beside its GPUs") for j, k in self.no_cores.items()})
        record = LayerRecord(self.layer.name, removed=tuple(stopped), note=note,
                             state=encode(state), why=why)
        period = self.layer.climb.period_s if self.layer.climb and climbing else 0.0
        plan = msgspec.structs.replace(gpu_plan, assignments=tuple(assignments),
                                       wake_after_s=max(gpu_plan.wake_after_s, period))
        return annotate(plan, record)
