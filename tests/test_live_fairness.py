"""A fairness replan on the live system (Hops §3.6, Eq. 8), every component
a real process (:mod:`tests.livestack`, the ``hops`` policy): a long job
holds the only 4-GPU server; a short job that needs it waits, its latency
ratio grows, and a round's first plan gives it the GPUs. The long job's stop
is on its timeline with a receipt naming the rule (``Fairness``) and the
job that took its GPUs, and it resumes once the short job is done."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import catalog_spec, timeline_of
from tests.livestack import LiveStack, until

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
    with LiveStack(tmp_path_factory.mktemp("fairness"), CLUSTER, schedulers=1) as s:
        yield s


def test_a_round_replan_stops_a_long_job_for_a_waiting_one_with_a_receipt(
        stack: LiveStack) -> None:
    assert stack.submit(catalog_spec("long", NEVER, requirements=[4]))["ok"]
    until(lambda: stack.phase("long") == "running"
          and (stack.record("long") or {}).get("samples_done", 0) > 0,
          "long runs and progresses", 90, stack.logs)
    assert stack.submit(catalog_spec("short", 2_000_000, requirements=[4]))["ok"]
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
