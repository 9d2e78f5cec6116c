"""Ground truth of the task model of Hare (hare.md §5.1, §7.1): what one task
(one batch of one job on one GPU) really costs.

Models (Table 2)
----------------
The catalog with per-type measurements on the paper's older types is
Gavel's (:func:`world.catalog.gavel_catalog`: K80, P100, V100, measured).
It has none of Table 2's eight models, so each Table 2 row gets the Gavel
job type nearest in architecture and per-GPU batch (:data:`STAND_INS`):

* CV: VGG-19/128 -> ResNet-18 (batch 128), ResNet50/64 -> ResNet-50 (batch
  64), Inception V3/32 -> ResNet-50 (batch 32);
* NLP: Bert_base/32 -> Transformer (batch 32), Transformer/128 ->
  Transformer (batch 128);
* Speech: DeepSpeech/8 (convolutions and recurrent layers) -> the LSTM
  language model, batch 80 (Gavel has no speech model; its LM is the only
  recurrent one, and at batch 80 a V100 task computes about as long as it
  synchronises, where smaller batches are all synchronisation);
* Rec.: FastGCN/128 and GraphSAGE/16 (small graph models that gain little
  from a V100, hare.md Fig. 2) -> Recommendation (batch 512 and 1024), a
  small model that Gavel measured faster on K80 and P100 than on V100.

T^c (compute) of a task is the per-GPU batch over the single-GPU throughput
of :meth:`world.truth.GroundTruth.single_gpu_throughput` on the built-in
``gavel`` cluster (Gavel's measured one-GPU figure).

GPU types
---------
T4 and M60, two of the testbed's four types, are in no catalog. The testbed
shape keeps its counts on the nearest available type by FP32 throughput:
T4 (8.1 TFLOPS) -> P100 (9.3), M60 (one of its two GPUs: 4.8) -> K80 (one
GPU of the board: 4.1). The 15-GPU testbed of §7.1 (8 V100, 4 T4, 1 K80,
2 M60) is thus 8 V100, 4 P100 and 3 K80 (:data:`CLUSTERS`).

Synchronisation (T^s)
---------------------
Hare synchronises through a parameter server (§3, §6). A task pushes its
fp32 gradients and pulls the updated model: ``2 · 4 · params`` bytes over its
host's NIC, the 25 Gbps Ethernet of the testbed (§7.1), plus a fixed latency
for the exchange. The servers are taken as sharded over the hosts (Li et
al., OSDI'14, hare.md ref. [25]) so that a server's NIC is never the
bottleneck: T^s depends on the model only, not on the GPU type nor on how
many tasks a round has. This is a stated simplification; the paper's T^s
may differ by GPU (§5.1) and grows with slower networks (Fig. 18).

In the emulated live cluster (``hops up``, :mod:`executor.tasks`) a task's
T^s is :func:`step_sync_time` instead: the cluster's own network, as the
world model times a synchronised step on it, not the testbed's 25 Gbps.

Switching (hare.md §4, Table 3)
-------------------------------
A GPU that starts a task of another job than its previous task's pays
:data:`SWITCH_S`, the mean of Hare's measured switch times in Table 3
(0.96-5.79 ms, mean 3.1 ms). A GPU's first task pays none: there is
nothing to clean, and launching a job lies outside the task model.
"""

from __future__ import annotations

from functools import lru_cache
from statistics import median
from typing import Literal

import msgspec

from shared.configuration import Configuration
from shared.ids import GpuType
from world.catalog import GAVEL_PREFIX, gavel_catalog
from world.clusters import builtin_cluster
from world.truth import GroundTruth

Category = Literal["CV", "NLP", "Speech", "Rec"]
CATEGORIES: tuple[Category, ...] = ("CV", "NLP", "Speech", "Rec")

K80, P100, V100 = GpuType("K80"), GpuType("P100"), GpuType("V100")

# Table 2's row -> the Gavel job type standing in for it (module docstring).
STAND_INS: dict[Category, tuple[tuple[str, str], ...]] = {
    "CV": (("VGG-19", "ResNet-18 (batch size 128)"),
           ("ResNet50", "ResNet-50 (batch size 64)"),
           ("Inception V3", "ResNet-50 (batch size 32)")),
    "NLP": (("Bert_base", "Transformer (batch size 32)"),
            ("Transformer", "Transformer (batch size 128)")),
    "Speech": (("DeepSpeech", "LM (batch size 80)"),),
    "Rec": (("FastGCN", "Recommendation (batch size 512)"),
            ("GraphSAGE", "Recommendation (batch size 1024)")),
}

# Cluster shapes: GPU type -> count, in the order their GPUs are numbered.
CLUSTERS: dict[str, dict[GpuType, int]] = {
    # §7.1's testbed on the nearest types (module docstring).
    "testbed": {V100: 8, P100: 4, K80: 3},
    # §7.3's 160 GPUs, heterogeneous: the testbed's 8:4:3 mix scaled to 160.
    "mixed-160": {V100: 85, P100: 43, K80: 32},
    # §7.3's low heterogeneity level (Fig. 16): V100 only.
    "v100-160": {V100: 160},
    # Fig. 16's middle level, "V100 x K80": half and half (not run by default).
    "v100-k80-160": {V100: 80, K80: 80},
}
# What ``hops experiment hare`` runs unless told otherwise.
DEFAULT_CLUSTERS = ("testbed", "mixed-160", "v100-160")

NET_GBPS = 25.0  # §7.1: instances connected by 25 Gbps Ethernet
PS_LATENCY_S = 1e-3  # one push-and-pull exchange with the server
BYTES_PER_PARAM = 4.0  # fp32 gradients and weights
SWITCH_S = 3.1e-3  # Table 3, Hare's row: mean of the eight models


class TaskModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model as the task scheduler sees it: its category, the Table 2 row
    it stands for, the catalog key, and per GPU type T^c and T^s (seconds
    per task, one batch)."""

    name: str
    category: Category
    stands_for: str
    batch_size: int
    params: int
    compute_s: dict[GpuType, float]
    sync_s: dict[GpuType, float]

    def round_s(self, gpu_type: GpuType) -> float:
        """One round on GPUs of one type, each task on its own GPU: T^c + T^s."""
        return self.compute_s[gpu_type] + self.sync_s[gpu_type]


def ps_sync_time(params: int, net_gbps: float = NET_GBPS,
                 latency_s: float = PS_LATENCY_S) -> float:
    """T^s of one task: push the gradients and pull the model (fp32) over a
    ``net_gbps`` NIC, plus the exchange's latency (module docstring)."""
    if params <= 0 or net_gbps <= 0 or latency_s < 0:
        raise ValueError("need params > 0, net_gbps > 0 and latency_s >= 0")
    return 2.0 * BYTES_PER_PARAM * params / (net_gbps * 1e9 / 8.0) + latency_s


def step_sync_time(truth: GroundTruth, model: str, gpu_type: GpuType) -> float:
    """T^s of one task of ``model`` on ``gpu_type`` in ``truth``'s cluster:
    what a synchronised step costs a GPU beyond its compute there (the
    all-reduce on the cluster's links, partly hidden by the backward pass):
    the iteration time on two GPUs of one server of the type less on one,
    the median over its servers with two; over two servers of one GPU each
    where none has two; 0 where the type has a single GPU (no synchronised
    placement). This is the quantity the live leader estimates for T^s
    (``scheduling.live.taskrun.task_times``), taken from the truth."""
    servers = [s.id for s in truth.cluster.servers_of_type(gpu_type)]
    pairs = [(Configuration.of({s: 2}), Configuration.of({s: 1}))
             for s in servers if truth.cluster.by_id[s].gpus >= 2]
    if not pairs and len(servers) >= 2:
        pairs = [(Configuration.of({servers[0]: 1, servers[1]: 1}),
                  Configuration.of({servers[0]: 1}))]
    if not pairs:
        return 0.0
    return median(max(0.0, truth.iteration_time(model, two) - truth.iteration_time(model, one))
                  for two, one in pairs)


@lru_cache(maxsize=8)
def _task_models(net_gbps: float) -> tuple[TaskModel, ...]:
    catalog = gavel_catalog()
    truth = GroundTruth(builtin_cluster("gavel"), catalog)
    out: list[TaskModel] = []
    for category in CATEGORIES:
        for row, job_type in STAND_INS[category]:
            key = GAVEL_PREFIX + job_type
            m = catalog[key]
            types = sorted(m.by_type)
            sync = ps_sync_time(m.params, net_gbps)
            out.append(TaskModel(
                name=key, category=category, stands_for=row, batch_size=m.batch_size,
                params=m.params,
                compute_s={t: m.batch_size / truth.single_gpu_throughput(key, t) for t in types},
                sync_s=dict.fromkeys(types, sync),
            ))
    return tuple(out)


def task_models(net_gbps: float = NET_GBPS) -> dict[str, TaskModel]:
    """Every stand-in model keyed by its catalog name, in category order."""
    return {m.name: m for m in _task_models(net_gbps)}


def cluster_shape(name: str) -> dict[GpuType, int]:
    """The GPU counts of cluster ``name`` (one of :data:`CLUSTERS`)."""
    if name not in CLUSTERS:
        raise ValueError(f"unknown Hare cluster {name!r}; known: {', '.join(CLUSTERS)}")
    return dict(CLUSTERS[name])
