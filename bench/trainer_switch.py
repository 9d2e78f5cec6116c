"""Hare's task switching time with REAL resident trainers (hare.md §4,
Table 3; docs/hare.md §7, step 4): from the end of one job's task to the
start of another's compute on the same GPU, against the task time.

For each example (``examples/train_cnn.py``, ``examples/train_lm.py``, at
their default sizes unless told), two jobs of it (seeds 0 and 1) are
interleaved on one GPU's :class:`executor.trainers.TrainerPool`
(``--trainers`` processes, one thread each on the CPU: one core stands in
for a GPU), ``--micro`` micro-batches per task, A and B in turn, for
``--rounds`` rounds of S = ``--sync-scale``. Each round's parameters go
with its first task on a trainer (as the pool sends them), so some switches carry
a parameter transfer: they are shown apart. The first round (model loads)
is left out. Each task is staged (:meth:`TrainerPool.stage`) while the
one before it computes: its trainer puts the round's parameters in place
and waits for its turn, which the computing trainer passes as its compute
ends (:mod:`hops.trainer.turns`); the previous gradients are read while it
computes (:meth:`TrainerPool.finish`), as Hare's sync overlaps the next
task. Times are the trainers' own ``time.monotonic()``: the switch is the
next task's ``compute_start`` less the previous one's ``compute_end``, and
so holds the hand-off of the turn, the waiting trainer's wake-up, and
whatever of the next task's preparation (its command, its parameters
decoded and put in place) the previous compute did not cover; the share
is of the task it starts; *late* is how long after the previous compute
ended the next task's command reached its trainer (the pool's side:
reading the previous gradients, sending the command and its parameters),
the rest of a switch is the trainer's; *unready* (of the switches whose
task carries the round's parameters) is how long after the previous compute
ended the next task's model and parameters were in place on its trainer:
what the trainer's own preparation did not hide. ``--unstaged`` sends each task only once the
previous one's compute ended (:meth:`TrainerPool.start`: the ``computed``
message, the pool, the command's pipe and the parameters all in the
switch), ``--serial`` also reads its gradients first, for comparison.

    PYTHONPATH=. .venv/bin/python bench/trainer_switch.py [--device cpu|cuda]
        [--rounds 4] [--sync-scale 4] [--micro 1] [--trainers 2] [--unstaged | --serial]
        [--examples train_lm] [--set batch_size=64 ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

from executor.trainers import Pending, TaskResult, TrainerPool
from hops.trainer.api import load_task, option_flags

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"train_cnn": ROOT / "examples" / "train_cnn.py",
            "train_lm": ROOT / "examples" / "train_lm.py"}


def option_names(script: Path) -> set[str]:
    """The destinations of ``script``'s own options (``batch_size`` for
    ``--batch-size``), as :func:`hops.trainer.api.script_options` reads a
    job's config: a ``--set`` key outside them would be dropped unread."""
    spec = importlib.util.spec_from_file_location(f"_switch_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return set(option_flags(module.build_parser()))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sequence(rounds: int, s: int, micro: int) -> list[tuple[str, int, int, int]]:
    """(job, round, lo, hi) of the GPU's tasks: A's and B's in turn."""
    out = []
    for r in range(rounds):
        for lo in range(0, s, micro):
            hi = min(s, lo + micro)
            out += [("A", r, lo, hi), ("B", r, lo, hi)]
    return out


def measure(script: Path, config: dict[str, Any], args: argparse.Namespace,
            folder: str) -> list[TaskResult]:
    params = {}
    for job, seed in (("A", 0), ("B", 1)):
        model = load_task(script, {**config, "seed": seed}).model
        params[job] = {n: t.detach().clone() for n, t in model.named_parameters()}
    tasks = sequence(args.rounds, args.sync_scale, args.micro)
    results = []
    with TrainerPool(args.trainers, device=args.device, threads=1, folder=folder) as pool:
        for job, seed in (("A", 0), ("B", 1)):
            pool.add_job(job, str(script), {**config, "seed": seed})
        started: deque[Pending] = deque()
        for i, (job, r, lo, hi) in enumerate(tasks):
            upcoming = [t[0] for t in tasks[i + 1:]]
            if args.serial:  # the gradients read before the next task is sent
                results.append(pool.run(job, r, lo, hi, args.sync_scale, params[job], upcoming))
                continue
            # Staged while the previous one computes (it takes its turn as that
            # one ends), or sent once its compute ended; gradients read meanwhile:
            # staged, two tasks behind, so that the next command goes to a
            # trainer as soon as its last task's compute ended, not its gradients.
            send = pool.start if args.unstaged else pool.stage
            started.append(send(job, r, lo, hi, args.sync_scale, params[job], upcoming))
            while len(started) > (1 if args.unstaged else 2):
                results.append(pool.finish(started.popleft()))
        results.extend(pool.finish(pending) for pending in started)
    return results


class Switch(NamedTuple):
    """One switch between consecutive tasks of different jobs (seconds)."""

    switch: float
    task: float
    params_sent: bool
    late: float
    unready: float


def switches(results: list[TaskResult], skip: int) -> list[Switch]:
    """The :class:`Switch` of each pair of consecutive tasks of different
    jobs, from task ``skip`` on; late:
    how long after the previous compute ended the next task's command
    reached its trainer (0 when before), the part of the switch the pool's
    side did not hide; unready: how long after it the next task's model and
    parameters were in place (0 when before), what the trainer's own
    preparation (parameters decoded and copied to the device, a reload)
    did not hide."""
    out = []
    for prev, nxt in zip(results[skip:], results[skip + 1:], strict=False):
        out.append(Switch(nxt.compute_start - prev.compute_end,
                          nxt.compute_end - nxt.compute_start, nxt.params_sent,
                          max(0.0, nxt.received - prev.compute_end),
                          max(0.0, nxt.ready - prev.compute_end)))
    return out


def row(name: str, device: str, pairs: list[Switch]) -> str:
    sw = [s.switch for s in pairs]
    share = [s.switch / s.task for s in pairs]
    plain = [s.switch / s.task for s in pairs if not s.params_sent] or [float("nan")]
    late = [s.late for s in pairs]
    unready = [s.unready for s in pairs if s.params_sent] or [float("nan")]
    late_params = [s.late for s in pairs if s.params_sent] or [float("nan")]
    task = statistics.median(s.task for s in pairs)
    return (f"{name:10} {device:5} {len(pairs):5} {task * 1e3:9.1f} "
            f"{percentile(sw, 0.5) * 1e3:9.2f} {percentile(sw, 0.95) * 1e3:9.2f} "
            f"{100 * percentile(share, 0.5):7.2f}% {100 * percentile(share, 0.95):7.2f}% "
            f"{100 * percentile(plain, 0.95):9.2f}% {percentile(late, 0.95) * 1e3:9.2f} "
            f"{percentile(late_params, 0.95) * 1e3:9.2f} {percentile(unready, 0.95) * 1e3:9.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per job (default 4)")
    parser.add_argument("--sync-scale", type=int, default=4, help="S (default 4)")
    parser.add_argument("--micro", type=int, default=1, help="micro-batches a task (default 1)")
    parser.add_argument("--trainers", type=int, default=2, help="trainers (default 2)")
    parser.add_argument("--serial", action="store_true",
                        help="read each task's gradients before the next is sent")
    parser.add_argument("--unstaged", action="store_true",
                        help="send each task once the previous one's compute ended")
    parser.add_argument("--examples", nargs="+", default=sorted(EXAMPLES), choices=EXAMPLES)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a script option for every example (e.g. batch_size=64); repeatable")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("need 2 rounds or more: the first is left out")
    print(f"{'example':10} {'dev':5} {'n':>5} {'task ms':>9} {'p50 ms':>9} {'p95 ms':>9} "
          f"{'p50 %':>8} {'p95 %':>8} {'p95 %, no params':>10} {'p95 late ms':>9} "
          f"{'p95 late ms, params':>9} {'p95 unready ms, params':>9}")
    config: dict[str, Any] = {"sync_scale": args.sync_scale}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: not KEY=VALUE")
        config[key] = value
    for name in args.examples:
        unknown = sorted(set(config) - {"sync_scale"} - option_names(EXAMPLES[name]))
        if unknown:
            parser.error(f"--set {', '.join(unknown)}: not an option of {name}")
    for name in args.examples:
        with tempfile.TemporaryDirectory(prefix="hops-trainer-switch-") as folder:
            results = measure(EXAMPLES[name], config, args, folder)
        skip = 2 * len(range(0, args.sync_scale, args.micro))  # round 0: loads
        mode = "serial" if args.serial else "unstaged" if args.unstaged else "staged"
        print(row(name, args.device.split(":")[0], switches(results, skip)) + f"   {mode}")
    print("target (Hare, Table 3): <= 5% of the task time at p95")
    return 0


if __name__ == "__main__":
    sys.exit(main())
