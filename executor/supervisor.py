"""``python -m executor --cluster C --all``: one executor process per server
of the cluster, kept running.

Each server gets ``python -m executor --cluster C --server-id S --order I``
with the supervisor's other flags (``--backend``, ``--run-dir``,
``--cpu-affinity`` ... included), ``I`` being the server's index in the
cluster (its adjacency order). A child that exits while the supervisor runs
is restarted after a back-off (1 s, doubling up to 30 s; reset once a child
stayed up a minute). SIGTERM/SIGINT stop every child and then the
supervisor. The children run without a health endpoint (they would share
one port); the supervisor logs each start and exit.

With ``HOPS_NATS_CREDENTIALS_DIR`` set (``hops up``, compose), each child
connects as its own server's identity, ``<dir>/executor-<server id>.nk``
(docs/security.md), and is not told where the other seeds are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from shared.cluster import Cluster

_BACKOFF_S = (1.0, 30.0)
_STABLE_S = 60.0
_STOP_GRACE_S = 10.0


def child_argv(argv: Sequence[str], server_id: str, order: int) -> list[str]:
    """``argv`` without ``--all`` and the health port, for one server."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--all" or arg.startswith("--health-port="):
            continue
        if arg in ("--health-port", "--server-id", "--order"):
            skip = True
            continue
        if arg.startswith(("--server-id=", "--order=")):
            continue
        out.append(arg)
    return [*out, "--server-id", server_id, "--order", str(order)]


CREDENTIALS_DIR = "HOPS_NATS_CREDENTIALS_DIR"


def child_env(environ: Mapping[str, str], server_id: str) -> dict[str, str]:
    """The environment of ``server_id``'s executor: the supervisor's, without
    the health port, and with that server's own NATS credential when the
    supervisor was given the credentials folder."""
    env = {k: v for k, v in environ.items() if k not in ("HOPS_HEALTH_PORT", CREDENTIALS_DIR)}
    folder = environ.get(CREDENTIALS_DIR, "")
    if folder:
        env["HOPS_NATS_NKEY"] = str(Path(folder) / f"executor-{server_id}.nk")
    return env


async def _keep(argv: list[str], server_id: str, stopping: asyncio.Event,
                log: FilteringBoundLogger) -> None:
    """Run one executor until ``stopping``, restarting it when it exits."""
    env = child_env(os.environ, server_id)
    delay = _BACKOFF_S[0]
    loop = asyncio.get_running_loop()
    while not stopping.is_set():
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "executor", *argv,
                                                    env=env)
        started = loop.time()
        log.info("executor started", server_id=server_id, pid=proc.pid)
        waiter = asyncio.create_task(proc.wait())
        stop = asyncio.create_task(stopping.wait())
        await asyncio.wait((waiter, stop), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not waiter.done():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(waiter), _STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await waiter
            log.info("executor stopped", server_id=server_id, exit_code=proc.returncode)
            return
        log.warning("executor exited; restarting", server_id=server_id,
                    exit_code=proc.returncode, delay_s=delay)
        delay = _BACKOFF_S[0] if loop.time() - started > _STABLE_S else delay
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        delay = min(_BACKOFF_S[1], delay * 2)


async def supervise(cluster: Cluster, argv: Sequence[str], log: FilteringBoundLogger) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    log.info("supervising executors", servers=len(cluster.servers), cluster=cluster.name)
    await asyncio.gather(*(
        _keep(child_argv(argv, s.id, i), s.id, stopping, log)
        for i, s in enumerate(cluster.servers)
    ))
    return 0
