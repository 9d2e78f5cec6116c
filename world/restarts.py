"""What a checkpoint-restart costs each model: the seconds from a job's stop
to its first step again (saving and loading its checkpoint, starting its
processes and data loaders), the world model's truth for the simulator.

Provenance: Sia's artifact (siasosp23/artifacts, ``sia-simulator/sia.py``,
``get_restart_penalty``) gives the restart penalties Sia's authors measured
on their physical cluster, by workload: ImageNet 250 s, BERT 120 s,
YOLOv3 45 s, CIFAR-10 30 s, DeepSpeech2 25 s, and 30 s for anything else.
The artifact matches a job's name against those words; here each catalog
model is matched by its dataset or architecture in the same order
(:data:`RULES`). Three matches are this project's assumption, not Sia's
measurement (docs/simulator-data.md, "Restart costs"): GPT-2 and Gavel's
Transformer take BERT's 120 s (large transformer checkpoints), wav2vec2
takes DeepSpeech2's 25 s (the speech model Sia measured), and Gavel's
ResNet-50 (trained on ImageNet in Gavel) takes ImageNet's 250 s.
"""

from __future__ import annotations

from typing import Final

# (substring of the model's catalog name, seconds), first match wins.
RULES: Final[tuple[tuple[str, float], ...]] = (
    ("imagenet", 250.0),
    ("resnet-50", 250.0),  # Gavel's ResNet-50 runs ImageNet
    ("bert", 120.0),
    ("gpt2", 120.0),
    ("transformer", 120.0),
    ("yolo", 45.0),
    ("cifar", 30.0),
    ("deepspeech", 25.0),
    ("wav2vec2", 25.0),
)
OTHER_S: Final = 30.0  # the artifact's default


def restart_cost(model: str) -> float:
    """Seconds one checkpoint-restart of ``model`` costs (see the module)."""
    name = model.lower()
    return next((s for key, s in RULES if key in name), OTHER_S)
