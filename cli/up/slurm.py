"""``hops up --backend slurm``: the cluster is Slurm's nodes. Before the
stack starts, the nodes of Hops' partition are read (``sinfo --json`` or
slurmrestd, :mod:`executor.slurm.client`) into a cluster file in the data
folder, which every part of the stack then uses as any cluster file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from cli.up.stack import StackConfig
from executor.slurm.cli import SlurmFailure
from executor.slurm.client import SlurmClient
from executor.slurm.nodes import cluster_doc
from executor.slurm.settings import BridgeSettingsError, bridge_settings
from shared.specs import SpecError, cluster_from_doc

CLUSTER_FILE = "slurm-cluster.json"
CONF = "HOPS_SLURM_CONF"
# What the bridge reads for its --backend when none is given (executor.__main__).
BACKEND = "HOPS_EXECUTOR_BACKEND"


def slurm_flags(flags: Mapping[str, str], environ: Mapping[str, str], *,
                slurm: bool) -> dict[str, str]:
    """The bridge's ``HOPS_SLURM_*`` settings from ``hops up``'s flags
    (those given; none unless ``slurm``), with Slurm's own ``SLURM_CONF``
    from ``environ`` when no flag names a slurm.conf, as Slurm's commands
    read it (with neither, they find theirs themselves)."""
    if not slurm:
        return {}
    out = {k: v for k, v in flags.items() if v}
    if not out.get(CONF) and environ.get("SLURM_CONF"):
        out[CONF] = environ["SLURM_CONF"]
    return out


def slurm_jobs_of(flag: str, environ: Mapping[str, str], *, slurm: bool) -> str:
    """Which jobs the bridge runs, ``emulated`` or ``real``: ``--slurm-jobs``
    when given, else (with the Slurm backend) ``HOPS_EXECUTOR_BACKEND`` from
    ``environ``, as the bridge itself would read it, else ``emulated``. ``hops
    up`` then says which, and runs the bridge with that, whatever it
    inherits. Without the Slurm backend only the flag counts (the variable
    is the executors' own)."""
    if flag or not slurm:
        return flag or "emulated"
    return environ.get(BACKEND) or "emulated"


class SlurmUpError(RuntimeError):
    """The Slurm cluster cannot be described; the message says why."""


async def _nodes_doc(config: StackConfig) -> dict[str, object]:
    settings = bridge_settings(config.slurm, config.runs_dir)
    client = SlurmClient(settings.slurm)
    try:
        nodes = await client.nodes()
    finally:
        await client.aclose()
    return cluster_doc(nodes, settings.gpu_type, f"slurm-{settings.slurm.partition}")


def describe(config: StackConfig) -> StackConfig:
    """``config`` with its cluster the file written from Slurm's nodes."""
    try:
        doc = asyncio.run(_nodes_doc(config))
        cluster_from_doc(doc, "Slurm's nodes")
    except (BridgeSettingsError, SlurmFailure, SpecError) as e:
        raise SlurmUpError(f"cannot describe the Slurm cluster: {e}") from None
    path = Path(config.data_dir) / CLUSTER_FILE
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return replace(config, cluster=str(path.resolve()))
