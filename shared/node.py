"""What a node executor knows of its devices and of a job's peers.

A real executor discovers its GPUs through NVML; on a machine without NVML
it runs with GPUs declared in its configuration and labels them
``declared``. A distributed job's processes meet at a rendezvous the placer
names: the address of the executor of the configuration's first server and
a port chosen from the start's idempotency key.
"""

from __future__ import annotations

import zlib
from typing import Literal

import msgspec

DeviceSource = Literal["nvml", "declared", "emulated"]

# Ports a rendezvous is drawn from (PyTorch's default 29500 and above).
RENDEZVOUS_PORTS = (29500, 39500)


class Device(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One accelerator of a server: its index, name and memory, and where
    the executor learnt of it. ``links`` names, per other device index, how
    the two are connected (NVML topology: ``nvlink``, ``same-board``,
    ``pcie-switch``, ``pcie-host-bridge``, ``cpu-socket``, ``system``)."""

    index: int
    name: str
    memory_mb: int = 0
    uuid: str = ""
    source: DeviceSource = "declared"
    links: dict[int, str] = {}

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"device index must be >= 0, got {self.index}")
        if self.memory_mb < 0:
            raise ValueError(f"device memory must be >= 0, got {self.memory_mb}")


class Rendezvous(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the processes of a data-parallel job meet (``MASTER_ADDR``,
    ``MASTER_PORT``)."""

    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if not self.master_addr:
            raise ValueError("master_addr must not be empty")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be a TCP port, got {self.master_port}")


def rendezvous_port(key: str) -> int:
    """A port for the start with idempotency ``key``: the same on every
    server of the start (they share the key's plan prefix and job), and
    unlikely to collide with another job's."""
    lo, hi = RENDEZVOUS_PORTS
    return lo + zlib.crc32(key.encode()) % (hi - lo)
