"""The monitor service shell (§3.1: it "continuously checks if a job has
failed or ended, releasing the occupied resources immediately").

* ``hops.v1.nodes.register.<server_id>``, ``hops.v1.nodes.remove`` and
  ``hops.v1.nodes.drain``: admits, removes and drains nodes, kept in
  ``hops_nodes`` by :mod:`services.monitor.registry` (a removed node's jobs
  are requeued; a drained node's are the leader's to keep or move);
* what executors send is held to the server its subject names, and to the
  jobs placed there (:mod:`services.monitor.authz`): a registration or
  heartbeat of another server is refused, a heartbeat entry of a job not
  placed there is ignored; ``HOPS_REPORTS`` is relayed, checked, to the
  canonical subjects (:mod:`services.monitor.relay`; a Hare task job is
  placed where the leader's task sequences put it); each refusal is
  logged, published as an error record (code ``forbidden``) and counted in
  ``hops_refused_total``;
* node and job heartbeats feed the :class:`DeadlineTracker`, checked every
  ``check_s``; a heartbeat from a server never registered is an error
  record (at most one per server per minute); a lost node that beats again
  is alive again; a job a node's heartbeat lists as ``lost`` (its executor
  restarted and found the job's processes gone) is released at once, as a
  vanished process;
* ``HOPS_JOBS`` (durable ``monitor``): ``job_finished``, ``job_failed`` and
  ``job_cancelled`` release the job's resources at once;
  ``hops.v1.profiles.*`` (durable ``monitor-profiles``): a profiling run
  that reported frees its GPU;
* the release itself (:mod:`services.monitor.releaser`, deciding with
  :mod:`services.monitor.release`) stops what still
  runs, deletes or shrinks the ``hops_alloc`` entry (compare-and-set on its
  revision) and publishes the job event and ``resources_released``;
* metrics on ``GET /metrics`` (:mod:`services.monitor.exposition`): each
  scrape reads the buckets as they are then (:mod:`services.monitor.scrape`),
  not the copies above; what the monitor counts (:mod:`services.monitor.counts`)
  and what events feed (:mod:`services.monitor.feeds`) are added.

Settings are in :mod:`services.monitor.__main__`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import cast

import msgspec
from nats.aio.msg import Msg
from nats.js.kv import KeyValue
from prometheus_client.metrics_core import Metric

from services.monitor.authz import (
    PlacementHistory,
    Suspects,
    foreign_jobs,
    heartbeat_refusal,
    job_beat_refusal,
    register_refusal,
    without_jobs,
)
from services.monitor.counts import Counts
from services.monitor.deadlines import DeadlineTracker
from services.monitor.exposition import MetricsServer
from services.monitor.feeds import MetricFeeds
from services.monitor.follow import poll_queue, watch_bucket
from services.monitor.metrics import LatencyBook, Outcome
from services.monitor.registry import NodeRegistry
from services.monitor.relay import (
    RelaySettings,
    ReportRelay,
    audit,
    follow_plans,
    follow_sequences,
)
from services.monitor.release import (
    EarlyReports,
    Release,
    on_heartbeat_lost,
    on_job_end,
    on_node_lost,
    on_node_removed,
    on_profiled,
    on_vanished,
)
from services.monitor.releaser import Releaser
from services.monitor.settings import MonitorSettings
from services.runtime.bus import serve_requests, serve_scoped_requests
from services.runtime.consumer import ConsumerSpec, Delivery, consume
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import (
    FORBIDDEN,
    INVALID,
    DrainNode,
    JobCancelled,
    JobEvent,
    JobFailed,
    JobFinished,
    Message,
    ProfileReported,
    RegisterNode,
    RemoveNode,
    Reply,
    SampleEvent,
    WireError,
    decode_drain_node,
    decode_job_event,
    decode_job_heartbeat,
    decode_node_heartbeat,
    decode_register,
    decode_remove_node,
    decode_sample_event,
    encode,
    error_reply,
)
from shared.ids import JobId, ServerId
from shared.records import JobRecord, Placement


class Monitor:
    def __init__(self, ctx: ServiceContext, settings: MonitorSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.ctx = ctx
        self.settings = settings
        self.clock = clock
        self.log = ctx.log
        self.tracker = DeadlineTracker(settings.heartbeat_timeout_s, settings.orphan_grace_s,
                                       settings.vanish_grace_s)
        self.book = LatencyBook()
        self.early = EarlyReports()
        self.placements: dict[JobId, Placement] = {}
        self.jobs: dict[JobId, JobRecord] = {}
        self.ended: set[JobId] = set()
        self.feeds = MetricFeeds()  # its registry: the event-fed metrics, then a scrape's
        self.counts = Counts(self.feeds.on_error)
        self.history = PlacementHistory()
        # A start's first heartbeats come before its placement is written.
        self.suspects = Suspects(grace=2 * settings.heartbeat_timeout_s)
        self.metrics_port: int | None = None

    # --- start ------------------------------------------------------------------------

    async def start(self) -> None:
        js = self.ctx.js
        self.kv_alloc = await js.key_value(subjects.KV_ALLOC)
        self.releaser = Releaser(self.ctx, self.kv_alloc, self.settings.command_timeout_s,
                                 self.clock)
        self.registry = NodeRegistry(self.ctx, await js.key_value(subjects.KV_NODES),
                                     self.tracker, self.settings.node_write_s,
                                     self.settings.unknown_report_s, self.clock)
        await self.registry.load()
        synced = [asyncio.Event(), asyncio.Event()]
        self.ctx.spawn(watch_bucket(self.ctx, subjects.KV_ALLOC, self._on_alloc, synced[0]),
                       "watch-alloc")
        self.ctx.spawn(watch_bucket(self.ctx, subjects.KV_JOBS, self._on_job_record, synced[1]),
                       "watch-jobs")
        await asyncio.gather(*(e.wait() for e in synced))
        nc, rep = self.ctx.nc, self.ctx.reporter
        await serve_scoped_requests(nc, subjects.NODES_REGISTER_ALL, decode_register,
                                    self._on_register, rep)
        await serve_requests(nc, subjects.NODES_REMOVE, decode_remove_node, self._on_remove, rep)
        await serve_requests(nc, subjects.NODES_DRAIN, decode_drain_node, self._on_drain, rep)
        await self._subscribe(subjects.NODE_HEARTBEATS_ALL, self._on_node_beat)
        await self._subscribe(subjects.JOB_HEARTBEATS_ALL, self._on_job_beat)
        await self._subscribe(subjects.ERRORS, self.counts.on_error_record)
        await self._subscribe(subjects.PLACER_SKIPPED, self.counts.on_skipped)
        fetch = self.settings.fetch_timeout_s
        jobs = ConsumerSpec("HOPS_JOBS", "monitor", subjects.JOB_EVENTS_ALL, fetch_timeout=fetch)
        profiles = ConsumerSpec(subjects.STREAM_SAMPLES.name, "monitor-profiles",
                                subjects.PROFILES_ALL, fetch_timeout=fetch)
        self.ctx.spawn(consume(self.ctx.js, jobs, decode_job_event, self._on_job_event,
                               self.ctx.reporter, self.ctx.stopping),
                       "jobs")
        self.ctx.spawn(consume(self.ctx.js, profiles, decode_sample_event, self._on_profile,
                               self.ctx.reporter, self.ctx.stopping),
                       "profiles")
        self.relay = ReportRelay(self.ctx, self.history, RelaySettings.waiting(
            self.settings.report_wait_s, self.settings.report_retry_s, fetch))
        self.ctx.spawn(follow_plans(self.ctx, self.history, fetch, self.feeds.on_plan), "plans")
        await follow_sequences(self.ctx, self.history)  # where Hare's task jobs run
        self.feeds.start(self.ctx, fetch)
        self.ctx.spawn(self.relay.run(), "reports")
        self.ctx.spawn(self._check_loop(), "deadlines")
        self.ctx.spawn(poll_queue(self.ctx, self.book, self.settings.queue_poll_s), "queue-view")
        if self.settings.metrics_port is not None:
            self.metrics = MetricsServer(self.scrape_families, self.feeds.registry,
                                         host=self.settings.metrics_host,
                                         port=self.settings.metrics_port)
            self.metrics_port = await self.metrics.start()
        self.log.info("monitor started", nodes=len(self.registry.nodes),
                      metrics_port=self.metrics_port)

    def _on_alloc(self, entry: KeyValue.Entry) -> None:
        job = JobId(entry.key)
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self.placements.pop(job, None)
            self.tracker.release(job)
            return
        try:
            placement = msgspec.json.decode(entry.value, type=Placement)
        except msgspec.DecodeError as e:
            self.releaser.background(self.ctx.reporter.report(
                f"kv.{subjects.KV_ALLOC}.{job}", str(e), INVALID, entry.value))
            return
        self.placements[job] = placement
        self.history.placed(job, placement.configuration.servers)
        now = self.clock()
        self.tracker.expect(job, placement.configuration.servers, now)
        if job in self.ended:  # it ended before its placement was written
            self.releaser.spawn(job, partial(on_job_end, kind="ended"))
        for server in self.early.take(placement, now):  # profiled before it was written
            self.releaser.spawn(job, partial(on_profiled, server=server))

    def _on_job_record(self, entry: KeyValue.Entry) -> None:
        job = JobId(entry.key)
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self.jobs.pop(job, None)
            self.history.forget(job)
            return
        with contextlib.suppress(msgspec.DecodeError):
            rec = msgspec.json.decode(entry.value, type=JobRecord)
            self.jobs[job] = rec
            config = rec.configuration
            self.history.submitted(job, rec.submitted_at, config.servers if config else ())
            if rec.final:
                self.ended.add(job)

    # --- requests and heartbeats ------------------------------------------------------

    async def _on_register(self, req: RegisterNode, subject: str) -> Message:
        sid = subjects.last_token(subject, subjects.NODES_REGISTER_ALL)
        refusal = register_refusal(req, sid)
        if refusal is not None:
            await audit(self.ctx.reporter, sid, subject, refusal, encode(req))
            return error_reply(FORBIDDEN, refusal)
        await self.registry.register(req, subject)
        return Reply(ok=True, server_id=req.server.id)

    async def _on_remove(self, req: RemoveNode) -> Message:
        """An operator removes a node; its placements are released as by a
        lost node, stopped on every server (the node may still run them)."""
        sid = req.server_id
        await self.registry.remove(req)
        await self._release_on(sid, partial(on_node_removed, sid))
        return Reply(ok=True, server_id=sid)

    async def _on_drain(self, req: DrainNode) -> Message:
        """An operator drains or undrains a node; the leader reads the record
        (:mod:`scheduling.live.drain`): nothing is released here."""
        await self.registry.drain(req)
        return Reply(ok=True, server_id=req.server_id)

    async def _subscribe(self, subject: str, handler: Callable[[Msg], Awaitable[None]]) -> None:
        async def on_msg(msg: Msg) -> None:
            try:
                await handler(msg)
            except WireError as e:
                await self.ctx.reporter.report(msg.subject, str(e), e.code, msg.data)
            except Exception as e:
                self.log.exception("handler failed", subject=msg.subject)
                await self.ctx.reporter.report(msg.subject, repr(e), "internal", msg.data)

        await self.ctx.nc.subscribe(subject, cb=on_msg)
        await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
        await self.ctx.nc.flush()

    async def _on_node_beat(self, msg: Msg) -> None:
        beat = decode_node_heartbeat(msg.data)
        sid = subjects.last_token(msg.subject, subjects.NODE_HEARTBEATS_ALL)
        refusal = heartbeat_refusal(beat, sid)
        if refusal is not None:
            await audit(self.ctx.reporter, sid, msg.subject, refusal, msg.data)
            return
        foreign = foreign_jobs(beat, self.history)
        for job in foreign:
            self.suspects.saw(job, beat.server_id, msg.subject, self.clock())
        beat = without_jobs(beat, foreign)
        if not await self.registry.beat(beat, msg.subject, msg.data):
            return
        for job in beat.lost:
            self._release_lost(job, beat.server_id)

    def _release_lost(self, job: JobId, sid: ServerId) -> None:
        """The node's executor restarted and found the job's processes gone:
        its part is released at once, as a vanished process (no deadline,
        no grace: the node said so). Once only: the node lists the job for
        a while, and a released part is no longer expected."""
        if sid not in self.tracker.expected(job):
            return
        progress = self.tracker.progress(job)
        self.tracker.release(job)  # before any await: not judged again
        self.log.warning("job process lost while its executor was away", job_id=job,
                         server_id=sid)
        self.releaser.spawn(job, partial(on_vanished, server=sid, samples_done=progress,
                                         ended=job in self.ended))

    async def _on_job_beat(self, msg: Msg) -> None:
        beat = decode_job_heartbeat(msg.data)
        sid, job = subjects.last_two_tokens(msg.subject, subjects.JOB_HEARTBEATS_ALL)
        refusal = job_beat_refusal(beat, sid, job)
        if refusal is not None:
            await audit(self.ctx.reporter, sid, msg.subject, refusal, msg.data)
        elif not self.history.on(beat.job_id, beat.server_id):
            self.suspects.saw(beat.job_id, beat.server_id, msg.subject, self.clock())
        else:
            self.tracker.job_beat(beat.job_id, beat.server_id, self.clock(), beat.samples_done)

    async def _audit_suspects(self) -> None:
        for s in self.suspects.due(self.history, self.clock()):
            await audit(self.ctx.reporter, s.server, s.subject,
                        f"heartbeat entry of job {s.job}, which is not placed on server "
                        f"{s.server}; ignored")

    # --- job ends -------------------------------------------------------------------

    async def _on_job_event(self, event: JobEvent, delivery: Delivery) -> None:
        self.feeds.on_job_event(event, self.jobs.get(event.job_id))
        if not isinstance(event, JobFinished | JobFailed | JobCancelled):
            return
        kind = str(event.__struct_config__.tag).removeprefix("job_")
        self.ended.add(event.job_id)
        self.book.ended(event.job_id, event.at, cast(Outcome, kind))  # the three tags above
        await self.releaser.release(event.job_id, partial(on_job_end, kind=kind))

    async def _on_profile(self, event: SampleEvent, delivery: Delivery) -> None:
        if isinstance(event, ProfileReported):
            job, server = event.report.job_id, event.report.server_id
            if await self.releaser.release(job, partial(on_profiled, server=server)) is None:
                self.early.add(job, server, self.clock())

    # --- deadlines ------------------------------------------------------------------

    async def _check_loop(self) -> None:
        nc = self.ctx.nc
        reconnects = nc.stats["reconnects"]
        while not self.ctx.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ctx.stopping.wait(), self.settings.check_s)
            if not nc.is_connected:
                continue  # deaf, not alone: judge nobody while NATS is away
            if nc.stats["reconnects"] != reconnects:
                reconnects = nc.stats["reconnects"]
                self.tracker.rebase(self.clock())
                self.log.info("reconnected: every heartbeat deadline starts again")
            await self._audit_suspects()
            found = self.tracker.check(self.clock())
            for sid, last in found.nodes:
                await self._node_lost(sid, last)
            for job, sid in found.jobs:
                self.log.warning("job heartbeat lost", job_id=job, server_id=sid)
                self.releaser.spawn(job, partial(on_heartbeat_lost, ended=job in self.ended,
                                                 samples_done=found.progress.get(job)))
            for job, sid in found.vanished:
                self.log.warning("job process ended without a word", job_id=job,
                                 server_id=sid)
                self.releaser.spawn(job, partial(on_vanished, server=sid,
                                                 samples_done=found.progress.get(job),
                                                 ended=job in self.ended))
            for job, sid in found.stranded:
                self.log.warning("placement on a server that is not alive", job_id=job,
                                 server_id=sid)
                self.releaser.spawn(job, partial(on_node_lost, sid,
                                                 samples_done=found.progress.get(job)))
            for job, sid in found.orphans:
                self.log.warning("job runs without a placement; stopping it", job_id=job,
                                 server_id=sid)
                key = f"orphan:{job}@{sid}:{self.clock():.0f}"
                self.releaser.background(self.releaser.stop(job, sid, key, "no placement"))

    async def _node_lost(self, sid: ServerId, last: float) -> None:
        self.log.warning("node lost", server_id=sid, last_heartbeat=last)
        await self.registry.mark_lost(sid, last)
        await self._release_on(sid, partial(on_node_lost, sid))

    async def _release_on(self, sid: ServerId, decide: Callable[..., Release | None]) -> None:
        """Release every placement on ``sid`` with ``decide`` (given the job's
        heartbeat progress and whether it ended)."""
        for job, placement in sorted(self.placements.items()):
            if sid not in placement.configuration.servers:
                continue
            progress = self.tracker.progress(job)
            self.tracker.release(job)  # before any await: not stranded next check
            self.releaser.spawn(job, partial(decide, samples_done=progress,
                                             ended=job in self.ended))

    # --- metrics ------------------------------------------------------------------

    async def scrape_families(self) -> list[Metric]:
        """One scrape's families: the buckets read now, as the API reads them."""
        return await self.counts.scrape(self.ctx.js, self.book, self.clock(),
                                        self.settings.raqlr_window_h, self._bad_record)

    async def _bad_record(self, where: str, error: str, data: bytes) -> None:
        await self.ctx.reporter.report(where, error, INVALID, data)

    async def stop(self) -> None:
        await self.releaser.close()
        if self.metrics_port is not None:
            await self.metrics.stop()


async def run_monitor(ctx: ServiceContext, settings: MonitorSettings) -> None:
    monitor = Monitor(ctx, settings)
    await monitor.start()
    try:
        await ctx.stopping.wait()
    finally:
        await monitor.stop()
