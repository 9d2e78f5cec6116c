"""The cell spec's errors (HiveD §4 "Cell specification"): each is one
SpecError naming the file and the field, never a crash."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduling.cells import Allocation, Cells, load_cells
from shared.specs import SpecError
from tests.cells_trees import cluster, figure3_cluster, figure3_doc


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "cells.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def error(tmp_path: Path, doc: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        load_cells(write(tmp_path, doc), figure3_cluster())
    return str(info.value)


def test_figure3_spec_loads(tmp_path: Path) -> None:
    cells = Cells.load(write(tmp_path, figure3_doc()), figure3_cluster())
    assert cells.tenants() == ("A", "B", "C")
    assert cells.model.chains["K80"].sizes == (1, 2, 4, 8)  # type: ignore[index]


def test_unknown_child_cell_type(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["cell_types"]["K80-SOCKET"]["child_cell_type"] = "K80-SWTCH"
    assert error(tmp_path, doc) == (
        "cells.yaml: cell_types.K80-SOCKET.child_cell_type: unknown cell type 'K80-SWTCH'")


def test_unknown_physical_cell_type(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["physical_cells"][2]["cell_type"] = "V100-NODE"
    assert error(tmp_path, doc) == (
        "cells.yaml: physical_cells[2].cell_type: unknown cell type 'V100-NODE'")


def test_unknown_virtual_cell_type(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["virtual_clusters"]["B"]["virtual_cells"][1]["cell_type"] = "K80-RACK"
    assert error(tmp_path, doc) == (
        "cells.yaml: virtual_clusters.B.virtual_cells[1].cell_type: "
        "unknown cell type 'K80-RACK'")


def test_cyclic_cell_type(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["cell_types"]["K80-SWITCH"]["child_cell_type"] = "K80-NODE"
    assert error(tmp_path, doc) == (
        "cells.yaml: cell_types.K80-SWITCH.child_cell_type: "
        "cyclic cell type: K80-NODE -> K80-SOCKET -> K80-SWITCH -> K80-NODE")


def test_leaf_count_differs_from_server(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["cell_types"]["K80-NODE"]["child_cell_number"] = 4  # 16 leaves, n0 has 8 GPUs
    doc["virtual_clusters"] = {}
    assert error(tmp_path, doc) == (
        "cells.yaml: physical_cells[0].server: server n0 has 8 GPUs, its cell has 16 leaf cells")


def test_gpu_type_mismatch(tmp_path: Path) -> None:
    doc = figure3_doc()
    mixed = cluster({"n0": ("K80", 8), "n1": ("K80", 8), "n2": ("V100", 8), "n3": ("K80", 8)})
    with pytest.raises(SpecError) as info:
        load_cells(write(tmp_path, doc), mixed)
    assert str(info.value) == (
        "cells.yaml: physical_cells[2].server: server n2 has V100 GPUs, a K80-NODE cell has K80")


def test_server_used_twice(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["physical_cells"][3]["server"] = "n1"
    assert error(tmp_path, doc) == (
        "cells.yaml: physical_cells[3].server: server n1 is already used by physical_cells[1]")


def test_unknown_server(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["physical_cells"][0]["server"] = "n9"
    assert error(tmp_path, doc) == "cells.yaml: physical_cells[0].server: unknown server 'n9'"


def test_infeasible_reservation(tmp_path: Path) -> None:
    """The issue's example: one level-2 cell more than the chain can give."""
    doc = {
        "cell_types": {
            "TitanXP-SWITCH": {"child_cell_type": "TitanXP", "child_cell_number": 2},
            "TitanXP-NODE": {"child_cell_type": "TitanXP-SWITCH", "child_cell_number": 2,
                             "is_node_level": True},
        },
        "physical_cells": [{"cell_type": "TitanXP-NODE", "server": f"t{i}"} for i in range(4)],
        "virtual_clusters": {
            "cv": {"virtual_cells": [{"cell_type": "TitanXP-SWITCH", "cell_number": 1}]},
            "nlp": {"virtual_cells": [{"cell_type": "TitanXP-SWITCH", "cell_number": 8}]},
        },
    }
    titans = cluster({f"t{i}": ("TitanXP", 4) for i in range(4)})
    with pytest.raises(SpecError) as info:
        load_cells(write(tmp_path, doc), titans)
    assert str(info.value) == (
        "cells.yaml: virtual_clusters.nlp: tenant nlp: chain TitanXP level 2: "
        "9 needed, 8 available")


def test_infeasible_at_a_higher_level(tmp_path: Path) -> None:
    doc = copy.deepcopy(figure3_doc())
    doc["virtual_clusters"]["C"]["virtual_cells"][0]["cell_number"] = 5
    assert error(tmp_path, doc) == (
        "cells.yaml: virtual_clusters.C: tenant C: chain K80 level 4: 5 needed, 4 available")


def test_type_errors_name_the_field(tmp_path: Path) -> None:
    doc = figure3_doc()
    doc["cell_types"]["K80-NODE"]["child_cell_number"] = "two"
    message = error(tmp_path, doc)
    assert message.startswith("cells.yaml: ") and "cell_types" in message


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"missing\.yaml: cannot read spec"):
        load_cells(tmp_path / "missing.yaml", figure3_cluster())


def test_the_example_in_the_docs_loads(tmp_path: Path) -> None:
    """docs/tenancy.md's example: Figure 3 as one rack, plus a low-priority tenant."""
    text = (Path(__file__).parents[1] / "docs" / "tenancy.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "tenancy.yaml"
    path.write_text(block)
    cells = Cells.load(path, figure3_cluster())
    assert cells.tenants() == ("A", "B", "C", "scavenger")
    assert cells.model.chains["K80"].sizes == (1, 2, 4, 8, 32)  # type: ignore[index]
    out = cells.allocate("scavenger", "K80", 2, "s1")  # type: ignore[arg-type]
    assert isinstance(out, Allocation) and out.opportunistic
    assert cells.check_safety() == ()
