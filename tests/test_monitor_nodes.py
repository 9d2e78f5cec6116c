"""The monitor's pure decisions added for stale views and preemption: a
``heartbeat lost`` verdict that no stop confirms, node removal, heartbeat
times written at a bounded rate, and a removed node forgotten by the
deadlines. The live behaviour is in ``tests/test_live_preempt.py`` and
``tests/test_live_hardening.py``."""

from __future__ import annotations

import msgspec

from services.monitor.deadlines import DeadlineTracker
from services.monitor.nodes import heartbeat_due, removal_refused
from services.monitor.release import confirmed, on_heartbeat_lost, on_node_removed
from tests.test_live_pure_dataplane import A, B, C, node, placement


def test_a_heartbeat_lost_verdict_stands_only_when_a_stop_found_the_process() -> None:
    run = placement("j", {A: (0,), B: (1,)})
    verdict = on_heartbeat_lost(run, ended=False, samples_done=12.0)
    assert confirmed(verdict, found=True) is verdict and verdict.event == "failed"
    # no executor was running it (the placer stopped it, or it ended): requeued with progress
    requeued = confirmed(verdict, found=False)
    assert (requeued.event, requeued.samples_done, requeued.reason) == (
        "stopped", 12.0, "heartbeat lost")
    ended = on_heartbeat_lost(run, ended=True)
    assert confirmed(ended, found=False) is ended  # a final job gets no event at all


def test_removing_a_node() -> None:
    alive, dead = node("a", 4), node("b", 4, alive=False)
    assert removal_refused(A, None, False, 0.0).code == "not_found"  # type: ignore[union-attr]
    refused = removal_refused(A, msgspec.structs.replace(alive, last_heartbeat=7.0), False, 10.0)
    assert refused is not None and refused.code == "conflict" and "3 s ago" in str(refused)
    assert removal_refused(A, alive, True, 10.0) is None  # forced
    assert removal_refused(B, dead, False, 10.0) is None
    run = placement("j", {A: (0,), B: (1,)})
    rel = on_node_removed(A, run, 5.0)
    # as a lost node, but the removed node's executor may still run its part
    assert rel is not None and (rel.stop_on, rel.event, rel.reason, rel.samples_done) == (
        (A, B), "stopped", "node removed", 5.0)
    assert on_node_removed(C, run) is None


def test_heartbeat_times_are_written_at_a_bounded_rate() -> None:
    rec = msgspec.structs.replace(node("a", 4), last_heartbeat=100.0)
    assert not heartbeat_due(rec, 104.9, 5.0) and heartbeat_due(rec, 105.0, 5.0)


def test_a_removed_node_is_forgotten_by_the_deadlines() -> None:
    t = DeadlineTracker(timeout=3.0, orphan_grace=1.0)
    t.watch_node(A, 0.0)
    t.node_beat(A, 0.5, ["stray"])
    t.forget_node(A)
    assert not t.watching(A)
    assert not t.check(10.0)  # neither lost nor an orphan
    assert not t.node_beat(A, 11.0)  # a beat of it is a stranger's until it registers again
