"""The scheduler's leader (Hops §3.1, §3.6).

A replica (``__main__``; the lease: :mod:`scheduling.live.lease`) runs a
:class:`Leader` while it holds the lease. The leader consumes ``HOPS_JOBS``
(durable consumer ``scheduler``: an interregnum's events apply before the
first plan) and is the only writer of job records (:class:`.jobbook.JobBook`,
which also feeds each tenant's live feed). It plans every ``HOPS_ROUND_S``
seconds, and within the round on a submission, a release or a change of the
alive servers (:mod:`scheduling.live.clock`), from a snapshot of
``hops_jobs``, ``hops_nodes`` and ``hops_alloc`` (:mod:`scheduling.live.snapshot`)
and the estimators' answers, with the policy ``HOPS_POLICY`` names and each
waiting job's reason (:func:`scheduling.explain.with_reasons`); it publishes
a ``plan_issued`` with its lease term, then receipts, forecasts and timelines
(:mod:`.explainer`; the plan itself: :mod:`.planning`); under a task policy it runs the task loop of
:mod:`.tasks` instead. It answers ``hops.v1.queue`` by its last plan's ranking
with reasons, positions and forecasts, ends jobs at their time limit
(:mod:`.timelimits`), and keeps stateful layers' state in ``hops_state`` and
the tenants' views in ``hops_tenants`` (:mod:`.layer_store`);
:mod:`.settings` lists the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError
from structlog.contextvars import bound_contextvars

from scheduling.layers.base import Layer
from scheduling.live import explain as xp
from scheduling.live import snapshot as snap
from scheduling.live import state as st
from scheduling.live.clock import RoundClock
from scheduling.live.lease import Lease
from services.runtime.consumer import ConsumerSpec, Delivery, consume
from services.runtime.service import ServiceContext
from services.scheduler.kv import catch_up, unacked, watch_topology
from services.scheduler.planning import Planning
from services.scheduler.settings import SchedulerSettings
from services.scheduler.tasks import TaskLoop
from services.scheduler.timelimits import TimeLimits
from shared import events as ev
from shared import subjects
from shared.records import NodeRecord, QueueView

# A job event the leader fails to apply is retried, then terminated (the
# consumer's poison guard). Its writes fail while JetStream elects after a
# server is lost (4-8 s, longer under load): 60 deliveries a second apart
# outlast an election, where 10 could terminate an accepted job's events.
JOBS_CONSUMER = ConsumerSpec("HOPS_JOBS", "scheduler", subjects.JOB_EVENTS_ALL, ack_wait=10.0,
                             max_deliver=60)


class Leader(Planning):
    """The leader's state and loops for one term; see the module docstring.
    Its plans are :class:`.planning.Planning`'s."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, lease: Lease,
                 layers: Sequence[Layer] = ()) -> None:
        super().__init__(ctx, settings, lease, layers)
        self.limits = TimeLimits()  # ends running jobs at their time limit
        self.wake = asyncio.Event()
        self.watched: dict[str, NodeRecord] = {}  # hops_nodes by server id, kept by the watch
        # A task policy runs the task loop instead of the plan loop (:mod:`.tasks`).
        self.tasks = (TaskLoop(ctx, settings, lease, self.book, self.log, self.wake,
                                self.watched)
                      if settings.task_policy is not None else None)

    async def run(self) -> None:
        js = self.ctx.js
        await self.book.open(js)
        self.kv_nodes = await js.key_value(subjects.KV_NODES)
        self.kv_alloc = await js.key_value(subjects.KV_ALLOC)
        await self.store.open(js)
        await self.explainer.open()
        await self._load()
        subs = [
            await self._subscribe(subjects.QUEUE, self._on_queue),
            await self._subscribe(subjects.RELEASED, self._on_released),
            await self._subscribe(subjects.JOB_HEARTBEATS_ALL, self._on_heartbeat),
        ]
        held = await unacked(js, JOBS_CONSUMER)  # taken by a leader before this one
        tasks = [
            asyncio.create_task(
                consume(
                    js,
                    JOBS_CONSUMER,
                    ev.decode_job_event,
                    self._on_event,
                    self.ctx.reporter,
                    self.ctx.stopping,
                )
            ),
            asyncio.create_task(self._watch_nodes()),
        ]
        try:
            await catch_up(js, JOBS_CONSUMER, held, self.log)
            await (self._loop(tasks) if self.tasks is None else self.tasks.run(tasks))
        finally:
            self.explainer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _load(self) -> None:
        await self.book.load()
        self.nodes = await self._nodes()
        self.watched.update((n.server.id, n) for n in self.nodes)  # the watch goes on from here
        last_round = 0
        with contextlib.suppress(NotFoundError):
            msg = await self.ctx.js.get_last_msg(subjects.STREAM_PLANS.name, subjects.PLANS)
            with contextlib.suppress(ev.WireError):
                plan = ev.decode_plan_event(msg.data or b"")
                last_round = plan.round if isinstance(plan, ev.PlanIssued) else 0
        await self.store.load()
        if self.tasks is not None:
            await self.tasks.load()
            self.allocs = {}  # no plans: the queue view answers from the records
        await self.explainer.load()  # the queue view answers as the last leader's did
        await self.store.check_nodes(self.nodes)
        now = time.time()
        await self.store.publish_views(now, self.nodes)  # this term's, from the state it restores
        s = self.settings
        self.clock = RoundClock(s.round_s, s.replan_delay_s, s.refresh_s, now, last_round)
        self.log.info("leader state loaded", jobs=len(self.book.records), last_round=last_round)

    async def _subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]]) -> Subscription:
        sub = await self.ctx.nc.subscribe(subject, cb=cb)
        await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
        await self.ctx.nc.flush()
        return sub

    async def _loop(self, tasks: list[asyncio.Task[None]]) -> None:
        while not any(t.done() for t in tasks):
            now = time.time()
            try:
                limit_in = await self.limits.end_over_limit(
                    self.book.current(), now, self.lease, self.ctx.js, self.log,
                    self.explainer.time_limit)
                due = self.clock.due(now)
                if due is None:
                    self.wake.clear()
                    sleep_s = self.clock.sleep_s(now)
                    if limit_in is not None:  # wake when the next job reaches its limit
                        sleep_s = min(sleep_s, limit_in)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), sleep_s)
                    continue
                await self._work(due, now)
            except (nats.errors.Error, TimeoutError) as e:  # NATS unreachable: try again soon
                self.log.warning("planning postponed", error=repr(e))
                await asyncio.sleep(1.0)
        for task in tasks:
            if task.done():
                task.result()  # a task that ended on its own: raise why
        raise RuntimeError("a leader task stopped")

    async def _watch_nodes(self) -> None:
        """Plan within the round when the alive servers change (new capacity)."""
        await watch_topology(self.kv_nodes, self.ctx.nc, self.watched, self._replan, self.log)

    # --- events --------------------------------------------------------------

    async def _on_event(self, event: ev.JobEvent, delivery: Delivery) -> None:
        with bound_contextvars(job_id=event.job_id):  # on every line, the runtime's too
            if await self.book.apply(event, delivery, self._facts):
                self._replan()


    def use(self, settings: SchedulerSettings) -> None:
        """A reloaded tenants file (:mod:`.reload`): the next refresh holds
        or releases jobs by it, at once."""
        self.settings = self.store.settings = settings
        self._replan()

    def _replan(self) -> None:
        self.clock.request_replan(time.time())
        self.wake.set()

    async def _on_released(self, msg: Msg) -> None:
        with contextlib.suppress(ev.WireError):
            if isinstance(ev.decode_plan_event(msg.data), ev.ResourcesReleased):
                self._replan()

    async def _on_heartbeat(self, msg: Msg) -> None:
        with contextlib.suppress(ev.WireError, subjects.SubjectError):
            beat = ev.decode_job_heartbeat(msg.data)
            ids = subjects.last_two_tokens(msg.subject, subjects.JOB_HEARTBEATS_ALL)
            placed = (self.allocs or {}).get(beat.job_id)
            if not st.counts_progress(beat, ids, placed.configuration if placed else None):
                return
            self.progress[beat.job_id] = max(self.progress.get(beat.job_id, 0.0), beat.samples_done)
            self.throughputs.note(beat.job_id, beat.at, beat.samples_done)

    async def _on_queue(self, msg: Msg) -> None:
        # A record write holds the book's lock until the leader's own copy
        # follows it, so a view taken under the lock includes every record a
        # client could have read back already.
        async with self.book.lock:
            view = self._view()
        with contextlib.suppress(Exception):
            await msg.respond(msgspec.json.encode(view))

    def _view(self) -> QueueView:
        """The records as they are now, ranked by the last plan's reasons."""
        if self.allocs is None:
            return QueueView(ok=False, error="the leader is starting", term=self.term)
        records = self.book.current()
        reasons, at = self.ranked
        try:
            view = snap.queue_view(reasons, records, at, self.lease.holder, self.term)
            return xp.fill_queue(view, self.explainer.explained)
        except Exception as e:  # a bad reply, not a dead leader
            self.log.exception("queue view failed")
            return QueueView(ok=False, error=f"{type(e).__name__}: {e}", term=self.term)
