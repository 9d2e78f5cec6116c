"""The one protocol every scheduling policy implements.

Hops, the Sia and Gavel baselines and the priority ablations all answer
``plan(snapshot) -> Plan``; the live scheduler and the simulator call nothing
else and never look at which policy they hold (the shape of AdaptDL's
``optimize(jobs, nodes, base_allocations)``).
"""

from __future__ import annotations

from typing import Protocol

from shared.snapshot import Plan, Snapshot


class Policy(Protocol):
    name: str

    def plan(self, snapshot: Snapshot) -> Plan:
        """Decide which job gets which configuration from ``snapshot``."""
        ...
