"""The real backend's work of a task entry (docs/hare.md §7, step 4b):
the :class:`~executor.taskwork.TaskWork` of :mod:`executor.taskrun` on a
real executor.

For an entry (job, round r, micro-batches ``lo .. hi - 1``):

1. the round's parameters from the job's aggregator
   (:func:`executor.gradients.fetch_params`), kept per job until a later
   round is asked. While the aggregator has applied fewer than r rounds
   (the entry was released before its round's barrier reached the
   aggregator), or hosts no such job yet, it asks again every
   ``POLL_S``, up to ``HOPS_TASK_PARAMS_WAIT_S``
   (:class:`executor.settings.ExecutorSettings`); then the entry is
   refused ``no_params`` and tried again (it stays its GPU's head: nothing
   is lost). An aggregator that has applied round r already (the entry
   ran before a restart, and its gradients were counted) needs nothing:
   the entry is reported done without gradients;
2. the task on the GPU's :class:`~executor.trainers.TrainerPool` (made at
   the GPU's first entry, ``HOPS_TRAINERS_PER_GPU`` resident processes),
   the job's model loaded from its spec (:mod:`hops.trainer.spec`) for its
   tenant's trainer; the GPU's later entries' jobs tell the pool which
   models to keep;
3. :meth:`RealWork.deliver` sends the gradients
   (:func:`executor.gradients.send_gradients`); the shell publishes the
   ``task_done`` only after that.

A job of a revision that cannot run as tasks (its spec has no
``python <script.py>`` command, :mod:`hops.trainer.spec`) fails at its
first entry here, ``not_task_ready``: the revision is taken for the other
jobs, which a refusal of the whole revision would stall. A script that
raises fails the entry ``task_failed``, and the job (``fails_job``: so
does a script its trainer cannot load, ``not_task_ready``, and one that
killed every trainer it ran on); the
job's models then leave the GPUs' trainers (:meth:`RealWork.drop`, done
by each GPU's runner between two entries: a pool is used by one thread).

**The GPU's next entry is staged while one computes** (Hare §4's fast
switch; :meth:`executor.trainers.TrainerPool.stage`). The shell names it
(``ahead``) when it is the GPU's next entry in the held revision and its
barrier is met; it is staged right after the running entry when its
round's parameters are at hand: kept here, or fetched by one request sent
as the running entry's work begins (:meth:`RealWork._prefetch`, waited for
at most ``AHEAD_WAIT_S`` once the running entry is on its trainer, so that
it never delays it). The trainer then starts it as the running one's
compute ends, with no round trip through the pool or the aggregator. When
the GPU's next entry turns out to be another one (a revision dropped or
moved the staged entry, or its job failed), the staged one is abandoned:
its result is read and dropped (its turn passes; nothing is sent or
reported), then the entry asked for runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import torch
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from executor.gradients import ParamsRefused, fetch_params, send_gradients
from executor.tasks import Refused, key_of
from executor.taskwork import NO_PARAMS, Clock, Computed, Running, TaskFailed
from executor.trainers import Pending, TrainerDied, TrainerPool, TrainerRefused
from hops.trainer.protocol import TASK_FAILED
from hops.trainer.spec import NOT_TASK_READY, NotTaskReady, task_config, task_script
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.sequence import TaskEntry, TaskKey

POLL_S = 0.1  # between two asks for a round's parameters
# How long the next entry's parameters, asked for as an entry's work began,
# are waited for once that entry is on its trainer (it computes meanwhile).
AHEAD_WAIT_S = 0.02
# A trainer's refusals that are the job's fault: it fails. The others
# (bad_span, stale_params, ...) are this executor's, and fail no job.
JOB_FAULTS = frozenset({TASK_FAILED, NOT_TASK_READY})
Params = dict[str, torch.Tensor]
PoolMaker = Callable[[int], TrainerPool]


@dataclass(frozen=True)
class Staged:
    """An entry sent to a GPU's trainers ahead of its turn in the shell."""

    entry: TaskEntry
    pending: Pending


def same_task(a: TaskEntry, b: TaskEntry) -> bool:
    """Whether two entries are the same work (a revision may move their times)."""
    return (a.job_id, a.round, a.lo, a.hi) == (b.job_id, b.round, b.lo, b.hi)


class RealWork:
    """Tasks on resident trainers, gradients to the aggregators (module doc)."""

    def __init__(self, nc: NATS, js: JetStreamContext, server_id: ServerId,
                 make_pool: PoolMaker, params_wait_s: float, clock: Clock = time.time) -> None:
        self.nc, self.js, self.server_id = nc, js, server_id
        self.make_pool, self.params_wait_s, self.clock = make_pool, params_wait_s, clock
        self.specs: dict[JobId, JobSpec] = {}
        self.pools: dict[int, TrainerPool] = {}
        self.params: dict[JobId, tuple[int, Params]] = {}
        self.dropped: dict[int, set[JobId]] = {}  # per GPU: jobs its pool is to forget
        self.unready: dict[JobId, str] = {}  # jobs that cannot run as tasks: why
        self.staged_on: dict[int, Staged] = {}  # per GPU: its next entry, sent ahead
        self.abandoned = 0  # staged entries the shell did not run next: dropped
        self._fetches: set[asyncio.Task[None]] = set()  # held until done (asyncio keeps none)

    def take(self, specs: tuple[JobSpec, ...]) -> Refused | None:
        for spec in specs:
            try:
                task_config(spec)
            except NotTaskReady as e:
                self.unready[spec.id] = str(e)  # fails the job at its first entry
        self.specs.update({s.id: s for s in specs})
        named = {s.id for s in specs}  # a job's parameters are kept while revisions name it
        self.params = {j: p for j, p in self.params.items() if j in named}
        return None

    async def compute(self, gpu: int, entry: TaskEntry, held: tuple[int, int],
                      last_job: JobId | None, upcoming: tuple[JobId, ...],
                      running: Running, ahead: TaskEntry | None = None) -> Computed | None:
        if (why := self.unready.get(entry.job_id)) is not None:
            raise TaskFailed(NOT_TASK_READY, why, fails_job=True)
        fetch = self._prefetch(ahead)
        pending = await self._take_staged(gpu, entry)
        staged = pending is not None
        if pending is None:
            params = await self._params(entry, running)
            if params is None:  # abandoned while it waited
                return None
            if isinstance(params, int):  # the round is applied: nothing to compute
                now = self.clock()
                return Computed(gpu, now, now)
            with self._failing(entry):
                pending = await asyncio.to_thread(self._stage, await self._pool(gpu), entry,
                                                  params, upcoming)
        pool = self.pools[gpu]
        if ahead is not None:
            await self._stage_ahead(gpu, pool, ahead, upcoming[1:], fetch)
        with self._failing(entry):
            result = await asyncio.to_thread(pool.finish, pending)
        if not running():
            return None
        wall = self.clock() - time.monotonic()  # a monotonic reading on the wall clock
        return Computed(gpu, result.compute_start + wall, result.compute_end + wall,
                        gradients=result.gradients, staged=staged)

    def staged(self, gpu: int) -> TaskKey | None:
        """The entry GPU ``gpu``'s trainers have ahead of the shell (module doc)."""
        staged = self.staged_on.get(gpu)
        return None if staged is None else key_of(staged.entry)

    @staticmethod
    @contextlib.contextmanager
    def _failing(entry: TaskEntry) -> Iterator[None]:
        """A trainer's refusal or loss as the entry's :class:`TaskFailed`."""
        try:
            yield
        except TrainerRefused as e:  # the job's own script raised, or cannot be loaded
            raise TaskFailed(e.code, f"job {entry.job_id} round {entry.round}: {e.words}",
                             fails_job=e.code in JOB_FAULTS) from None
        except TrainerDied as e:  # it killed every trainer it was given
            raise TaskFailed(TASK_FAILED, f"job {entry.job_id} round {entry.round}: {e}",
                             fails_job=True) from None

    def _stage(self, pool: TrainerPool, entry: TaskEntry, params: Params,
               upcoming: tuple[JobId, ...]) -> Pending:
        """Send ``entry`` to ``pool`` (its job's model added first); blocking."""
        spec = self.specs[entry.job_id]
        if entry.job_id not in pool.jobs:
            script = task_script(spec)
            pool.add_job(entry.job_id, str(script if script.is_absolute() else Path.cwd() / script),
                         task_config(spec), spec.tenant)
        return pool.stage(entry.job_id, entry.round, entry.lo, entry.hi, spec.sync_scale,
                          params, upcoming)

    async def _take_staged(self, gpu: int, entry: TaskEntry) -> Pending | None:
        """``entry``'s task when it was staged; a staged task of another entry
        is abandoned first: its result read and dropped, its turn passed."""
        staged = self.staged_on.pop(gpu, None)
        if staged is None:
            return None
        if same_task(staged.entry, entry):
            return staged.pending
        with contextlib.suppress(TrainerDied, TrainerRefused):
            await asyncio.to_thread(self.pools[gpu].finish, staged.pending)
        self.abandoned += 1
        return None

    def _prefetch(self, ahead: TaskEntry | None) -> asyncio.Task[None] | None:
        """One request for ``ahead``'s round's parameters, unless kept (or
        ``ahead`` cannot run as tasks); kept when the aggregator has them."""
        if ahead is None or ahead.job_id in self.unready or self._kept(ahead) is not None:
            return None

        async def ask() -> None:
            # a miss only leaves the entry to fetch its parameters in its turn
            with contextlib.suppress(ParamsRefused, TimeoutError, nats.errors.Error):
                applied, params = await fetch_params(self.nc, ahead.job_id)
                if applied == ahead.round and ahead.job_id in self.specs:
                    self.params[ahead.job_id] = (applied, params)
        fetch = asyncio.create_task(ask())
        self._fetches.add(fetch)
        fetch.add_done_callback(self._fetches.discard)
        return fetch

    def _kept(self, entry: TaskEntry) -> Params | None:
        kept = self.params.get(entry.job_id)
        return kept[1] if kept is not None and kept[0] == entry.round else None

    async def _stage_ahead(self, gpu: int, pool: TrainerPool, ahead: TaskEntry,
                           upcoming: tuple[JobId, ...], fetch: asyncio.Task[None] | None) -> None:
        """Stage ``ahead`` behind the running entry when its parameters are
        at hand (module doc); a trainer's refusal leaves it to its turn."""
        if fetch is not None:
            await asyncio.wait({fetch}, timeout=AHEAD_WAIT_S)
        params = self._kept(ahead)
        if params is None or ahead.job_id in self.unready:
            return
        try:
            pending = await asyncio.to_thread(self._stage, pool, ahead, params, upcoming)
        except (TrainerDied, TrainerRefused):  # it runs in its turn, and fails there if it must
            return
        self.staged_on[gpu] = Staged(ahead, pending)

    async def _params(self, entry: TaskEntry, running: Running) -> Params | int | None:
        """The parameters entry's round starts from; the rounds applied when
        the round is applied already; None once the entry is abandoned."""
        kept = self._kept(entry)
        if kept is not None:
            return kept
        deadline = time.monotonic() + self.params_wait_s
        why = "no answer"
        while running():
            try:
                applied, params = await fetch_params(self.nc, entry.job_id)
            except (ParamsRefused, TimeoutError) as e:  # not hosted yet, or restarting
                applied, params, why = -1, {}, repr(e)
            if applied == entry.round:
                self.params[entry.job_id] = (applied, params)
                return params
            if applied > entry.round:
                return applied
            if applied >= 0:
                why = f"{applied} rounds applied"
            if time.monotonic() >= deadline:
                raise TaskFailed(NO_PARAMS, f"job {entry.job_id}: no parameters of round "
                                 f"{entry.round} within {self.params_wait_s:g} s ({why})")
            await asyncio.sleep(POLL_S)
        return None

    async def _pool(self, gpu: int) -> TrainerPool:
        pool = self.pools.get(gpu)
        if pool is None:  # started at the GPU's first entry: an executor without tasks has none
            pool = self.pools[gpu] = await asyncio.to_thread(self.make_pool, gpu)
        return pool

    def drop(self, job: JobId) -> None:
        self.params.pop(job, None)
        for gpu in self.pools:
            self.dropped.setdefault(gpu, set()).add(job)

    async def tidy(self, gpu: int) -> tuple[JobId, ...]:
        pool, jobs = self.pools.get(gpu), self.dropped.pop(gpu, set())
        if pool is None:
            return ()
        for job in sorted(jobs):
            # its models, in memory or moved out, leave every trainer (a dead one held none)
            with contextlib.suppress(TrainerDied, TrainerRefused):
                await asyncio.to_thread(pool.forget, job)
        return tuple(sorted(jobs))

    async def deliver(self, entry: TaskEntry, held: tuple[int, int], done: Computed) -> None:
        if done.gradients:
            await send_gradients(self.js, self.server_id, entry.job_id, round_=entry.round,
                                 lo=entry.lo, gradients=done.gradients, gpu_index=done.gpu,
                                 term=held[0], revision=held[1])
