"""Exact core pinning with real processes (no NATS: the node executor's
command handling and the real backend, driven directly).

A job holding 2 cores runs a Python process with several threads and a
child process of its own (as a data-loader worker would be): every thread
of the group runs on exactly the 2 cores the executor chose. ``set_cores``
to 1 re-pins it in place (same pid) and rewrites its ``HOPS_CORES_FILE``;
a thread that widens its own affinity afterwards is brought back. A CPU
job then runs beside it on the other core, as one process with no GPUs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import structlog

from executor.isolation import JobIdentity
from executor.launch import LaunchOptions
from executor.pinning import group_threads
from executor.real import RealBackend
from executor.realjob import RealSettings
from executor.service import NodeExecutor
from executor.settings import ExecutorSettings
from shared import events as ev
from shared.cluster import Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.resources import Resources

POOL = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(
    len(POOL) < 2, reason=f"needs 2 cores this process may use; it may use {POOL}")

S = ServerId("local-a")
SERVER = Server(S, GpuType("cpu"), 1, cores=2)

JOB = r'''
import json, os, pathlib, signal, subprocess, sys, threading, time
out = pathlib.Path(sys.argv[1])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
def spin():
    while not stop.is_set():
        time.sleep(0.02)
def escape():  # as a library pinning its own workers would: widen, once asked
    while not stop.is_set() and not (out / "escape").exists():
        time.sleep(0.02)
    if not stop.is_set():
        os.sched_setaffinity(0, range(os.cpu_count()))
        (out / "escaped").write_text(str(threading.get_native_id()))
    spin()
threads = [threading.Thread(target=spin) for _ in range(3)] + [threading.Thread(target=escape)]
for t in threads:
    t.start()
child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                          "t = threading.Thread(target=time.sleep, args=(600,), daemon=True)\n"
                          "t.start(); time.sleep(600)"])
(out / "started.json").write_text(json.dumps({
    "pid": os.getpid(), "child": child.pid,
    "cuda": os.environ["CUDA_VISIBLE_DEVICES"], "cores": os.environ["HOPS_CORES"],
    "cores_file": os.environ["HOPS_CORES_FILE"]}))
while not stop.is_set():
    time.sleep(0.02)
child.kill(); child.wait()
'''


class NoSink:
    async def sample(self, msg: ev.SampleReported) -> None:
        pass

    def event(self, job_id: str, msg: ev.Report, msg_id: str) -> None:
        pass


@dataclass
class Node:
    executor: NodeExecutor
    backend: RealBackend
    root: Path


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Coroutine[Any, Any, None], name: str = "") -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name or None)
        tasks.add(task)
        return task

    log = structlog.get_logger()
    ctx = SimpleNamespace(log=log, spawn=spawn, js=None)  # no bus: the log shipper never runs
    settings = ExecutorSettings(cluster="none", server_id=S, backend="real",
                                run_dir=tmp_path / "runs", server=SERVER, stop_grace_s=5.0)
    real = RealSettings(run_dir=settings.run_dir, options=LaunchOptions(gpu_type="cpu"),
                        identity=JobIdentity("me", os.geteuid(), os.getegid(), allow_root=True),
                        poll_s=0.05)
    backend = RealBackend(SERVER, real, NoSink(), log, cast(Callable[..., object], spawn))
    executor = NodeExecutor(cast(Any, ctx), settings, cast(Any, None), backend)
    yield Node(executor, backend, tmp_path)
    await executor.shutdown()
    for task in tasks:
        task.cancel()


def start(node: Node, job: str, config: Configuration, idx: tuple[int, ...],
          spec_kw: dict[str, Any]) -> ev.StartJob:
    out = node.root / job
    out.mkdir()
    spec = JobSpec(JobId(job), "script", 1, 1000, 10**9, **spec_kw,
                   command=(sys.executable, "-c", JOB, str(out)))
    return ev.StartJob(key=f"start-{job}", job_id=JobId(job), server_id=S, spec=spec,
                       configuration=config, gpu_indices=idx)


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def affinities(node: Node, job: str) -> dict[int, set[int]]:
    """Every thread of the job's process group, with the cores it may run on."""
    out: dict[int, set[int]] = {}
    for tid in group_threads(node.backend.jobs[JobId(job)].pgid):
        try:
            out[tid] = os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue
    return out


def started(node: Node, job: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((node.root / job / "started.json").read_text()))


async def test_a_job_is_pinned_retuned_in_place_and_a_cpu_job_runs_beside_it(
        node: Node) -> None:
    two, (first, second) = set(POOL[:2]), POOL[:2]
    gpu_cfg = Configuration.of({S: 1}).with_extras({S: Resources(cores=2)})
    ack = await node.executor.handle(start(node, "train", gpu_cfg, (0,),
                                           {"requirements": (1,)}))
    assert ack.ok and set(ack.cores) == two
    await until(lambda: (node.root / "train" / "started.json").exists(), "the job's start")
    info = started(node, "train")
    assert (info["cuda"], info["cores"]) == ("0", "2")
    # Every thread of both processes (5 of the job, 2 of its child), exactly 2 cores.
    await until(lambda: len(affinities(node, "train")) >= 7, "the job's threads")
    assert all(a == two for a in affinities(node, "train").values())

    ack = await node.executor.handle(ev.SetCores(key="cores-1", job_id=JobId("train"),
                                                 server_id=S, cores=1, at=1.0))
    assert ack.ok and ack.cores == (first,)
    assert all(a == {first} for a in affinities(node, "train").values())
    assert node.backend.jobs[JobId("train")].ranks[0].pid == info["pid"]  # not restarted
    assert Path(info["cores_file"]).read_text() == "1\n"
    assert node.executor.ledger.allocated().cores == 1

    (node.root / "train" / "escape").touch()
    await until(lambda: (node.root / "train" / "escaped").exists(), "the escape")
    await until(lambda: all(a == {first} for a in affinities(node, "train").values()),
                "the escaped thread re-pinned", timeout=5.0)

    more = await node.executor.handle(ev.SetCores(key="cores-3", job_id=JobId("train"),
                                                  server_id=S, cores=3, at=2.0))
    assert not more.ok and more.code == "invalid"  # the server has 2
    cpu = await node.executor.handle(start(node, "crunch", Configuration.cpu(S, 1), (),
                                           {"kind": "cpu", "cores": 1}))
    assert cpu.ok and cpu.cores == (second,)
    await until(lambda: (node.root / "crunch" / "started.json").exists(), "the CPU job")
    assert (started(node, "crunch")["cuda"], started(node, "crunch")["cores"]) == ("", "1")
    await until(lambda: len(affinities(node, "crunch")) >= 7, "the CPU job's threads")
    assert all(a == {second} for a in affinities(node, "crunch").values())
    assert all(a == {first} for a in affinities(node, "train").values())

    # No core is left for a growth of either job.
    grow = await node.executor.handle(ev.SetCores(key="cores-2", job_id=JobId("train"),
                                                  server_id=S, cores=2, at=3.0))
    assert not grow.ok and grow.code == "conflict"
    assert all(a == {first} for a in affinities(node, "train").values())
    for job in ("train", "crunch"):
        stop = await node.executor.handle(ev.StopJob(key=f"stop-{job}", job_id=JobId(job)))
        assert stop.ok
