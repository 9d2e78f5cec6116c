"""A running job whose GPUs stay and whose CPU cores change is retuned in
place, not stopped and started: the placer's diff finds the retune and
books the difference (a growth that does not fit is refused, a shrink frees
cores for the plan's starts), and the service sends ``set_cores`` to each
server where the cores change, updating ``hops_alloc`` once every server
acknowledged, or putting the others back when one refused."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import nats.js.errors
import structlog
from nats.js.api import PubAck

from services.placer.booking import book_all
from services.placer.commands import Retune
from services.placer.diff import diff
from services.placer.service import Placer, PlacerSettings
from shared import events as ev
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.records import JobRecord, Placement
from shared.resources import Resources
from shared.snapshot import Assignment, Plan

A, B = ServerId("a"), ServerId("b")
CAP = {A: Resources(gpus=4, cores=8, memory_mb=1024), B: Resources(gpus=4, cores=8)}


def config(parts: Mapping[str, int], cores: Mapping[str, int] | None = None,
           memory_mb: int = 0) -> Configuration:
    extras = {ServerId(s): Resources(cores=(cores or {}).get(s, 0),
                                     memory_mb=memory_mb if s == A else 0) for s in parts}
    return Configuration.of(parts).with_extras(extras)


def placement(job: str, cfg: Configuration) -> Placement:
    idx: dict[ServerId, tuple[int, ...]] = {s: tuple(range(g)) for s, g in cfg.parts}
    return Placement(job_id=JobId(job), configuration=cfg, gpu_indices=idx, key="old")


def record(job: str) -> JobRecord:
    spec = JobSpec(JobId(job), "resnet18-cifar10", 32, 1000, 10**9, requirements=(1, 2, 4))
    return JobRecord(spec=spec, submitted_at=0.0, phase="running")


def plan(*assigned: tuple[str, Configuration]) -> Plan:
    return Plan(assignments=tuple(Assignment(JobId(j), c) for j, c in assigned))


JOBS = {JobId(j): record(j) for j in ("x", "y", "z")}


def test_same_gpus_other_cores_is_a_retune_not_a_resize() -> None:
    current = {JobId("x"): placement("x", config({A: 1, B: 1}, {A: 4, B: 2}))}
    new = config({A: 1, B: 1}, {A: 2, B: 2})
    cmds = diff(current, plan(("x", new)), True, JOBS, CAP, "p")
    assert not cmds.stops and not cmds.starts and not cmds.problems
    [r] = cmds.retunes
    assert r.servers == (A,)  # B keeps its 2 cores: no command for it
    assert r.retuned.configuration == new and r.retuned.gpu_indices == {A: (0,), B: (0,)}
    assert r.retuned.key == "old"  # the start that booked its GPUs


def test_unchanged_cores_are_left_alone_and_other_gpus_or_memory_resize() -> None:
    current = {JobId("x"): placement("x", config({A: 1}, {A: 4}, memory_mb=100))}
    same = diff(current, plan(("x", config({A: 1}, {A: 4}, memory_mb=100))), True, JOBS,
                CAP, "p")
    assert not same.stops and not same.starts and not same.retunes
    for other in (config({A: 2}, {A: 4}, memory_mb=100), config({A: 1}, {A: 4}, memory_mb=200)):
        cmds = diff(current, plan(("x", other)), True, JOBS, CAP, "p")
        assert [s.job_id for s in cmds.stops] == ["x"] and not cmds.retunes
        assert [s.resize for s in cmds.starts] == [True]


def test_a_growth_that_does_not_fit_is_refused_and_the_job_keeps_its_cores() -> None:
    current = {JobId("x"): placement("x", config({A: 1}, {A: 4})),
               JobId("y"): placement("y", config({A: 1}, {A: 3}))}
    cmds = diff(current, plan(("x", config({A: 1}, {A: 6})), ("y", config({A: 1}, {A: 3}))),
                True, JOBS, CAP, "p")
    assert not cmds.retunes and not cmds.stops
    assert [(p.job_id, p.code) for p in cmds.problems] == [("x", "conflict")]
    assert "cannot change its cores: a has 5 CPU cores free of 8, 6 needed" in \
        cmds.problems[0].error


def test_a_shrink_frees_cores_for_a_start_in_the_same_plan() -> None:
    current = {JobId("x"): placement("x", config({A: 1}, {A: 8}))}
    assigned = plan(("x", config({A: 1}, {A: 4})), ("y", config({A: 1}, {A: 4})))
    cmds = diff(current, assigned, True, JOBS, CAP, "p")
    assert [r.job_id for r in cmds.retunes] == ["x"]
    assert [s.job_id for s in cmds.starts] == ["y"] and not cmds.problems
    assert cmds.starts[0].placement.gpu_indices == {A: (1,)}
    # Without the shrink, y does not fit beside x.
    alone = diff(current, plan(("x", config({A: 1}, {A: 8})), ("y", config({A: 1}, {A: 4}))),
                 True, JOBS, CAP, "p")
    assert not alone.starts and [p.job_id for p in alone.problems] == ["y"]


def test_a_retune_giving_cores_back_is_booked_before_one_taking_them() -> None:
    # x grows where y shrinks, x first in the plan: together they fit.
    current = {JobId("x"): placement("x", config({A: 1}, {A: 2})),
               JobId("y"): placement("y", config({A: 1}, {A: 6}))}
    cmds = diff(current, plan(("x", config({A: 1}, {A: 6})), ("y", config({A: 1}, {A: 2}))),
                True, JOBS, CAP, "p")
    assert not cmds.problems, cmds.problems
    assert [(r.job_id, r.shrinks) for r in cmds.retunes] == [("y", True), ("x", False)]


def test_a_cpu_job_halved_is_a_retune() -> None:
    current = {JobId("z"): placement("z", Configuration.cpu(A, 4))}
    cmds = diff(current, plan(("z", Configuration.cpu(A, 2))), False, JOBS, CAP, "p")
    [r] = cmds.retunes
    assert r.configuration.cores_on(A) == 2 and r.placement.gpu_indices == {A: ()}


def test_an_mba_cap_alone_is_a_retune_on_every_server_of_the_job() -> None:
    current = {JobId("z"): placement("z", Configuration.cpu(A, 4))}
    capped = Configuration.cpu(A, 4, mba_percent=50)
    cmds = diff(current, plan(("z", capped)), False, JOBS, CAP, "p")
    [r] = cmds.retunes
    assert r.servers == (A,) and r.shrinks and r.retuned.configuration == capped
    assert not cmds.stops and not cmds.starts


def test_a_retune_on_a_server_not_alive_is_a_problem() -> None:
    current = {JobId("x"): placement("x", config({A: 1, B: 1}, {A: 4, B: 2}))}
    r = Retune(JobId("x"), current[JobId("x")], config({A: 1, B: 1}, {A: 4, B: 1}))
    booked = book_all((), (r,), current, {A: CAP[A]}, "p")
    assert not booked.retunes and [p.code for p in booked.problems] == ["unknown_server"]


# --- the service ------------------------------------------------------------------------


class FakeKv:
    """A fake ``hops_alloc``: the updates it was given, refusing a stale
    revision; written as a KV update or, as the placer writes it
    (:func:`services.runtime.retry.kv_write`), a publish on the bucket's
    subject expecting the key's last revision."""

    def __init__(self, revision: int) -> None:
        self.revision = revision
        self.updates: list[tuple[str, Placement, int]] = []

    async def update(self, key: str, value: bytes, last: int) -> int:
        if last != self.revision:
            raise nats.js.errors.KeyWrongLastSequenceError()
        self.updates.append((key, msgspec.json.decode(value, type=Placement), last))
        self.revision += 1
        return self.revision

    async def publish(self, subject: str, payload: bytes, timeout: float | None = None,
                      headers: dict[str, str] | None = None) -> PubAck:
        key = subject.removeprefix("$KV.hops_alloc.")
        last = int((headers or {}).get("Nats-Expected-Last-Subject-Sequence", self.revision))
        if last != self.revision:
            raise nats.js.errors.APIError(code=400, err_code=10071,
                                          description="wrong last sequence")
        return PubAck(stream="KV_hops_alloc", seq=await self.update(key, payload, last))


class FakeReporter:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, str]] = []

    async def report(self, where: str, error: str, code: str = "") -> None:
        self.reports.append((where, error, code))


def fake_placer(answers: Mapping[ServerId, bool]) -> tuple[Placer, list[ev.SetCores],
                                                            FakeKv, FakeReporter]:
    reporter = FakeReporter()
    kv = FakeKv(revision=5)
    ctx = SimpleNamespace(log=structlog.get_logger(), reporter=reporter, js=kv)
    placer = Placer(cast(Any, ctx), PlacerSettings(), clock=lambda: 7.0)
    sent: list[ev.SetCores] = []

    async def command(server: ServerId, cmd: Any) -> ev.CommandAck:
        sent.append(cmd)
        ok = answers[server] or cmd.key.startswith("uncores")
        return ev.CommandAck(key=cmd.key, ok=ok, code="" if ok else "conflict",
                             error="" if ok else "no cores", cores=(0,) if ok else ())

    placer._command = command  # type: ignore[method-assign]
    placer.kv_alloc = cast(Any, kv)
    return placer, sent, kv, reporter


async def test_the_service_sets_the_cores_then_updates_hops_alloc() -> None:
    old = placement("x", config({A: 1, B: 1}, {A: 4, B: 2}))
    r = Retune(JobId("x"), old, config({A: 1, B: 1}, {A: 1, B: 3}))
    placer, sent, kv, reporter = fake_placer({A: True, B: True})
    assert await placer._retune(r, "t1.r2.p3", revision=5)
    assert [(c.key, c.server_id, c.cores, c.at) for c in sent] == [
        ("cores:t1.r2.p3:x@a", A, 1, 7.0), ("cores:t1.r2.p3:x@b", B, 3, 7.0)]
    assert [(k, p.configuration, last) for k, p, last in kv.updates] == [
        ("x", r.configuration, 5)]
    assert not reporter.reports


async def test_the_service_sends_the_mba_cap_and_puts_it_back_on_a_refusal() -> None:
    old = placement("z", Configuration.cpu(A, 4))
    r = Retune(JobId("z"), old, Configuration.cpu(A, 4, mba_percent=20))
    placer, sent, kv, _ = fake_placer({A: True})
    assert await placer._retune(r, "t1.r2.p3", revision=5)
    assert [(c.server_id, c.cores, c.mba_percent) for c in sent] == [(A, 4, 20)]
    assert [p.configuration.mba_percent for _, p, _ in kv.updates] == [20]


async def test_a_refusal_puts_the_other_servers_back_and_keeps_hops_alloc() -> None:
    old = placement("x", config({A: 1, B: 1}, {A: 4, B: 2}))
    r = Retune(JobId("x"), old, config({A: 1, B: 1}, {A: 1, B: 3}))
    placer, sent, kv, reporter = fake_placer({A: True, B: False})
    assert not await placer._retune(r, "t1.r2.p3", revision=5)
    assert [(c.key, c.cores) for c in sent] == [
        ("cores:t1.r2.p3:x@a", 1), ("cores:t1.r2.p3:x@b", 3), ("uncores:t1.r2.p3:x@a", 4)]
    assert not kv.updates
    assert [(code, "b: conflict no cores" in error) for _, error, code in reporter.reports] == [
        ("retune_failed", True)]
