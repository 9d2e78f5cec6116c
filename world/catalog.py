"""The world model's catalog: what each model *really* does on each GPU type.

A :class:`ModelTruth` holds, per GPU type, the true single-GPU time modules of
Eq. (1) (forward, backward, update and overlap pattern), the true bimodal
data-time source of Eq. (3) with its per-condition synchronisation waits
(Hops §3.5), and, where measured, per-GPU throughputs for 1, 2, 4 and 8 GPUs
consolidated on one server or spread one per server.

Two catalogs are built in (provenance of every number: docs/simulator-data.md):

* the models of the Hops paper's Table 2 (§4.2) on GTX1080Ti, TitanXP and
  RTX3090, derived from public facts (parameter counts, relative FP32 training
  speed, memory bandwidth, input-pipeline cost) since the paper publishes no
  per-model timings;
* Gavel's 26 job types on K80, P100 and V100 from its measured
  ``simulation_throughputs.json`` (Narayanan et al., "Heterogeneity-Aware
  Cluster Scheduling Policies for Deep Learning Workloads", OSDI'20, MIT
  licence, world/data/gavel/LICENSE).
"""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from importlib import resources
from typing import Literal, NamedTuple

import msgspec

from shared.ids import GpuType
from shared.measurements import Pattern

Category = Literal["S", "M", "L", "XL"]
Optimizer = Literal["sgd", "adamw"]
Source = Literal["paper", "gavel"]

PAPER_TYPES = (GpuType("GTX1080Ti"), GpuType("TitanXP"), GpuType("RTX3090"))
GAVEL_TYPES = {"k80": GpuType("K80"), "p100": GpuType("P100"), "v100": GpuType("V100")}
GAVEL_PREFIX = "gavel:"


class DataSource(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Eq. (3) as ground truth, in seconds per iteration: with probability
    ``p_cache`` the batch is in memory, T_d ~ N(mu_cache, sd_cache), else it
    is read from storage, T_d ~ N(mu_load, sd_load). ``wait_cache`` and
    ``wait_load`` are the mean synchronisation waits T_w under each condition
    (§3.5: T_w follows T_d). A stable source has ``p_cache == 1``."""

    p_cache: float
    mu_cache: float
    sd_cache: float
    mu_load: float
    sd_load: float
    wait_cache: float
    wait_load: float

    def __post_init__(self) -> None:
        if not 0.0 < self.p_cache <= 1.0:
            raise ValueError(f"p_cache must lie in (0, 1], got {self.p_cache}")
        values = (self.mu_cache, self.sd_cache, self.mu_load, self.sd_load,
                  self.wait_cache, self.wait_load)
        if any(v < 0 for v in values):
            raise ValueError("data-source times must be >= 0")

    @property
    def bimodal(self) -> bool:
        return self.p_cache < 1.0


class TypeTruth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model on one GPU type, on that type's reference server.

    ``consolidated[k]`` / ``unconsolidated[k]``: measured per-GPU throughput
    (samples/s) with k GPUs on one server / on k servers; only measured points
    are present."""

    t_f: float
    t_b: float
    t_u: float
    pattern: Pattern
    data: DataSource
    consolidated: dict[int, float] = {}
    unconsolidated: dict[int, float] = {}

    def __post_init__(self) -> None:
        if min(self.t_f, self.t_b, self.t_u) < 0:
            raise ValueError("time modules must be >= 0")
        measured = (*self.consolidated.items(), *self.unconsolidated.items())
        if any(k <= 0 or v <= 0 for k, v in measured):
            raise ValueError("measured scaling points need k > 0 and throughput > 0")


class ModelTruth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A trainable model: architecture, dataset and per-GPU batch, and its true
    behaviour per GPU type. ``category`` is Table 2's duration class (None for
    Gavel's job types, which Table 2 does not classify)."""

    name: str
    params: int
    batch_size: int
    dataset: str
    by_type: dict[GpuType, TypeTruth]
    category: Category | None = None
    optimizer: Optimizer = "sgd"
    source: Source = "paper"

    def __post_init__(self) -> None:
        if not self.name or self.params <= 0 or self.batch_size <= 0:
            raise ValueError(f"model {self.name!r}: need a name, params > 0 and batch_size > 0")
        if not self.by_type:
            raise ValueError(f"model {self.name}: no GPU type")


# --- Table 2 models -------------------------------------------------------------

# Relative FP32 training speed against the GTX 1080 Ti (public benchmark
# reports; see docs). Transformers gain more on Ampere: TF32 matmuls and 1.9x
# the memory bandwidth.
SPEEDUP = {
    "cnn": {"GTX1080Ti": 1.0, "TitanXP": 1.06, "RTX3090": 2.0},
    "transformer": {"GTX1080Ti": 1.0, "TitanXP": 1.10, "RTX3090": 2.4},
}
# Peak memory bandwidth (GB/s, spec sheets) and the share an optimizer step
# reaches: the update is memory-bound, so T_u = params·bytes/(0.6·bandwidth).
MEM_BW_GBS = {"GTX1080Ti": 484.0, "TitanXP": 548.0, "RTX3090": 936.0}
MEM_EFFICIENCY = 0.6
# Bytes moved per parameter by one step (fp32): SGD with momentum reads
# param, grad, momentum and writes param, momentum; AdamW also reads and
# writes the second moment.
UPDATE_BYTES = {"sgd": 20.0, "adamw": 28.0}
# Cache-miss read rate of the shared storage per job (MB/s).
STORAGE_MBPS = 120.0


class _Paper(NamedTuple):
    key: str
    dataset: str
    category: Category
    batch: int
    params: int
    optimizer: Optimizer
    family: Literal["cnn", "transformer"]
    samples_per_s: float  # FP32 training throughput on one GTX 1080 Ti
    data_ms: float  # input-pipeline cost per sample on the reference host, cache hit
    miss_kb: float  # bytes read per sample on a cache miss (0: stable)
    p_cache: float
    pattern: Pattern


# Table 2 read as: each model row trained on each dataset of its row, the
# category/batch pair following the dataset order (ImageNet/CIFAR-10).
_PAPER = (
    _Paper("resnet18-imagenet", "ImageNet", "XL", 128, 11_689_512, "sgd", "cnn",
           480.0, 1.5, 110.0, 0.65, 1),
    _Paper("resnet18-cifar10", "CIFAR-10", "S", 256, 11_181_642, "sgd", "cnn",
           4800.0, 0.03, 0.0, 1.0, 1),
    _Paper("resnet50-imagenet", "ImageNet", "XL", 128, 25_557_032, "sgd", "cnn",
           210.0, 1.5, 110.0, 0.65, 1),
    _Paper("resnet50-cifar10", "CIFAR-10", "S", 256, 23_528_522, "sgd", "cnn",
           2100.0, 0.03, 0.0, 1.0, 1),
    _Paper("vgg11-imagenet", "ImageNet", "L", 32, 132_863_336, "sgd", "cnn",
           230.0, 1.5, 110.0, 0.65, 1),
    _Paper("vgg11-cifar10", "CIFAR-10", "S", 128, 128_807_306, "sgd", "cnn",
           2300.0, 0.03, 0.0, 1.0, 1),
    _Paper("vgg13-imagenet", "ImageNet", "L", 32, 133_047_848, "sgd", "cnn",
           165.0, 1.5, 110.0, 0.65, 1),
    _Paper("vgg13-cifar10", "CIFAR-10", "S", 128, 128_991_818, "sgd", "cnn",
           1650.0, 0.03, 0.0, 1.0, 1),
    _Paper("convnext-base-imagenet", "ImageNet", "L", 32, 88_591_464, "sgd", "cnn",
           60.0, 1.5, 110.0, 0.65, 1),
    _Paper("convnext-base-cifar10", "CIFAR-10", "S", 64, 87_576_714, "sgd", "cnn",
           600.0, 0.03, 0.0, 1.0, 1),
    _Paper("densenet161-imagenet", "ImageNet", "L", 32, 28_681_000, "sgd", "cnn",
           100.0, 1.5, 110.0, 0.65, 1),
    _Paper("densenet161-cifar10", "CIFAR-10", "S", 64, 26_494_090, "sgd", "cnn",
           1000.0, 0.03, 0.0, 1.0, 1),
    _Paper("mobilenetv2-imagenet", "ImageNet", "M", 64, 3_504_872, "sgd", "cnn",
           550.0, 1.5, 110.0, 0.65, 1),
    _Paper("mobilenetv2-cifar10", "CIFAR-10", "S", 64, 2_236_682, "sgd", "cnn",
           5500.0, 0.03, 0.0, 1.0, 1),
    _Paper("regnet-imagenet", "ImageNet", "L", 32, 11_202_430, "sgd", "cnn",
           330.0, 1.5, 110.0, 0.65, 1),
    _Paper("regnet-cifar10", "CIFAR-10", "M", 32, 10_322_320, "sgd", "cnn",
           3300.0, 0.03, 0.0, 1.0, 1),
    _Paper("distilbert-imdb", "IMDb", "L", 128, 66_955_010, "adamw", "transformer",
           95.0, 0.02, 0.0, 1.0, 2),
    _Paper("vit-food101", "Food-101", "M", 48, 85_876_325, "adamw", "transformer",
           60.0, 1.0, 0.0, 1.0, 2),
    _Paper("macbert-c3", "C3", "M", 8, 102_268_417, "adamw", "transformer",
           5.7, 0.05, 0.0, 1.0, 2),
    _Paper("wav2vec2-common-language", "Common Language", "M", 16, 94_580_141, "adamw",
           "transformer", 33.0, 1.5, 160.0, 0.7, 2),
    _Paper("gpt2-medium-wikitext", "WikiText-2", "L", 8, 354_823_168, "adamw",
           "transformer", 6.5, 0.01, 0.0, 1.0, 2),
)


def _paper_data(p: _Paper, compute: float) -> DataSource:
    """Data times of one batch; waits are 1% of compute when the data is in
    memory, plus a fifth of the extra load time on a miss (other ranks stall
    on the slow reader)."""
    mu_c = p.batch * p.data_ms / 1000.0
    wait_c = 0.01 * compute
    if p.p_cache >= 1.0:
        return DataSource(1.0, mu_c, 0.1 * mu_c, mu_c, 0.1 * mu_c, wait_c, wait_c)
    extra = p.batch * p.miss_kb / STORAGE_MBPS / 1000.0
    mu_l = mu_c + extra
    return DataSource(p.p_cache, mu_c, 0.1 * mu_c, mu_l, 0.15 * mu_l,
                      wait_c, wait_c + 0.2 * extra)


def _paper_type(p: _Paper, gpu: GpuType) -> TypeTruth:
    """Backward costs twice the forward (gradients for activations and
    weights); the update is memory-bound."""
    compute = p.batch / (p.samples_per_s * SPEEDUP[p.family][gpu])
    t_u = p.params * UPDATE_BYTES[p.optimizer] / (MEM_EFFICIENCY * MEM_BW_GBS[gpu] * 1e9)
    return TypeTruth(compute / 3.0, 2.0 * compute / 3.0, t_u, p.pattern, _paper_data(p, compute))


def paper_catalog() -> dict[str, ModelTruth]:
    """Table 2's models on the paper's three GPU types (§4.2, §4.3)."""
    return {
        p.key: ModelTruth(
            name=p.key, params=p.params, batch_size=p.batch, dataset=p.dataset,
            by_type={g: _paper_type(p, g) for g in PAPER_TYPES},
            category=p.category, optimizer=p.optimizer, source="paper",
        )
        for p in _PAPER
    }


# --- Gavel's job types -----------------------------------------------------------------

# Parameter counts of Gavel's workloads (its workloads/pytorch sources; the
# Transformer's vocabulary sizes are estimated, see docs) and their datasets.
_GAVEL_FAMILY: dict[str, tuple[int, str, Optimizer]] = {
    "ResNet-18": (11_173_962, "CIFAR-10", "sgd"),
    "ResNet-50": (25_557_032, "ImageNet", "sgd"),
    "Transformer": (49_260_000, "Multi30k", "adamw"),
    "LM": (13_987_678, "WikiText-2", "sgd"),
    "Recommendation": (8_063_508, "ML-20M", "adamw"),
    "A3C": (3_249_639, "Pong", "adamw"),
    "CycleGAN": (28_285_832, "monet2photo", "adamw"),
}
# Split of the measured single-GPU iteration time T (the rule of docs §Gavel):
# forward, backward, update and wait fractions sum to 1 and the input pipeline
# (0.3 T) stays hidden behind backward + update under pattern 1, so Eq. (1)
# gives back exactly T.
GAVEL_SPLIT = (0.32, 0.64, 0.03, 0.01)
GAVEL_DATA_SHARE = 0.3


def _gavel_name(job_type: str) -> tuple[str, int]:
    """('ResNet-18 (batch size 16)') -> ('ResNet-18', 16); unbatched types
    (A3C, CycleGAN) count one sample per step."""
    family, _, rest = job_type.partition(" (batch size ")
    return family, int(rest.rstrip(")")) if rest else 1


def _read_gavel() -> dict[str, dict[tuple[str, int], float]]:
    path = resources.files("world") / "data" / "gavel" / "simulation_throughputs.json"
    raw = json.loads(path.read_text())
    out: dict[str, dict[tuple[str, int], float]] = {}
    for worker, entries in raw.items():
        table = out.setdefault(worker, {})
        for key, value in entries.items():
            job_type, scale = ast.literal_eval(key)
            table[(str(job_type), int(scale))] = float(value["null"])
    return out


def _gavel_type(job_type: str, batch: int, raw: dict[str, dict[tuple[str, int], float]],
                worker: str) -> TypeTruth | None:
    """Per-GPU samples/s at k GPUs = steps/s · batch / k: Gavel's multi-GPU
    figure counts the whole job's steps (each of batch samples) per second.
    Zero means not measured."""
    def measured(table: dict[tuple[str, int], float], lo: int) -> dict[int, float]:
        return {k: table[(job_type, k)] * batch / k for k in (1, 2, 4, 8)
                if k >= lo and table.get((job_type, k), 0.0) > 0.0}

    cons = measured(raw[worker], 1)
    if 1 not in cons:
        return None
    t = batch / cons[1]
    f, b, u, w = (share * t for share in GAVEL_SPLIT)
    mu = GAVEL_DATA_SHARE * t
    data = DataSource(1.0, mu, 0.1 * mu, mu, 0.1 * mu, w, w)
    uncons = measured(raw.get(f"{worker}_unconsolidated", {}), 2)
    return TypeTruth(f, b, u, 1, data, cons, uncons)


def gavel_catalog() -> dict[str, ModelTruth]:
    """Gavel's job types on K80, P100 and V100, keyed ``gavel:<job type>``."""
    raw = _read_gavel()
    names = sorted({jt for table in raw.values() for jt, _ in table})
    out: dict[str, ModelTruth] = {}
    for job_type in names:
        family, batch = _gavel_name(job_type)
        params, dataset, optimizer = _GAVEL_FAMILY[family]
        by_type = {
            gpu: tt for worker, gpu in GAVEL_TYPES.items()
            if (tt := _gavel_type(job_type, batch, raw, worker)) is not None
        }
        name = GAVEL_PREFIX + job_type
        out[name] = ModelTruth(name=name, params=params, batch_size=batch, dataset=dataset,
                               by_type=by_type, optimizer=optimizer, source="gavel")
    return out


@lru_cache(maxsize=1)
def _builtin() -> tuple[tuple[str, ModelTruth], ...]:
    merged = {**paper_catalog(), **gavel_catalog()}
    return tuple(sorted(merged.items()))


def builtin_catalog() -> dict[str, ModelTruth]:
    """Every built-in model keyed by its stable, unique name."""
    return dict(_builtin())
