"""The accelerators of this machine, for a real node executor.

With NVML (the ``pynvml`` module of package nvidia-ml-py) every GPU is
listed with its name, memory, UUID and how it connects to every other GPU:
``nvlink`` when NVML reports an active NvLink to that peer, else the
topology level of their closest common ancestor (``same-board``,
``pcie-switch``, ``pcie-host-bridge``, ``cpu-socket``, ``system``). The
number found must be the number the cluster file declares for the server,
or the executor would offer GPUs it does not have (or hide some).

Without NVML (no library, no driver: a CPU-only machine) the executor runs
with the devices the cluster file declares, labelled ``declared``, and
says so when it starts.

:func:`discover` takes the NVML module as an argument, so tests may hand
in a stand-in; the real path imports ``pynvml``.

Besides GPUs a server has CPU cores and memory to allocate
(:attr:`shared.cluster.Server.capacity`). A real executor advertises those
the cluster file declares (``cores``, ``memory_gb``) and, for either left
undeclared (0), what it finds on this host (:func:`with_host_capacity`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from shared.cluster import Server
from shared.node import Device

# NVML's topology levels (nvmlGpuTopologyLevel_t), closest first.
TOPOLOGY_LINKS = {
    0: "same-board",  # NVML_TOPOLOGY_INTERNAL
    10: "pcie-switch",  # NVML_TOPOLOGY_SINGLE
    20: "pcie-switch",  # NVML_TOPOLOGY_MULTIPLE
    30: "pcie-host-bridge",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "cpu-socket",  # NVML_TOPOLOGY_NODE
    50: "system",  # NVML_TOPOLOGY_SYSTEM
}
NVLINK = "nvlink"
_NVLINK_ACTIVE = 1  # NVML_FEATURE_ENABLED
_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of older drivers; NVML stops us sooner


class DiscoveryError(RuntimeError):
    """What NVML found contradicts the cluster file."""


@dataclass(frozen=True)
class Discovery:
    """The devices an executor runs with, and one line saying where from."""

    devices: tuple[Device, ...]
    source: str  # "nvml" or "declared"
    message: str


def _text(value: Any) -> str:
    """NVML strings are bytes in older bindings."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvlink_peers(nvml: Any, handle: Any) -> set[str]:
    """The PCI bus ids at the far end of the device's active NvLinks."""
    peers: set[str] = set()
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != _NVLINK_ACTIVE:
                continue
            peers.add(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except nvml.NVMLError:  # no such link, or no NvLink at all
            break
    return peers


def _link(nvml: Any, a: Any, b: Any, nvlinked: set[str], bus_b: str) -> str:
    if bus_b in nvlinked:
        return NVLINK
    try:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except nvml.NVMLError:
        return "system"  # NVML cannot tell: assume the farthest
    return TOPOLOGY_LINKS.get(level, "system")


def nvml_devices(nvml: Any) -> tuple[Device, ...]:
    """Every GPU NVML lists (NVML already initialised)."""
    count = int(nvml.nvmlDeviceGetCount())
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    buses = [_text(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    devices = []
    for i, h in enumerate(handles):
        nvlinked = _nvlink_peers(nvml, h)
        links = {j: _link(nvml, h, handles[j], nvlinked, buses[j])
                 for j in range(count) if j != i}
        memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
        devices.append(Device(index=i, name=_text(nvml.nvmlDeviceGetName(h)),
                              memory_mb=memory_mb, uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                              source="nvml", links=links))
    return tuple(devices)


def declared_devices(server: Server) -> tuple[Device, ...]:
    """The server's GPUs as the cluster file declares them."""
    return tuple(Device(index=i, name=server.gpu_type, source="declared")
                 for i in range(server.gpus))


def load_nvml() -> Any:
    """The ``pynvml`` module (ImportError when it is not installed)."""
    return importlib.import_module("pynvml")


def discover(server: Server, nvml: Any | None = None) -> Discovery:
    """The devices of ``server`` on this machine (see the module docstring);
    :class:`DiscoveryError` when NVML finds another number of GPUs than the
    cluster file declares."""
    try:
        nvml = nvml if nvml is not None else load_nvml()
        nvml.nvmlInit()
    except Exception as e:  # NVMLError (no library, no driver) or no pynvml at all
        devices = declared_devices(server)
        return Discovery(devices, "declared",
                         f"NVML unavailable ({e}); running with {server.gpus} declared GPUs "
                         f"of type {server.gpu_type}")
    try:
        devices = nvml_devices(nvml)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    if len(devices) != server.gpus:
        raise DiscoveryError(f"NVML finds {len(devices)} GPUs on this machine, but the "
                             f"cluster file declares {server.gpus} for {server.id}; fix the "
                             "cluster file (or CUDA_VISIBLE_DEVICES) so that they agree")
    names = sorted({d.name for d in devices})
    return Discovery(devices, "nvml", f"NVML finds {len(devices)} GPUs ({', '.join(names)}) "
                                      f"for {server.id} of type {server.gpu_type}")


def host_cores() -> int:
    """The CPU cores this executor may use (its affinity mask, which a
    container's cpuset narrows; else every core the host has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def host_memory_gb(meminfo: Path = Path("/proc/meminfo"),
                   sysconf: Callable[[str], int] = os.sysconf) -> int:
    """The host's memory in whole GiB (``os.sysconf``, else ``/proc/meminfo``;
    0 when neither says)."""
    try:
        total = sysconf("SC_PAGE_SIZE") * sysconf("SC_PHYS_PAGES")
        if total > 0:
            return int(total // 1024**3)
    except (AttributeError, ValueError, OSError):
        pass
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024**2  # kB
    return 0


def with_host_capacity(server: Server, cores: int, memory_gb: int) -> Server:
    """``server`` as a real executor advertises it: the cores and memory the
    cluster file declares, or else those found on this host."""
    return msgspec.structs.replace(server, cores=server.cores or cores,
                                   memory_gb=server.memory_gb or memory_gb)
