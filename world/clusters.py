"""Built-in clusters of the world model: the Hops paper's physical cluster (§4.2),
its 512-GPU simulated cluster (§4.3) and Gavel's simulated cluster (OSDI'20).

The specs live as YAML under world/data/clusters/, in the format of
:mod:`shared.specs`, with the rationale of their bandwidths in comments.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from shared.cluster import Cluster
from shared.specs import SpecError, cluster_from_doc, load_cluster

BUILTIN_CLUSTERS = ("paper-physical", "paper-sim-512", "gavel")


@lru_cache(maxsize=len(BUILTIN_CLUSTERS))
def builtin_cluster(name: str) -> Cluster:
    """The built-in cluster ``name`` (one of :data:`BUILTIN_CLUSTERS`)."""
    if name not in BUILTIN_CLUSTERS:
        known = ", ".join(BUILTIN_CLUSTERS)
        raise SpecError(f"unknown built-in cluster {name!r} (known: {known})")
    source = f"{name}.yaml"
    text = (resources.files("world") / "data" / "clusters" / source).read_text()
    # YAML 1.1 reads 1.25e9 as a string, hence the lenient conversion.
    return cluster_from_doc(yaml.safe_load(text), source, lenient_keys=True)


def cluster_arg(name_or_path: str) -> Cluster:
    """A built-in cluster by name, or a cluster spec file (YAML, TOML, JSON)."""
    if name_or_path in BUILTIN_CLUSTERS:
        return builtin_cluster(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(BUILTIN_CLUSTERS)
        raise SpecError(
            f"{name_or_path}: neither a built-in cluster ({known}) nor a cluster spec file"
        )
    return load_cluster(path)
