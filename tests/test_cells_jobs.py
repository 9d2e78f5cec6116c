"""Job shapes, heterogeneous chains, admission's fit and the tenant view
(HiveD §3.2 "Heterogeneity", §3.3, §4 "Cell specification")."""

from __future__ import annotations

from typing import Any

from scheduling.cells import Allocation, Cells, Refusal, cells_from_doc, virtual_slots
from shared.ids import GpuType, ServerId
from tests.cells_trees import cluster, figure3

V100, K80 = GpuType("V100"), GpuType("K80")


def two_chains() -> Cells:
    """A V100 rack of four 4-GPU nodes and two loose 8-GPU K80 nodes."""
    doc: dict[str, Any] = {
        "cell_types": {
            "V100-NODE": {"child_cell_type": "V100", "child_cell_number": 4,
                          "is_node_level": True},
            "V100-RACK": {"child_cell_type": "V100-NODE", "child_cell_number": 4},
            "K80-NODE": {"child_cell_type": "K80", "child_cell_number": 8,
                         "is_node_level": True},
        },
        "physical_cells": [
            {"cell_type": "V100-RACK", "children": [{"server": f"v{i}"} for i in range(4)]},
            {"cell_type": "K80-NODE", "server": "k0"},
            {"cell_type": "K80-NODE", "server": "k1"},
        ],
        "virtual_clusters": {
            "nlp": {"virtual_cells": [{"cell_type": "V100-NODE", "cell_number": 3},
                                      {"cell_type": "K80-NODE"}]},
            "cv": {"virtual_cells": [{"cell_type": "V100"},
                                     {"cell_type": "K80", "cell_number": 2}]},
            "spot": {"low_priority": True, "weight": 2},
        },
    }
    servers = {f"v{i}": ("V100", 4) for i in range(4)} | {"k0": ("K80", 8), "k1": ("K80", 8)}
    return Cells(cells_from_doc(doc, cluster(servers), "two.yaml"))


def test_chains_are_allocated_apart() -> None:
    cells = two_chains()
    assert sorted(cells.model.chains) == ["K80", "V100"]
    a = cells.allocate("nlp", K80, 8, "a")
    b = cells.allocate("cv", V100, 1, "b")
    assert isinstance(a, Allocation) and a.servers() == {"k0": 8}
    assert isinstance(b, Allocation) and list(b.servers()) == ["v0"]
    refused = cells.allocate("cv", V100, 2, "c")  # cv has one V100 GPU
    assert isinstance(refused, Refusal) and refused.reason == "no-cell"
    unknown = cells.allocate("cv", GpuType("A100"), 1, "d")
    assert isinstance(unknown, Refusal) and unknown.reason == "unknown-gpu-type"
    assert cells.allocate("ops", V100, 1, "e").reason == "unknown-tenant"  # type: ignore[union-attr]


def test_a_job_larger_than_a_node_takes_node_cells() -> None:
    """nlp holds node-level cells only: a 12-GPU job takes three of them,
    one per server, all or nothing; 16 GPUs exceed its cells and change nothing."""
    cells = two_chains()
    before = cells.snapshot()
    too_big = cells.allocate("nlp", V100, 16, "x")
    assert isinstance(too_big, Refusal) and too_big.reason == "no-cell"
    assert cells.snapshot() == before
    out = cells.allocate("nlp", V100, 12, "big")
    assert isinstance(out, Allocation)
    assert out.servers() == {"v0": 4, "v1": 4, "v2": 4}
    assert cells.check_safety() == ()
    cells.release("big")
    assert cells.snapshot() == before
    # Beyond the rack, five node cells would be needed: more than nlp has.
    assert cells.allocate("nlp", V100, 17, "y").reason == "no-cell"  # type: ignore[union-attr]


def test_fits_is_admission() -> None:
    cells = two_chains()
    assert cells.fits("nlp", V100, 12) and not cells.fits("nlp", V100, 13)
    assert cells.fits("cv", K80, 1) and not cells.fits("cv", K80, 2)
    assert not cells.fits("spot", V100, 1) and not cells.fits("ops", V100, 1)


def test_low_priority_tenant_runs_opportunistically() -> None:
    cells = two_chains()
    out = cells.allocate("spot", V100, 4, "s")
    assert isinstance(out, Allocation) and out.opportunistic
    assert cells.weights() == {"cv": 1.0, "nlp": 1.0, "spot": 2.0}
    assert cells.opportunistic_gpus() == {"cv": 0, "nlp": 0, "spot": 4}
    view = cells.view("spot")
    assert view.low_priority and view.opportunistic_jobs == ("s",) and view.chains == ()
    cells.allocate("cv", K80, 1, "k")
    assert cells.idle_gpus() == {"K80": 15, "V100": 12}
    assert [a.job_id for a in cells.allocations()] == ["k", "s"]


def test_view_shows_bindings_and_usable_gpus() -> None:
    cells = two_chains()
    cells.allocate("cv", K80, 1, "k")
    (k80, v100) = cells.view("cv").chains
    assert k80.gpu_type == "K80" and k80.reserved_gpus == 2 and k80.used_gpus == 1
    assert [(b.address, b.level, b.used_gpus) for b in k80.bound] == [("K80:1.0", 1, 1)]
    assert k80.free_gpus == 1 and k80.unbound_gpus == 1 and k80.usable == ()
    assert v100.bound == () and v100.unbound_gpus == 1
    cells.allocate("nlp", V100, 1, "n")
    nlp = cells.view("nlp").chains[1]
    assert [(u.server, u.gpus) for u in nlp.usable] == [("v0", 3)]
    # The job holds a level-1 cell inside nlp's node cell, which is now bound.
    assert nlp.used_gpus == 1 and nlp.free_gpus == 11 and nlp.unbound_gpus == 8


def k80_nodes(n: int) -> Cells:
    """``n`` loose 8-GPU K80 nodes; nlp reserves one node, cv two GPUs."""
    doc: dict[str, Any] = {
        "cell_types": {"K80-NODE": {"child_cell_type": "K80", "child_cell_number": 8,
                                    "is_node_level": True}},
        "physical_cells": [{"cell_type": "K80-NODE", "server": f"k{i}"} for i in range(n)],
        "virtual_clusters": {
            "nlp": {"virtual_cells": [{"cell_type": "K80-NODE"}]},
            "cv": {"virtual_cells": [{"cell_type": "K80", "cell_number": 2}]},
        },
    }
    return Cells(cells_from_doc(doc, cluster({f"k{i}": ("K80", 8) for i in range(n)}), "k.yaml"))


def test_a_held_free_part_is_passed_over_for_a_clean_cell() -> None:
    """cv's first job takes a GPU of k0; every other GPU of k0 is then held
    outside the cells (profiling runs, opportunistic to the cells).
    Algorithm 1 takes a free cell of the level before splitting a larger
    one, so cv's next 1-GPU job would get a held GPU of k0 and be refused
    naming the hold. With a node to spare it gets a clean GPU of k1 instead;
    with none to spare (nlp needs the last whole node: invariant (2)) it is
    refused as before. A release undoes the allocation."""
    cells = k80_nodes(3)
    first = cells.allocate("cv", K80, 1, "c1")
    assert isinstance(first, Allocation) and first.servers() == {"k0": 1}
    assert cells.hold(first.placement[0].server, 7, "profiling") == 7
    before = cells.snapshot()
    second = cells.allocate("cv", K80, 1, "c2")
    assert isinstance(second, Allocation) and second.servers() == {"k1": 1}, second
    assert cells.check_safety() == ()
    assert cells.release("c2") and cells.snapshot() == before
    nlp = cells.allocate("nlp", K80, 8, "n1")
    assert isinstance(nlp, Allocation) and nlp.servers() == {"k1": 8}

    tight = k80_nodes(2)
    assert isinstance(tight.allocate("cv", K80, 1, "c1"), Allocation)
    assert tight.hold(ServerId("k0"), 7, "profiling") == 7
    before = tight.snapshot()
    refused = tight.allocate("cv", K80, 1, "c2")
    assert isinstance(refused, Refusal) and refused.victims == ("profiling",)
    assert tight.snapshot() == before and tight.check_safety() == ()


def test_virtual_servers_bind_one_to_one_and_show_what_they_lost() -> None:
    """Tenant C of Figure 3 sees two 8-GPU virtual nodes and a 2-GPU one.
    Its jobs go to the physical node bound to the virtual one they name; GPUs
    held there are named for preemption; a hold and a dead
    server show on exactly the virtual server whose cell they hit."""
    cells = figure3()
    slots = virtual_slots(cells.model, "C", K80)
    assert [(s.level, s.index, g) for s, g in slots] == [(4, 0, 8), (4, 1, 8), (2, 0, 2)]
    node0, node1 = slots[0][0], slots[1][0]
    a = cells.allocate_on("C", K80, [(node0, 3), (node1, 3)], "a")
    assert isinstance(a, Allocation) and a.servers() == {"n0": 3, "n1": 3}
    b = cells.allocate_on("C", K80, [(node0, 5)], "b")
    assert isinstance(b, Allocation) and b.servers() == {"n0": 5}
    before = cells.snapshot()
    full = cells.allocate_on("C", K80, [(node0, 1)], "c")
    assert isinstance(full, Refusal) and full.reason == "no-cell" and cells.snapshot() == before
    o = cells.allocate("A", K80, 4, "o", opportunistic=True)
    assert isinstance(o, Allocation) and o.servers() == {"n2": 4}  # outside bound cells
    cells.hold(ServerId("n1"), 2, "\x00held")
    assert cells.unavailable("C", K80) == {node1: 2}
    cells.set_health(ServerId("n0"), False)
    assert cells.unavailable("C", K80) == {node0: 8, node1: 2}
    c = cells.allocate_on("C", K80, [(node1, 4)], "c")  # 5 free on n1, 2 of them held
    assert isinstance(c, Refusal) and c.reason == "preempt" and c.victims == ("\x00held",)
    cells.release("\x00held")
    c = cells.allocate_on("C", K80, [(node1, 4)], "c")
    assert isinstance(c, Allocation) and c.servers() == {"n1": 4}
    assert Cells.restore(cells.model, cells.snapshot()).snapshot() == cells.snapshot()
    # A layer's own holder (a profiling run) uses GPUs but is not listed as a job.
    run = cells.allocate_on("C", K80, [(slots[2][0], 1)], "\x00prof:K80:p")
    assert isinstance(run, Allocation)
    view = cells.view("C")
    assert view.guaranteed_jobs == ("a", "b", "c") and view.chains[0].used_gpus == 16
