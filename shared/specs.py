"""Loading cluster and job specs from YAML, TOML or JSON files.

A spec error is raised as one :class:`SpecError` naming the file, the field
and the problem, e.g. ``jobs.yaml: Expected `int`, got `str` - at `$.jobs[0].batch_size```.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, ServerId
from shared.job import JobSpec

T = TypeVar("T")


class SpecError(ValueError):
    """A spec file or document that cannot be used, with the reason."""


class ServerGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``count`` identical servers named ``{id_prefix}{n}`` (n from 0), or a
    single server when ``id`` is given."""

    gpu_type: GpuType
    gpus: int
    id: ServerId | None = None
    id_prefix: str = ""
    count: int = 1
    model: str = ""
    cpu: str = ""
    memory_gb: int = 0
    network: str = ""
    cores: int = 0  # CPU cores that may be allocated (0: none are scheduled)
    memory_bandwidth_gbps: float = 0.0  # CODA's eliminator (0: not declared)
    mba: bool = False

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise ValueError(f"count must be > 0, got {self.count}")
        if self.id is None and not self.id_prefix:
            raise ValueError("give id (one server) or id_prefix and count (a group)")
        if self.id is not None and self.count != 1:
            raise ValueError("id names one server; use id_prefix with count")


class ClusterFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    gpu_types: tuple[GpuTypeSpec, ...]
    servers: tuple[ServerGroup, ...]
    name: str = "cluster"


class JobsFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    jobs: tuple[JobSpec, ...]


def _expand(group: ServerGroup) -> list[Server]:
    ids = (
        [group.id]
        if group.id is not None
        else [ServerId(f"{group.id_prefix}{n}") for n in range(group.count)]
    )
    return [
        Server(
            id=sid,
            gpu_type=group.gpu_type,
            gpus=group.gpus,
            model=group.model,
            cpu=group.cpu,
            memory_gb=group.memory_gb,
            network=group.network,
            cores=group.cores,
            memory_bandwidth_gbps=group.memory_bandwidth_gbps,
            mba=group.mba,
        )
        for sid in ids
    ]


def _read(path: Path) -> tuple[Any, bool]:
    """The parsed document and whether its scalars may need coercion.

    Files are read leniently: JSON and TOML keys are always strings, and YAML
    1.1 reads ``2.5e9`` as a string, so numbers written as strings are
    accepted; anything that is not a number still fails with its path.
    """
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml", ".json"):
        raise SpecError(f"{path.name}: unknown spec format {suffix!r} (use .yaml, .toml or .json)")
    text = path.read_text()
    if suffix in (".yaml", ".yml"):
        return yaml.safe_load(text), True
    if suffix == ".toml":
        return tomllib.loads(text), True
    return json.loads(text), True


def convert(doc: Any, kind: type[T], source: str, lenient_keys: bool = False) -> T:
    """Validate an already-parsed document against ``kind``."""
    try:
        return msgspec.convert(doc, kind, strict=not lenient_keys)
    except msgspec.ValidationError as exc:
        raise SpecError(f"{source}: {exc}") from None


def cluster_from_doc(doc: Any, source: str = "cluster", lenient_keys: bool = False) -> Cluster:
    spec = convert(doc, ClusterFile, source, lenient_keys)
    servers = tuple(s for g in spec.servers for s in _expand(g))
    try:
        return Cluster(gpu_types=spec.gpu_types, servers=servers, name=spec.name)
    except ValueError as exc:
        raise SpecError(f"{source}: {exc}") from None


def load_cluster(path: str | Path) -> Cluster:
    p = Path(path)
    doc, lenient = read_document(p)
    return cluster_from_doc(doc, p.name, lenient)


def load_jobs(path: str | Path) -> tuple[JobSpec, ...]:
    """A jobs file holds ``{"jobs": [...]}`` or a bare list of job specs."""
    p = Path(path)
    doc, lenient = read_document(p)
    if isinstance(doc, list):
        doc = {"jobs": doc}
    return convert(doc, JobsFile, p.name, lenient).jobs


def read_document(p: Path) -> tuple[Any, bool]:
    """Parse a spec file; the flag says whether scalars may be coerced."""
    try:
        return _read(p)
    except (OSError, yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"{p.name}: cannot read spec: {exc}") from None
