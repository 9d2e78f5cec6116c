"""A small transformer language model on synthetic tokens, trained under
the Hops plugin.

Two ``nn.TransformerEncoder`` layers with a causal mask over a 256-token
vocabulary predict the next token of synthetic sequences: each sequence
is an arithmetic progression with a random start and stride (t[k+1] = t[k]
+ b mod V) with 5% of its tokens replaced at random, so there is something
to learn. Sequences are made in the loop from a seed and
the step, cheaply: the data time is small and serial (pattern 2 of Eq. 1).

Standalone, one process::

    python examples/train_lm.py --total-samples 1024 --report /tmp/lm.jsonl

Two processes with DistributedDataParallel over gloo, as an executor
starts them::

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29501 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 \\
        python examples/train_lm.py --total-samples 2048 &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29501 WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 \\
        python examples/train_lm.py --total-samples 2048

Under a real executor, as a job's command (``command: [python,
examples/train_lm.py]``): the options default to the executor's
``HOPS_BATCH_SIZE`` and ``HOPS_TOTAL_SAMPLES``; the plugin reads the rest
(shared/jobenv.py), a relaxed-sync job's ``HOPS_SYNC_SCALE`` and
``HOPS_MICRO_BATCHES`` among them: each rank then draws its share of a
step's batches from its own stream, as micro-batches (hare.md §2.2.3).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import cast

import torch
from torch import nn

from hops import plugin
from hops.trainer import TaskJob, micro_batch_seed, script_options, sync_scale_of


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--batch-size", type=int, default=int(env.get("HOPS_BATCH_SIZE") or 16),
                   help="sequences per process (default: HOPS_BATCH_SIZE or 16)")
    p.add_argument("--total-samples", type=float,
                   default=float(env.get("HOPS_TOTAL_SAMPLES") or 4096),
                   help="sequences over the whole job (default: HOPS_TOTAL_SAMPLES or 4096)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3, help="base learning rate at --base-gpus")
    p.add_argument("--base-gpus", type=int, default=1)
    p.add_argument("--lr-rule", choices=("linear", "sqrt"), default="sqrt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, help="report file when standalone")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def sequences(batch: int, length: int, vocab: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless batches of ``length + 1`` tokens (inputs and shifted targets)."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.arange(length + 1)
    while True:
        stride = torch.randint(1, vocab, (batch, 1), generator=g)
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        tokens = (start + stride * steps) % vocab
        noise = torch.rand(batch, length + 1, generator=g) < 0.05
        yield torch.where(noise, torch.randint(0, vocab, tokens.shape, generator=g), tokens)


class TinyLM(nn.Module):
    mask: torch.Tensor

    def __init__(self, vocab: int, d_model: int, layers: int, length: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(length, d_model) / math.sqrt(d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        n = tokens.shape[1]
        logits: torch.Tensor = self.out(self.encoder(h, mask=self.mask[:n, :n], is_causal=True))
        return logits


def hops_task(config: Mapping[str, object]) -> TaskJob:
    """This script as Hare's tasks (hops.trainer, docs/hare.md §7): main()'s
    model, optimiser and loss, with global micro-batch k the first batch of
    a stream of sequences seeded with (seed, k)."""
    args = script_options(build_parser(), config)
    scale = sync_scale_of(config)
    torch.manual_seed(args.seed)  # the same initial weights in every trainer
    model = TinyLM(args.vocab, args.d_model, args.layers, args.seq_len)
    lr = (float(str(config["learning_rate"])) if "learning_rate" in config
          else plugin.scaled_lr(scale, args.lr, args.base_gpus, args.lr_rule))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()

    def batch(k: int) -> torch.Tensor:
        seed = micro_batch_seed(args.seed, k)
        return next(sequences(args.batch_size, args.seq_len, args.vocab, seed))

    def loss(net: nn.Module, drawn: object) -> torch.Tensor:
        tokens = cast(torch.Tensor, drawn)
        logits = net(tokens[:, :-1])
        out: torch.Tensor = loss_fn(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        return out

    return TaskJob(model, optimizer, batch, loss)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = plugin.init(batch_size=args.batch_size, total_samples=args.total_samples,
                      report_file=args.report)
    torch.manual_seed(args.seed)
    model = run.wrap(TinyLM(args.vocab, args.d_model, args.layers, args.seq_len))
    lr = run.learning_rate(base_lr=args.lr, base_gpus=args.base_gpus, rule=args.lr_rule)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    run.resume(model, optimizer)
    # Each rank its own stream of sequences; each start a fresh one.
    seed = args.seed * 1000 + run.settings.rank + int(run.samples_done)
    batches = run.batches(sequences(args.batch_size, args.seq_len, args.vocab, seed))
    loss_fn = nn.CrossEntropyLoss()
    for step in run.steps():
        # One micro-batch, or a relaxed-sync job's share of its sync scale.
        for micro in step.micro_batches():
            with step.data():
                tokens = next(batches).to(run.device)
            with step.forward():
                logits = model(tokens[:, :-1])
                loss = loss_fn(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
                loss = micro.scale(loss)
            with step.backward():
                loss.backward()
        with step.update():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return run.close()


if __name__ == "__main__":
    sys.exit(main())
