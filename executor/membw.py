"""A node's memory bandwidth, through Linux resctrl (Intel RDT, AMD PQoS).

CODA's contention eliminator (§V-D) watches each node's memory bandwidth
with Memory Bandwidth Monitoring (MBM) and throttles a CPU job with Memory
Bandwidth Allocation (MBA); without MBA it halves the CPU job's cores
instead. Where the kernel exposes resctrl (mounted at ``/sys/fs/resctrl``):

* MBM: ``mon_data/<domain>/mbm_total_bytes`` of the default group counts
  the bytes every task of the node moved to and from memory, per L3
  domain (socket); the sum over domains, read twice, gives GB/s
  (:class:`BandwidthMeter`). A domain may read ``Unavailable`` for a
  while: it is left out of that reading;
* MBA: the ``schemata`` file has an ``MB:`` line.

Anything missing (no resctrl, a VM, a CPU without RDT) reads as not
available: the executor says so once when it starts, and registers
``mba = False`` so that the eliminator uses the fallback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESCTRL = Path("/sys/fs/resctrl")
_TOTAL = "mbm_total_bytes"


@dataclass(frozen=True)
class Resctrl:
    """What this node's resctrl offers."""

    mounted: bool = False
    mbm: bool = False  # memory bandwidth can be read
    mba: bool = False  # memory bandwidth can be throttled

    def describe(self) -> str:
        """One line for the executor's log."""
        if not self.mounted:
            return ("resctrl is not available (no /sys/fs/resctrl): memory bandwidth is not "
                    "measured, and the contention eliminator will halve a CPU job's cores "
                    "instead of throttling its bandwidth")
        parts = [f"memory bandwidth monitoring {'on' if self.mbm else 'not available'}",
                 f"allocation (MBA) {'on' if self.mba else 'not available'}"]
        tail = "" if self.mba else ("; the contention eliminator will halve a CPU job's "
                                    "cores instead of throttling its bandwidth")
        return "resctrl: " + ", ".join(parts) + tail


def _counters(root: Path) -> list[Path]:
    mon = root / "mon_data"
    try:
        return sorted(d / _TOTAL for d in mon.iterdir() if (d / _TOTAL).is_file())
    except OSError:
        return []


def has_mba(schemata: str) -> bool:
    """Whether a ``schemata`` file's text has a memory bandwidth (``MB:``) line."""
    return any(line.strip().startswith("MB:") for line in schemata.splitlines())


def detect(root: Path = RESCTRL) -> Resctrl:
    """What resctrl at ``root`` offers (all False where it is not mounted)."""
    try:
        schemata = (root / "schemata").read_text()
    except OSError:
        return Resctrl()
    return Resctrl(mounted=True, mbm=bool(_counters(root)), mba=has_mba(schemata))


def total_bytes(root: Path = RESCTRL) -> int | None:
    """The bytes moved so far over every domain that reads; None when none does."""
    total, read = 0, False
    for counter in _counters(root):
        try:
            total += int(counter.read_text().strip())
            read = True
        except (OSError, ValueError):  # "Unavailable", or gone
            continue
    return total if read else None


class BandwidthMeter:
    """GB/s between two readings of the node's MBM counters."""

    def __init__(self, root: Path = RESCTRL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self.clock = clock
        self._last: tuple[int, float] | None = None

    def read(self) -> float:
        """The bandwidth since the last reading (0.0 on the first, or when
        the counters cannot be read or went backwards)."""
        now, value = self.clock(), total_bytes(self.root)
        last, self._last = self._last, (value, now) if value is not None else None
        if value is None or last is None or now <= last[1] or value < last[0]:
            return 0.0
        return (value - last[0]) / (now - last[1]) / 1e9


class NodeMemory:
    """What an executor knows of its node's memory bandwidth: nothing for
    an emulated one (``real`` False), else what resctrl offers."""

    def __init__(self, real: bool, root: Path = RESCTRL) -> None:
        self.resctrl = detect(root) if real else Resctrl()
        self.meter = BandwidthMeter(root) if self.resctrl.mbm else None

    def gbps(self) -> float:
        """The bandwidth in use since the last call (0.0: not measured)."""
        return self.meter.read() if self.meter is not None else 0.0
