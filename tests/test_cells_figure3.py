"""HiveD's Figure 3 worked example (§3.2), step by step through buddy cell
allocation (§3.3, Algorithm 1) and dynamic binding.

One rack of four 8-GPU nodes n0..n3, levels GPU (1), PCIe switch (2), CPU
socket (4) and node (8). Tenants A and B each reserve one level-3, one
level-2 and one level-1 cell; C reserves two level-4 cells and one level-2
cell. The 32 reserved GPUs fill the rack exactly, so invariant (2) is tight
and every split must be the one Algorithm 1 makes.
"""

from __future__ import annotations

from scheduling.cells import Allocation, Cells, Refusal
from shared.ids import GpuType
from tests.cells_trees import figure3

K80 = GpuType("K80")


def pool(cells: Cells) -> list[tuple[int, str]]:
    """The unbound free cells as (level, address)."""
    return [(lv, cells.tree.address[c]) for _, lv, owner, c in cells.buddy.free_cells()
            if owner == ""]


def place(cells: Cells, tenant: str, gpus: int, job: str) -> Allocation:
    out = cells.allocate(tenant, K80, gpus, job)
    assert isinstance(out, Allocation), out
    assert cells.check_safety() == ()
    return out


def bound(cells: Cells, tenant: str) -> list[tuple[int, str]]:
    return [(b.level, b.address) for ch in cells.view(tenant).chains for b in ch.bound]


def allocate_every_cell() -> Cells:
    """Steps 1-7: every virtual cell gets bound, one job each."""
    cells = figure3()
    # The VC assignment is feasible and fills the rack: no slack at any level.
    assert cells.check_safety() == ()
    assert sum(ch.reserved_gpus for v in cells.views() for ch in v.chains) == 32
    assert pool(cells) == [(4, "K80:0"), (4, "K80:1"), (4, "K80:2"), (4, "K80:3")]

    # 1. A runs a 1-GPU job on its level-1 cell: no free cell at levels 1-3,
    #    so n0 is split recursively (node -> sockets -> switches -> GPUs).
    a1 = place(cells, "A", 1, "a1")
    assert a1.cells == ("K80:0.0.0.0",) and a1.servers() == {"n0": 1}
    assert pool(cells) == [(1, "K80:0.0.0.1"), (2, "K80:0.0.1"), (3, "K80:0.1"),
                           (4, "K80:1"), (4, "K80:2"), (4, "K80:3")]
    assert bound(cells, "A") == [(1, "K80:0.0.0.0")]

    # 2. C's 8-GPU job binds one of its level-4 cells to a whole free node.
    c1 = place(cells, "C", 8, "c1")
    assert c1.cells == ("K80:1",) and c1.servers() == {"n1": 8}

    # 3. B's 4-GPU job takes the free socket left by step 1's split instead
    #    of splitting another node: higher-level cells stay available.
    b1 = place(cells, "B", 4, "b1")
    assert b1.cells == ("K80:0.1",) and b1.servers() == {"n0": 4}
    assert (4, "K80:2") in pool(cells) and (4, "K80:3") in pool(cells)

    # 4. C's 2-GPU job binds its level-2 cell to the free switch of n0.
    assert place(cells, "C", 2, "c2").cells == ("K80:0.0.1",)

    # 5. A's 4-GPU job: no free level-3 cell, so node n2 is split.
    assert place(cells, "A", 4, "a2").cells == ("K80:2.0",)
    assert pool(cells) == [(1, "K80:0.0.0.1"), (3, "K80:2.1"), (4, "K80:3")]

    # 6. B's and A's 2-GPU jobs split n2's second socket into its two switches.
    assert place(cells, "B", 2, "b2").cells == ("K80:2.1.0",)
    assert place(cells, "A", 2, "a3").cells == ("K80:2.1.1",)

    # 7. C's second node and B's single GPU: B's level-1 cell lands on the
    #    buddy of A's (§5.3: level-1 cells of two tenants are packed).
    assert place(cells, "C", 8, "c3").cells == ("K80:3",)
    b3 = place(cells, "B", 1, "b3")
    assert b3.cells == ("K80:0.0.0.1",)
    assert pool(cells) == []
    for v in cells.views():
        assert all(lc.bound == lc.reserved for ch in v.chains for lc in ch.levels)
    return cells


def test_figure3_allocations() -> None:
    allocate_every_cell()


def test_figure3_illegal_request_and_releases() -> None:
    cells = allocate_every_cell()
    # 8. A request beyond A's cells is illegal and changes nothing.
    before = (cells.snapshot(), cells.buddy.free_cells())
    refused = cells.allocate("A", K80, 1, "a4")
    assert isinstance(refused, Refusal) and refused.reason == "no-cell"
    assert (cells.snapshot(), cells.buddy.free_cells()) == before

    # 9. Releasing unbinds and merges bottom-up: A's GPU cannot merge while
    #    B holds its buddy; once b3, c2 and b1 are gone n0 is whole again.
    cells.release("a1")
    assert pool(cells) == [(1, "K80:0.0.0.0")]
    assert bound(cells, "A") == [(3, "K80:2.0"), (2, "K80:2.1.1")]
    cells.release("b3")
    assert pool(cells) == [(2, "K80:0.0.0")]
    cells.release("c2")
    assert pool(cells) == [(3, "K80:0.0")]
    cells.release("b1")
    assert pool(cells) == [(4, "K80:0")]
    assert cells.check_safety() == ()


def test_a_smaller_job_uses_a_larger_virtual_cell() -> None:
    """C has no level-1 cell: its 1-GPU job binds its level-2 cell, and a
    second 1-GPU job goes into the same bound cell without a new binding."""
    cells = figure3()
    assert place(cells, "C", 1, "c1").cells == ("K80:0.0.0.0",)
    assert place(cells, "C", 1, "c2").cells == ("K80:0.0.0.1",)
    assert bound(cells, "C") == [(2, "K80:0.0.0")]
    view = cells.view("C").chains[0]
    assert view.used_gpus == 2 and view.unbound_gpus == 16


def test_opportunistic_job_is_preempted_by_the_fewest_gpus() -> None:
    """An opportunistic job runs on idle cells; a guaranteed job that needs
    them is refused with the victims named, and placed once they stop."""
    cells = figure3()
    for i in range(4):
        out = cells.allocate("A", K80, 8, f"o{i}", opportunistic=True)
        assert isinstance(out, Allocation) and out.opportunistic
    full = cells.allocate("A", K80, 1, "o4", opportunistic=True)
    assert isinstance(full, Refusal) and full.reason == "no-capacity"
    assert cells.preemption_victims("C", K80, 8) == ("o0",)
    refused = cells.allocate("C", K80, 8, "c1")
    assert isinstance(refused, Refusal) and refused.victims == ("o0",)
    cells.release("o0")
    assert place(cells, "C", 8, "c1").cells == ("K80:0",)
    # The binding prefers the cell with fewest opportunistic GPUs.
    cells.release("o2")
    cells.allocate("B", K80, 1, "o5", opportunistic=True)
    assert cells.allocation("o5").servers() == {"n2": 1}
    assert cells.preemption_victims("C", K80, 8) == ("o5",)  # 1 GPU, not n1's or n3's 8
    assert cells.view("A").opportunistic_jobs == ("o1", "o3")
    assert cells.opportunistic_gpus() == {"A": 16, "B": 1, "C": 0}


def test_dead_server_gives_doomed_cells() -> None:
    """With n3 dead only 24 healthy GPUs remain for 32 reserved: the cells
    the healthy pool cannot hold are bound, doomed, to n3's GPUs so the
    tenants' views show the loss (§4, hivedscheduler issue #25)."""
    cells = figure3()
    cells.set_health("n3", False)  # type: ignore[arg-type]
    doomed = {v.tenant: sorted((b.level, b.bad_gpus) for ch in v.chains for b in ch.bound
                               if b.doomed) for v in cells.views()}
    assert doomed == {"A": [(1, 1), (2, 2)], "B": [(1, 1), (2, 2)], "C": [(2, 2)]}
    assert cells.view("A").chains[0].free_gpus == 4
    assert cells.check_safety() == ()
    # Guaranteed jobs never land on the dead server.
    for job in ("c1", "c2"):
        out = place(cells, "C", 8, job)
        assert "n3" not in out.servers()
    cells.set_health("n3", True)  # type: ignore[arg-type]
    assert not any(b.doomed for v in cells.views() for ch in v.chains for b in ch.bound)
    assert cells.check_safety() == ()
