"""The leader's task loop: a live task policy (``HOPS_POLICY=hare``,
``hare-eft`` or a baseline of ``hops experiment hare``) in place of the
round-based plan loop (docs/hare.md §7 "Live mechanism"; the pure part is
:mod:`scheduling.live.taskrun`).

Each pass, woken by a job event, a change of the nodes, a ``task_done`` or
the resend interval:

1. counts the ``task_done`` reports that arrived (``HOPS_TASK_DONE``, an
   ordered consumer from the stream sequence the leader's state has
   reached); a refused one is logged and reported as an error record with
   the code ``task_refused``, and changes nothing; one of a job that
   ended (cancelled while its entry ran, say) is logged and ignored; then
   the rounds the aggregators applied (``HOPS_AGG_APPLIED``, likewise
   from its own stream sequence): a job with a command takes its applied
   rounds from there (:func:`scheduling.live.taskrun.aggregated`). Once
   the count applied a round, it sends the current revision again at
   once to the servers whose sequences name the job, its rounds applied
   grown: a server holds an entry of a round
   until its job's earlier rounds are applied, and this is what releases
   it, without waiting for the pass's estimates and replan (the state is
   written first, as before any revision is sent: a new leader resumes
   with these rounds applied, and counts the entry so started as possibly
   started);
2. builds the task snapshot from the job records, the alive nodes (as the
   leader's watch of ``hops_nodes`` keeps them: no read per pass) and the
   estimators' answers (asked for the jobs without one, :mod:`.taskasks`; a
   job with none gets profiling runs, :mod:`scheduling.live.taskprofile`); queues a job it
   can sequence and notes why the others wait (``not_relaxed``,
   ``no_estimate``);
3. publishes ``job_finished`` for a job whose last round is applied;
4. replans when :func:`scheduling.live.taskrun.replan_reasons` says so,
   writes the state (object ``tasks`` in ``hops_state``), publishes
   ``job_started`` for each job sequenced for the first time (its
   placement: the GPUs its entries are on), and sends each server its
   ``task_sequence`` under the lease term; every ``HOPS_TASK_RESEND_S``
   seconds it sends the current revision again;
5. then writes each job record's progress to its rounds applied (a new
   leader writes them again: the state holds the rounds).

Where a pass's wall time goes is logged (:mod:`.passtimes`): a round's
turnaround, from its last report to the next revision, is a pass.

The state is written before a revision is sent, and, with the resend, after
reports were counted since (not at each report: a pass that counts the
first reports of a round would delay the one that counts its last), each
time with the last sequence counted of each stream: a new leader loads it,
replays both streams from there (up to the last message stored when its
term began, before its first pass; a report counted again counts once),
and sends its first revision under its own term, so a report is counted
once and a started entry keeps its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time

import msgspec
import nats.errors
from nats.aio.msg import Msg
from structlog.typing import FilteringBoundLogger

from scheduling.live import state as st
from scheduling.live import taskrun as tr
from scheduling.live.lease import Lease
from scheduling.live.tasks import TaskSnapshot, planned_tasks, replan, sequence_messages
from scheduling.registry import make_task_policy, spec_text
from services.runtime.bus import publish_event
from services.runtime.follow import follow_stream
from services.runtime.objects import ObjectError, ObjectWriter, read_retried
from services.runtime.service import ServiceContext
from services.scheduler.jobbook import JobBook
from services.scheduler.passtimes import PassTimes
from services.scheduler.settings import SchedulerSettings
from services.scheduler.taskasks import TaskAsks
from shared import events as ev
from shared import subjects
from shared.gradients import decode_applied
from shared.ids import JobId
from shared.records import NodeRecord
from shared.wire import INTERNAL, INVALID, TASK_REFUSED

INLINE_TASKS = 128  # a replan of at most this many tasks runs on the event loop (~15 ms)
CATCH_UP_S = 10.0  # the most a new leader waits for the stored reports before its first pass


class TaskLoop:
    """One leader term's task loop; see the module docstring."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, lease: Lease,
                 book: JobBook, log: FilteringBoundLogger, wake: asyncio.Event,
                 nodes: dict[str, NodeRecord]) -> None:
        assert settings.task_policy is not None
        self.ctx, self.settings, self.lease, self.book = ctx, settings, lease, book
        self.nodes = nodes  # hops_nodes as the leader's watch keeps it (never read per pass)
        self.writer = ObjectWriter(ctx.js, subjects.OBJ_STATE, tr.TASK_STATE)
        self.unwritten: set[JobId] = set()  # jobs whose record's progress is behind
        self.log, self.wake = log.bind(task_policy=spec_text(settings.task_policy)), wake
        self.policy = make_task_policy(settings.task_policy)
        self.live = settings.live_tasks()
        self.progress = tr.Progress(tr.TaskState())
        self.inbox: list[Msg] = []  # reports not yet counted, in stream order
        self.agg_inbox: list[Msg] = []  # rounds applied by the aggregators, not yet counted
        self.asks = TaskAsks(ctx, settings, lease, book, log, wake)  # estimates, profiles
        self.new_term = True  # a new leader sends its first revision under its term
        self.applied = False  # a round was applied since the last replan
        self.grown: set[JobId] = set()  # jobs with a round applied in this pass's count
        self.dirty = False  # the state changed since it was written
        self.sent_at = 0.0
        self.replay_to = 0  # the stream's last sequence when the term began
        self.agg_replay_to = 0  # HOPS_AGG_APPLIED's
        self.failed: tuple[frozenset[str], frozenset[str]] | None = None  # the last failed replan
        self.times = PassTimes()  # where a pass's wall time goes (logged)

    async def load(self) -> None:
        """The state the last leader left, if any (unreadable: none)."""
        try:
            data = await read_retried(self.ctx.js, subjects.OBJ_STATE, tr.TASK_STATE)
            state = tr.decode_state(data) if data else tr.TaskState()
        except (ObjectError, msgspec.DecodeError) as e:
            self.log.error("task state unreadable: starting afresh", error=str(e))
            await self.ctx.reporter.report("scheduler.tasks", f"task state: {e}", INTERNAL)
            state = tr.TaskState()
        self.progress = tr.Progress(state)
        self.unwritten = set(state.applied)  # the last leader may not have written them
        info = await self.ctx.js.stream_info(subjects.STREAM_TASK_DONE.name)
        self.replay_to = info.state.last_seq  # counted before the first revision of the term
        info = await self.ctx.js.stream_info(subjects.STREAM_AGG_APPLIED.name)
        self.agg_replay_to = info.state.last_seq
        seqs = state.seqs
        self.log.info("task state loaded", from_term=state.term, stream_seq=state.stream_seq,
                      revision=seqs.revision if seqs else 0, applied=state.applied)

    async def run(self, others: list[asyncio.Task[None]]) -> None:
        """Passes until another leader task ends (then raise why) or the lease goes."""
        follow = asyncio.create_task(follow_stream(
            self.ctx.nc, self.ctx.js, subjects.STREAM_TASK_DONE.name,
            (subjects.TASK_DONE_ALL,), self._on_report, lambda: self.progress.stream_seq + 1,
            self.ctx.stopping, self.log))
        follow_agg = asyncio.create_task(follow_stream(
            self.ctx.nc, self.ctx.js, subjects.STREAM_AGG_APPLIED.name,
            (subjects.AGG_APPLIED_ALL,), self._on_applied, lambda: self.progress.agg_seq + 1,
            self.ctx.stopping, self.log))
        try:
            await self._catch_up()
            while not any(t.done() for t in (*others, follow, follow_agg)):
                self.wake.clear()
                try:
                    await self._pass(time.time())
                except (nats.errors.Error, TimeoutError) as e:  # NATS unreachable: soon again
                    self.log.warning("task pass postponed", error=repr(e))
                    await asyncio.sleep(1.0)
                wait = max(0.05, self.sent_at + self.settings.task_resend_s - time.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait)
        finally:
            follow.cancel()
            follow_agg.cancel()
            await asyncio.gather(follow, follow_agg, return_exceptions=True)
        for task in (*others, follow, follow_agg):
            if task.done() and not task.cancelled():
                task.result()
        raise RuntimeError("a leader task stopped")

    async def _catch_up(self) -> None:
        """Wait for the reports stored before this term (up to ``CATCH_UP_S``):
        the term's first revision then starts from every entry reported done."""
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            seen = max([self.progress.stream_seq,
                        *(m.metadata.sequence.stream for m in self.inbox)])
            seen_agg = max([self.progress.agg_seq,
                            *(m.metadata.sequence.stream for m in self.agg_inbox)])
            if seen >= self.replay_to and seen_agg >= self.agg_replay_to:
                return
            await asyncio.sleep(0.05)
        self.log.warning("task reports not all replayed in time", replay_to=self.replay_to,
                         counted=self.progress.stream_seq)

    async def _on_report(self, msg: Msg) -> None:
        self.inbox.append(msg)
        self.wake.set()

    async def _on_applied(self, msg: Msg) -> None:
        self.agg_inbox.append(msg)
        self.wake.set()

    async def _pass(self, now: float) -> None:
        times = self.times
        times.begin()
        await self._count()
        if self.grown and not self.new_term:  # the rounds applied, before the replan's work
            await self._save()  # written before any server acts on them, as a revision is
            await self._send(now, self.grown)
            # out now: the client's flusher would wait for the pass's next
            # pause, after its estimates and replan (~7 ms measured)
            await self.ctx.nc.flush()
        self.grown = set()
        times.lap("count")
        nodes = list(self.nodes.values())
        await self.asks.estimate(nodes, now)
        await self.asks.profile(nodes, now)
        times.lap("estimate")
        records = self.book.current()
        snapshot, waits = tr.task_snapshot(now, records, self.asks.estimates, nodes, self.progress,
                                           self.settings.task_time_scale)
        await self._note_waits(snapshot, waits, now)
        await self._finish(now)
        self.progress.forget_jobs(r.job_id for r in tr.candidates(self.book.current()))
        reasons = tr.replan_reasons(self.progress.seqs, snapshot, self.applied, self.new_term)
        times.lap("snapshot")
        revision = self.progress.seqs.revision if self.progress.seqs else 0
        if reasons and self.lease.is_leader(time.time()) and self._fresh(snapshot):
            await self._replan(snapshot, reasons, now)
        elif self.dirty and time.time() - self.sent_at >= self.settings.task_resend_s:
            await self._save()  # reports counted: with the resend, not on a round's path
            times.lap("save")
        await self._start(now)
        if time.time() - self.sent_at >= self.settings.task_resend_s:
            await self._send(now)
        times.lap("send")
        await self._write_progress()  # after the revision: no report waits for it
        times.lap("progress")
        await self.writer.tidy()
        times.lap("tidy")
        times.end(self.progress.seqs is not None and self.progress.seqs.revision != revision,
                  self.log)

    # --- reports --------------------------------------------------------------------

    async def _count(self) -> None:
        batch, self.inbox = self.inbox, []
        for msg in batch:
            seq = msg.metadata.sequence.stream
            try:
                report = ev.decode_task_event(msg.data)
                if not isinstance(report, ev.TaskDone):
                    raise ev.WireError(ev.INVALID, f"{type(report).__name__} on {msg.subject}")
                ids = subjects.last_two_tokens(msg.subject, subjects.TASK_DONE_ALL)
            except (ev.WireError, subjects.SubjectError) as e:
                self.progress.stream_seq = max(self.progress.stream_seq, seq)
                await self.ctx.reporter.report(msg.subject, str(e), TASK_REFUSED, msg.data)
                continue
            rec = self.book.current().get(report.job_id)
            if rec is not None and rec.final:  # computed before its job was dropped: no news
                self.progress.stream_seq = max(self.progress.stream_seq, seq)
                self.log.info("task report of an ended job", job_id=report.job_id,
                              phase=rec.phase, round=report.round, lo=report.lo)
                continue
            aggregated = rec is not None and tr.aggregated(rec.spec)
            counted = self.progress.count(report, ids, seq, aggregated)
            self.dirty = True
            if counted.outcome == "refused":
                self.log.warning("task report refused", subject=msg.subject, reason=counted.reason,
                                 job_id=report.job_id, round=report.round, lo=report.lo)
                await self.ctx.reporter.publish(msg.subject, f"task_done refused: "
                                                f"{counted.reason}", TASK_REFUSED)
            elif counted.outcome == "applied":
                await self._round_applied(report.job_id)
        await self._count_applied()

    async def _count_applied(self) -> None:
        """The rounds the aggregators applied: a job with a command takes
        its applied rounds from them (module docstring)."""
        batch, self.agg_inbox = self.agg_inbox, []
        for msg in batch:
            seq = msg.metadata.sequence.stream
            try:
                applied = decode_applied(msg.data)
                job = subjects.last_token(msg.subject, subjects.AGG_APPLIED_ALL)
            except (ev.WireError, subjects.SubjectError) as e:
                self.progress.agg_seq = max(self.progress.agg_seq, seq)
                code = e.code if isinstance(e, ev.WireError) else INVALID
                await self.ctx.reporter.report(msg.subject, str(e), code, msg.data)
                continue
            rec = self.book.current().get(applied.job_id)
            if job != applied.job_id or rec is None or rec.final or not tr.aggregated(rec.spec):
                self.progress.agg_seq = max(self.progress.agg_seq, seq)
                continue  # another job's subject, or no job of ours: no news
            counted = self.progress.round_applied(applied.job_id, applied.round, seq)
            self.dirty = True
            if counted.outcome == "applied":
                await self._round_applied(applied.job_id)

    async def _round_applied(self, job: JobId) -> None:
        self.applied = True
        self.grown.add(job)
        self.log.info("round applied", job_id=job, applied=self.progress.applied[job])
        self.unwritten.add(job)

    async def _write_progress(self) -> None:
        """Each record's progress to its rounds applied: informative (the
        task state is what a new leader resumes from), so written after the
        pass's revision is sent, and again by a new leader."""
        for job in sorted(self.unwritten):
            rec = self.book.current().get(job)
            if rec is not None:
                samples = tr.samples_applied(rec, self.progress.applied.get(job, 0))
                await self.book.update(job, functools.partial(st.with_progress, progress=samples))
            self.unwritten.discard(job)

    # --- jobs --------------------------------------------------------------------------

    async def _note_waits(self, snapshot: TaskSnapshot, waits: dict[JobId, str],
                          now: float) -> None:
        """Queue each job the snapshot holds; give each other one its reason."""
        for job in snapshot.jobs:
            await self.book.update(job.id, functools.partial(st.queue_now, now=now))
            await self.book.update(job.id, functools.partial(tr.wait_reason, reason=None))
        for job_id, reason in waits.items():
            await self.book.update(job_id, functools.partial(tr.wait_reason, reason=reason))

    async def _finish(self, now: float) -> None:
        for job in tr.to_finish(self.book.current(), self.progress):
            event = ev.JobFinished(job_id=job, at=now)
            await publish_event(self.ctx.js, subjects.job_events(job), event,
                                msg_id=f"{job}:tasks-finished")
            self.progress.finished.add(job)
            self.dirty = True
            self.log.info("job finished", job_id=job, rounds=self.progress.applied.get(job))

    # --- sequences ---------------------------------------------------------------------

    def _fresh(self, snapshot: TaskSnapshot) -> bool:
        """Whether a replan may succeed: not the jobs and GPUs of the last
        failed one again, with no round applied since."""
        return self.applied or self.failed != _problem_key(snapshot)

    async def _replan(self, snapshot: TaskSnapshot, reasons: list[str], now: float) -> None:
        previous = self.progress.seqs
        try:
            if planned_tasks(snapshot, self.live.horizon_rounds) <= INLINE_TASKS:
                seqs = replan(snapshot, self.policy, previous, self.live)  # no thread's hop
            else:  # a large plan off the event loop
                seqs = await asyncio.to_thread(replan, snapshot, self.policy, previous, self.live)
        except Exception as e:  # a policy's failure skips this revision, not the service
            self.failed = _problem_key(snapshot)  # tried again once the jobs or GPUs change
            self.log.warning("task replan failed", reasons=reasons, error=repr(e))
            await self.ctx.reporter.report("scheduler.tasks", f"task replan failed: {e}",
                                           INTERNAL)
            return
        self.failed = None
        self.progress.seqs = seqs
        self.new_term = self.applied = False
        self.times.lap("plan")
        await self._save()  # the state first: a new leader resumes from what was sent or later
        self.times.lap("save")
        self.log.info("task sequences issued", revision=seqs.revision, reasons=reasons,
                      jobs=sorted(tr.sequenced_jobs(seqs)))
        await self._start(now)
        await self._send(now)

    async def _start(self, now: float) -> None:
        for job, config in tr.to_start(self.progress.seqs, self.book.current(),
                                       self.progress.started).items():
            event = ev.JobStarted(job_id=job, configuration=config, at=now)
            await publish_event(self.ctx.js, subjects.job_events(job), event,
                                msg_id=f"{job}:tasks-started")
            self.progress.started.add(job)
            self.dirty = True

    async def _send(self, now: float, jobs: set[JobId] | None = None) -> None:
        """The current revision to every server (``jobs``: only to the
        servers whose sequences name one of them; the others' resend stays
        due, so it does not count as one)."""
        seqs = self.progress.seqs
        if jobs is None:
            self.sent_at = time.time()
        if seqs is None or seqs.revision < 1 or not self.lease.is_leader(time.time()):
            return
        specs = {k: r.spec for k, r in self.book.current().items()}
        try:
            messages = sequence_messages(seqs, self.progress.done_keys(), self.lease.term, now,
                                         specs, self.progress.applied)
        except (KeyError, ValueError) as e:
            await self.ctx.reporter.report("scheduler.tasks", repr(e), INTERNAL)
            return
        for msg in messages:
            if jobs is not None and not any(spec.id in jobs for spec in msg.specs):
                continue
            await self.ctx.nc.publish(subjects.task_sequence(msg.server_id), ev.encode(msg))

    async def _save(self) -> None:
        if not self.lease.is_leader(time.time()):  # a deposed leader must not overwrite it
            return
        state = self.progress.state(self.lease.term)
        await self.writer.put(tr.encode_state(state))
        self.dirty = False


def _problem_key(snapshot: TaskSnapshot) -> tuple[frozenset[str], frozenset[str]]:
    return (frozenset(j.id for j in snapshot.jobs), frozenset(g.id for g in snapshot.gpus))
