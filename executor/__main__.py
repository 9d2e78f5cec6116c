"""``python -m executor``: the EMULATED node executor.

``python -m executor --cluster paper-physical --server-id titanxp-0 [--time-scale 60]``
runs the executor of one server; ``python -m executor --cluster C --all``
supervises one executor process per server of ``C`` (:mod:`executor.supervisor`).
``--cluster`` is a built-in cluster name or a cluster spec file.

Besides the runtime's settings (:mod:`services.runtime.settings`), each
flag below overrides its environment variable:

=========================  ====================  =========  =============================
variable                   flag                  default    meaning
=========================  ====================  =========  =============================
``HOPS_CLUSTER``           ``--cluster``         required   cluster name or file
``HOPS_SERVER_ID``         ``--server-id``       required   this executor's server
                           ``--order``           its index  adjacency order to register
``HOPS_TIME_SCALE``        ``--time-scale``      1          emulated seconds per second
``HOPS_HEARTBEAT_S``       ``--heartbeat-s``     1          node and job heartbeat period
``HOPS_SAMPLE_S``          ``--sample-s``        10         running-mode sample period
``HOPS_STOP_GRACE_S``      ``--stop-grace-s``    5          SIGTERM to SIGKILL on a stop
``HOPS_START_TIMEOUT_S``   ``--start-timeout-s`` 30         wait for a job's first beat
``HOPS_PROFILE_ITERS``     ``--profile-iters``   20         iterations of a profiling run
=========================  ====================  =========  =============================
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import structlog

from executor.service import ExecutorSettings, run_node
from executor.supervisor import supervise
from services.runtime.logging import configure_logging
from services.runtime.service import ServiceContext, run_service
from services.runtime.settings import build_parser, env_float, env_int, parse_args
from shared.cluster import Cluster
from shared.ids import ServerId
from shared.specs import SpecError
from simulator.clusters import cluster_arg

_NUMBERS = (
    ("time_scale", "HOPS_TIME_SCALE", float, 1.0),
    ("heartbeat_s", "HOPS_HEARTBEAT_S", float, 1.0),
    ("sample_s", "HOPS_SAMPLE_S", float, 10.0),
    ("stop_grace_s", "HOPS_STOP_GRACE_S", float, 5.0),
    ("start_timeout_s", "HOPS_START_TIMEOUT_S", float, 30.0),
    ("profile_iters", "HOPS_PROFILE_ITERS", int, 20),
)


def _parser() -> argparse.ArgumentParser:
    p = build_parser("executor")
    p.add_argument("--cluster", default=os.environ.get("HOPS_CLUSTER") or None,
                   help="built-in cluster or cluster file; overrides $HOPS_CLUSTER")
    p.add_argument("--server-id", default=os.environ.get("HOPS_SERVER_ID") or None,
                   help="the server this executor runs; overrides $HOPS_SERVER_ID")
    p.add_argument("--order", type=int, default=None,
                   help="adjacency order to register (default: the server's index)")
    p.add_argument("--all", action="store_true", help="one executor per server (supervisor)")
    for name, var, kind, default in _NUMBERS:
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                       help=f"overrides ${var} (default {default})")
    return p


def executor_settings(args: argparse.Namespace, cluster: Cluster) -> ExecutorSettings:
    """The executor's settings: flags over environment variables over defaults."""
    values: dict[str, float | int] = {}
    for name, var, kind, default in _NUMBERS:
        flag = getattr(args, name)
        if flag is not None:
            values[name] = flag
        elif kind is int:
            values[name] = env_int(var, int(default), minimum=1)
        else:
            values[name] = env_float(var, float(default))
    if values["time_scale"] <= 0 or values["heartbeat_s"] <= 0 or values["sample_s"] <= 0:
        raise SpecError("time scale, heartbeat and sample periods must be > 0")
    server_id = ServerId(args.server_id)
    order = args.order if args.order is not None else cluster.server_index[server_id]
    return ExecutorSettings(cluster=args.cluster, server_id=server_id, order=order,
                            **values)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    runtime, args = parse_args(argv, service="executor", parser=parser)
    if not args.cluster:
        parser.error("--cluster (or HOPS_CLUSTER) is required")
    try:
        cluster = cluster_arg(args.cluster)
    except (SpecError, OSError, ValueError) as e:
        parser.error(str(e))
    if args.all:
        log = configure_logging("executor-supervisor", runtime.log_level)
        return asyncio.run(supervise(cluster, argv, log))
    if not args.server_id:
        parser.error("--server-id (or HOPS_SERVER_ID) is required without --all")
    if args.server_id not in cluster.by_id:
        parser.error(f"server {args.server_id!r} is not in cluster {cluster.name}")
    try:
        settings = executor_settings(args, cluster)
    except ValueError as e:
        parser.error(str(e))
    structlog.contextvars.bind_contextvars(server_id=settings.server_id)

    async def node_main(ctx: ServiceContext) -> None:
        await run_node(ctx, settings, cluster)

    return run_service("executor", node_main, runtime)


if __name__ == "__main__":
    sys.exit(main())
