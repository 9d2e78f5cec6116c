"""Snapshot and restore (HiveD §4 "Fault tolerance"): the bindings as
plain data rebuild an identical state, which makes identical decisions."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.cells import Allocation, Cells, Snapshot
from shared.ids import GpuType, ServerId
from tests.cells_trees import figure3
from tests.test_cells_props import build, run, scenarios, state


def round_trip(cells: Cells) -> Cells:
    """Through JSON, as a standby would read it from the KV store."""
    data = msgspec.json.encode(cells.snapshot())
    return Cells.restore(cells.model, msgspec.json.decode(data, type=Snapshot))


def toggle(cells: Cells, servers: list[str], picks: list[int]) -> None:
    for p in picks:
        server = ServerId(servers[p % len(servers)])
        cells.set_health(server, server in cells.bad_servers)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.lists(st.integers(0, 50), max_size=3), st.data())
def test_restore_gives_the_same_state_and_decisions(scenario: Any, picks: list[int],
                                                     data: st.DataObject) -> None:
    doc, servers, ops = scenario
    cells = build(doc, servers)
    half = len(ops) // 2
    run(cells, ops[:half], check=False)
    toggle(cells, sorted(servers), picks)  # bad servers and doomed cells travel too
    run(cells, ops[half:], check=False)
    standby = round_trip(cells)
    assert state(standby) == state(cells)
    assert standby.views() == cells.views()
    assert standby.check_safety() == cells.check_safety()
    more = data.draw(scenarios()).__getitem__(2)
    assert run(standby, more, False, "k") == run(cells, more, False, "k")
    assert state(standby) == state(cells)


def test_figure3_snapshot_is_plain_data() -> None:
    cells = figure3()
    cells.allocate("A", "K80", 1, "a1")  # type: ignore[arg-type]
    # Opportunistic: away from A's job, on a node no guaranteed job uses.
    cells.allocate("C", "K80", 2, "o1", opportunistic=True)  # type: ignore[arg-type]
    plain = msgspec.json.decode(msgspec.json.encode(cells.snapshot()))
    assert plain == {
        "bindings": [{"address": "K80:0.0.0.0", "tenant": "A", "doomed": False,
                      "slot": 0}],
        "jobs": [
            {"job_id": "a1", "tenant": "A", "gpu_type": "K80", "gpus": 1,
             "opportunistic": False, "cells": ["K80:0.0.0.0"]},
            {"job_id": "o1", "tenant": "C", "gpu_type": "K80", "gpus": 2,
             "opportunistic": True, "cells": ["K80:1.0.0"]},
        ],
        "bad_servers": [],
    }
    assert state(round_trip(cells)) == state(cells)


def test_restore_refuses_a_snapshot_that_does_not_fit() -> None:
    cells = figure3()
    bad = Snapshot(bindings=(), jobs=(), bad_servers=(ServerId("n9"),))
    try:
        Cells.restore(cells.model, bad)
    except ValueError as e:
        assert "n9" in str(e)
    else:
        raise AssertionError("restored a snapshot naming an unknown server")


def test_restore_keeps_a_guaranteed_job_beside_an_opportunistic_one_in_its_cell() -> None:
    """An opportunistic 3-GPU job holds two 2-GPU nodes but uses three GPUs;
    a guaranteed job then takes the fourth. Restore checks the GPUs the
    opportunistic job uses, not its whole cells (found by the property test)."""
    doc = {"cell_types": {"N": {"child_cell_type": "G", "child_cell_number": 2,
                                "is_node_level": True}},
           "physical_cells": [{"cell_type": "N", "server": f"s{i}"} for i in range(3)],
           "virtual_clusters": {"t0": {"virtual_cells": [{"cell_type": "G", "cell_number": 3}]}}}
    cells = build(doc, {f"s{i}": ("G", 2) for i in range(3)})
    g = GpuType("G")
    for job in ("b0", "b1"):
        assert isinstance(cells.allocate("t0", g, 1, job), Allocation)
    opp = cells.allocate("t0", g, 3, "z-opp", opportunistic=True)
    assert isinstance(opp, Allocation) and opp.servers() == {"s1": 2, "s2": 1}
    # Restored in id order, the guaranteed job comes before the opportunistic one.
    mine = cells.allocate("t0", g, 1, "a-mine")
    assert isinstance(mine, Allocation) and mine.servers() == {"s2": 1}
    assert state(round_trip(cells)) == state(cells)
