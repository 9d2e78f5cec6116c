"""Hare's task sequences on one server: the rules its executor follows
(hare.md §3: "a task running sequence for each GPU"; §4, fast task
switching; docs/hare.md, "Live mechanism"). Pure: the shell
(:mod:`executor.taskrun`) passes the clock's readings and the messages.

Taking a revision (:meth:`Follower.offer`)
------------------------------------------
A decoded ``task_sequence`` for this server is judged by
:func:`shared.sequence.follow_problem`, the lease term being the highest
term this executor has seen (it cannot read the lease; NATS permissions let
only the scheduler publish there, so a lower term is a deposed leader's):

* the (term, revision) it holds again: the leader's resend, a no-op;
* a lower term: refused, :data:`STALE_TERM`;
* a revision of its term not newer than the held one: :data:`STALE_REVISION`;
* a sequence that moves an entry it runs or ran: :data:`MOVES_STARTED`,
  but for an entry of a job absent from the sequence's specs (the leader
  dropped the job: cancelled, or ended): that running entry is abandoned
  (its GPU stops it and reports nothing) and the sequence is taken;
* another server's, or a GPU index the server lacks: ``invalid``.

A refusal changes nothing. An entry is named by its key ``(job, round,
lo)``. The executor keeps the keys of the entries it ran (each with its
GPU) while a revision still lists them there; a revision of a new term
keeps only those it lists on the same GPU (a new leader may not have their
reports yet), so a done entry is never run again, and one the new leader
moved cannot make it refuse that leader for ever.

Running a GPU's entries (:func:`entry_run`)
-------------------------------------------
Each GPU runs its entries in order, one at a time, as the task simulator
does (:mod:`simulator.tasks`, ``_start``): an entry begins at
``max(free, start_s)``, ``free`` being when the GPU's previous entry ended
its compute and ``start_s`` the planned start on the leader's clock (it
carries the round's barrier and ``hold``: the executor sees no other
GPU); it pays the switch cost ``switch_s`` (:data:`world.hare.SWITCH_S`,
Table 3's 3.1 ms) when the GPU's previous entry was another job's (a GPU's
first entry pays none), then computes ``(hi - lo) · T^c``. It also
waits for the gradients of its job's earlier rounds that the held revision
lists on this server (:meth:`Follower.barrier`): if the emulation runs
behind the leader's plan, a round does not start before the one before it
ended on another GPU of the server. And an entry of round r waits until
r rounds of its job are applied, as the revision (or the leader's resend
of it, sent as soon as it counts a round applied) lists them
(:meth:`Follower.may_start`): the round's barrier across servers. Its
gradients are sent ``T^s`` later, while the GPU already runs its next
entry (the model's "sync overlaps the next task"; micro-batches of one
round run back to back, so an entry of k of them is synchronised k · T^c +
T^s after its compute starts: what the simulator counts for k one-batch
tasks of one round). The report goes out then.

T^c of one micro-batch is the job's batch over the world model's one-GPU
throughput of its model on the GPU's type
(:meth:`world.truth.GroundTruth.single_gpu_throughput`, as
:mod:`world.hare` derives T^c); T^s is :func:`world.hare.step_sync_time`:
what the world model says a synchronised step of the job costs a GPU of
the type beyond its compute on this cluster's links, the quantity the
leader plans T^s with (its estimate of it), rather than Hare's
parameter-server push and pull at the paper testbed's 25 Gbps
(:func:`world.hare.ps_sync_time`, the task simulator's workload), which
ignored the emulated cluster's network. Both are divided by the
executor's time scale, as every emulated time is (:mod:`executor.emulator`);
so is the switch cost.

A job whose task fails for good (:func:`task_job_failed`)
--------------------------------------------------------
When a job's own script raises in a task, its round can never complete,
so the job fails, as Slurm fails a job whose program exits non-zero: the
executor reports ``job_failed`` as it does for a real job's process, its
reason the stable code then the script's error in words, bounded to
:data:`FAILURE_WORDS_MAX` characters.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from shared.events import JobFailed, TaskSequence
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.sequence import TaskEntry, TaskKey, follow_problem
from shared.wire import INVALID
from world.hare import step_sync_time
from world.truth import GroundTruth

# Codes of a refused task_sequence (error records; docs/events.md).
TASKS_NOT_SUPPORTED = "tasks_not_supported"  # a backend with no world model and no trainers
STALE_TERM = "stale_term"  # a term below the highest seen: a deposed leader's
STALE_REVISION = "stale_revision"  # not newer than the revision held
MOVES_STARTED = "moves_started"  # moves an entry this server runs or ran
# A traceback's last line fits; a runaway message (a tensor printed whole)
# would bloat the job's record, which every listing carries.
FAILURE_WORDS_MAX = 500


class TaskTimes(NamedTuple):
    """Wall seconds: ``compute_s`` of one micro-batch (T^c), ``sync_s`` of
    sending an entry's gradients (T^s)."""

    compute_s: float
    sync_s: float


class Refused(NamedTuple):
    """Why a ``task_sequence`` is not taken, in words and as a stable code."""

    code: str
    reason: str


Verdict = Literal["taken", "resend"] | Refused


class EntryRun(NamedTuple):
    """When an entry runs (wall seconds): ``begin`` (the GPU takes it),
    compute over ``[compute_start, compute_end)`` after ``switch_s``, and
    ``reported`` (its gradients sent)."""

    begin: float
    switch_s: float
    compute_start: float
    compute_end: float
    reported: float


def task_times(truth: GroundTruth, spec: JobSpec, gpu_type: GpuType,
               time_scale: float) -> TaskTimes:
    """T^c and T^s of ``spec``'s tasks on a GPU of ``gpu_type`` (module
    docstring); ValueError when the model does not run there."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    rate = truth.single_gpu_throughput(spec.model, gpu_type)  # samples/s
    sync = step_sync_time(truth, spec.model, gpu_type)
    return TaskTimes(spec.batch_size / rate / time_scale, sync / time_scale)


def sequence_times(truth: GroundTruth, specs: tuple[JobSpec, ...], gpu_type: GpuType,
                   time_scale: float) -> dict[JobId, TaskTimes] | Refused:
    """Every job's :class:`TaskTimes`, or ``invalid`` for a job this
    server's GPUs cannot run (an unknown model, or not on this type)."""
    out: dict[JobId, TaskTimes] = {}
    for spec in specs:
        try:
            out[spec.id] = task_times(truth, spec, gpu_type, time_scale)
        except ValueError as e:
            return Refused(INVALID, f"job {spec.id}: {e}")
    return out


def switch_cost(last_job: JobId | None, job: JobId, switch_s: float) -> float:
    """What a GPU pays before ``job``'s entry: ``switch_s`` after another
    job's entry, nothing after the same job's or as its first."""
    return switch_s if last_job is not None and last_job != job else 0.0


def entry_run(entry: TaskEntry, times: TaskTimes, free: float, last_job: JobId | None,
              switch_s: float) -> EntryRun:
    """When ``entry`` runs on a GPU free at ``free`` whose previous entry was
    ``last_job``'s (module docstring)."""
    begin = max(free, entry.start_s)
    switch = switch_cost(last_job, entry.job_id, switch_s)
    start = begin + switch
    end = start + (entry.hi - entry.lo) * times.compute_s
    return EntryRun(begin, switch, start, end, end + times.sync_s)


def task_job_failed(job: JobId, code: str, words: str, server: ServerId, gpu: int,
                    at: float) -> JobFailed:
    """The ``job_failed`` of ``job``, whose task on GPU ``gpu`` of ``server``
    failed with ``code`` (``task_failed``: its script raised) and ``words``
    (the script's error): reason ``<code>: <words> (server S, GPU g)``,
    the words cut to :data:`FAILURE_WORDS_MAX` characters (module doc)."""
    said = " ".join(words.split())  # one line: a listing shows it in a cell
    if len(said) > FAILURE_WORDS_MAX:
        said = said[:FAILURE_WORDS_MAX - 1] + "…"
    return JobFailed(job_id=job, at=at, reason=f"{code}: {said} (server {server}, GPU {gpu})")


def key_of(entry: TaskEntry) -> TaskKey:
    return (entry.job_id, entry.round, entry.lo)


class Follower:
    """One server's view of its task sequences (module docstring): the
    revision it holds, what each GPU runs and what it ran."""

    def __init__(self, server_id: ServerId, gpus: int) -> None:
        self.server_id = server_id
        self.gpus = gpus
        self.term = 0  # the highest term seen
        self.held: tuple[int, int] | None = None
        self.entries: dict[int, tuple[TaskEntry, ...]] = {}
        self.specs: dict[JobId, JobSpec] = {}
        self.running: dict[int, TaskKey] = {}
        self.done: dict[TaskKey, int] = {}
        self.applied: dict[JobId, int] = {}  # rounds applied of the jobs the leader listed

    def _where(self, msg: TaskSequence) -> dict[TaskKey, int]:
        return {key_of(e): g.gpu_index for g in msg.gpus for e in g.entries}

    def _done_under(self, msg: TaskSequence) -> dict[TaskKey, int]:
        """The done entries ``msg`` is judged against (module docstring)."""
        if self.held is not None and msg.term == self.held[0]:
            return self.done
        where = self._where(msg)
        return {k: g for k, g in self.done.items() if where.get(k) == g}

    def judge(self, msg: TaskSequence) -> Verdict:
        """Whether ``msg`` would be taken; changes nothing."""
        if msg.server_id != self.server_id:
            return Refused(INVALID, f"a sequence for server {msg.server_id} sent to "
                                    f"{self.server_id}")
        past = sorted(g.gpu_index for g in msg.gpus if g.gpu_index >= self.gpus)
        if past:
            return Refused(INVALID, f"GPU indices {past}: server {self.server_id} has "
                                    f"{self.gpus} GPUs")
        if self.held == (msg.term, msg.revision):
            return "resend"
        lease = max(self.term, msg.term)
        why = follow_problem(lease, self.held, msg.term, msg.revision, msg.gpus,
                             self._kept_running(msg), self._done_under(msg))
        if why is None:
            return "taken"
        if msg.term < lease:
            return Refused(STALE_TERM, why)
        if self.held is not None and (msg.term, msg.revision) <= self.held:
            return Refused(STALE_REVISION, why)
        return Refused(MOVES_STARTED, why)

    def _kept_running(self, msg: TaskSequence) -> dict[int, TaskKey]:
        """The running entries ``msg`` must keep: those of the jobs it still
        names (a job absent from its specs was dropped, cancelled say: its
        running entry is abandoned, never reported)."""
        jobs = {s.id for s in msg.specs}
        return {g: k for g, k in self.running.items() if k[0] in jobs}

    def barrier(self, entry: TaskEntry) -> list[TaskKey]:
        """The entries of ``entry``'s job in an earlier round that this
        server's held revision lists, on any of its GPUs: ``entry`` waits
        for their gradients (the round's barrier as far as this server
        sees it; the leader's ``start_s`` carries the rest)."""
        return [key_of(e) for es in self.entries.values() for e in es
                if e.job_id == entry.job_id and e.round < entry.round]

    def offer(self, msg: TaskSequence) -> Verdict:
        """Judge ``msg`` and take it if it may be taken. A valid message of a
        higher term raises the term seen even when refused: only the
        scheduler can publish one, so the leader of that term exists."""
        verdict = self.judge(msg)
        if not (isinstance(verdict, Refused) and verdict.code == INVALID):
            self.term = max(self.term, msg.term)
        if verdict == "taken":
            self.running = self._kept_running(msg)
            self.done = {k: g for k, g in self._done_under(msg).items()
                         if self._where(msg).get(k) == g}
            self.held = (msg.term, msg.revision)
            self.entries = {g.gpu_index: g.entries for g in msg.gpus}
            self.specs = {s.id: s for s in msg.specs}
            self.applied = {j: n for j, n in self.applied.items() if j in self.specs}
            self.note_applied(msg)
        return verdict

    def note_applied(self, msg: TaskSequence) -> bool:
        """Take the rounds applied that ``msg`` (the held revision, or its
        resend) lists, each job's count only growing: rounds applied are
        never undone, and a resend may be overtaken by a later one. Whether
        a count grew (a held entry may start)."""
        if msg.server_id != self.server_id or self.held != (msg.term, msg.revision):
            return False
        grew = False
        for a in msg.applied:
            if a.job_id in self.specs and a.rounds > self.applied.get(a.job_id, -1):
                self.applied[a.job_id] = a.rounds
                grew = True
        return grew

    def may_start(self, entry: TaskEntry) -> bool:
        """Whether ``entry``'s job has its earlier rounds applied, as far as
        the leader said (a job it did not list is not held)."""
        return entry.round <= self.applied.get(entry.job_id, entry.round)

    def head(self, gpu: int) -> TaskEntry | None:
        """The next entry GPU ``gpu`` runs: its first one neither done nor
        running (None: nothing to run, or the GPU is busy)."""
        if gpu in self.running:
            return None
        return next((e for e in self.entries.get(gpu, ()) if key_of(e) not in self.done), None)

    def start(self, gpu: int, entry: TaskEntry) -> tuple[int, int]:
        """GPU ``gpu`` starts ``entry`` (its head); the (term, revision) it
        runs under."""
        if self.held is None or self.head(gpu) != entry:
            raise ValueError(f"GPU {gpu}: entry {key_of(entry)} is not its head")
        self.running[gpu] = key_of(entry)
        return self.held

    def release(self, gpu: int) -> TaskKey:
        """GPU ``gpu`` gives its running entry back, not run: its head again."""
        return self.running.pop(gpu)

    def finish(self, gpu: int) -> TaskKey:
        """GPU ``gpu`` computed its running entry: done, never run again."""
        key = self.running.pop(gpu)
        self.done[key] = gpu
        return key

    def runs(self, gpu: int, key: TaskKey) -> bool:
        """Whether GPU ``gpu`` still runs ``key`` (not abandoned)."""
        return self.running.get(gpu) == key
