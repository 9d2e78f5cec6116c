"""The scheduler leader running a task policy (``HOPS_POLICY=hare``) as real
processes against a real nats-server: two relaxed-sync jobs sequenced on
one server's two GPUs, a forged report refused, and a leader killed
mid-sequence (docs/hare.md §7 "Live mechanism").

The emulated executor that follows ``task_sequence`` is not built yet, so
:class:`ExecutorStandIn`, in this test, plays server ``s``'s executor: it
takes each revision of ``hops.v1.tasks.seq.s`` that is newer than the one
it holds (refusing, by :func:`shared.sequence.follow_problem`, one that
moves an entry it started), runs each GPU's entries in order, one at a
time, each after the job's earlier rounds are done on every GPU, and
publishes one ``task_done`` per entry on ``hops.v1.tasks.done.s.<job>``
with ``Nats-Msg-Id`` ``<server>:<job>:<round>:<lo>``, as ``executor-s`` would.

The GPUs' link is slow (0.1 GB/s), so a round of the large model
synchronises for longer than a micro-batch computes, and Hare runs the
other job's tasks on a GPU inside that round (Fig. 1c).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from nats.aio.msg import Msg

from scheduling.live.taskrun import rounds_of
from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.sequence import TaskEntry, TaskKey, follow_problem
from tests.natsfix import nats_server, nats_url
from tests.test_live_scheduler import TTL, Bus, Service, Stack, _async, bus, eventually, stack

__all__ = ["bus", "nats_server", "nats_url", "stack"]  # fixtures

SLOW = GpuTypeSpec(GpuType("A"), 1e8, 1e9)  # a slow link: long synchronisation
S = 2  # micro-batches per round
ROUNDS = 6  # more than a revision holds (horizon 2): the leader replans as rounds end
TASK_S = 0.3  # the stand-in's time per entry (the leader replans well within it)
ENV = {"HOPS_POLICY": "hare", "HOPS_TASK_RESEND_S": "1", "HOPS_TASK_HORIZON": "2",
       "HOPS_ESTIMATE_TIMEOUT_S": "2"}


def relaxed(job: str, params: int) -> JobSpec:
    return JobSpec(JobId(job), "resnet50", 32, params, 32 * S * ROUNDS, requirements=(1, 2),
                   sync_scale=S)


JOBS = (relaxed("small", 25_557_032), relaxed("large", 110_000_000))


class ExecutorStandIn:
    """Server ``s``'s executor, played by the test (module docstring)."""

    def __init__(self, bus: Bus, server: str = "s") -> None:
        self.bus, self.server = bus, ServerId(server)
        self.held: ev.TaskSequence | None = None
        self.done: dict[TaskKey, int] = {}  # entry -> the GPU it ran on
        self.entries: dict[TaskKey, TaskEntry] = {}  # each entry done, as it ran
        self.ran: dict[int, list[TaskKey]] = {}  # per GPU, in order
        self.reported_at: dict[TaskKey, float] = {}
        self.refused: list[str] = []
        self.terms: list[int] = []
        self.running: dict[int, TaskKey] = {}
        self.changed = asyncio.Event()

    async def start(self) -> ExecutorStandIn:
        await self.bus.nc.subscribe(subjects.task_sequence(self.server), cb=self._on_sequence)
        await asyncio.sleep(0)
        await self.bus.nc.flush()
        return self

    async def _on_sequence(self, msg: Msg) -> None:
        seq = ev.decode_task_event(msg.data)
        assert isinstance(seq, ev.TaskSequence)
        held = None if self.held is None else (self.held.term, self.held.revision)
        if held is not None and (seq.term, seq.revision) == held:
            return  # a resend of the revision held: nothing to do
        if held is not None and seq.term < held[0]:
            self.refused.append(f"older term {seq.term}")
            return
        lease_term = max(seq.term, held[0] if held else 0)
        why = follow_problem(lease_term, held, seq.term, seq.revision, seq.gpus, self.running,
                             self.done)
        if why is not None:
            self.refused.append(why)
            return
        self.held = seq
        self.terms.append(seq.term)
        self.changed.set()

    def _next(self, gpu: int) -> TaskEntry | None:
        """The GPU's first entry not done, if its job's earlier rounds are done."""
        assert self.held is not None
        mine = next((g.entries for g in self.held.gpus if g.gpu_index == gpu), ())
        head = next((e for e in mine if (e.job_id, e.round, e.lo) not in self.done), None)
        if head is None:
            return None
        waiting = any((e.job_id, e.round, e.lo) not in self.done and e.job_id == head.job_id
                      and e.round < head.round for g in self.held.gpus for e in g.entries)
        return None if waiting else head

    async def run_gpu(self, gpu: int) -> None:
        while True:
            entry = self._next(gpu) if self.held is not None else None
            if entry is None:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.2)
                continue
            key = (entry.job_id, entry.round, entry.lo)
            self.running[gpu] = key
            started = time.time()
            await asyncio.sleep(TASK_S)
            # done here before it is reported: a revision the report leads to
            # no longer holds the entry
            del self.running[gpu]
            self.done[key] = gpu
            self.entries[key] = entry
            self.ran.setdefault(gpu, []).append(key)
            await self.report(entry, gpu, started)
            self.changed.set()

    async def report(self, entry: TaskEntry, gpu: int, started: float,
                     msg_id: str | None = None) -> None:
        assert self.held is not None
        done = ev.TaskDone(term=self.held.term, revision=self.held.revision, job_id=entry.job_id,
                           round=entry.round, lo=entry.lo, hi=entry.hi, server_id=self.server,
                           gpu_index=gpu, started_at=started, ended_at=time.time(),
                           at=time.time())
        key = subjects.task_done_id(self.server, entry.job_id, entry.round, entry.lo)
        if msg_id is None:  # a first report (not a resend): when it went out
            self.reported_at[(entry.job_id, entry.round, entry.lo)] = time.time()
        await self.bus.js.publish(subjects.task_done(self.server, entry.job_id), ev.encode(done),
                                  headers={"Nats-Msg-Id": msg_id or key})


async def setup(stack: Stack, bus: Bus, replicas: int) -> tuple[list[Service], ExecutorStandIn]:
    await bus.put_nodes((("s", SLOW, 2),))
    await stack.start("services.estimator")
    leaders = [await stack.start("services.scheduler", HOPS_REPLICA_ID=f"r{i}", **ENV)
               for i in range(replicas)]
    await eventually(lambda: _async(any(r.find("elected leader") for r in leaders)), 15,
                     "a leader elected")
    leaders.sort(key=lambda r: r.find("elected leader") is None)  # the leader first
    executor = await ExecutorStandIn(bus).start()
    for spec in JOBS:
        assert (await bus.submit(spec)).ok
        await bus.profile(spec.id, "s", "A")  # the estimator answers from a profile
    return leaders, executor


def switches(keys: list[TaskKey]) -> int:
    return sum(1 for a, b in itertools.pairwise(keys) if a[0] != b[0])


def finished_events(bus: Bus) -> list[ev.JobFinished]:
    return [e for e in bus.events if isinstance(e, ev.JobFinished)]


async def both_finish(bus: Bus, timeout: float) -> None:
    for spec in JOBS:
        rec = await bus.wait_phase(spec.id, "finished", timeout=timeout)
        assert rec.samples_done == spec.total_samples


async def test_two_relaxed_jobs_interleave_on_a_gpu_and_finish(stack: Stack, bus: Bus) -> None:
    (leader,), executor = await setup(stack, bus, 1)
    gpus = [asyncio.create_task(executor.run_gpu(i)) for i in (0, 1)]
    try:
        await leader.wait_log("task sequences issued", timeout=20, jobs=["large", "small"])
        for spec in JOBS:
            started = await bus.wait_phase(spec.id, "running", timeout=10)
            assert started.configuration is not None
            assert started.configuration.servers == (ServerId("s"),)
        # a forged report: server t names an entry of s's sequence, on its own subject
        assert executor.held is not None
        entry = executor.held.gpus[0].entries[-1]
        forged = ev.TaskDone(term=executor.held.term, revision=executor.held.revision,
                             job_id=entry.job_id, round=entry.round, lo=entry.lo, hi=entry.hi,
                             server_id=ServerId("t"), gpu_index=0, started_at=0.0, ended_at=1.0,
                             at=1.0)
        await bus.js.publish(subjects.task_done("t", entry.job_id), ev.encode(forged))
        error = await bus.wait_error("task_refused")
        assert "t:0 has no entry" in error.error
        await both_finish(bus, timeout=40)
    finally:
        for task in gpus:
            task.cancel()
    # every micro-batch of every round ran once, and the forged report changed nothing:
    # each job finished after its last entry was reported, not before
    ran = [k for keys in executor.ran.values() for k in keys]
    assert len(ran) == len(set(ran))
    for spec in JOBS:
        rounds = rounds_of(spec.total_samples, S, spec.batch_size)
        mine = sorted(k for k in ran if k[0] == spec.id)
        assert {r for _, r, _ in mine} == set(range(rounds))
        (end,) = [e for e in finished_events(bus) if e.job_id == spec.id]
        assert end.at >= max(executor.reported_at[k] for k in mine)
    # Hare put tasks of the other job inside a round on one GPU (Fig. 1c)
    assert any(switches(keys) >= 2 for keys in executor.ran.values()), executor.ran
    assert executor.refused == [], executor.refused
    assert leader.find("task report refused", reason=error.error.split(": ", 1)[1]) is not None


async def test_a_new_leader_resumes_the_sequences(stack: Stack, bus: Bus) -> None:
    (first, second), executor = await setup(stack, bus, 2)
    gpus = [asyncio.create_task(executor.run_gpu(i)) for i in (0, 1)]
    try:
        await first.wait_log("round applied", timeout=30)
        old_term = first.find("elected leader")["term"]  # type: ignore[index]
        first.kill()  # SIGKILL mid-sequence: the lease must expire
        await first.wait()
        elected = await second.wait_log("elected leader", timeout=TTL + 8)
        assert elected["term"] > old_term
        # the executor re-sends every report it made so far under new message ids
        # (stored again): the leader counts each entry once
        again = list(executor.done.items())
        assert again
        for key, gpu in again:
            await executor.report(executor.entries[key], gpu, 0.0,
                                  msg_id=f"{executor.server}:{key[0]}:{key[1]}:{key[2]}:again")
        await both_finish(bus, timeout=60)
    finally:
        for task in gpus:
            task.cancel()
    # the new leader's revisions were followed: no started entry ever moved
    assert elected["term"] in executor.terms, (executor.terms, executor.refused)
    assert executor.refused == [], executor.refused
    ran = [k for keys in executor.ran.values() for k in keys]
    assert len(ran) == len(set(ran))
    for spec in JOBS:
        (end,) = [e for e in finished_events(bus) if e.job_id == spec.id]
        mine = [k for k in ran if k[0] == spec.id]
        assert end.at >= max(executor.reported_at[k] for k in mine)
        applied = [x["applied"] for x in second.lines_with("round applied")
                   if x.get("job_id") == spec.id]
        assert applied == sorted(set(applied)) and max(applied) == ROUNDS
    loaded = second.find("task state loaded")
    assert loaded is not None and loaded["from_term"] == old_term
