"""A job the placer stops is requeued with its progress, never failed, even
when its process falls silent for longer than the monitor's heartbeat
deadline while it stops.

Real processes against a real nats-server: the monitor judging deadlines,
two EMULATED executors and the placer; the test plays the scheduler
(:class:`tests.test_live_placer.Stack`). A job process that is slow to stop
is one held with SIGSTOP: it neither beats nor handles its SIGTERM until the
executor kills it at the end of the stop grace, as a job writing a long
checkpoint, or starved on a busy host, would. The monitor's own stop is
given a short timeout, so that before the fix its verdict (``heartbeat
lost``: ``job_failed``) came while the placer's stop was still going on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from shared import events as ev
from shared import subjects
from tests.test_live_executor import S0, S1, TIMEOUT_S, Client, Procs, eventually, job_pids, spec
from tests.test_live_placer import (
    Stack,
    client,
    nats_server,
    nats_url,
    plan,
    procs,
    settle,
    stack,
)

__all__ = ["client", "nats_server", "nats_url", "procs", "stack"]  # fixtures

STOP_GRACE_S = 5.0  # > the 2 s deadline: the stop outlasts the silence allowed
LONG, MOVED = "preempt-long", "preempt-moved"


def children_of(parent: int, job: str) -> list[int]:
    """``job``'s processes started by the executor ``parent`` (other tests on
    this machine may run jobs of the same name)."""
    out = []
    for pid in job_pids(job):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            out.append(pid)
    return out


async def test_a_job_stopped_while_silent_is_requeued_not_failed(
    procs: Procs, client: Client, stack: Stack
) -> None:
    await stack.start(procs, monitor_env={"HOPS_COMMAND_TIMEOUT_S": "0.5"},
                      executor_env={"HOPS_STOP_GRACE_S": str(STOP_GRACE_S)})
    beats = await client.collect(subjects.JOB_HEARTBEATS_ALL, ev.decode_job_heartbeat)
    for job in (LONG, MOVED):
        await client.put_job(spec(job))
    await stack.publish(plan(1, 1, {LONG: {S0: 1}, MOVED: {S0: 1}}))
    await settle(client, {LONG: {S0: 1}, MOVED: {S0: 1}})
    await eventually(lambda: {b.job_id for b in beats if b.samples_done > 0} == {LONG, MOVED},
                     10, "progress of both jobs")
    executor = procs.procs[f"executor-{S0}"].pid
    held = [p for job in (LONG, MOVED) for p in children_of(executor, job)]
    assert len(held) == 2, held
    for pid in held:  # both fall silent and will not stop by themselves
        os.kill(pid, signal.SIGSTOP)
    silent = time.monotonic()
    # the next round: LONG is preempted, MOVED moves to the other server
    await stack.publish(plan(1, 2, {MOVED: {S1: 1}}))
    await settle(client, {MOVED: {S1: 1}}, timeout=STOP_GRACE_S + 15)
    assert time.monotonic() - silent > TIMEOUT_S + 1  # silent past the deadline meanwhile
    await eventually(lambda: bool(stack.of(ev.JobStopped)) and bool(stack.of(ev.JobResized)),
                     10, "job_stopped and job_resized")
    assert not stack.of(ev.JobFailed), stack.of(ev.JobFailed)
    # only the placer's stop: the monitor did not step in
    stopped = [(e.job_id, e.reason) for e in stack.of(ev.JobStopped)]
    assert stopped == [(LONG, "not in the plan")], stopped
    kept = {e.job_id: e.samples_done for e in (*stack.of(ev.JobStopped),
                                               *stack.of(ev.JobResized))}
    assert all(v is not None and v > 0 for v in kept.values()), kept

    # queued again, then running again from where it stopped
    await stack.publish(plan(1, 3, {LONG: {S1: 2}, MOVED: {S1: 1}}, first=False))
    await settle(client, {LONG: {S1: 2}, MOVED: {S1: 1}})
    await eventually(lambda: any(b.job_id == LONG and b.server_id == S1 for b in beats), 10,
                     "the requeued job beating on its new server")
    resumed = min(b.samples_done for b in beats if b.job_id == LONG and b.server_id == S1)
    assert resumed >= (kept[LONG] or 0.0) > 0
    assert not stack.of(ev.JobFailed)
