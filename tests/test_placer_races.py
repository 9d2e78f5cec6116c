"""Benign races in the placer: a plan entry the cluster overtook after the
plan was made (a job that ended meanwhile, a profiling run not yet released,
a profiling task for a job an earlier plan started, a server lost) is
skipped, logged at debug and counted apart, never an error record; a real
problem (an unknown job, a job assigned twice, GPUs that do not fit) stays
an error record."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families
from structlog import get_logger

from services.monitor.metrics import render, skipped_family
from services.placer.booking import book
from services.placer.commands import (
    ALREADY_RUNNING,
    JOB_ENDED,
    RACES,
    SERVER_GONE,
    STILL_PROFILING,
    Problem,
)
from services.placer.diff import changes
from services.placer.service import Placer, PlacerSettings
from services.runtime.bus import ErrorReporter
from services.runtime.service import ServiceContext
from services.runtime.settings import RuntimeSettings
from shared import subjects
from shared.configuration import Configuration
from shared.events import decode_error_record, decode_plan_entry_skipped
from shared.ids import GpuType, JobId, ServerId
from shared.snapshot import Assignment, Plan, ProfilingTask
from tests.test_live_pure_dataplane import CAP, assign, placement, record

A, B, C = ServerId("a"), ServerId("b"), ServerId("c")


def test_the_races_are_marked_and_the_errors_are_not() -> None:
    current = {"run": placement("run", {A: (0,)}),
               "prof": placement("prof", {B: (0,)}, "profile")}
    jobs = {j: record(j) for j in ("run", "prof", "x", "far")} | {
        "done": record("done", "finished")}
    plan = Plan(
        assignments=(*assign(x={A: 1}, done={A: 1}, ghost={A: 1}, prof={A: 1}, far={C: 1}),
                     Assignment(JobId("x"), Configuration.of({B: 1}))),
        profiling=(ProfilingTask(JobId("run"), GpuType("g"), B),),
    )
    ch = changes(current, plan, False, jobs)
    races = {(p.job_id, p.race) for p in ch.problems}
    assert races == {("done", JOB_ENDED), ("prof", STILL_PROFILING), ("run", ALREADY_RUNNING),
                     ("ghost", ""), ("x", "")}  # unknown job, assigned twice: errors
    _, problems = book(ch.wants, {}, CAP, "k")
    assert [(p.job_id, p.race) for p in problems] == [("far", SERVER_GONE)]
    # a start that does not fit the free GPUs is an error, not a race
    _, short = book(changes({}, Plan(assignments=assign(big={A: 8})), False,
                            {"big": record("big")}).wants, {}, CAP, "k")
    assert [(p.job_id, p.code, p.race) for p in short] == [("big", "conflict", "")]
    assert {p.race for p in ch.problems} - {""} <= RACES


class _Bus:
    """A NATS connection that keeps what is published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


def test_a_race_is_counted_apart_and_is_no_error_record() -> None:
    bus = _Bus()
    nc = cast(Any, bus)
    ctx = ServiceContext("placer", RuntimeSettings(), nc, cast(Any, None), get_logger(),
                         ErrorReporter(nc, "placer", clock=lambda: 7.0))
    placer = Placer(ctx, PlacerSettings(), clock=lambda: 7.0)
    asyncio.run(placer._problems([
        Problem(JobId("done"), "invalid", "job done is finished", JOB_ENDED),
        Problem(JobId("ghost"), "not_found", "job ghost is unknown to the scheduler"),
    ]))
    errors = [decode_error_record(d) for s, d in bus.sent if s == subjects.ERRORS]
    skipped = [decode_plan_entry_skipped(d) for s, d in bus.sent if s == subjects.PLACER_SKIPPED]
    assert [(e.code, e.error) for e in errors] == [
        ("not_found", "job ghost is unknown to the scheduler")]
    assert [(s.job_id, s.reason, s.at) for s in skipped] == [("done", JOB_ENDED, 7.0)]
    text = render([skipped_family({JOB_ENDED: 2, SERVER_GONE: 1})])
    m = {s.labels["reason"]: s.value for f in text_string_to_metric_families(text)
         for s in f.samples}
    assert m == {JOB_ENDED: 2, SERVER_GONE: 1}
