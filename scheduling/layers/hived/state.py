"""The HiveD layer's state after a plan (§4 "Fault tolerance": a standby
rebuilds the same bindings from it): what travels as ``LayerRecord.state``
and comes back as ``Snapshot.layer_state["hived"]``."""

from __future__ import annotations

import msgspec

from scheduling.cells import CellModel, Cells
from scheduling.cells import Snapshot as CellsSnapshot
from shared.configuration import Configuration


class HivedState(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The layer's state after a plan: the cells (bindings, each job's
    cells, bad servers) and each guaranteed job's virtual configuration."""

    cells: CellsSnapshot
    virtual: dict[str, Configuration] = {}


def decode_state(raw: bytes) -> HivedState:
    """The layer's state from ``LayerRecord.state`` / ``Snapshot.layer_state["hived"]``."""
    return msgspec.json.decode(raw, type=HivedState)


def restore_cells(model: CellModel, raw: bytes) -> Cells:
    """The cells as the plan that left ``raw`` left them (fresh when empty):
    what ``GET /tenants`` shows (:meth:`Cells.views`)."""
    return Cells.restore(model, decode_state(raw).cells) if raw else Cells(model)


def cells_of_state(model: CellModel, raw: bytes | None) -> Cells:
    """The cells ``raw`` holds; fresh when there is none, or when it does
    not fit ``model`` (the layer then starts afresh as well)."""
    if raw:
        try:
            return restore_cells(model, raw)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            pass
    return Cells(model)
