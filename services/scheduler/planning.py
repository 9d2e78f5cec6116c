"""The leader's planning (Hops §3.6): one plan from the records, the nodes
and the allocations, published as a ``plan_issued``.

:class:`Planning` holds what a plan reads and writes across plans (the
nodes, the estimates, the jobs' progress, the in-flight starts, the round
clock, the last ranking) and does one plan when the round clock says one is
due (:meth:`Planning._work`): the records step first
(:mod:`scheduling.live.refresh`), the estimators answer, the policy plans
from a snapshot (:mod:`scheduling.live.snapshot`), an over-allocating plan is
refused, and the plan is published with the layers' state and explained.
:class:`services.scheduler.leader.Leader` adds the loops, subscriptions and
answers of a term around it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from scheduling.check import plan_overallocation
from scheduling.explain import with_reasons
from scheduling.layers.base import Layer, stack
from scheduling.live import refresh as rf
from scheduling.live import snapshot as snap
from scheduling.live import state as st
from scheduling.live.clock import Due, Inflight, RoundClock
from scheduling.live.drain import drain_states
from scheduling.live.lease import Lease
from scheduling.live.reuse import reuse_events
from scheduling.live.samples import Throughputs, in_place
from scheduling.live.state import LiveJobRecord
from scheduling.registry import policy_traits, profile_reuse
from services.runtime.bus import publish_event
from services.runtime.service import ServiceContext
from services.scheduler.estimates import fetch_estimates, publish_reused
from services.scheduler.explainer import Explainer
from services.scheduler.jobbook import JobBook
from services.scheduler.kv import decode_all
from services.scheduler.layer_store import LayerStore, build_policy
from services.scheduler.settings import SchedulerSettings
from shared import events as ev
from shared import subjects
from shared.cluster import Cluster
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId
from shared.records import NodeRecord, Placement
from shared.relaxed import plan_splits
from shared.snapshot import Plan, PlanReasons, Snapshot
from shared.wire import PLAN_REFUSED

PLANNED = ("queued", "running")  # the phases whose estimates a plan reads
ESTIMATE_CHUNK = 32  # jobs per estimate request, well inside the payload limit


class Planning:
    """What the leader plans with, and one plan; see the module docstring."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, lease: Lease,
                 layers: Sequence[Layer] = ()) -> None:
        self.ctx = ctx
        self.settings = settings
        self.lease = lease
        self.term = lease.term
        self.log = ctx.log.bind(term=lease.term)
        self.book = JobBook(ctx, self.log)  # the job records: the leader writes them
        self.nodes: list[NodeRecord] = []
        self.progress: dict[JobId, float] = {}
        self.estimates: dict[JobId, JobEstimate] = {}
        self.throughputs = Throughputs()
        # else CPU jobs are held, never planned
        self.cores = policy_traits(settings.policy).schedules_cores
        self.reuse = profile_reuse(settings.policy)  # shared profiles (shared.reuse)
        self.inflight = Inflight(settings.grace_s)
        self.clock = RoundClock(settings.round_s, settings.replan_delay_s, settings.refresh_s, 0.0)
        self.allocs: dict[JobId, Placement] | None = None  # None: nothing planned yet
        # The configured policy inside any layers a launcher adds (__main__.main).
        self.policy = stack(build_policy(settings), *layers)
        # the layers' state (hops_state) and the tenants' views (hops_tenants)
        self.store = LayerStore(ctx, settings, lease.term, lease.holder)
        # The last plan's reasons and time, whichever policy made it: the queue view.
        self.ranked: tuple[PlanReasons, float] = (PlanReasons(self.policy.name), 0.0)
        self.plans_refused = 0  # plans that over-allocated, never published
        # reasons, receipts, forecasts and timelines (hops_explain, HOPS_TIMELINE)
        self.explainer = Explainer(ctx, self.log, lease.term, settings.round_s,
                                   self.book.current, fill_s=settings.replan_delay_s,
                                   r_num=settings.policy.r_num, cells=self.store.tenant_servers)
        self.book.on_applied = self.explainer.on_event

    def _facts(self, job_id: JobId) -> st.Facts:
        given_up = self.inflight.given_up(job_id)
        return snap.facts(self.nodes, self.progress.get(job_id, 0.0), given_up)

    async def _work(self, due: Due, now: float) -> None:
        self.nodes = await self._nodes()
        await self.store.check_nodes(self.nodes)
        allocs = await self._allocs()
        cluster = snap.cluster_of(self.nodes)
        self.inflight.settle(self.book.current(), allocs, now)
        await self._refresh_records(now, allocs, snap.cluster_of(self.nodes))
        records = self.book.current()
        self.progress = {k: p for k, p in self.progress.items() if k in records}
        self.throughputs.keep(k for k, r in records.items() if r.phase == "running")
        estimates, shared = await self._estimates(records, cluster)
        await publish_reused(self.ctx.js, reuse_events(records, shared, cluster), now, self.log)
        first = due != "fill"
        built = snap.build_snapshot(
            now, records, self.nodes, allocs, estimates, self.progress, self.inflight, first,
            r_num=self.settings.policy.r_num, layer_state=self.store.snapshot_state(),
            throughputs=self.throughputs, schedules_cores=self.cores, shared=shared,
        )
        self.allocs = allocs  # heartbeats are checked against these; set: the view may answer
        busy = bool(built.snapshot.jobs or built.sticky or allocs)
        if due == "refresh" or not cluster.servers or not busy:
            await self.store.publish_views(now, self.nodes)  # a node lost with nothing to plan
            self.clock.done(due, now)
            return
        drained = {s for s, _ in drain_states(self.nodes)}
        next_plan_at = now + self.settings.round_s if first else self.clock.next_round
        solve_from = time.perf_counter()
        try:
            # with each waiting job's reason (the plan itself is unchanged)
            plan = await asyncio.to_thread(lambda: with_reasons(
                built.snapshot, self.policy.plan(built.snapshot), drained=drained,
                next_plan_at=next_plan_at))
        except Exception as e:  # a planner failure skips this plan, not the service
            self.log.exception("planning failed", round=self.clock.round, first_plan=first)
            await self.ctx.reporter.report("scheduler.plan", repr(e), ev.INTERNAL)
            self.clock.done(due, now)
            return
        solve_s = time.perf_counter() - solve_from
        if await self._refused(built.snapshot, plan, first):
            self.clock.done(due, now)  # the next round plans again
            return
        # A fill plan that ranked nothing (no job waiting, or a policy that
        # ranks at round starts only) keeps the round's ranking for the view.
        if plan.reasons.priorities or first:
            self.ranked = (plan.reasons, now)
        plan = snap.with_sticky(plan, built.sticky)
        if due == "first" or plan.assignments or plan.profiling:
            round_no = self.clock.round + (1 if first else 0)
            if await self._publish(plan, round_no, first, now, solve_s):
                lost = {n.server.id for n in self.nodes if not n.alive}
                await self.explainer.after_plan(built.snapshot, plan, round_no,
                                                drained=drained, lost=lost)
        else:  # nothing fits the idle GPUs: no news for the placer, but its reasons hold
            self.log.info("nothing to add", round=self.clock.round, jobs=len(built.snapshot.jobs))
            await self.explainer.after_plan(built.snapshot, plan, self.clock.round,
                                            drained=drained, lost=set())
        self.clock.done(due, now)
        self.clock.wake_in(now, plan.wake_after_s)

    async def _refused(self, snapshot: Snapshot, plan: Plan, first: bool) -> bool:
        """Whether ``plan`` over-allocates what ``snapshot`` leaves free, by the
        simulator's check (:func:`scheduling.check.plan_overallocation`): a
        faulty policy or layer must not reach the placer. A refused plan is
        logged with the reason and counted, here (``plans_refused``) and by
        the monitor (an error record of the scheduler, ``hops_errors_total``)."""
        why = plan_overallocation(snapshot, plan)
        if why is None:
            return False
        self.plans_refused += 1
        self.log.warning("plan refused", reason=why, round=self.clock.round, first_plan=first,
                       plans_refused=self.plans_refused)
        await self.ctx.reporter.publish("scheduler.plan", f"plan refused: {why}", PLAN_REFUSED)
        return True

    async def _refresh_records(
        self, now: float, allocs: dict[JobId, Placement], cluster: Cluster
    ) -> None:
        """Before a plan, each job's record steps (:mod:`scheduling.live.refresh`)."""
        alive = [n for n in self.nodes if n.alive]
        busy = snap.busy_types_of(cluster, allocs)
        for job_id in list(self.book.records):
            alloc = allocs.get(job_id)
            mode = alloc.mode if alloc is not None else None
            seen = rf.Cluster(alive, self._facts(job_id).required, busy,
                              self.settings.policy.r_num, self.cores, self.settings.tenants)
            flight = rf.InFlight(
                bool(self.inflight.profiling_types(job_id)) or mode == "profile",
                job_id in self.inflight.starts or mode == "run",
                self.progress.get(job_id),
                alloc.configuration if alloc is not None and mode == "run" else None,
            )
            for step in rf.steps(self.book.records[job_id][0], seen, flight, now):
                await self.book.update(job_id, step)

    async def _publish(self, plan: Plan, round_no: int, first: bool, now: float,
                       solve_s: float | None = None) -> bool:
        """Publish ``plan`` (``solve_s``: the time making it); False when it was dropped."""
        if not self.lease.is_leader(time.time()):
            self.log.warning("plan dropped: the lease may have lapsed")
            return False
        # Relaxed-sync jobs' micro-batches, by the estimates this plan was made with.
        specs = {k: r.spec for k, r in self.book.current().items()}
        splits = plan_splits(plan, specs, self.estimates, snap.cluster_of(self.nodes))
        issued = ev.PlanIssued(round=round_no, term=self.term, plan=snap.without_layer_state(plan),
                               at=now, first_plan=first, micro_batches=splits,
                               solve_s=solve_s)
        msg_id = f"plan:{self.term}:{round_no}:{now:.6f}"
        # the layers' state first: a standby may see more than was published
        # (the layer releases what did not start), never less (layer_store)
        await self.store.save(plan.reasons.layers)
        await publish_event(self.ctx.js, subjects.PLANS, issued, msg_id=msg_id)
        await self.store.publish_views(now, self.nodes)
        running = st.running_configs(self.book.current().values())
        self.inflight.note_plan(plan, now, first, running)
        for job_id in in_place(plan, running):  # its samples at the old cores no longer count
            self.throughputs.changed(job_id, now)
        for job_id in {t.job_id for t in plan.profiling}:
            if job_id in self.book.records:
                await self.book.update(job_id, st.mark_profiling)
        self.log.info(
            "plan issued",
            round=round_no,
            first_plan=first,
            assignments=[f"{a.job_id}:{a.config}" for a in plan.assignments],
            profiling=[f"{t.job_id}:{t.gpu_type}@{t.server}" for t in plan.profiling],
            wake_after_s=plan.wake_after_s,
        )
        return True

    async def _estimates(
        self, records: dict[JobId, LiveJobRecord], cluster: Cluster
    ) -> tuple[dict[JobId, JobEstimate], dict[JobId, frozenset[GpuType]]]:
        """The waiting and running jobs' estimates (the last ones where no
        estimator answers) and, where the policy reuses profiles, the types
        of each job's shared profiles (:mod:`scheduling.live.reuse`)."""
        shared: dict[JobId, frozenset[GpuType]] = {}
        requests = snap.estimate_requests(records, cluster, ESTIMATE_CHUNK)
        self.estimates = await fetch_estimates(self.ctx.nc, requests, self.estimates,
                                               self.settings.estimate_timeout_s, self.log, shared)
        planned = {k: v for k, v in self.estimates.items() if records[k].phase in PLANNED}
        return planned, (shared if self.reuse else {})

    async def _nodes(self) -> list[NodeRecord]:
        return await decode_all(self.ctx.js, subjects.KV_NODES, NodeRecord, self.log)

    async def _allocs(self) -> dict[JobId, Placement]:
        allocs = await decode_all(self.ctx.js, subjects.KV_ALLOC, Placement, self.log)
        return {p.job_id: p for p in allocs}
