"""A burst of submissions while long jobs run, on the real stack (real
nats-server, every service and EMULATED executors as processes), at a size
CI can afford: the bounds of ``bench/live_submit.py --burst`` (the figures of
:mod:`bench.burst_figures`), and a kill -9 of the leader in the middle of a
burst, which loses no accepted job.

The full-size figures (500 jobs, 15 long jobs, the paper's 64-GPU cluster)
are the bench's; docs/live.md gives them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench.burst_figures import BurstFigures
from shared.ids import GpuType, ServerId
from shared.records import JobRecord
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

CLUSTER = """\
name: burst
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
  - {id: titan-1, gpu_type: TitanXP, gpus: 4}
"""
SERVERS = {ServerId(f"{n}-{i}"): (GpuType(t), 4)
           for n, t in (("rtx", "RTX3090"), ("titan", "TitanXP")) for i in range(2)}
LONGS = 2
BURST = 40
MODELS = ("resnet18-cifar10", "mobilenetv2-cifar10", "regnet-cifar10", "resnet50-cifar10")
SHAPES = ([1], [1, 2], [2])
# Samples: at the stack's time scale (600) a burst job runs for 2 to 10
# rounds of 10 s (4 to 20 hours of its own time): long next to the second or
# so from a release to the next start, which the bench measures at 60.
SHORT = 40_000_000
NEVER = 10**13  # samples: a long job runs until something stops it
OBSERVE_S = 120.0  # twelve rounds: the burst's first round weighs one twelfth


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LiveStack]:
    # Rounds of 10 s, as the bench's: the booked share is a mean over rounds.
    with LiveStack(tmp_path, CLUSTER, round_s=10.0) as s:
        yield s


def records(stack: LiveStack) -> dict[str, JobRecord]:
    raw = stack.bus_().bucket("hops_jobs")
    return {k: msgspec.convert(v, JobRecord) for k, v in raw.items()}


def booked(allocs: dict[str, Any]) -> Counter[ServerId]:
    out: Counter[ServerId] = Counter()
    for alloc in allocs.values():
        for sid, gpus in alloc["configuration"]["parts"]:
            out[sid] += gpus
    return out


def planned(stack: LiveStack, allocs: dict[str, Any], round_s: float) -> Counter[ServerId]:
    """The GPUs of the starts (and profiling runs) plans of the last round
    gave jobs that hold no booking yet: the placer books them within the
    round (a refused or dropped start stops counting a round after its plan)."""
    since = time.monotonic() - round_s
    latest: dict[str, list[tuple[str, int]]] = {}
    for seen in stack.bus_().messages("hops.v1.plans", "plan_issued", since=since):
        plan = seen.body["plan"]
        for task in reversed(plan.get("profiling", [])):  # a job's first task runs first
            latest[task["job_id"]] = [(task["server"], task.get("gpus", 1))]
        for a in plan.get("assignments", []):
            latest[a["job_id"]] = [(sid, g) for sid, g in a["config"]["parts"]]
    out: Counter[ServerId] = Counter()
    for job, parts in latest.items():
        if job not in allocs:
            for sid, gpus in parts:
                out[ServerId(sid)] += gpus
    return out


def taken(stack: LiveStack) -> Counter[ServerId]:
    """Booked GPUs, and those of a start planned but not yet booked, at most
    a server's GPUs (a start may plan on GPUs whose job is being stopped)."""
    allocs: dict[str, Any] = stack.allocs()
    held = booked(allocs) + planned(stack, allocs, stack.round_s)
    return Counter({sid: min(n, SERVERS[sid][1]) for sid, n in held.items() if sid in SERVERS})


def start_longs(stack: LiveStack) -> list[str]:
    longs = [f"long-{i}" for i in range(LONGS)]
    for job in longs:
        assert stack.submit(catalog_spec(job, NEVER, requirements=[4]))["ok"] is True
    for job in longs:
        until(lambda job=job: stack.phase(job) == "running", f"{job} running", 90, stack.logs)  # type: ignore[misc]
    return longs


def submit_burst(stack: LiveStack, fig: BurstFigures) -> None:
    for i, job in enumerate(sorted(fig.burst)):
        spec = catalog_spec(job, SHORT + SHORT * i // 10, MODELS[i % len(MODELS)],
                            requirements=SHAPES[i % len(SHAPES)])
        t = time.perf_counter()
        assert stack.submit(spec)["ok"] is True, job
        fig.submit_ms.append((time.perf_counter() - t) * 1000)


def watch(stack: LiveStack, fig: BurstFigures, t0: float, observe: float) -> None:
    def done() -> bool:
        elapsed = time.monotonic() - t0
        # The GPUs taken, not only booked: a start is planned, then booked
        # by the placer, then started. Between plan and booking (a planning
        # round at most; seconds when the host is loaded) its GPUs read as
        # idle, and counting bookings alone measured 77-82% under CPU load
        # where the plans left no fitting job waiting. The threshold
        # (BOOKED_SHARE) stays: what it holds the scheduler to is GPUs given
        # to work while work waits, as an operator reads "booked".
        fig.poll(elapsed, records(stack), taken(stack))
        time.sleep(1.0)
        return fig.all_past_profiling() and elapsed >= observe

    until(done, "the burst past profiling", 300, lambda: "\n".join(fig.lines()))


def test_a_burst_meets_its_bounds_while_long_jobs_run(stack: LiveStack) -> None:
    """Every burst job is past profiling within the bound, GPUs stay booked
    while a job that fits waits, the long jobs are restarted at most twice
    and none fails, and every submission is acknowledged within the bound."""
    longs = start_longs(stack)
    burst = frozenset(f"burst-{i:03d}" for i in range(BURST))
    fig = BurstFigures(SERVERS, burst, frozenset(longs), round_s=stack.round_s)
    fig.begin(records(stack))
    t0 = time.monotonic()
    submit_burst(stack, fig)
    watch(stack, fig, t0, OBSERVE_S)
    print("\n".join(fig.lines()))
    for wait in fig.waits:
        print(wait)
    assert fig.misses() == [], fig.lines()


def test_a_kill_of_the_leader_during_a_burst_loses_no_job(stack: LiveStack) -> None:
    """kill -9 of the leading scheduler half-way through a burst: every
    accepted job is kept, the standby takes over, and every job of the
    burst gets past profiling; the long jobs neither fail nor lose progress."""
    longs = start_longs(stack)
    burst = frozenset(f"burst-{i:03d}" for i in range(BURST))
    fig = BurstFigures(SERVERS, burst, frozenset(longs), round_s=stack.round_s)
    fig.begin(records(stack))
    before = {j: r.samples_done for j, r in records(stack).items() if j in longs}
    t0 = time.monotonic()
    first, second = sorted(burst)[: BURST // 2], sorted(burst)[BURST // 2:]
    submit_burst(stack, BurstFigures(SERVERS, frozenset(first), frozenset()))
    lease = stack.leader()
    assert lease is not None
    killed = lease["holder"]
    stack.kill(killed)
    submit_burst(stack, BurstFigures(SERVERS, frozenset(second), frozenset()))
    until(lambda: (x := stack.leader()) and x["holder"] != killed, "a new leader", 20, stack.logs)
    watch(stack, fig, t0, 0.0)
    now = records(stack)
    assert burst <= set(now), sorted(burst - set(now))
    assert not fig.failed, fig.failed
    for job in longs:
        assert now[job].phase == "running" and now[job].samples_done >= before[job], now[job]
