"""The placer applying plans to two EMULATED executor processes, against a
real nats-server: starts (one job over both servers), profiling runs,
stops and resizes with the progress of the stop acks, plans of a deposed
leader and of a term no leader held, plans the placer cannot fully carry
out, fill plans.

The test plays the scheduler: it holds the leader lease in ``hops_leader``,
writes ``hops_jobs`` and publishes ``plan_issued`` on ``HOPS_PLANS``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import TypeVar

import pytest

from scheduling.live.lease import LEASE_KEY, LeaseValue, encode_value
from services.runtime.bus import publish_event
from shared import events as ev
from shared import subjects
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.records import Placement
from shared.snapshot import Assignment, Plan, ProfilingTask
from tests.test_live_executor import (
    S0,
    S1,
    Client,
    Procs,
    client,
    eventually,
    job_pids,
    nats_server,
    nats_url,
    procs,
    spec,
    start_cmd,
)

__all__ = ["client", "nats_server", "nats_url", "procs"]  # fixtures
LEASE_REFRESH_S = 1.0  # the bucket's TTL is 5 s


def plan(
    term: int,
    round_: int,
    assign: Mapping[str, Mapping[str, int]],
    profile: Mapping[str, str] | None = None,
    first: bool = True,
) -> ev.PlanIssued:
    body = Plan(
        assignments=tuple(Assignment(JobId(j), Configuration.of(c)) for j, c in assign.items()),
        profiling=tuple(
            ProfilingTask(JobId(j), GpuType("RTX3090"), ServerId(s))
            for j, s in (profile or {}).items()
        ),
    )
    return ev.PlanIssued(round=round_, term=term, plan=body, at=time.time(), first_plan=first)


async def allocations(client: Client) -> dict[str, Placement]:
    kv = await client.js.key_value(subjects.KV_ALLOC)
    try:
        keys = await kv.keys()
    except Exception:
        return {}
    out = {}
    for key in keys:
        p = await client.placement(key)
        if p is not None:
            out[key] = p
    return out


async def settle(
    client: Client, want: Mapping[str, Mapping[str, int]], timeout: float = 30.0
) -> dict[str, Placement]:
    """Wait until ``hops_alloc`` holds exactly ``want`` (job -> configuration)."""
    deadline = time.monotonic() + timeout
    while True:
        current = await allocations(client)
        if {j: p.configuration.as_dict() for j, p in current.items()} == want:
            return current
        assert time.monotonic() < deadline, f"hops_alloc is {current}, not {want}"
        await asyncio.sleep(0.1)


def booked_once(allocs: Mapping[str, Placement]) -> None:
    """Every placement books as many GPUs as its configuration, each GPU once."""
    seen: set[tuple[str, int]] = set()
    for p in allocs.values():
        assert {s: len(i) for s, i in p.gpu_indices.items()} == p.configuration.as_dict()
        for s, idx in p.gpu_indices.items():
            for i in idx:
                assert (s, i) not in seen, f"GPU {i} of {s} booked twice"
                seen.add((s, i))


E = TypeVar("E", bound=ev.Message)


class Stack:
    """Monitor, two executors and the placer; what the test sees of them.
    The test holds the leader lease (term :attr:`term`), refreshing it as a
    leader does."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.events: list[ev.JobEvent] = []
        self.errors: list[ev.ErrorRecord] = []
        self.skipped: list[ev.PlanEntrySkipped] = []
        self.beats: dict[str, list[ev.NodeHeartbeat]] = {}
        self.term = 1
        self._lease: asyncio.Task[None] | None = None

    async def start(self, procs: Procs, monitor_env: Mapping[str, str] | None = None,
                    executor_env: Mapping[str, str] | None = None) -> None:
        self._lease = asyncio.create_task(self._hold_lease())
        procs.monitor(**(monitor_env or {}))
        procs.executor(S0, **(executor_env or {}))
        procs.executor(S1, **(executor_env or {}))
        procs.start("placer", "services.placer", HOPS_COMMAND_TIMEOUT_S="15")
        await self.client.wait_node(S0)
        await self.client.wait_node(S1)
        self.events = await self.client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
        self.errors = await self.client.collect(subjects.ERRORS, ev.decode_error_record)
        self.skipped = await self.client.collect(subjects.PLACER_SKIPPED,
                                                 ev.decode_plan_entry_skipped)
        for s in (S0, S1):
            self.beats[s] = await self.client.collect(subjects.node_heartbeat(s),
                                                      ev.decode_node_heartbeat)

    async def lead(self, term: int) -> None:
        """A new leader, of ``term``, holds the lease from now on."""
        self.term = term
        await self._write_lease()

    async def _write_lease(self) -> None:
        kv = await self.client.js.key_value(subjects.KV_LEADER)
        await kv.put(LEASE_KEY, encode_value(LeaseValue(holder="test", term=self.term)))

    async def _hold_lease(self) -> None:
        while True:
            await self._write_lease()
            await asyncio.sleep(LEASE_REFRESH_S)

    async def close(self) -> None:
        if self._lease is not None:
            self._lease.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._lease, 10)  # bounded, as the client's close

    async def publish(self, issued: ev.PlanIssued) -> None:
        await publish_event(self.client.js, subjects.PLANS, issued)

    async def running(self, want: Mapping[str, set[str]]) -> None:
        """Wait until each server's heartbeat lists exactly these jobs."""

        def holds() -> bool:
            return all(bool(self.beats[s]) and set(self.beats[s][-1].running) == jobs
                       for s, jobs in want.items())

        await eventually(holds, 10, f"executors running {want}")

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
async def stack(client: Client) -> AsyncIterator[Stack]:
    s = Stack(client)
    try:
        yield s
    finally:
        await s.close()


async def test_plans_start_stop_and_resize_jobs(procs: Procs, client: Client,
                                                stack: Stack) -> None:
    await stack.start(procs)
    for job in ("a", "b", "p", "d", "e", "f", "x"):
        await client.put_job(spec(job), phase="profiling" if job == "p" else "queued")
    await client.put_job(spec("q"), phase="finished")

    # round 1: a job over both servers, a profiling run, and two the placer skips:
    # the cluster overtook the plan (a job that ended, a server not there), a
    # benign race, not an error
    await stack.publish(plan(1, 1, {"a": {S0: 1}, "b": {S0: 2, S1: 2}, "q": {S1: 1},
                                    "d": {"nowhere": 1}}, profile={"p": S1}))
    allocs = await settle(client, {"a": {S0: 1}, "b": {S0: 2, S1: 2}, "p": {S1: 1}})
    booked_once(allocs)
    assert allocs["p"].mode == "profile" and allocs["b"].mode == "run"
    await eventually(lambda: len(stack.skipped) >= 2, what="skipped plan entries")
    assert sorted((e.reason, e.job_id) for e in stack.skipped) == [
        ("job_ended", "q"), ("server_gone", "d")]
    assert not [e for e in stack.errors if e.subject == subjects.PLANS], stack.errors
    await stack.running({S0: {"a", "b"}, S1: {"b", "p"}})
    # a profiling run is no start of the job
    assert sorted(e.job_id for e in stack.of(ev.JobStarted)) == ["a", "b"]

    # round 2: b leaves, a moves, e takes the GPUs b gave back
    await stack.publish(plan(1, 2, {"a": {S1: 1}, "e": {S0: 3}}))
    booked_once(await settle(client, {"a": {S1: 1}, "e": {S0: 3}, "p": {S1: 1}}))
    await stack.running({S0: {"e"}, S1: {"a", "p"}})
    stopped, resized = stack.of(ev.JobStopped), stack.of(ev.JobResized)
    assert [(e.job_id, e.reason) for e in stopped] == [("b", "not in the plan")]
    assert stopped[0].samples_done is not None and stopped[0].samples_done > 0
    assert [(e.job_id, e.configuration.as_dict()) for e in resized] == [("a", {S1: 1})]
    assert resized[0].samples_done is not None and resized[0].samples_done > 0

    # a new leader: a plan of the deposed one changes nothing (x would fit), nor does one
    # of a term no leader held; the new leader's fill plan only adds
    await stack.lead(2)
    await stack.publish(plan(1, 9, {"x": {S0: 1}}))
    await stack.publish(plan(10**12, 9, {"x": {S0: 1}}))
    await stack.publish(plan(2, 1, {"f": {S1: 2}}, first=False))
    want = {"a": {S1: 1}, "e": {S0: 3}, "p": {S1: 1}, "f": {S1: 2}}
    booked_once(await settle(client, want))
    assert not any(e.job_id == "x" for e in stack.events)
    await stack.running({S0: {"e"}, S1: {"a", "p", "f"}})
    forged = [e for e in stack.errors if "no leader has held it" in e.error]
    assert [(e.code, e.service) for e in forged] == [("invalid", "placer")]


async def test_a_start_refused_on_one_server_is_undone(procs: Procs, client: Client,
                                                       stack: Stack) -> None:
    await stack.start(procs)
    # a process the placer does not know of holds GPU 3 of S1
    assert (await client.command(S1, start_cmd("squat", spec("squat"), S1, {S1: 1}, (3,)))).ok
    await client.put_job(spec("g"))
    await stack.publish(plan(1, 1, {"g": {S0: 1, S1: 4}}))
    await eventually(lambda: any(e.code == "start_failed" for e in stack.errors), 20,
                     "start_failed")
    failed = next(e for e in stack.errors if e.code == "start_failed")
    assert "conflict" in failed.error and S1 in failed.error
    # it had started on S0, and was stopped there again before the report
    assert '"reason": "start failed"' in procs.log(f"executor-{S0}")
    await stack.running({S0: set(), S1: {"squat"}})
    assert await client.placement("g") is None and not stack.of(ev.JobStarted)


async def test_a_new_placer_adopts_what_its_predecessor_started(procs: Procs, client: Client,
                                                                stack: Stack) -> None:
    """Starts sent by a placer that died before their acks (the test sends
    them): a job running as the new plan asks is adopted (its placement
    written, job_started once, no start_failed, one process); a job running
    on one of its two servers only is stopped and started again on both."""
    await stack.start(procs)
    for job in ("w", "v"):
        await client.put_job(spec(job))
    # on GPUs 2 and 3, where the new placer's booking will say 0 and 1
    whole = start_cmd("start:t1.r1.p1:w@s0", spec("w"), S0, {S0: 2}, (2, 3))
    half = start_cmd("start:t1.r1.p1:v@s0", spec("v"), S0, {S0: 1, S1: 1}, (1,))
    assert (await client.command(S0, whole)).ok and (await client.command(S0, half)).ok
    await stack.running({S0: {"w", "v"}, S1: set()})
    pid = job_pids("w")
    await stack.publish(plan(1, 2, {"w": {S0: 2}, "v": {S0: 1, S1: 1}}))
    await eventually(lambda: any(e.code == "start_failed" for e in stack.errors), 20,
                     "v's start undone")
    failed = [e for e in stack.errors if e.code == "start_failed"]
    assert len(failed) == 1 and "job v could not start" in failed[0].error, failed
    assert f"already ran on {S0} from an earlier start and started now on {S1}" in (
        failed[0].error)
    placed = await settle(client, {"w": {S0: 2}})
    assert placed["w"].gpu_indices == {S0: (2, 3)}  # where it runs
    await eventually(lambda: [e.job_id for e in stack.of(ev.JobStarted)] == ["w"], 10,
                     "w started once")
    assert job_pids("w") == pid  # the same process: adopted, not restarted
    await stack.running({S0: {"w"}, S1: set()})  # v stopped on both
    await stack.publish(plan(1, 3, {"w": {S0: 2}, "v": {S0: 1, S1: 1}}))
    booked_once(await settle(client, {"w": {S0: 2}, "v": {S0: 1, S1: 1}}))
    await stack.running({S0: {"w", "v"}, S1: {"v"}})
    await eventually(lambda: sorted(e.job_id for e in stack.of(ev.JobStarted)) == ["v", "w"],
                     10, "v started")
    assert len([e for e in stack.errors if e.code == "start_failed"]) == 1
    assert job_pids("w") == pid
