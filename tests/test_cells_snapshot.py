"""Snapshot and restore (HiveD §4 "Fault tolerance"): the bindings as
plain data rebuild an identical state, which makes identical decisions."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.cells import Cells, Snapshot
from shared.ids import ServerId
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
