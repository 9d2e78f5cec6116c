"""One start of a Hops job as a Slurm batch job, as the executor service
sees it (:class:`executor.backend.JobHandle`).

The job inside Slurm is the emulated job (``python -m executor.job``; a
real job's start is :class:`executor.slurm.realjobs.SlurmRealHandle`): it
publishes its own heartbeats, samples, profile and ``job_finished`` with
its node's identity, and writes its progress lines
(``{"event": ..., "samples_done": x}``) to standard output, which Slurm
writes to the start's output file. The handle reads that file for the
progress and Slurm (through :class:`executor.slurm.watch.SlurmWatch`) for
the job's state; :func:`shared.slurm.job_verdict` says what an end means:

* finished, or a stop Hops asked for: nothing to publish (the job said so);
* failed, or ended outside Hops (``scancel``, a time limit): ``job_failed``
  whose reason starts with the stable code (``slurm_cancelled: ...``), and
  the job is not restarted;
* lost by Slurm or its node (``NODE_FAIL``), or forgotten by Slurm while
  Hops thought it ran: the node lists it as lost, and the monitor requeues
  it from its progress;
* in a state Hops does not know: it counts as running (logged once per
  state), see :func:`shared.slurm.job_verdict`.

Every wait on Slurm is bounded by the client's ``timeout_s``: a start that
Slurm does not answer is refused ``slurm_unavailable`` (its Slurm job, if
any, is cancelled once Slurm answers, :mod:`executor.slurm.strays`), a stop
refused the same way leaves the job as it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from executor.backend import CommandRefused, OnEnding, Outcome, Refusal, with_cap
from executor.cores import with_cores
from executor.emulated import write_count
from executor.slurm.cli import SlurmFailure
from executor.slurm.client import SlurmClient
from executor.slurm.records import SlurmJob
from executor.slurm.watch import SlurmWatch
from shared.events import JobFailed, StartJob
from shared.slurm import (
    JobVerdict,
    StartOf,
    end_verdict,
    failure_code,
    holds_node,
    is_this_start,
    start_verdict,
    stop_read_end,
)


class SlurmJobHandle:
    """See the module docstring. ``on_lost``: called when the job is lost
    (the node's heartbeats then list it)."""

    beats_itself = True

    def __init__(self, cmd: StartJob, slurm_id: int, output: Path, submitted_at: float,
                 watch: SlurmWatch, client: SlurmClient, log: FilteringBoundLogger,
                 on_ending: OnEnding, on_lost: Callable[[], None],
                 cores_file: Path | None = None) -> None:
        self.cmd = cmd
        self.slurm_id = slurm_id
        self.output = output
        self.submitted_at = submitted_at
        self.watch = watch
        self.client = client
        self.log = log.bind(slurm_job=slurm_id)
        self.on_ending = on_ending
        self.on_lost = on_lost
        self.cores_file = cores_file
        self.start = StartOf(job_id=cmd.job_id, server=cmd.server_id, slurm_id=slurm_id,
                             submitted_at=submitted_at)
        self.samples_done = cmd.samples_done
        self.stopping = False
        self.cores: tuple[int, ...] = ()  # Slurm places the job's threads
        self.ready = False
        self.last_event = ""
        self._offset = 0
        self._ended: JobVerdict | None = None
        self.start_failed = False  # started() said why not: nobody runs it for Hops
        self._unanswered: SlurmFailure | None = None  # what Slurm did not answer in started()
        self._unknown_said: set[str] = set()

    def retune(self, count: int, cores: tuple[int, ...], mba_percent: int = 100) -> None:
        """The job is told its new count (its cores file); Slurm keeps the
        CPUs it allocated at the start (a running job's CPUs do not change)."""
        self.cmd = with_cap(with_cores(self.cmd, count), mba_percent)
        if self.cores_file is not None:
            write_count(self.cores_file, count)

    async def take_in(self) -> None:
        """What the job said since the last look (a real job's handle also
        publishes its reports here)."""
        self.read_output()

    def read_output(self) -> None:
        """Take in the progress lines written since the last read."""
        try:
            with self.output.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for raw in data[:end].splitlines():
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        try:
            line = json.loads(raw)
            event, samples = line["event"], float(line["samples_done"])
        except (ValueError, KeyError, TypeError):
            return  # the job's own log lines share the file
        self.samples_done = samples
        self.last_event = str(event)
        if event == "ready":
            self.ready = True
        elif event == "finished":
            self.on_ending()

    def tail(self, size: int = 2000) -> str:
        """The end of the start's output (its own log lines, Slurm's errors)."""
        try:
            with self.output.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - size))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def state(self) -> SlurmJob | None:
        """This start's Slurm job in the latest reading (a job listed under
        its id that is not this start's is not it: :func:`shared.slurm.is_this_start`)."""
        job = self.watch.jobs.get(self.slurm_id)
        return job if job is not None and is_this_start(self.start, job) else None

    def _verdict(self) -> JobVerdict | None:
        """The job's end, once Slurm shows it (None: it has not ended), as
        :func:`shared.slurm.start_verdict` judges the latest reading."""
        if self._ended is not None:
            return self._ended
        listed = self.watch.jobs.get(self.slurm_id)
        verdict = start_verdict(self.start, listed, self.watch.read_at, stopping=self.stopping)
        if verdict is None:
            return None
        if verdict.kind == "unknown" and listed is not None \
                and listed.job_state not in self._unknown_said:
            self._unknown_said.add(listed.job_state)
            self.log.warning("Slurm job state not understood: counted as running",
                             state=listed.job_state, code=verdict.code, reason=verdict.reason)
        if holds_node(verdict):
            return None
        self._ended = verdict
        return verdict

    async def _next(self, after: float = 0.0) -> None:
        """The next reading of Slurm, within the client's time limit."""
        await self.watch.next_within(self.client.settings.timeout_s, after)

    async def started(self, timeout: float) -> str | Refusal | None:
        """None once the job's first heartbeat is out; else why not (a
        :class:`Refusal` ``slurm_unavailable`` when Slurm stops answering)."""
        why: str | Refusal | None
        try:
            why = await self._started(timeout)
        except SlurmFailure as e:
            self._unanswered = e
            why = Refusal(failure_code(e.code, e.error), f"Slurm job {self.slurm_id} on "
                          f"{self.cmd.server_id}: {e.error}")
        self.start_failed = why is not None
        return why

    async def _started(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self._next()
            await self.take_in()
            if self.ready:
                job = self.state()
                # Slurm's GRES chose the indices within the node (docs/slurm.md, "Limits")
                self.log.info("Slurm job runs", planned_gpus=list(self.cmd.gpu_indices),
                              slurm_gpus=list(job.gpu_indices) if job else [])
                return None
            if (ended := self._verdict()) is not None:
                said = self.tail(300).strip().splitlines()
                return (f"Slurm job {self.slurm_id} ended before it ran ({ended.code}: "
                        f"{ended.reason}){': ' + said[-1] if said else ''}")
        job = self.state()
        why = f"{job.job_state} {job.state_reason}".strip() if job else "not listed"
        return f"Slurm job {self.slurm_id} did not start within {timeout:g} s ({why})"

    async def terminate(self, grace: float) -> None:
        """Hops' stop: SIGTERM, a kill after ``grace``; returns once it ended.
        A job that said it finished is exiting by itself: it gets ``grace``
        to do so before it is signalled (the stop that follows a finish
        would otherwise kill it while it closes). When Slurm does not answer
        in time: :class:`CommandRefused`, unless the start failed (then
        nobody runs the job for Hops, and its Slurm job is left to the
        watch, which cancels it once Slurm answers)."""
        self.stopping = True
        try:
            if self._unanswered is not None:  # the start failed on it: no use asking again
                raise self._unanswered
            await self._terminate(grace)
        except SlurmFailure as e:
            code = failure_code(e.code, e.error)
            if not self.start_failed:
                raise CommandRefused(code, f"Slurm job {self.slurm_id} on "
                                     f"{self.cmd.server_id} could not be stopped: "
                                     f"{e.error}") from e
            self.watch.strays.add_id(self.slurm_id, self.cmd.job_id, time.time())
            self._ended = JobVerdict(kind="stopped", code=code, reason=e.error)
            self.log.warning("Slurm job of a failed start left to cancel once Slurm "
                             "answers", code=code, error=e.error)

    async def _terminate(self, grace: float) -> None:
        await self.take_in()
        deadline = time.monotonic() + grace
        while self.last_event == "finished" and time.monotonic() < deadline:
            if self._verdict() is not None:
                return
            await self._next()
        ended = stop_read_end(self.start, await self.client.stop(
            self.slurm_id, grace, mine=lambda job: is_this_start(self.start, job)))
        if ended is not None:
            self._ended = ended  # the stop read its end: no wait for the next reading
        else:
            await self._next(after=time.time())
        await self.take_in()

    async def wait(self) -> Outcome:
        while (verdict := self._verdict()) is None:
            await self.watch.next()
            await self.take_in()
        await self.take_in()
        return self._outcome(verdict)

    def _outcome(self, verdict: JobVerdict) -> Outcome:
        code = verdict.exit_code
        verdict = end_verdict(verdict, self.last_event)
        if verdict.kind in ("finished", "stopped"):
            return Outcome(exit_code=code)
        self.log.warning("Slurm job ended", kind=verdict.kind, code=verdict.code,
                         reason=verdict.reason, samples_done=self.samples_done)
        if verdict.kind == "requeue":
            self.on_lost()
            return Outcome(exit_code=code)
        reason = f"{verdict.code}: {verdict.reason} (Slurm job {self.slurm_id} on " \
                 f"{self.cmd.server_id})"
        failed = JobFailed(job_id=self.cmd.job_id, at=time.time(), reason=reason,
                           exit_code=code, log_tail=self.tail())
        return Outcome(exit_code=code, log_tail=failed.log_tail, event=failed)

    def stop_details(self) -> tuple[int | None, str]:
        return None, ""  # an emulated job's exit says nothing about the job
