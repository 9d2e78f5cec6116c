"""The Hops cluster a Slurm partition is: one server per Slurm node, with
the node's GPUs (its ``gpu`` GRES) and CPUs, of one GPU type.

Fake GRES (``gpu:fake:8``) names no real model, so the operator says which
Hops GPU type the nodes are (``HOPS_SLURM_GPU_TYPE``, ``hops up
--slurm-gpu-type``); without it the GRES type name is taken. A type the
built-in clusters know keeps their communication model; another gets the
paper's PCIe and network bandwidths.
"""

from __future__ import annotations

from typing import Any

import msgspec

from executor.slurm.records import SlurmNode
from shared.cluster import Cluster
from shared.slurm import gpu_gres
from shared.specs import SpecError, cluster_from_doc
from world.clusters import BUILTIN_CLUSTERS, builtin_cluster

# The paper's testbed (examples/cluster-paper-physical.yaml): PCIe, 10 GbE.
_DEFAULT_LINK = 1.25e9
_DEFAULT_NET = 1.0e9


def gres_type(gres: str) -> str:
    """The type of the first ``gpu`` GRES (``gpu:fake:8`` -> ``fake``); ''
    when it names none (``gpu:8``)."""
    return next((kind for kind, _ in gpu_gres(gres) if kind), "")


def _type_spec(name: str) -> dict[str, Any]:
    for cluster in BUILTIN_CLUSTERS:
        for spec in builtin_cluster(cluster).gpu_types:
            if spec.name == name:
                return dict(msgspec.to_builtins(spec))
    return {"name": name, "link_bandwidth": _DEFAULT_LINK, "net_bandwidth": _DEFAULT_NET}


def cluster_doc(nodes: list[SlurmNode], gpu_type: str, name: str = "slurm") -> dict[str, Any]:
    """The cluster file (as a document) of ``nodes``, in Slurm's order;
    :class:`SpecError` when there is no node or no type to give them."""
    if not nodes:
        raise SpecError("the Slurm partition has no nodes")
    types = {gpu_type or gres_type(n.gres) for n in nodes}
    if "" in types:
        raise SpecError("the nodes' GRES names no GPU type: set HOPS_SLURM_GPU_TYPE "
                        "(hops up --slurm-gpu-type)")
    servers = [{"id": n.name, "gpu_type": gpu_type or gres_type(n.gres), "gpus": n.gpus,
                "cores": n.cpus} for n in nodes]
    return {"name": name, "gpu_types": [_type_spec(t) for t in sorted(types)],
            "servers": servers}


def slurm_cluster(nodes: list[SlurmNode], gpu_type: str, name: str = "slurm") -> Cluster:
    """:func:`cluster_doc` as a :class:`Cluster` (checked as a file would be)."""
    return cluster_from_doc(cluster_doc(nodes, gpu_type, name), "Slurm's nodes")
