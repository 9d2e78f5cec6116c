"""The aggregator service (docs/hare.md §7, "Step 3b") as its own process,
under its NATS identity, against a real nats-server with authentication
on. The test plays the leader (task sequences, job events, as ``admin``)
and two servers' executors (``executor-a``, ``executor-b``), which compute
their tasks' gradients with :func:`hops.trainer.task_gradients` on
``examples/train_cnn.py`` (113,738 parameters: a report of two
micro-batches is two chunks) and send them with
:func:`executor.gradients.send_gradients`.

- Two servers' tasks of one job, interleaved within each round, reach the
  parameters of the one-process loop (:func:`hops.trainer.reference_rounds`)
  bitwise, and so do the job's final parameters (``<job>/final``); each
  round is published applied once.
- Forged input is refused and changes nothing: another server's subject
  (NATS refuses it: nothing stored), a report of an entry sequenced to
  another server (``not_sequenced``), a body naming another job
  (``other_job``), lying tensors (``bad_tensor``), a resend (counted once).
  A report of round 2 sent before round 0 is applied waits for round 1.
- Two shards (``HOPS_AGGREGATOR_SHARD`` 0/2 and 1/2): the job's shard
  aggregates it bitwise, the other hosts nothing, answers nothing and
  refuses nothing, also when it is killed.
- kill -9 mid-round, after one server's task of the round was counted, and
  the leader's next revision no longer lists that task: the restarted
  service restores the checkpoint, replays the stream, keeps the grant,
  and the rounds resume; nothing is applied twice.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats
import nats.errors
import pytest
import torch
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from executor.gradients import fetch_params, send_gradients
from hops.aggregator.codec import decode_params
from hops.trainer import TaskJob, encode_tensors, load_task, reference_rounds, task_gradients
from hops.trainer.spec import task_config
from services.aggregator.rules import shard_of
from services.runtime.bus import JetStreamLayout, connect, ensure_jetstream
from services.runtime.identity import ADMIN, AGGREGATOR, executor_identity
from services.runtime.objects import get_object
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.gradients import GradientChunk, decode_applied, encode, final_name, split
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry
from tests.natsfix import secured_nats
from tests.test_live_scheduler import ROOT, Service, eventually

S, ROUNDS, BATCH = 3, 3, 2
J = JobId("cnn")
A, B = ServerId("a"), ServerId("b")
SPEC = JobSpec(J, "resnet18", BATCH, 113_738, S * ROUNDS * BATCH, requirements=(1, 2),
               sync_scale=S, command=("python", "examples/train_cnn.py", "--dataset-size",
                                      "64", "--seed", "3"))
# Each round: a runs micro-batches 0..1, b micro-batch 2 (round 1: the other way).
SPLIT = {0: {A: (0, 2), B: (2, 3)}, 1: {B: (0, 1), A: (1, 3)}, 2: {A: (0, 2), B: (2, 3)}}
# HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S: round 2, sent early, waits this long for
# rounds 0 and 1 to be applied (seconds on a loaded machine)
WAIT_S = 5.0


def load() -> TaskJob:
    return load_task(ROOT / "examples" / "train_cnn.py", task_config(SPEC))


def reference() -> dict[str, torch.Tensor]:
    job = load()
    reference_rounds(job, S, ROUNDS)
    return {n: p.detach().clone() for n, p in job.model.named_parameters()}


def sequence(server: ServerId, revision: int, rounds: range) -> ev.TaskSequence:
    entries = tuple(TaskEntry(J, r, *SPLIT[r][server], float(r), float(r) + 0.5)
                    for r in rounds)
    return ev.TaskSequence(term=1, revision=revision, server_id=server, at=0.0,
                           gpus=(GpuTasks(0, entries),), policy="hare", specs=(SPEC,))


@dataclass
class Cluster:
    """The secured nats-server, the aggregator process and the test's clients."""

    runtime: Callable[[str], RuntimeSettings]
    tmp: Path
    admin: NATS
    executors: dict[ServerId, NATS]
    trainers: dict[ServerId, TaskJob] = field(default_factory=dict)
    services: list[Service] = field(default_factory=list)
    errors: list[ev.ErrorRecord] = field(default_factory=list)

    async def start_aggregator(self, shard: str = "0/1") -> Service:
        settings = self.runtime(AGGREGATOR)
        env = os.environ | {"HOPS_NATS_URL": settings.nats_url,
                            "HOPS_NATS_NKEY": str(settings.nats_nkey), "PYTHONPATH": str(ROOT),
                            "HOPS_AGGREGATOR_ROOT": str(ROOT),
                            "HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S": str(WAIT_S),
                            "HOPS_AGGREGATOR_SHARD": shard}
        service = Service("services.aggregator", env,
                          self.tmp / f"aggregator-{len(self.services)}.log")
        self.services.append(service)
        await service.start()
        await service.wait_log("aggregating", timeout=60)
        return service

    async def sequence(self, server: ServerId, revision: int, rounds: range) -> None:
        await self.admin.publish(subjects.task_sequence(server),
                                 ev.encode(sequence(server, revision, rounds)))
        await self.admin.flush()

    async def run(self, server: ServerId, round_: int) -> None:
        """``server``'s task of ``round_``: its gradients computed and sent."""
        lo, hi = SPLIT[round_][server]
        grads = task_gradients(self.trainers[server], round_, lo, hi, S)
        sent = await send_gradients(self.executors[server].jetstream(), server, J,
                                    round_=round_, lo=lo, gradients=grads, gpu_index=0,
                                    term=1, revision=1)
        assert sent == 2 if hi - lo == 2 else sent == 1

    async def take_params(self, applied: int) -> None:
        """Each trainer loads the parameters after ``applied`` rounds."""
        async def ready() -> tuple[int, dict[str, torch.Tensor]] | None:
            got = await fetch_params(self.executors[A], J)
            return got if got[0] == applied else None

        _, params = await eventually(ready, 30, f"round {applied - 1} applied")
        for trainer in self.trainers.values():
            trainer.model.load_state_dict(params)

    async def applied(self) -> list[int]:
        js = self.admin.jetstream()
        info = await js.stream_info(subjects.STREAM_AGG_APPLIED.name)
        sub = await js.subscribe(subjects.agg_applied(J), ordered_consumer=True)
        out = [decode_applied((await sub.next_msg(timeout=5)).data).round
               for _ in range(info.state.messages)]
        await sub.unsubscribe()
        return out

    async def final(self) -> dict[str, torch.Tensor]:
        async def saved() -> bytes | None:
            return await get_object(self.admin.jetstream(), subjects.OBJ_AGGREGATOR,
                                    final_name(J))

        return decode_params(await eventually(saved, 30, "final parameters saved"))

    async def wait_error(self, code: str) -> ev.ErrorRecord:
        async def probe() -> ev.ErrorRecord | None:
            return next((e for e in self.errors if e.code == code), None)

        return await eventually(probe, 15, f"an error record {code}")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Callable[[str], RuntimeSettings]]:
    identities = [ADMIN, AGGREGATOR, executor_identity(A), executor_identity(B)]
    with secured_nats(tmp_path, identities) as runtime:
        yield runtime


@pytest.fixture
async def cluster(secured: Callable[[str], RuntimeSettings],
                  tmp_path: Path) -> AsyncIterator[Cluster]:
    admin = await connect(secured(ADMIN), "test")
    await ensure_jetstream(admin.jetstream(), JetStreamLayout())
    executors = {s: await connect(secured(executor_identity(s)), f"executor-{s}")
                 for s in (A, B)}
    c = Cluster(secured, tmp_path, admin, executors, {A: load(), B: load()})

    async def on_error(msg: Msg) -> None:
        c.errors.append(ev.decode_error_record(msg.data))

    await admin.subscribe(subjects.ERRORS, cb=on_error)
    try:
        yield c
    finally:
        for service in c.services:
            await service.stop()
        for nc in (admin, *executors.values()):
            await nc.close()
        for service in c.services:
            assert not service.errors(), service.tail()


def assert_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), "parameters differ"


async def forge(c: Cluster) -> None:
    """Round 0's forgeries, before its real tasks (module docstring)."""
    a_js = c.executors[A].jetstream(timeout=1)
    grads = task_gradients(c.trainers[A], 0, 0, 2, S)
    with pytest.raises(nats.errors.TimeoutError):  # b's subject: NATS refuses it
        await send_gradients(a_js, B, J, round_=0, lo=2, gradients=grads[:1], gpu_index=0,
                             term=1, revision=1)
    # b's entry (micro-batch 2), from a, on a's own subject: no grant
    await send_gradients(a_js, A, J, round_=0, lo=2, gradients=grads[:1], gpu_index=0,
                         term=1, revision=1)
    await c.wait_error("not_sequenced")
    # a body naming another job on the job's subject
    lie = GradientChunk(job_id=JobId("other"), round=0, lo=0, hi=1, gpu_index=0, term=1,
                        revision=1, chunk=0, chunks=1, size=0, data=b"")
    await a_js.publish(subjects.grads(A, J, 0), encode(lie), headers={"Nats-Msg-Id": "lie-1"})
    await c.wait_error("other_job")
    # a's own entry with tensors that lie (the shape says more than the bytes)
    lying = encode_tensors({"w": torch.zeros(4)})
    lying[0]["shape"] = [4, 4]
    payload = msgspec.msgpack.encode([lying, lying])
    part = split(payload)[0]
    chunk = GradientChunk(job_id=J, round=0, lo=0, hi=2, gpu_index=0, term=1, revision=1,
                          chunk=0, chunks=1, size=len(payload), data=part)
    await a_js.publish(subjects.grads(A, J, 0), encode(chunk), headers={"Nats-Msg-Id": "lie-2"})
    await c.wait_error("bad_tensor")
    info = await c.admin.jetstream().stream_info(subjects.STREAM_GRADS.name,
                                                 subjects_filter=subjects.grads(B, J, 0))
    assert not info.state.subjects  # nothing stored on b's subject


async def test_two_servers_tasks_reach_one_process_bitwise_and_forgeries_change_nothing(
        cluster: Cluster) -> None:
    c = cluster
    want = reference()
    await c.start_aggregator()
    await c.sequence(A, 1, range(ROUNDS))
    await c.sequence(B, 1, range(ROUNDS))
    await c.services[0].wait_log("job hosted", job_id=J)
    await forge(c)
    # a's task of round 2, from a trainer two rounds ahead, before round 0
    # is applied: it waits for round 1 (not refused round_ahead)
    ahead = load()
    reference_rounds(ahead, S, 2)
    await send_gradients(c.executors[A].jetstream(), A, J, round_=2, lo=0,
                         gradients=task_gradients(ahead, 2, 0, 2, S), gpu_index=0, term=1,
                         revision=1)
    for round_ in range(ROUNDS):
        await c.run(A, round_)
        if round_ == 1:
            await c.run(A, round_)  # sent twice: stored once, counted once
        await c.run(B, round_)
        await c.take_params(round_ + 1)
    assert_bitwise({n: p.detach() for n, p in c.trainers[A].model.named_parameters()}, want)
    assert_bitwise(await c.final(), want)
    assert await c.applied() == list(range(ROUNDS))
    assert not c.services[0].find("refused", code="round_ahead")
    await c.admin.jetstream().publish(subjects.job_events(J), ev.encode(
        ev.JobFinished(job_id=J, at=0.0)))
    await c.services[0].wait_log("job dropped", job_id=J)


async def test_kill_9_mid_round_resumes_and_applies_nothing_twice(cluster: Cluster) -> None:
    c = cluster
    want = reference()
    first = await c.start_aggregator()
    await c.sequence(A, 1, range(ROUNDS))
    await c.sequence(B, 1, range(ROUNDS))
    await first.wait_log("job hosted", job_id=J)
    await c.run(A, 0)
    await c.run(B, 0)
    await c.take_params(1)
    await c.run(B, 1)  # round 1's first task, counted; then the service is killed
    await first.wait_log("gradients counted", round=1)
    first.kill()
    await first.wait()
    # the leader no longer lists b's task of round 1 (reported done)
    await c.admin.publish(subjects.task_sequence(B), ev.encode(ev.TaskSequence(
        term=1, revision=2, server_id=B, at=0.0, policy="hare", specs=(SPEC,),
        gpus=(GpuTasks(0, (TaskEntry(J, 2, 2, 3, 2.0, 2.5),)),))))
    second = await c.start_aggregator()
    restored = await second.wait_log("job restored", job_id=J)
    assert restored["applied"] == 1
    await c.run(A, 1)
    await c.take_params(2)
    await c.run(A, 2)
    await c.run(B, 2)
    await c.take_params(3)
    assert_bitwise(await c.final(), want)
    assert await c.applied() == list(range(ROUNDS))
    assert not second.find("refused", code="not_sequenced")
    # round 0 applied before the kill, rounds 1 and 2 after: each once
    assert [x["round"] for x in first.lines_with("round applied")] == [0]
    assert [x["round"] for x in second.lines_with("round applied")] == [1, 2]


async def test_two_shards_one_aggregates_the_job_the_other_passes_over_it(
        cluster: Cluster) -> None:
    c = cluster
    want = reference()
    assert shard_of(J, 2) == 1
    other = await c.start_aggregator("0/2")  # first: a reply of its own would come first
    owner = await c.start_aggregator("1/2")
    await c.sequence(A, 1, range(ROUNDS))
    await c.sequence(B, 1, range(ROUNDS))
    await owner.wait_log("job hosted", job_id=J)
    for round_ in range(ROUNDS):
        await c.run(A, round_)
        await c.run(B, round_)
        await c.take_params(round_ + 1)
        if round_ == 0:
            other.kill()  # the other shard's death changes nothing for this job
            await other.wait()
    assert_bitwise(await c.final(), want)
    assert await c.applied() == list(range(ROUNDS))
    assert not other.find("job hosted") and not other.find("refused")
    assert not other.find("gradients counted")
    c.services.remove(other)  # killed on purpose: its exit is no error
