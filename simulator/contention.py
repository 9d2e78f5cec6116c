"""Memory-bandwidth contention between co-located jobs: the world model's
slowdown (CODA §IV-C), an assumption throughout (docs/simulator-data.md,
"Memory-bandwidth contention").

CODA measured (Figures 6 and 7, without publishing the numbers) that a
training job's CPU side uses memory bandwidth growing with its data
preparation (CV and speech more than NLP, whose data sit in memory), that
co-located bandwidth-heavy programs slow NLP models by 50% and more, speech
models less and most CV models hardly at all, and that LLC contention does
not matter. This module turns that into a model with stated numbers:

* a job's bandwidth demand is its cores times a per-core rate: by CODA
  category for GPU jobs (:data:`GPU_GBPS_PER_CORE`), 1 GB/s for a CPU job
  and 8 GB/s for a bandwidth-heavy one (model ``cpu-membw``: the HEAT-like
  programs of §IV-C, 0.5% of CPU jobs in §VI-E);
* a server whose demand ``u`` of its capacity passes ``KNEE`` (75%, where
  CODA places its threshold) slows each GPU job on it by
  ``sensitivity x min(1, (u - KNEE) / (1 - KNEE))``, the sensitivity by
  category (:data:`SENSITIVITY`: NLP 0.5, speech 0.3, CV 0.1, other 0.2);
  CPU jobs are not slowed by contention (CODA protects GPU jobs only);
* MBA (CODA §V-D) caps each core of a job at ``mba_percent`` of a core's
  full bandwidth, taken as :data:`CORE_FULL_GBPS` (8 GB/s, the heaviest
  per-core demand of this model); a capped job draws ``min(rate, cap)`` per
  core and, bandwidth-bound while capped, runs at the share it draws of
  what it would (a light CPU job under a 50% cap is not slowed at all).

Servers that declare no bandwidth (``memory_bandwidth_gbps`` 0) have no
contention, so every cluster before CODA's runs as it did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.ids import ServerId
from shared.job import Category, JobSpec

GPU_GBPS_PER_CORE: Mapping[Category, float] = {"cv": 2.0, "nlp": 0.3, "speech": 1.0,
                                               "other": 1.0}
CPU_GBPS_PER_CORE = 1.0
HEAVY_GBPS_PER_CORE = 8.0
HEAVY_MODEL = "cpu-membw"
SENSITIVITY: Mapping[Category, float] = {"cv": 0.1, "nlp": 0.5, "speech": 0.3, "other": 0.2}
KNEE = 0.75
CORE_FULL_GBPS = HEAVY_GBPS_PER_CORE


def per_core_gbps(spec: JobSpec, model: str) -> float:
    """What one core of the job draws without a cap."""
    if spec.kind == "cpu":
        return HEAVY_GBPS_PER_CORE if model == HEAVY_MODEL else CPU_GBPS_PER_CORE
    return GPU_GBPS_PER_CORE[spec.category]


def capped(rate: float, mba_percent: int) -> float:
    """A core's draw ``rate`` under an MBA cap of ``mba_percent``."""
    return min(rate, CORE_FULL_GBPS * mba_percent / 100)


def demand_gbps(spec: JobSpec, model: str, cores: int, mba_percent: int = 100) -> float:
    """A job's memory bandwidth demand holding ``cores`` on a server."""
    return cores * capped(per_core_gbps(spec, model), mba_percent)


def mba_factor(spec: JobSpec, model: str, mba_percent: int) -> float:
    """The speed (<= 1) of a job under an MBA cap: the share of its draw it keeps."""
    rate = per_core_gbps(spec, model)
    return 1.0 if mba_percent >= 100 or rate <= 0 else capped(rate, mba_percent) / rate


def server_demand(jobs: Iterable[tuple[JobSpec, str, Configuration]]) -> dict[ServerId, float]:
    """Bandwidth demand per server of the running ``(spec, model, config)``."""
    out: dict[ServerId, float] = {}
    for spec, model, config in jobs:
        for s in config.servers:
            out[s] = out.get(s, 0.0) + demand_gbps(spec, model, config.cores_on(s),
                                                   config.mba_percent)
    return out


def slowdown(cluster: Cluster, demand: Mapping[ServerId, float], spec: JobSpec,
             config: Configuration, model: str = "") -> float:
    """The factor (<= 1) a GPU job on ``config`` runs at for the contention
    on its worst server (1 on servers without a capacity); a CPU job's is
    its MBA cap's (:func:`mba_factor`)."""
    if spec.kind == "cpu":
        return mba_factor(spec, model, config.mba_percent)
    worst = 1.0
    for s in config.servers:
        capacity = cluster.by_id[s].memory_bandwidth_gbps
        if capacity <= 0:
            continue
        over = (demand.get(s, 0.0) / capacity - KNEE) / (1.0 - KNEE)
        worst = min(worst, 1.0 - SENSITIVITY[spec.category] * min(1.0, max(0.0, over)))
    return worst
