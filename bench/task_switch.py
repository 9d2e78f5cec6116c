"""Hare's task switching time on the EMULATED executor (hare.md §4, Table 3):
from the end of one job's task to the start of another's compute on the
same GPU, against the task time.

A real nats-server and one real executor process (``python -m executor``,
emulated backend, ``paper-physical``'s server rtx3090-sugon-0, four GPUs);
the bench plays the scheduler leader: one ``task_sequence`` in which every
GPU interleaves the micro-batches of two jobs of its own, one micro-batch
per entry (A0, B0, A1, B1, ...), for ``--rounds`` rounds of S =
``--sync-scale``, planned back to back with the world model's times. It
reads the ``task_done`` reports (their ``started_at`` and ``ended_at`` are
the compute's span) and keeps every pair of consecutive entries of
different jobs on a GPU where the second did not wait for its planned
start. Task time: an entry's compute span.

The switch here is the emulated one (Table 3's 3.1 ms, :data:`world.hare.
SWITCH_S`, slept) plus what the executor adds: its event loop, timers and
bookkeeping. A real trainer's figure (resident processes, models kept in
memory) is bench/trainer_switch.py's: this bench measures the emulated executor.

    PYTHONPATH=. .venv/bin/python bench/task_switch.py [--rounds 2] [--sync-scale 16]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
from nats.aio.msg import Msg

from executor.tasks import TaskTimes, task_times
from services.runtime.bus import connect
from services.runtime.layout import ensure_jetstream
from services.runtime.natsd import EmbeddedNats
from services.runtime.settings import RuntimeSettings
from shared import events as ev
from shared import subjects
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry, TaskKey
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.hare import SWITCH_S
from world.truth import GroundTruth

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "paper-physical"
SERVER = ServerId("rtx3090-sugon-0")
# Two jobs per GPU, tasks of about 0.1 s on an RTX 3090 (the world model).
MODELS = (("resnet50-imagenet", 32, 25_557_032), ("resnet18-cifar10", 1024, 11_181_642))


def jobs(gpu: int, s: int) -> list[JobSpec]:
    return [JobSpec(JobId(f"g{gpu}-{name.split('-')[0]}"), name, batch, params, 10**6,
                    requirements=(1,), sync_scale=s) for name, batch, params in MODELS]


def gpu_entries(specs: list[JobSpec], times: dict[JobId, TaskTimes], rounds: int, s: int,
                t0: float) -> list[TaskEntry]:
    """The two jobs' micro-batches interleaved, one per entry, back to back;
    a job's next round after its barrier (compute and sync of the last)."""
    out: list[TaskEntry] = []
    t = t0
    barrier = dict.fromkeys((j.id for j in specs), t0)
    for r in range(rounds):
        ready = dict(barrier)
        for lo in range(s):
            for spec in specs:
                start = max(t, ready[spec.id])
                end = start + times[spec.id].compute_s
                out.append(TaskEntry(spec.id, r, lo, lo + 1, start, end))
                barrier[spec.id] = end + times[spec.id].sync_s
                t = end
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(rounds: int, s: int, tmp: Path) -> list[tuple[float, float]]:
    """(switching time, task time) in seconds per switch, from one run."""
    truth = GroundTruth(cluster_arg(CLUSTER), builtin_catalog())
    server = truth.cluster.by_id[SERVER]
    with EmbeddedNats(tmp / "nats") as nats_server:
        nc = await connect(RuntimeSettings(nats_servers=(nats_server.url,)), "bench-tasks")
        await ensure_jetstream(nc.jetstream())
        reports: list[ev.TaskDone] = []

        async def on_done(msg: Msg) -> None:
            reports.append(msgspec.json.decode(msg.data, type=ev.TaskDone))

        await nc.subscribe(subjects.TASK_DONE_ALL, cb=on_done)
        log = tmp / "executor.log"
        env = os.environ | {"HOPS_NATS_URL": nats_server.url, "HOPS_METRICS_PORT": "off",
                            "PYTHONPATH": str(ROOT)}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "executor", "--cluster", CLUSTER,
                                     "--server-id", SERVER, "--time-scale", "1"],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while b"following task sequences" not in log.read_bytes():
                if proc.poll() is not None or not log.exists():
                    raise SystemExit(f"the executor ended:\n{log.read_text()}")
                await asyncio.sleep(0.1)
            t0 = time.time() + 0.5
            gpus, specs, planned = [], [], {}
            for g in range(server.gpus):
                mine = jobs(g, s)
                times = {j.id: task_times(truth, j, server.gpu_type, 1.0) for j in mine}
                entries = gpu_entries(mine, times, rounds, s, t0)
                planned.update({(e.job_id, e.round, e.lo): e for e in entries})
                gpus.append(GpuTasks(g, tuple(entries)))
                specs += mine
            seq = ev.TaskSequence(term=1, revision=1, server_id=SERVER, at=time.time(),
                                  gpus=tuple(gpus), policy="bench", specs=tuple(specs))
            await nc.publish(subjects.task_sequence(SERVER), ev.encode(seq))
            deadline = time.time() + 60 + 2 * max(e.end_s for e in planned.values()) - t0
            while len(reports) < len(planned) and time.time() < deadline:
                await asyncio.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(10)
        await nc.close()
    return switching(reports, planned)


def switching(reports: list[ev.TaskDone], planned: dict[TaskKey, TaskEntry]
              ) -> list[tuple[float, float]]:
    """Per pair of consecutive entries of different jobs on one GPU, the
    second not waiting for its planned start: (the switching time, the
    second's task time: its compute span)."""
    out: list[tuple[float, float]] = []
    for g in {r.gpu_index for r in reports}:
        ran = sorted((r for r in reports if r.gpu_index == g), key=lambda r: r.started_at)
        for a, b in itertools.pairwise(ran):
            went_on = planned[(b.job_id, b.round, b.lo)].start_s <= a.ended_at
            if a.job_id != b.job_id and went_on:
                out.append((b.started_at - a.ended_at, b.ended_at - b.started_at))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per job (default 2)")
    parser.add_argument("--sync-scale", type=int, default=16,
                        help="micro-batches per round, S (default 16)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hops-task-switch-") as tmp:
        pairs = asyncio.run(measure(args.rounds, args.sync_scale, Path(tmp)))
    if not pairs:
        raise SystemExit("no switch measured")
    switches = [sw for sw, _ in pairs]
    shares = [sw / task for sw, task in pairs]
    task = statistics.median(task for _, task in pairs)
    print(f"emulated executor: {len(pairs)} switches ({SERVER}, {MODELS[0][0]} batch "
          f"{MODELS[0][1]} and {MODELS[1][0]} batch {MODELS[1][1]} interleaved on each of "
          f"its 4 GPUs, median task {task * 1e3:.1f} ms)")
    print(f"switch model (Table 3 mean): {SWITCH_S * 1e3:.2f} ms")
    for name, q in (("p50", 0.5), ("p95", 0.95)):
        print(f"switching time {name}: {percentile(switches, q) * 1e3:6.2f} ms, "
              f"{100 * percentile(shares, q):5.2f}% of the task it starts")
    print("target (Hare, Table 3): <= 5% of the task time at p95")
    print("real trainers (resident processes): bench/trainer_switch.py")


if __name__ == "__main__":
    main()
