"""The world model's CPU scaling: how fast a GPU job trains with c CPU cores.

The curves are Synergy's measured tables (Mohan et al., "Looking Beyond GPUs
for DNN Scheduling on Multi-Tenant Clusters", OSDI'22, MIT licence,
world/data/synergy/LICENSE), converted by ``bench/synergy_convert.py`` into
``world/data/synergy/cpu_scaling.json``. Provenance and every choice below:
docs/simulator-data.md, "CPU scaling (Synergy)".

* The cores axis is **CPU cores per GPU** (1, 2, 3, 4, 5, 6, 9, 12, 24):
  Synergy's simulator multiplies the row's cores by the job's GPUs
  (``opt_algo/synergy_opt.py``, "tput matrix gives normalized tput ... PER
  GPU"; ``jobs/model.py`` reads a model's ``cpus`` as ``cpu_per_gpu``). This
  is CODA's finding too (§IV-B-2: on one server, a job's CPU demand is linear
  in its GPUs).
* Throughput is Synergy's normalisation: 1.0 at the GPU-proportional share of
  its servers (3 cores and 62.5 GB per GPU); the column with the most memory
  is kept, so only the CPU limits the job.
* Between measured points the curve is linear; beyond the last point it is
  flat; below one core per GPU it falls linearly to 0 at 0 cores (an
  assumption: nothing was measured there and a job with no core does not run).

``SYNERGY_MODEL`` maps the simulator's models (world/catalog.py: the Hops
paper's Table 2 and Gavel's job types) to the closest Synergy model, with
CODA's category (§IV-B: CV, NLP or speech) for the adaptive allocator.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from types import MappingProxyType

import msgspec

from shared.job import Category
from world.catalog import GAVEL_PREFIX


class CpuCurve(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One Synergy model at one GPU count: normalised throughput
    ``throughput[i]`` at ``cores[i]`` cores per GPU (measured points only,
    ascending)."""

    model: str
    gpus: int
    cores: tuple[int, ...]
    throughput: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.cores or len(self.cores) != len(self.throughput):
            raise ValueError(f"{self.model}: need as many throughputs as core counts, > 0")
        steps = zip(self.cores, self.cores[1:], strict=False)
        if self.cores[0] < 1 or any(b <= a for a, b in steps):
            raise ValueError(f"{self.model}: core counts must be >= 1 and ascending")
        if any(t <= 0 for t in self.throughput):
            raise ValueError(f"{self.model}: throughputs must be > 0")

    def speed(self, cores: float) -> float:
        """Normalised throughput at ``cores`` cores per GPU: linear between
        measured points, flat beyond the last, linear from 0 at 0 cores up
        to the first point (assumed, not measured)."""
        if cores < 0:
            raise ValueError(f"cores must be >= 0, got {cores}")
        xs, ys = self.cores, self.throughput
        if cores <= xs[0]:
            return ys[0] * cores / xs[0]
        if cores >= xs[-1]:
            return ys[-1]
        i = bisect_right(xs, cores) - 1
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        return y0 + (y1 - y0) * (cores - x0) / (x1 - x0)

    def peak(self) -> float:
        """The highest measured throughput."""
        return max(self.throughput)

    def saturation(self) -> int:
        """The fewest cores per GPU that reach the peak."""
        top = self.peak()
        return next(c for c, t in zip(self.cores, self.throughput, strict=True) if t >= top)


class _Table(msgspec.Struct, frozen=True):
    cores: list[int]
    throughput: list[float]
    memory_gb_per_gpu: float
    synergy_cpus: int


@lru_cache(maxsize=1)
def _curves() -> Mapping[str, Mapping[int, CpuCurve]]:
    path = resources.files("world") / "data" / "synergy" / "cpu_scaling.json"
    raw = json.loads(path.read_text())
    out: dict[str, Mapping[int, CpuCurve]] = {}
    for model, by_gpus in raw["models"].items():
        tables = {int(g): msgspec.convert(t, _Table) for g, t in by_gpus.items()}
        out[model] = MappingProxyType({
            g: CpuCurve(model, g, tuple(t.cores), tuple(t.throughput))
            for g, t in sorted(tables.items())
        })
    return MappingProxyType(out)


def synergy_models() -> tuple[str, ...]:
    """Synergy's models with a measured table, sorted."""
    return tuple(sorted(_curves()))


def measured_gpus(model: str) -> tuple[int, ...]:
    """The GPU counts Synergy measured ``model`` at, ascending."""
    return tuple(_curve_table(model))


def _curve_table(model: str) -> Mapping[int, CpuCurve]:
    try:
        return _curves()[model]
    except KeyError:
        raise KeyError(f"no Synergy table for {model!r}; known: {synergy_models()}") from None


def curve(model: str, gpus: int) -> CpuCurve:
    """Synergy ``model``'s curve at the measured GPU count nearest ``gpus``
    (1, 2 or 4; a tie goes to the fewer GPUs)."""
    if gpus <= 0:
        raise ValueError(f"gpus must be > 0, got {gpus}")
    table = _curve_table(model)
    nearest = min(table, key=lambda g: (abs(g - gpus), g))
    return table[nearest]


# --- the simulator's models ---------------------------------------------------------


class Match(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The Synergy model closest to one of ours, CODA's category, and why."""

    synergy: str
    category: Category
    reason: str


_CV_HEAVY = ("heavy per-image compute; CODA §IV-B: the more complex a CV model, "
             "the fewer cores it needs, and res50 is Synergy's heaviest CV model")
_LM_FLAT = "text held in memory, tokenised once; Synergy's language models need one core"

# Keyed by model family: the Hops paper's models without their dataset suffix,
# Gavel's job types without their batch size.
_MATCHES: dict[str, Match] = {
    # Hops paper, Table 2
    "resnet18": Match("res18", "cv", "same architecture"),
    "resnet50": Match("res50", "cv", "same architecture"),
    "vgg11": Match("res50", "cv", "VGG (7.6 GFLOPs/image): " + _CV_HEAVY),
    "vgg13": Match("res50", "cv", "VGG (11 GFLOPs/image): " + _CV_HEAVY),
    "convnext-base": Match("res50", "cv", "ConvNeXt-B (15 GFLOPs/image): " + _CV_HEAVY),
    "densenet161": Match("res50", "cv", "DenseNet-161 (7.7 GFLOPs/image): " + _CV_HEAVY),
    "mobilenetv2": Match("mobilenet", "cv", "same family (MobileNet)"),
    "regnet": Match("res18", "cv", "RegNet of 11M parameters (~1.6 GFLOPs/image), "
                    "the per-image cost of ResNet-18 (1.8)"),
    "distilbert": Match("bert", "nlp", "a distilled BERT; " + _LM_FLAT),
    "vit": Match("res50", "cv", "ViT-B/16 (17.6 GFLOPs/image) with an image pipeline: "
                 + _CV_HEAVY),
    "macbert": Match("bert", "nlp", "a BERT-base variant; " + _LM_FLAT),
    "wav2vec2": Match("deepspeech", "speech", "audio decoding on the CPU before a large "
                      "GPU model; Synergy's other speech model, m5, is a tiny CNN"),
    "gpt2-medium": Match("transformer", "nlp", "a Transformer language model like "
                         "Synergy's Transformer-XL; " + _LM_FLAT),
    # Gavel's job types
    "ResNet-18": Match("res18", "cv", "same architecture"),
    "ResNet-50": Match("res50", "cv", "same architecture"),
    "Transformer": Match("transformer", "nlp", "same architecture (translation; "
                         "Synergy's GNMT is flat too); " + _LM_FLAT),
    "LM": Match("lstm", "nlp", "same model: a word-level LSTM language model"),
    "Recommendation": Match("vae", "other", "an autoencoder over in-memory rating "
                            "vectors, like Synergy's VAE; no input pipeline"),
    "A3C": Match("lstm", "other", "small conv+LSTM network and no dataset to load; no "
                 "Synergy model is reinforcement learning, and the Atari emulator's "
                 "own CPU cost is not modelled"),
    "CycleGAN": Match("res50", "cv", "two 9-block ResNet generators over images: "
                      + _CV_HEAVY),
}

MODEL_MATCH: Mapping[str, Match] = MappingProxyType(_MATCHES)
SYNERGY_MODEL: Mapping[str, str] = MappingProxyType(
    {family: m.synergy for family, m in _MATCHES.items()})


def family(model: str) -> str:
    """The family of a catalog name: ``gavel:ResNet-50 (batch size 64)`` ->
    ``ResNet-50``, ``convnext-base-imagenet`` -> ``convnext-base``; a family
    name is its own family."""
    if model.startswith(GAVEL_PREFIX):
        model = model[len(GAVEL_PREFIX):].partition(" (batch size ")[0]
    if model in _MATCHES:
        return model
    prefixes = [f for f in _MATCHES if model.startswith(f + "-")]
    if not prefixes:
        raise KeyError(f"no Synergy match for model {model!r}")
    return max(prefixes, key=len)


def match(model: str) -> Match:
    """The :class:`Match` of a catalog name or family."""
    return _MATCHES[family(model)]


def synergy_model(model: str) -> str:
    """The Synergy model closest to a catalog name or family."""
    return match(model).synergy


def category_of(model: str) -> Category:
    """CODA's category (§IV-B) of a catalog name or family."""
    return match(model).category


def curve_for(model: str, gpus: int) -> CpuCurve:
    """The CPU curve of one of the simulator's models at ``gpus`` GPUs."""
    return curve(synergy_model(model), gpus)
