"""HiveD as a layer of the policy stack (Zhao et al., OSDI'20): the layer
(:mod:`.layer`), one plan of it (:mod:`.round`) and its state
(:mod:`.state`), the virtual cluster a tenant's inner policy plans on
(:mod:`.view`), profiling inside the cells (:mod:`.profiling`) and the
opportunistic jobs' share of idle GPUs (:mod:`.opportunistic`). The cell
algorithms themselves (HiveD's ``pkg/algorithm``) are :mod:`scheduling.cells`."""

from scheduling.layers.hived.layer import HivedLayer
from scheduling.layers.hived.state import HivedState, decode_state, restore_cells

__all__ = ["HivedLayer", "HivedState", "decode_state", "restore_cells"]
