"""The placer service shell (§3.1, step 9): applies each plan to the cluster.

It consumes ``plan_issued`` from ``HOPS_PLANS`` (durable ``placer``; a new
durable starts at the newest plan, not at the stream's history) and, per
plan:

1. ignores it unless its ``term`` is the term of the leader lease as it is
   now in KV ``hops_leader``, or when a later plan was applied already (a
   redelivery after a crash would undo it); see :mod:`services.placer.gate`;
2. reads ``hops_alloc``, the alive nodes of ``hops_nodes`` and the jobs'
   ``hops_jobs`` records, and computes the changes
   (:func:`services.placer.diff.changes`);
3. sends every ``stop_job`` (all servers of a placement at once), deletes
   the stopped jobs' entries and publishes ``job_stopped`` with the
   ``samples_done`` of the stop acks (a job no server runs any more is left
   to the monitor, which says why it ended);
4. books GPU indices for the starts against what is still booked, and the
   CPU cores and memory their configurations demand against the servers'
   registered capacity (:func:`services.placer.booking.book`): a stop that
   failed keeps its GPUs, cores and memory;
5. sends ``set_cores`` for each retune (a running job whose GPUs stay and
   whose CPU cores change, :class:`services.placer.commands.Retune`; booked
   before the starts, so the cores a shrink frees are theirs) to every
   server where its cores change, and once all acknowledged updates its
   ``hops_alloc`` entry (no job event: the job did not restart). A refusal
   anywhere puts the others back to their old cores and is an
   ``error_record`` (``retune_failed``);
6. sends the ``start_job`` commands of each job (a relaxed-sync job's
   with the micro-batches per rank the plan carries,
   :mod:`shared.relaxed`), and once every server
   acknowledged writes its ``hops_alloc`` entry and publishes
   ``job_started`` (``job_resized`` for a job that moved). A job whose start
   fails on some server is stopped again where it started. A server may
   answer ``already_started``: the job runs there as asked, started by a
   placer that died before it saw the ack; the job is adopted as started
   when all its servers run that one earlier start, and stopped everywhere
   (``start_failed``) when some run it and others started it now
   (:func:`services.placer.commands.adoption_problem`).

Each command is retried on timeout with the same idempotency key, up to
``command_attempts`` times; then an ``error_record`` says so
(:mod:`services.placer.executors`). Problems of
the plan (unknown jobs or servers, GPUs, cores or memory that do not fit,
...) are error records too, and the rest of the plan still applies; those
the cluster overtook since the plan (:data:`services.placer.commands.RACES`)
are logged at debug and published on ``hops.v1.placer.skipped`` instead.
Profiling runs only appear in ``hops_alloc`` (mode ``profile``): the job is
not running. The placer is meant to run as one instance: two would share
the durable and apply plans concurrently.

Settings are in :mod:`services.placer.__main__`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from structlog.typing import FilteringBoundLogger

from services.placer.booking import book_all
from services.placer.commands import (
    Problem,
    Retune,
    Start,
    Stop,
    adopted,
    adoption_problem,
    command_key,
    plan_prefix,
)
from services.placer.diff import changes
from services.placer.executors import Executors
from services.placer.gate import PlanGate, leader_term
from services.runtime.bus import publish_event
from services.runtime.consumer import ConsumerSpec, Delivery, consume
from services.runtime.kv import read_bucket
from services.runtime.retry import kv_write
from services.runtime.service import ServiceContext
from shared import subjects
from shared.configuration import Configuration
from shared.events import (
    ALREADY_STARTED,
    CommandAck,
    JobResized,
    JobStarted,
    JobStopped,
    PlanEntrySkipped,
    PlanEvent,
    PlanIssued,
    SetCores,
    StartJob,
    StopJob,
    decode_plan_event,
    encode,
)
from shared.ids import JobId, ServerId
from shared.records import JobRecord, NodeRecord, Placement
from shared.relaxed import split_problem

R = TypeVar("R")


@dataclass(frozen=True)
class PlacerSettings:
    command_timeout_s: float = 10.0
    command_attempts: int = 3
    retry_delay_s: float = 0.5
    fetch_timeout_s: float = 1.0
    ack_wait_s: float = 120.0


@dataclass(frozen=True)
class StopResult:
    ok: bool
    samples: float | None = None  # progress at the stop, None when unknown


@dataclass(frozen=True)
class NewestFirst(ConsumerSpec):
    """A consumer that, when first created, starts at the last message."""

    def config(self) -> ConsumerConfig:
        config = super().config()
        config.deliver_policy = DeliverPolicy.LAST
        return config


class Placer:
    def __init__(self, ctx: ServiceContext, settings: PlacerSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.ctx = ctx
        self.settings = settings
        self.clock = clock
        self.log = ctx.log
        self.gate = PlanGate()
        self.progress: dict[JobId, float] = {}  # samples_done of the latest stop acks
        self.executors = Executors(ctx, settings.command_timeout_s, settings.command_attempts,
                                   settings.retry_delay_s)

    async def start(self) -> None:
        js = self.ctx.js
        self.kv_alloc = await js.key_value(subjects.KV_ALLOC)
        self.kv_nodes = await js.key_value(subjects.KV_NODES)
        self.kv_jobs = await js.key_value(subjects.KV_JOBS)
        self.kv_leader = await js.key_value(subjects.KV_LEADER)
        spec = NewestFirst(subjects.STREAM_PLANS.name, "placer", subjects.PLANS,
                           fetch_timeout=self.settings.fetch_timeout_s,
                           ack_wait=self.settings.ack_wait_s)
        plans = consume(self.ctx.js, spec, decode_plan_event, self.on_plan, self.ctx.reporter,
                        self.ctx.stopping)
        self.ctx.spawn(plans, "plans")
        self.log.info("placer started")

    # --- one plan ---------------------------------------------------------------------

    async def on_plan(self, event: PlanEvent, delivery: Delivery) -> None:
        if not isinstance(event, PlanIssued):
            return
        log = self.log.bind(term=event.term, round=event.round, first_plan=event.first_plan,
                            seq=delivery.stream_seq)
        if await self._ignored(event, delivery.stream_seq, log):
            return
        late = self.gate.superseded(event.term, delivery.stream_seq, await self._newest_plan())
        if late is not None:
            self.gate.applied(delivery.stream_seq)
            log.info("plan skipped", why=late.why)
            return
        prefix = plan_prefix(event.term, event.round, delivery.stream_seq)
        js = self.ctx.js
        current = await _read_all(js, subjects.KV_ALLOC, Placement, self._bad_record)
        nodes = await _read_all(js, subjects.KV_NODES, NodeRecord, self._bad_record)
        capacity = {ServerId(k): r.server.capacity for k, (r, _) in nodes.items() if r.alive}
        self.executors.addresses = {ServerId(k): r.address for k, (r, _) in nodes.items()}
        jobs = await self._records({a.job_id for a in event.plan.assignments}
                                   | {t.job_id for t in event.plan.profiling})
        placements = {JobId(k): p for k, (p, _) in current.items()}
        ch = changes(placements, event.plan, event.first_plan, jobs)
        await self._problems(ch.problems)
        results = await asyncio.gather(*(self._stop(s, prefix, current[s.job_id][1])
                                         for s in ch.stops))
        stopped = {s.job_id for s, r in zip(ch.stops, results, strict=True) if r.ok}
        resumed = {s.job_id: r.samples for s, r in zip(ch.stops, results, strict=True)
                   if r.ok and s.resize}
        left = {j: p for j, p in placements.items() if j not in stopped}
        wants = [w for w in ch.wants if not w.resize or w.job_id in stopped]
        booked = book_all(wants, ch.retunes, left, capacity, prefix, at=self.clock())
        starts, problems = booked.starts, booked.problems
        await self._problems(problems)
        # Those giving cores back first, acknowledged before any grows: an
        # executor books each set_cores as it comes.
        for wave in ([r for r in booked.retunes if r.shrinks],
                     [r for r in booked.retunes if not r.shrinks]):
            await asyncio.gather(*(self._retune(r, prefix, current[r.job_id][1])
                                   for r in wave))
        started = await asyncio.gather(*(self._start(s, jobs[s.job_id], prefix,
                                                     resumed.get(s.job_id),
                                                     event.micro_batches.get(s.job_id, ()))
                                         for s in starts))
        moved = {s.job_id for s, ok in zip(starts, started, strict=True) if ok and s.resize}
        for job in sorted(set(resumed) - moved):  # stopped to move, but could not start
            await self._publish_stopped(job, "resize failed", resumed[job], prefix)
        self.gate.applied(delivery.stream_seq)
        log.info("plan applied", stops=len(ch.stops), retunes=len(booked.retunes),
                 starts=len(starts),
                 started=sum(started), problems=len(ch.problems) + len(problems))

    async def _ignored(self, event: PlanIssued, seq: int, log: FilteringBoundLogger) -> bool:
        """Whether the gate refuses the plan (:mod:`services.placer.gate`): the
        refusal is logged, and reported when it calls for it."""
        lease_term = await leader_term(self.kv_leader)
        skip = self.gate.refuse(event.term, lease_term, seq)
        if skip is None:
            return False
        log.warning("plan ignored", why=skip.why, leader_term=lease_term)
        if skip.code:
            await self.ctx.reporter.report(subjects.PLANS, f"plan {seq} ignored: {skip.why}",
                                           skip.code)
        return True

    async def _newest_plan(self) -> tuple[int, int, bool] | None:
        """The newest plan on the stream: its sequence, term and whether it
        is a first plan (None when it cannot be read: the plan is applied)."""
        try:
            msg = await self.ctx.js.get_last_msg(subjects.STREAM_PLANS.name, subjects.PLANS)
            newest = decode_plan_event(msg.data or b"")
        except Exception:  # a read that fails only loses the shortcut
            return None
        if not isinstance(newest, PlanIssued):
            return None
        return msg.seq or 0, newest.term, newest.first_plan

    async def _records(self, ids: Iterable[JobId]) -> dict[JobId, JobRecord]:
        out: dict[JobId, JobRecord] = {}
        for job in ids:
            try:
                entry = await self.kv_jobs.get(job)
                out[job] = msgspec.json.decode(entry.value or b"", type=JobRecord)
            except nats.js.errors.KeyNotFoundError:
                continue
            except msgspec.DecodeError as e:
                await self._bad_record(f"kv.{subjects.KV_JOBS}.{job}", e)
        return out

    async def _bad_record(self, where: str, error: Exception) -> None:
        await self.ctx.reporter.report(where, f"unreadable record: {error}", "invalid")

    async def _problems(self, problems: Iterable[Problem]) -> None:
        """Errors are logged and reported; benign races are logged at debug
        and counted by the monitor (``hops_placer_skipped_total{reason}``)."""
        for p in problems:
            if not p.race:
                self.log.warning("plan entry not applied", job_id=p.job_id, code=p.code,
                                 error=p.error)
                await self.ctx.reporter.report(subjects.PLANS, p.error, p.code)
                continue
            self.log.debug("plan entry skipped", job_id=p.job_id, reason=p.race, error=p.error)
            skipped = PlanEntrySkipped(job_id=p.job_id, reason=p.race, detail=p.error,
                                       at=self.clock())
            with contextlib.suppress(nats.errors.Error):  # a count lost, nothing else
                await self.ctx.nc.publish(subjects.PLACER_SKIPPED, encode(skipped))

    # --- stops and starts -------------------------------------------------------------

    async def _stop(self, stop: Stop, prefix: str, revision: int) -> StopResult:
        """Stop the job on every server of its placement; unless all of them
        stopped it (or never ran it), its GPUs stay booked."""
        job = stop.job_id
        servers = stop.placement.configuration.servers
        acks = await asyncio.gather(*(
            self._command(s, StopJob(key=command_key("stop", prefix, job, s), job_id=job,
                                     reason=stop.reason)) for s in servers))
        if any(a is None or (not a.ok and a.code != "not_found") for a in acks):
            await self.ctx.reporter.report(subjects.PLANS, f"job {job} could not be stopped on "
                                           f"every server; its GPUs stay booked", "stop_failed")
            return StopResult(ok=False)
        if not any(a is not None and a.ok for a in acks):
            # It runs nowhere any more: it ended, or its process or node was
            # lost, and the monitor releases it with the event that says so (a
            # job_stopped now would follow the job's job_finished). Its GPUs
            # stay booked for this plan.
            self.log.info("job runs nowhere; its release is the monitor's", job_id=job)
            return StopResult(ok=False)
        done = [a.samples_done for a in acks if a is not None and a.ok]
        samples = max(done) if done else None
        if samples is not None:
            self.progress[job] = samples
        with contextlib.suppress(nats.js.errors.APIError):  # the monitor released it meanwhile
            await self.kv_alloc.delete(job, last=revision)
        self.log.info("job stopped", job_id=job, reason=stop.reason, samples_done=samples)
        if not stop.resize:
            await self._publish_stopped(job, stop.reason, samples, prefix)
        return StopResult(ok=True, samples=samples)

    async def _start(self, start: Start, record: JobRecord, prefix: str,
                     resumed: float | None, split: tuple[int, ...] = ()) -> bool:
        job = start.job_id
        samples = resumed if resumed is not None else max(record.samples_done,
                                                          self.progress.get(job, 0.0))
        meet = self.executors.rendezvous(start, prefix)
        config = start.placement.configuration
        # A relaxed-sync job's split (plan_issued) where it fits this start; else even.
        if start.placement.mode != "run" or split_problem(
                record.spec.sync_scale, config.total_gpus, split) is not None:
            split = ()
        cmds = [StartJob(key=command_key("start", prefix, job, launch.server), job_id=job,
                         server_id=launch.server, spec=record.spec,
                         configuration=launch.configuration, gpu_indices=launch.gpu_indices,
                         samples_done=samples, mode=start.placement.mode, rendezvous=meet,
                         micro_batches=split)
                for launch in start.launches]
        acks = await asyncio.gather(*(self._command(c.server_id, c) for c in cmds))
        answered = [a for a in acks if a is not None and a.ok]
        split_run = adoption_problem([c.server_id for c in cmds], answered) if len(
            answered) == len(acks) else None
        if len(answered) < len(acks) or split_run is not None:
            await self.executors.undo(start, acks, prefix, split_run)
            return False
        placement = adopted(start.placement, [c.server_id for c in cmds], answered)
        await kv_write(self.ctx.js, subjects.KV_ALLOC, job, msgspec.json.encode(placement),
                       msg_id=f"{job}:alloc:{prefix}")
        now = self.clock()
        if start.resize:
            await self._publish(job, JobResized(job_id=job, configuration=config, at=now,
                                                reason="resize", samples_done=samples),
                                f"{job}:job_resized:{prefix}")
        elif start.placement.mode == "run":
            await self._publish(job, JobStarted(job_id=job, configuration=config, at=now),
                                f"{job}:job_started:{prefix}")
        earlier = sorted({a.started_by for a in answered if a.code == ALREADY_STARTED})
        self.log.info("job placed", job_id=job, mode=start.placement.mode, adopted=earlier,
                      configuration=str(config), samples_done=samples,
                      gpu_indices={s: list(i) for s, i in placement.gpu_indices.items()})
        return True

    async def _retune(self, retune: Retune, prefix: str, revision: int) -> bool:
        """Change a running job's cores in place (step 5 of the module)."""
        job, new = retune.job_id, retune.configuration
        servers = retune.servers
        acks = await asyncio.gather(*(self._set_cores("cores", prefix, job, s, new)
                                      for s in servers))
        if not all(a is not None and a.ok for a in acks):
            old = retune.placement.configuration
            await asyncio.gather(*(self._set_cores("uncores", prefix, job, s, old)
                                   for s, a in zip(servers, acks, strict=True)
                                   if a is not None and a.ok))
            failed = [f"{s}: {a.code + ' ' + a.error if a else 'no answer'}"
                      for s, a in zip(servers, acks, strict=True) if a is None or not a.ok]
            await self.ctx.reporter.report(subjects.PLANS, f"job {job} keeps its cores "
                                           f"({'; '.join(failed)})", "retune_failed")
            return False
        with contextlib.suppress(nats.js.errors.APIError):  # the monitor released it meanwhile
            await kv_write(self.ctx.js, subjects.KV_ALLOC, job,
                           msgspec.json.encode(retune.retuned), last=revision,
                           msg_id=f"{job}:retune:{prefix}")
        self.log.info("job cores changed", job_id=job, configuration=str(new),
                      core_ids={s: list(a.cores) for s, a in zip(servers, acks, strict=True)
                                if a is not None})
        return True

    async def _set_cores(self, verb: str, prefix: str, job: JobId, server: ServerId,
                         config: Configuration) -> CommandAck | None:
        cmd = SetCores(key=command_key(verb, prefix, job, server), job_id=job,
                       server_id=server, cores=config.cores_on(server), at=self.clock(),
                       mba_percent=config.mba_percent)
        return await self._command(server, cmd)

    async def _command(self, server: ServerId,
                       cmd: StartJob | StopJob | SetCores) -> CommandAck | None:
        """The ack of ``cmd`` (:meth:`.executors.Executors.send`); None if none came."""
        return await self.executors.send(server, cmd)

    async def _publish_stopped(self, job: JobId, reason: str, samples: float | None,
                               prefix: str) -> None:
        event = JobStopped(job_id=job, at=self.clock(), reason=reason, samples_done=samples)
        await self._publish(job, event, f"{job}:job_stopped:{prefix}")

    async def _publish(self, job: JobId, event: JobStarted | JobResized | JobStopped,
                       msg_id: str) -> None:
        await publish_event(self.ctx.js, subjects.job_events(job), event, msg_id=msg_id)


async def _read_all(js: JetStreamContext, bucket: str, kind: type[R],
                    on_bad: Callable[[str, Exception], Awaitable[None]]
                    ) -> dict[str, tuple[R, int]]:
    """Every value of KV ``bucket`` decoded as ``kind``, with its revision
    (:func:`services.runtime.kv.read_bucket`: nats-py's ``keys()`` may read a
    bucket with keys as empty on a busy host)."""
    out: dict[str, tuple[R, int]] = {}
    for key, value in (await read_bucket(js, bucket)).items():
        try:
            out[key] = (msgspec.json.decode(value.data, type=kind), value.revision)
        except msgspec.DecodeError as e:
            await on_bad(f"kv.{bucket}.{key}", e)
    return out


async def run_placer(ctx: ServiceContext, settings: PlacerSettings) -> None:
    placer = Placer(ctx, settings)
    await placer.start()
    await ctx.stopping.wait()

