"""``python -m executor.slurm``: the Slurm bridge. One process answers for
every Slurm node of Hops' partition, as that many node executors
(:mod:`executor.service`) whose backend is :class:`SlurmBackend`: the
placer and the scheduler see executors as ever.

Each node keeps its own NATS identity (``executor-<node>``, the seed from
``HOPS_NATS_CREDENTIALS_DIR`` as under the supervisor), registration,
commands and heartbeats; one :class:`SlurmWatch` reads Slurm for all of
them. Without ``--cluster`` the cluster is Slurm's nodes
(:func:`executor.slurm.nodes.slurm_cluster`); with it, every server must be
a node of the partition. The flags are the executor's (``--time-scale``,
``--stop-grace-s``...; ``--backend real``: each start runs the job's own
command, :mod:`executor.slurm.realjobs`, rather than the emulated job); the
Slurm settings are :mod:`executor.slurm.settings`'.
SIGTERM stops the bridge's jobs, as an executor's; a crash (kill -9) leaves
them running in Slurm, and the next bridge adopts them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import msgspec
import structlog
from structlog.typing import FilteringBoundLogger

from executor.__main__ import _parser, executor_settings, run_dir_of
from executor.launch import LaunchOptions
from executor.publish import NatsSink
from executor.service import run_node
from executor.settings import ExecutorSettings
from executor.slurm.backend import JobEnv, SlurmBackend, jobs_pythonpath
from executor.slurm.cli import SlurmFailure
from executor.slurm.client import SlurmClient
from executor.slurm.nodes import slurm_cluster
from executor.slurm.realjobs import RealJobs
from executor.slurm.records import SlurmNode
from executor.slurm.settings import BridgeSettings, BridgeSettingsError, from_environ
from executor.slurm.watch import SlurmWatch
from executor.supervisor import CREDENTIALS_DIR
from services.runtime.bus import ErrorReporter, connect
from services.runtime.logging import configure_logging
from services.runtime.service import ServiceContext
from services.runtime.settings import RuntimeSettings, parse_args
from shared.cluster import Cluster, Server
from shared.specs import SpecError
from world.catalog import builtin_catalog
from world.clusters import cluster_arg
from world.truth import GroundTruth

_SHUTDOWN_MARGIN_S = 3.0


class BridgeError(RuntimeError):
    """The bridge cannot start; the message says why."""


def cluster_file(cluster: Cluster, run_dir: Path) -> str:
    """The cluster as a file the jobs on the nodes read (the run folder is
    shared with them; the bridge's own file may be where they cannot go)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "cluster.json"
    path.write_bytes(msgspec.json.encode(cluster))
    path.chmod(0o644)
    return str(path)


async def the_cluster(args: argparse.Namespace, bridge: BridgeSettings,
                      client: SlurmClient) -> Cluster:
    """``--cluster`` checked against Slurm's nodes, or those nodes."""
    try:
        nodes = await client.nodes()
    except SlurmFailure as e:
        raise BridgeError(f"cannot read Slurm's nodes ({e.code}): {e.error}") from None
    if not args.cluster:
        return slurm_cluster(nodes, bridge.gpu_type)
    cluster = cluster_arg(args.cluster)
    names = {n.name for n in nodes}
    strangers = [s.id for s in cluster.servers if s.id not in names]
    if strangers:
        raise BridgeError(f"servers {', '.join(strangers)} are no nodes of Slurm partition "
                          f"{bridge.slurm.partition}")
    return cluster


def real_jobs(ctx: ServiceContext, settings: ExecutorSettings, server: Server,
              bridge: BridgeSettings) -> RealJobs:
    """What a node's real starts need (``--backend real``, as for an executor)."""
    sink = NatsSink(ctx.nc, ctx.js, server.id, ctx.log, ctx.spawn)
    options = LaunchOptions(gpu_type=server.gpu_type, sample_s=settings.sample_s,
                            profile_iters=settings.profile_iters)
    env = {**os.environ, "PYTHONPATH": jobs_pythonpath(bridge)}
    return RealJobs(sink=sink, options=options, base_env=env,
                    stop_grace_s=settings.stop_grace_s)


def node_address(node: SlurmNode | None, default: str) -> str:
    """Where a node's peers meet (its rendezvous address, the placer's
    ``MASTER_ADDR`` for a job whose first server it is): the address
    slurmctld reaches the node at (``NodeAddr``), which the other nodes
    reach it at too; ``default`` (the bridge's ``--address``) when Slurm
    names none."""
    return node.address if node is not None and node.address else default


def _node_settings(args: argparse.Namespace, cluster: Cluster, bridge: BridgeSettings,
                   slurm_nodes: Mapping[str, SlurmNode]) -> list[ExecutorSettings]:
    out = []
    for order, server in enumerate(cluster.servers):
        ns = argparse.Namespace(**{**vars(args), "server_id": server.id, "order": order,
                                   "cluster": args.cluster or "slurm"})
        out.append(replace(executor_settings(ns, cluster), backend="slurm",
                           run_dir=bridge.run_dir,
                           address=node_address(slurm_nodes.get(server.id), args.address)))
    return out


def _runtime_of(runtime: RuntimeSettings, server_id: str) -> RuntimeSettings:
    folder = os.environ.get(CREDENTIALS_DIR, "")
    if not folder:
        return runtime
    return replace(runtime, nats_nkey=str(Path(folder) / f"executor-{server_id}.nk"))


async def _node_context(runtime: RuntimeSettings, server_id: str, stopping: asyncio.Event,
                        log: FilteringBoundLogger) -> ServiceContext:
    rt = _runtime_of(runtime, server_id)
    nc = await connect(rt, f"executor-{server_id}")
    return ServiceContext("executor", rt, nc, nc.jetstream(), log.bind(server_id=server_id),
                          ErrorReporter(nc, "executor"), stopping)


def _job_env(runtime: RuntimeSettings, settings: ExecutorSettings, cluster_path: str,
             seed: str) -> JobEnv:
    s = settings
    args = ["--time-scale", repr(s.time_scale), "--heartbeat-s", repr(s.heartbeat_s),
            "--sample-s", repr(s.sample_s), "--profile-iters", str(s.profile_iters),
            "--log-level", runtime.log_level]
    return JobEnv(nats_url=runtime.nats_url, job_args=args, cluster=cluster_path,
                  seed=seed, ca=runtime.nats_ca or "")


async def bridge_main(args: argparse.Namespace, runtime: RuntimeSettings,
                      bridge: BridgeSettings, log: FilteringBoundLogger) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    client = SlurmClient(bridge.slurm)
    try:
        cluster = await the_cluster(args, bridge, client)
        path = cluster_file(cluster, bridge.run_dir)
        watch = SlurmWatch(client, bridge.poll_s, bridge.down_s, log)
        await watch.read()
        nodes = _node_settings(args, cluster, bridge, watch.nodes)
        truth = GroundTruth(cluster, builtin_catalog())
        contexts = [await _node_context(runtime, s.server_id, stopping, log) for s in nodes]
        real = args.backend == "real"
        log.info("Slurm bridge serving", nodes=[s.server_id for s in nodes],
                 partition=bridge.slurm.partition, rest=bool(bridge.slurm.rest_url),
                 jobs="real" if real else "emulated")
        return await _serve(contexts, nodes, cluster, watch, truth, path, bridge, log, real)
    except (BridgeError, SpecError, SlurmFailure, ValueError) as e:
        log.error("the Slurm bridge cannot start", error=str(e))
        print(f"hops-slurm-bridge: {e}", file=sys.stderr)
        return 2
    finally:
        await client.aclose()


async def _serve(contexts: list[ServiceContext], nodes: list[ExecutorSettings],
                 cluster: Cluster, watch: SlurmWatch, truth: GroundTruth, path: str,
                 bridge: BridgeSettings, log: FilteringBoundLogger, real: bool) -> int:
    stopping = contexts[0].stopping
    mains = []
    for ctx, settings in zip(contexts, nodes, strict=True):
        server = cluster.by_id[settings.server_id]
        env = _job_env(ctx.settings, settings, path, ctx.settings.nats_nkey or "")
        backend = SlurmBackend(server, bridge, watch.client, watch, env, truth, ctx.log,
                               real_jobs(ctx, settings, server, bridge) if real else None)
        mains.append(asyncio.create_task(run_node(ctx, settings, cluster, backend)))
    poller = asyncio.create_task(watch.run(stopping))
    done, _ = await asyncio.wait([*mains, asyncio.create_task(stopping.wait())],
                                 return_when=asyncio.FIRST_COMPLETED)
    failed = any(t.exception() is not None for t in done if t in mains and not t.cancelled())
    stopping.set()
    grace = nodes[0].stop_grace_s + _SHUTDOWN_MARGIN_S if nodes else 0.0
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*mains, return_exceptions=True), grace)
    poller.cancel()
    for ctx in contexts:
        await ctx.cancel_tasks()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ctx.nc.close(), 2.0)
    failed = failed or any(ctx.failed for ctx in contexts)
    log.info("Slurm bridge stopped", failed=failed)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    runtime, args = parse_args(argv, service="executor", parser=_parser())
    log = configure_logging("slurm-bridge", runtime.log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request, twice a second
    structlog.contextvars.bind_contextvars(backend="slurm")
    try:
        bridge = from_environ(run_dir_of(args))
    except BridgeSettingsError as e:
        print(f"hops-slurm-bridge: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(bridge_main(args, runtime, bridge, log))
    except KeyboardInterrupt:
        return 130
