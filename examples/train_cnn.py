"""A small CNN on synthetic images, trained under the Hops plugin.

Images are 3x32x32 in 10 classes, generated deterministically from a seed
and the sample's index (a class pattern plus noise), then put through CPU
preprocessing (random crop with padding, flip, blur, normalisation) so that
data time is not negligible: Eq. (1)'s T_d. With ``--workers 0`` batches are
made in the training loop, after the update (pattern 2 of Eq. 1); with
workers they are made in the background (pattern 1). The plugin measures
which.

Standalone, one process (prints nothing; add ``--report`` to see the lines)::

    python examples/train_cnn.py --total-samples 2048 --report /tmp/cnn.jsonl

Two processes with DistributedDataParallel over gloo, as an executor
starts them (one per device; ``LOCAL_RANK`` and ``RANK`` differ)::

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 \\
        python examples/train_cnn.py --total-samples 4096 &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 \\
        python examples/train_cnn.py --total-samples 4096

Under a real executor, as a job's command (``command: [python,
examples/train_cnn.py]``): the executor sets ``HOPS_MODE``,
``HOPS_BATCH_SIZE``, ``HOPS_TOTAL_SAMPLES``, ``HOPS_REPORT_FILE``,
``HOPS_CHECKPOINT_DIR``, ``HOPS_LR`` and the rest (shared/jobenv.py); the
options below default to them.

A relaxed-sync job (``sync_scale`` in its spec, hare.md §2.2.3) gets
``HOPS_SYNC_SCALE`` and ``HOPS_MICRO_BATCHES``: each rank then processes
its share of a step's batches as micro-batches (the plugin's loader deals
them out), on GPUs of any speeds. Standalone, ``HOPS_SYNC_SCALE=4``
accumulates four batches a step::

    HOPS_SYNC_SCALE=4 python examples/train_cnn.py --total-samples 2048
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from hops import plugin
from hops.trainer import TaskJob, micro_batch_seed, script_options, sync_scale_of

CLASSES = 10
SIZE = 32


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--batch-size", type=int, default=int(env.get("HOPS_BATCH_SIZE") or 32),
                   help="per process (default: HOPS_BATCH_SIZE or 32)")
    p.add_argument("--total-samples", type=float,
                   default=float(env.get("HOPS_TOTAL_SAMPLES") or 8192),
                   help="over the whole job (default: HOPS_TOTAL_SAMPLES or 8192)")
    p.add_argument("--lr", type=float, default=0.05, help="base learning rate at --base-gpus")
    p.add_argument("--base-gpus", type=int, default=1)
    p.add_argument("--lr-rule", choices=("linear", "sqrt"), default="linear")
    p.add_argument("--workers", type=int, default=0,
                   help="loader worker processes (0: batches made in the loop)")
    p.add_argument("--dataset-size", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, help="report file when standalone")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Sample ``i`` is the same on every process: seeded by (seed, i)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(CLASSES, 3, SIZE, SIZE, generator=g)
        self.blur = torch.full((3, 1, 3, 3), 1.0 / 9.0)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = int(torch.randint(CLASSES, (1,), generator=g))
        image = self.patterns[label] + 0.8 * torch.randn(3, SIZE, SIZE, generator=g)
        return self.preprocess(image, g), label

    def preprocess(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """Crop with padding, flip, colour jitter, blur, cutout, normalise:
        the usual CPU work of an image pipeline."""
        padded = F.pad(image, (4, 4, 4, 4), mode="reflect")
        dy, dx, cy, cx = (int(v) for v in torch.randint(0, 9, (4,), generator=g))
        image = padded[:, dy:dy + SIZE, dx:dx + SIZE]
        if bool(torch.rand(1, generator=g) < 0.5):
            image = image.flip(2)
        gain, bias = 0.8 + 0.4 * torch.rand(2, 3, 1, 1, generator=g)
        image = image * gain + (bias - 1.0)
        grey = image.mean(0, keepdim=True)
        image = grey + (image - grey) * (0.8 + 0.4 * torch.rand(1, generator=g))
        image = F.conv2d(image.unsqueeze(0), self.blur, padding=1, groups=3).squeeze(0)
        image[:, 3 * cy:3 * cy + 8, 3 * cx:3 * cx + 8] = 0.0
        return (image - image.mean()) / (image.std() + 1e-5)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(128 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.features(x).flatten(1))
        return logits


def hops_task(config: Mapping[str, object]) -> TaskJob:
    """This script as Hare's tasks (hops.trainer, docs/hare.md §7): main()'s
    model, optimiser and loss, with global micro-batch k drawn from the
    dataset by a generator seeded with (seed, k)."""
    args = script_options(build_parser(), config)
    scale = sync_scale_of(config)
    torch.manual_seed(args.seed)  # the same initial weights in every trainer
    model = SmallCNN()
    lr = (float(str(config["learning_rate"])) if "learning_rate" in config
          else plugin.scaled_lr(scale, args.lr, args.base_gpus, args.lr_rule))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    data = SyntheticImages(args.dataset_size, args.seed)
    loss_fn = nn.CrossEntropyLoss()

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(micro_batch_seed(args.seed, k))
        picks = torch.randint(len(data), (args.batch_size,), generator=g).tolist()
        samples = [data[i] for i in picks]
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    def loss(net: nn.Module, drawn: object) -> torch.Tensor:
        images, labels = cast(tuple[torch.Tensor, torch.Tensor], drawn)
        out: torch.Tensor = loss_fn(net(images), labels)
        return out

    return TaskJob(model, optimizer, batch, loss)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = plugin.init(batch_size=args.batch_size, total_samples=args.total_samples,
                      report_file=args.report)
    torch.manual_seed(args.seed)  # the same initial weights everywhere
    model = run.wrap(SmallCNN())
    lr = run.learning_rate(base_lr=args.lr, base_gpus=args.base_gpus, rule=args.lr_rule)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    run.resume(model, optimizer)
    batches = run.loader(SyntheticImages(args.dataset_size, args.seed),
                         num_workers=args.workers, seed=args.seed)
    loss_fn = nn.CrossEntropyLoss()
    for step in run.steps():
        # One micro-batch, or a relaxed-sync job's share of its sync scale.
        for micro in step.micro_batches():
            with step.data():
                images, labels = next(batches)
                images, labels = images.to(run.device), labels.to(run.device)
            with step.forward():
                loss = micro.scale(loss_fn(model(images), labels))
            with step.backward():
                loss.backward()
        with step.update():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return run.close()


if __name__ == "__main__":
    sys.exit(main())
