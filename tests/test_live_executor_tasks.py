"""The emulated executor follows Hare's task sequences, against a real
nats-server with the identities of ``hops up`` and a real executor process:
the test publishes ``task_sequence`` as the scheduler leader does (its
identity, resent every few tenths of a second) and reads the ``task_done``
reports the stream ``HOPS_TASK_DONE`` captured."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from cli.up.credentials import Credentials, ensure_credentials, write_auth
from executor.tasks import MOVES_STARTED, STALE_TERM, task_times
from hops.trainer.spec import NOT_TASK_READY
from services.runtime.bus import connect
from services.runtime.identity import ADMIN, SCHEDULER, executor_identity
from services.runtime.layout import ensure_jetstream
from services.runtime.natsd import EmbeddedNats
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry
from shared.wire import INVALID
from tests.test_live_executor import CLUSTER, Procs
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.hare import SWITCH_S
from world.truth import GroundTruth

S = ServerId("rtx3090-sugon-0")
J1, J2 = JobId("j1"), JobId("j2")
# T^c of one micro-batch on an RTX 3090 (the world model): about 0.36 s and 0.23 s.
SPECS = {J1: JobSpec(J1, "resnet50-imagenet", 128, 25_557_032, 10**6, requirements=(1,),
                     sync_scale=4),
         J2: JobSpec(J2, "resnet18-cifar10", 2048, 11_181_642, 10**6, requirements=(1,),
                     sync_scale=4)}
TRUTH = GroundTruth(cluster_arg(CLUSTER), builtin_catalog())
TIMES = {j: task_times(TRUTH, s, TRUTH.cluster.by_id[S].gpu_type, 1.0) for j, s in SPECS.items()}
RESEND_S = 0.3
Key = tuple[str, int, int]


@dataclass
class Leader:
    """The scheduler leader's side, as the test plays it; what it hears."""

    admin: NATS
    scheduler: NATS
    procs: Procs
    seed: Path
    reports: list[ev.TaskDone] = field(default_factory=list)
    errors: list[ev.ErrorRecord] = field(default_factory=list)
    current: ev.TaskSequence | None = None

    async def send(self, msg: ev.TaskSequence | bytes) -> None:
        data = msg if isinstance(msg, bytes) else ev.encode(msg)
        await self.scheduler.publish(subjects.task_sequence(S), data)
        await self.scheduler.flush()

    async def resend(self) -> None:
        """Every RESEND_S: the current revision again (the leader's resend)."""
        while True:
            if self.current is not None:
                await self.send(self.current)
            await asyncio.sleep(RESEND_S)

    async def executor(self, backend: str = "emulated") -> None:
        """Start the executor of S; return once it follows its sequences."""
        self.procs.executor(S, HOPS_NATS_NKEY=str(self.seed), HOPS_EXECUTOR_BACKEND=backend,
                            HOPS_ALLOW_ROOT_JOBS="1", HOPS_RUN_DIR=str(self.procs.tmp / "runs"))
        name = f"executor-{S}"
        await until(lambda: "following task sequences" in self.procs.log(name),
                    f"{name} following", timeout=60)

    def done(self) -> dict[Key, ev.TaskDone]:
        return {(r.job_id, r.round, r.lo): r for r in self.reports}

    def codes(self) -> list[str]:
        return [e.code for e in self.errors if e.subject == subjects.task_sequence(S)]


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"{what} never held"
        await asyncio.sleep(0.05)


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Leader]:
    creds = Credentials(tmp_path / "credentials")
    ensure_credentials(creds.dir, [ADMIN, SCHEDULER, executor_identity(S)])
    write_auth(creds.dir)
    with EmbeddedNats(tmp_path / "nats", auth_conf=creds.auth_conf) as server:
        def runtime(identity: str) -> RuntimeSettings:
            return RuntimeSettings(nats_servers=(server.url,), reconnect_wait=0.1,
                                   nats_nkey=str(creds.seed(identity)))

        admin = await connect(runtime(ADMIN), ADMIN)
        scheduler = await connect(runtime(SCHEDULER), SCHEDULER)
        await ensure_jetstream(admin.jetstream())
        procs = Procs(server.url, tmp_path)
        lead = Leader(admin, scheduler, procs, creds.seed(executor_identity(S)))

        async def on_done(msg: Msg) -> None:
            lead.reports.append(msgspec.json.decode(msg.data, type=ev.TaskDone))

        async def on_error(msg: Msg) -> None:
            lead.errors.append(msgspec.json.decode(msg.data, type=ev.ErrorRecord))

        await admin.subscribe(subjects.TASK_DONE_ALL, cb=on_done)
        await admin.subscribe(subjects.ERRORS, cb=on_error)
        await admin.flush()
        resending = asyncio.create_task(lead.resend())
        try:
            yield lead
        finally:
            resending.cancel()
            procs.stop_all()
            await scheduler.close()
            await admin.close()


def revision(term: int, rev: int, gpus: dict[int, list[TaskEntry]]) -> ev.TaskSequence:
    jobs = sorted({e.job_id for es in gpus.values() for e in es})
    return ev.TaskSequence(term=term, revision=rev, server_id=S, at=time.time(),
                           gpus=tuple(GpuTasks(i, tuple(es)) for i, es in sorted(gpus.items())),
                           policy="hare", specs=tuple(SPECS[j] for j in jobs))


def planned(t0: float, *parts: tuple[JobId, int, int, int]) -> list[TaskEntry]:
    """Entries back to back from ``t0``, each (job, round, lo, hi) its T^c · (hi - lo)."""
    out, t = [], t0
    for job, round_, lo, hi in parts:
        d = (hi - lo) * TIMES[job].compute_s
        out.append(TaskEntry(job, round_, lo, hi, t, t + d))
        t += d
    return out


async def stored_ids(leader: Leader) -> list[str]:
    js = leader.admin.jetstream()
    info = await js.stream_info(subjects.STREAM_TASK_DONE.name)
    ids: list[str] = []
    sub = await js.subscribe(subjects.TASK_DONE_ALL, ordered_consumer=True)
    for _ in range(info.state.messages):
        msg = await sub.next_msg(timeout=5)
        ids.append((msg.headers or {}).get("Nats-Msg-Id", ""))
    await sub.unsubscribe()
    return ids


async def test_each_gpu_runs_its_sequence_in_order_with_the_world_models_times(
        leader: Leader) -> None:
    """Two jobs interleaved on GPU 0 within round 0, one on GPU 1; the
    leader resends all along, a deposed leader and forgeries speak up while
    GPU 0 runs its first entry: every entry runs once, in order, as long as
    the world model says, and nothing else changes."""
    await leader.executor()
    t0 = time.time() + 0.3
    gpu0 = planned(t0, (J1, 0, 0, 2), (J2, 0, 0, 1), (J1, 0, 2, 4))
    gpu1 = planned(t0, (J2, 0, 1, 4))
    barrier = max(gpu0[-1].end_s + TIMES[J1].sync_s, gpu1[-1].end_s + TIMES[J2].sync_s)
    gpu0 += planned(barrier, (J1, 1, 0, 2))
    rev1 = revision(2, 1, {0: gpu0, 1: gpu1})
    leader.current = rev1
    await leader.send(rev1)
    await until(lambda: time.time() > t0 + 0.2, "the first entry runs")
    await leader.send(revision(2, 2, {0: gpu0[1:], 1: [gpu0[0]]}))  # moves the running entry
    await leader.send(revision(1, 9, {0: gpu0[1:]}))  # a deposed leader
    await leader.send(b'{"type": "task_sequence", "term": 2}')  # malformed
    body = msgspec.to_builtins(revision(2, 3, {0: gpu0}))
    body["gpus"][0]["entries"][1]["start_s"] = 0.0  # overlaps the entry before it
    await leader.send(msgspec.json.encode(body))
    every = {(e.job_id, e.round, e.lo) for e in gpu0 + gpu1}
    await until(lambda: set(leader.done()) == every, "every entry reported")
    await asyncio.sleep(3 * RESEND_S)  # resends go on: nothing more runs

    assert len(leader.reports) == len(every)  # each once
    assert sorted(await stored_ids(leader)) == sorted(f"{S}:{j}:{r}:{lo}" for j, r, lo in every)
    done = leader.done()
    for gpu, entries in ((0, gpu0), (1, gpu1)):
        ran = sorted((r for r in leader.reports if r.gpu_index == gpu), key=lambda r: r.started_at)
        assert [(r.job_id, r.round, r.lo, r.hi) for r in ran] == [
            (e.job_id, e.round, e.lo, e.hi) for e in entries]
        for e in entries:
            r = done[(e.job_id, e.round, e.lo)]
            assert (r.term, r.revision, r.server_id) == (2, 1, S)
            assert r.started_at >= e.start_s - 0.005  # not before its planned start
            want = (e.hi - e.lo) * TIMES[e.job_id].compute_s
            assert r.ended_at - r.started_at == pytest.approx(want, abs=0.03, rel=0.05)
            assert r.at - r.ended_at >= TIMES[e.job_id].sync_s - 0.005  # gradients sent
        for a, b in itertools.pairwise(ran):
            gap = b.started_at - a.ended_at
            assert gap >= (SWITCH_S if a.job_id != b.job_id else 0.0) - 0.001
    switches = [done[(J2, 0, 0)].started_at - done[(J1, 0, 0)].ended_at,
                done[(J1, 0, 2)].started_at - done[(J2, 0, 0)].ended_at]
    assert all(SWITCH_S - 0.001 <= s < SWITCH_S + 0.05 for s in switches), switches
    codes = leader.codes()
    assert sorted(codes) == sorted([MOVES_STARTED, STALE_TERM, INVALID, INVALID]), codes
    taken = leader.procs.log(f"executor-{S}").count("task sequence taken")
    assert taken == 1  # resends were no-ops


async def test_a_killed_executor_resumes_from_the_leaders_resend(leader: Leader) -> None:
    """kill -9 mid-entry: the restarted executor holds nothing, takes the
    next resend, and runs the entry it was running again, once."""
    await leader.executor()
    t0 = time.time() + 0.3
    gpu0 = planned(t0, (J1, 0, 0, 1), (J1, 0, 1, 4), (J2, 0, 0, 1))
    keys = [(e.job_id, e.round, e.lo) for e in gpu0]
    rev = 1
    leader.current = revision(2, rev, {0: gpu0})
    await until(lambda: keys[0] in leader.done(), "the first entry reported")
    await asyncio.sleep(0.3)  # the second runs (1.08 s)
    pid = leader.procs.procs[f"executor-{S}"].pid
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    leader.procs.procs[f"executor-{S}"].wait()
    assert keys[1] not in leader.done()
    # The leader has the first report: its next revision lists the rest.
    rev += 1
    leader.current = revision(2, rev, {0: gpu0[1:]})
    await leader.executor()
    await until(lambda: set(leader.done()) == set(keys), "every entry reported", timeout=60)
    await asyncio.sleep(3 * RESEND_S)
    assert len(leader.reports) == 3
    done = leader.done()
    assert done[keys[1]].started_at > killed  # run again, from its start
    assert done[keys[1]].revision == rev and done[keys[0]].revision == 1
    assert done[keys[2]].started_at >= done[keys[1]].ended_at + SWITCH_S - 0.001
    assert sorted(await stored_ids(leader)) == sorted(f"{S}:{j}:{r}:{lo}" for j, r, lo in keys)
    assert leader.codes() == []


async def test_the_real_backend_fails_a_job_that_cannot_run_as_tasks(leader: Leader) -> None:
    """A catalog job has no ``python <script.py>`` command for a resident
    trainer to load: the revision is taken (its other jobs would run), and
    that job fails with a stable code, once whatever the resends; nothing
    runs."""
    failed: list[ev.JobEvent] = []

    async def on_report(msg: Msg) -> None:
        failed.append(ev.decode_job_event(msg.data))

    await leader.admin.subscribe(subjects.reports(S, J1), cb=on_report)
    await leader.executor(backend="real")
    leader.current = revision(2, 1, {0: planned(time.time(), (J1, 0, 0, 1))})
    await until(lambda: bool(failed), "the job failed")
    await asyncio.sleep(4 * RESEND_S)
    assert [e.code for e in leader.errors] == [NOT_TASK_READY]  # recorded once
    assert leader.codes() == []  # the revision itself was not refused
    assert len(failed) == 1 and isinstance(failed[0], ev.JobFailed)
    assert failed[0].reason.startswith(f"{NOT_TASK_READY}: "), failed[0].reason
    assert leader.reports == []
