"""A fairness replan on the live system (Hops §3.6, Eq. 8), every component
a real process (:mod:`tests.livestack`, the ``hops`` policy): a long job
holds the only 4-GPU server; a short job that needs it waits, its latency
ratio grows, and a round's first plan gives it the GPUs. The long job's stop
is on its timeline with a receipt naming the rule (``Fairness``) and the
job that took its GPUs, and it resumes once the short job is done. While
the short job waits, ``hops describe`` shows why: ``Resources`` (a plan
within the round, which a small job's submission asks for: the long job
holds the only server it fits), then ``Priority`` (a round's first plan
gave the server to the long job, named with its latency ratio), then it
runs."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.helpers import catalog_spec, timeline_of
from tests.livestack import LiveStack, until
from tests.test_live_hardening import hops

CLUSTER = """\
name: fairness
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-p, gpu_type: RTX3090, gpus: 1}
"""
# rtx-p profiles the short job while the long one holds rtx-0 (§3.2).
NEVER = 10**13  # samples: a job that runs until something stops it


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    # rounds of 6 s and plans within the round at once (no replan delay): the
    # plan after the short job's profile comes before the next round's
    with LiveStack(tmp_path_factory.mktemp("fairness"), CLUSTER, schedulers=1,
                   round_s=6.0, env={"HOPS_REPLAN_DELAY_S": "0"}) as s:
        yield s


def test_a_round_replan_stops_a_long_job_for_a_waiting_one_with_a_receipt(
        stack: LiveStack) -> None:
    assert stack.submit(catalog_spec("long", NEVER, requirements=[4]))["ok"]
    until(lambda: stack.phase("long") == "running"
          and (stack.record("long") or {}).get("samples_done", 0) > 0,
          "long runs and progresses", 90, stack.logs)
    # another model than the long job's: no profile to reuse, so it is
    # profiled on rtx-p and a plan within the round follows its profile
    assert stack.submit(catalog_spec("short", 2_000_000, model="distilbert-imdb",
                                     requirements=[4]))["ok"]
    # once it is profiled and its profiling run gave rtx-p back, a submission
    # asks for a plan within the round: the long job holds rtx-0, rtx-p has
    # one GPU, so the short job's reason is Resources (until the next
    # round's first plan, which replans rtx-0: Priority)
    until(lambda: stack.phase("short") == "queued" and "short" not in stack.allocs(),
          "short profiled", 60, stack.logs)
    assert stack.submit(catalog_spec("poke", 2_000_000, requirements=[1]))["ok"]
    seen = described_reasons(stack, "short", 180)
    assert seen[-1] == "running", seen
    # what describe showed on the way, and its timeline: every change of
    # reason (the poll may miss one that lasted less than a poll)
    code, out = hops(stack, "describe", "short")
    assert code == 0, out
    history = timeline_codes(out)
    assert "started" in history, out
    waited = history[:history.index("started")]
    assert "Resources" in waited and "Priority" in waited, (seen, out)
    assert waited.index("Resources") < waited.index("Priority"), (seen, out)
    bus = stack.bus_()
    stopped = until(lambda: bus.job_events("long", "job_stopped"), "long stopped for short",
                    120, stack.logs)
    assert stopped[0].body["reason"] == "not in the plan", stopped[0].body
    stops = until(lambda: [e for e in timeline_of(bus.stored, "long")
                           if e["kind"] == "stopped"], "the stop on long's timeline", 15)
    receipt = stops[0]["receipt"]
    assert receipt is not None and receipt["rule"] == "Fairness", stops
    assert "short" in receipt["takers"], receipt
    assert stack.wait_final(["short"], 120) == {"short": "finished"}
    until(lambda: stack.phase("long") == "running", "long resumes", 60, stack.logs)
    kinds = [e["kind"] for e in timeline_of(bus.stored, "long")]
    assert kinds[0] == "submitted" and kinds.count("started") >= 2, kinds
    short = [e["kind"] for e in timeline_of(bus.stored, "short")]
    assert short[0] == "submitted" and short[-1] == "finished", short


def timeline_codes(described: str) -> list[str]:
    """The reason codes and starts of ``hops describe``'s timeline, in order."""
    out: list[str] = []
    for line in described.split("Timeline:", 1)[-1].splitlines():
        kind = re.match(r"^\s+\S+ \S+\s+(reason|started)\s+(.*)$", line)
        if kind is None:
            continue
        code = re.search(r"\b([A-Z][A-Za-z]+): ", kind.group(2))
        out.append("started" if kind.group(1) == "started" else code.group(1) if code else "?")
    return out


def described_reasons(stack: LiveStack, job: str, timeout: float) -> list[str]:
    """The reason codes ``hops describe JOB`` shows, each time it changes,
    until the job runs (then ``running``)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, out = hops(stack, "describe", job)
        assert code == 0, out
        found = re.search(r"^Reason:\s+(\w+)", out, re.M)
        ran = stack.phase(job) in ("running", "finished")  # a short job may be done at once
        now = "running" if ran else (found.group(1) if found else "-")
        if not seen or seen[-1] != now:
            seen.append(now)
        if now == "running":
            return seen
        time.sleep(0.3)
    raise AssertionError(f"{job} never ran; reasons seen: {seen}\n{stack.logs()}")
