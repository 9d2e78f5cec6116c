"""Drained nodes in the leader's snapshot (scheduling.live.drain): no new
work there; running jobs stay, or are moved with ``move``."""

from __future__ import annotations

import msgspec

from scheduling.live.clock import Inflight
from scheduling.live.drain import drain_held, drain_states
from scheduling.live.snapshot import build_snapshot
from scheduling.policies.hops.policy import HopsPolicy
from services.monitor.nodes import Refusal, admit
from services.monitor.nodes import drained as drain
from shared.events import RegisterNode
from shared.ids import JobId
from shared.records import NodeRecord
from tests.helpers import assert_feasible, flat_estimate
from tests.test_live_pure_control import A, alloc, cfg, live, node

NODES = [node("a0", A, 4, 0), node("a1", A, 4, 1)]


def drained(move: bool = False) -> list[NodeRecord]:
    return [msgspec.structs.replace(NODES[0], drained=True, drain_move=move), NODES[1]]


def _plan(nodes: list[NodeRecord], records: dict, allocs: dict) -> tuple:  # type: ignore[type-arg]
    ests = {j: flat_estimate(j, {"A": 100.0}) for j in records}
    snap = build_snapshot(10.0, records, nodes, allocs, ests, {}, Inflight(60.0), True).snapshot
    plan = HopsPolicy().plan(snap)
    assert_feasible(plan, snap)
    return snap, plan


def test_a_drained_node_gets_no_new_work_and_keeps_its_running_job() -> None:
    records = {JobId("run"): live("run", "running", configuration=cfg(a0=2), since=0.0),
               JobId("new"): live("new", "queued", since=5.0, submit=1.0)}
    allocs = {JobId("run"): alloc("run", a0=2)}
    snap, plan = _plan(drained(), records, allocs)
    assert snap.held == {"a0": 2}  # its two free GPUs; the running job's are the plan's
    assert plan.config_of(JobId("run")) == cfg(a0=2)
    new = plan.config_of(JobId("new"))
    assert new is not None and new.servers == ("a1",)
    # Undrained: the same jobs may use a0's free GPUs again.
    snap, plan = _plan(NODES, records, allocs)
    assert snap.held == {} and plan.config_of(JobId("run")) == cfg(a0=2)


def test_drain_with_move_holds_every_gpu_so_running_jobs_move() -> None:
    records = {JobId("run"): live("run", "running", configuration=cfg(a0=2), since=0.0,
                                  samples_done=300.0)}
    allocs = {JobId("run"): alloc("run", a0=2)}
    snap, plan = _plan(drained(move=True), records, allocs)
    assert snap.held == {"a0": 4}
    moved = plan.config_of(JobId("run"))
    assert moved is not None and moved.servers == ("a1",)
    assert snap.jobs[0].done_samples == 300.0  # it resumes where it was


def test_drain_held_counts_only_alive_drained_nodes() -> None:
    lost = msgspec.structs.replace(drained()[0], alive=False)
    assert drain_held([lost, NODES[1]], []) == {}
    assert drain_held(drained(), []) == {"a0": 4}
    assert drain_states(NODES) == () and drain_states(drained(True)) == (("a0", True),)
    assert drain_states([lost]) == ()


def test_a_node_that_registers_again_keeps_its_drain() -> None:
    rec = drained(move=True)[0]
    again = admit({rec.server.id: rec}, RegisterNode(server=rec.server, gpu_type=A), 5.0)
    assert again.drained and again.drain_move and again.alive
    undrained = drain(rec.server.id, again, False, True)
    assert not undrained.drained and not undrained.drain_move
    try:
        drain(rec.server.id, None, True, False)
    except Refusal as e:
        assert e.code == "not_found"
    else:
        raise AssertionError("an unknown node was drained")
