"""The resident trainers on a GPU (docs/hare.md §7, step 4): the checks a
machine with CUDA runs, since the CPU-only one cannot.

For each example (small sizes), a :class:`executor.trainers.TrainerPool`
on ``cuda`` (1 trainer, 1 model in memory, so that two jobs in turn move
each other out to pinned memory and come back layer by layer on the side
stream) runs each round's micro-batches split into two tasks of each job,
in turn; every task's gradients are compared with the same micro-batches
computed here, in this process, on the same GPU from the same parameters:

* ``train_lm``: bitwise (``torch.equal``), since the same kernels run on
  the same inputs;
* ``train_cnn``: within a small tolerance (cuDNN's convolution gradients
  may differ in their last bits from run to run).

With ``--deterministic`` this process and the trainers use torch's
deterministic algorithms only, and both examples must match bitwise.

It prints each task's largest difference, reload and compute times. Exit
status 0 when every check passes, 2 without CUDA. ``--device cpu`` runs the same checks on the
CPU (a dry run of the script; bitwise for both examples there).

    PYTHONPATH=. .venv/bin/python bench/trainer_cuda_check.py [--rounds 2] [--deterministic]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from executor.trainers import TaskResult, TrainerPool
from hops.trainer.api import TaskJob, load_task, task_gradients

ROOT = Path(__file__).resolve().parents[1]
S = 4
CASES: dict[str, tuple[Path, dict[str, Any], bool]] = {
    "train_lm": (ROOT / "examples" / "train_lm.py",
                 {"batch_size": 8, "seq_len": 32, "d_model": 64, "sync_scale": S}, True),
    "train_cnn": (ROOT / "examples" / "train_cnn.py",
                  {"batch_size": 16, "dataset_size": 256, "sync_scale": S}, False),
}
TOLERANCE = 1e-5  # cnn: relative to the gradient's largest magnitude


def local_task(script: Path, config: dict[str, Any], device: torch.device) -> TaskJob:
    task = load_task(script, config)
    task.model.to(device)
    source = task.batch

    def batch(k: int) -> Any:
        drawn = source(k)
        if isinstance(drawn, torch.Tensor):
            return drawn.to(device)
        return tuple(t.to(device) for t in drawn)

    return TaskJob(task.model, task.optimizer, batch, task.loss)


def relative(tensor: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest difference of ``tensor`` from ``ref``, relative to
    ``ref``'s largest magnitude (0.0: equal)."""
    ref = ref.cpu()
    return float((tensor - ref).abs().max()) / (float(ref.abs().max()) or 1.0)


def worst(got: TaskResult, want: tuple[dict[str, torch.Tensor], ...]) -> float:
    """The largest :func:`relative` difference of any gradient of ``got``."""
    return max((relative(t, w[name]) for g, w in zip(got.gradients, want, strict=True)
                for name, t in g.items()), default=0.0)


def compare(got: TaskResult, want: tuple[dict[str, torch.Tensor], ...], exact: bool) -> str:
    """'' when ``got`` matches ``want``; else the first difference."""
    for m, (g, w) in enumerate(zip(got.gradients, want, strict=True)):
        if g.keys() != w.keys():
            return f"micro-batch {m}: other parameters"
        for name, tensor in g.items():
            if exact and not torch.equal(tensor, w[name].cpu()):
                return f"micro-batch {m}, {name}: not bitwise equal"
            if not exact and relative(tensor, w[name]) > TOLERANCE:
                return f"micro-batch {m}, {name}: off by more than {TOLERANCE} relative"
    return ""


def check(rounds: int, device: torch.device, folder: str, deterministic: bool) -> list[str]:
    failures: list[str] = []
    with TrainerPool(1, device=str(device), capacity=1, folder=folder,
                     deterministic=deterministic) as pool:
        locals_: dict[str, TaskJob] = {}
        for name, (script, config, _) in CASES.items():
            pool.add_job(name, str(script), config)
            locals_[name] = local_task(script, config, device)
        halves = ((0, S // 2), (S // 2, S))
        for r in range(rounds):
            for lo, hi in halves:
                for name, (_, _, exact) in CASES.items():
                    model = locals_[name].model
                    params = {n: t.detach().cpu() for n, t in model.named_parameters()}
                    got = pool.run(name, r, lo, hi, S, params, [n for n in CASES if n != name])
                    want = task_gradients(locals_[name], r, lo, hi, S)
                    why = compare(got, want, exact or deterministic)
                    print(f"{name:10} round {r} micro-batches {lo}..{hi - 1}: "
                          f"{why or 'ok'} (largest difference {worst(got, want):.1e} "
                          f"relative); reload {got.reload_s * 1e3:.2f} ms, "
                          f"task {(got.compute_end - got.compute_start) * 1e3:.2f} ms")
                    if why:
                        failures.append(f"{name} round {r} {lo}..{hi - 1}: {why}")
            for name in CASES:  # the next round's parameters: a step of the local model
                with torch.no_grad():
                    for param in locals_[name].model.parameters():
                        param.mul_(0.999)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda:0", help="cuda:N; cpu for a dry run")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic algorithms here and in the trainers: "
                             "both examples bitwise")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU", file=sys.stderr)
        return 2
    # cuBLAS's workspace fixed here; a trainer fixes its own when deterministic
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    with tempfile.TemporaryDirectory(prefix="hops-trainer-cuda-") as folder:
        failures = check(args.rounds, torch.device(args.device), folder, args.deterministic)
    for failure in failures:
        print(f"FAILED {failure}")
    print("all checks passed" if not failures else f"{len(failures)} checks failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
