"""``hops up``: the whole live system on this machine, one process per component.

It starts nats-server with JetStream (:class:`~services.runtime.natsd.EmbeddedNats`,
state under ``<data-dir>/nats``), then every process of :mod:`cli.up.stack`
(two scheduler replicas by default: a leader and a standby) with its log in
``<data-dir>/logs/<name>.log``, waits until the gateway's ``/healthz``
answers, says where the gateway and the metrics are, and supervises
(:class:`cli.up.launcher.Launcher`): a process that ends without being asked
to is reported (with its log file) and restarted, 1 s later, then twice as
late each time up to 30 s. nats-server too (:class:`NatsKeeper`), on the
same port and data dir, so that streams and KV buckets survive and every
service reconnects to it. SIGINT (Ctrl-C) or SIGTERM stops everything:
SIGTERM to each process, a grace period, then SIGKILL to whatever is left of
each one's process group (emulated jobs included), and nats-server last.
On Linux ``hops up`` is a child subreaper: descendants orphaned by a dead
parent become its children, are reaped, and it returns only once every
group it killed is gone.
Real executors (``--executor real``) stop their jobs themselves on SIGTERM:
a real job runs in a process group of its own, so that it can outlive a
crash of its executor.
With ``--backend slurm`` it first reads the nodes of the Slurm partition
into ``<data-dir>/slurm-cluster.json`` (:mod:`cli.up.slurm`), the stack's
cluster, and runs the Slurm bridge in place of the executors (docs/slurm.md).
``<data-dir>/up.json`` lists the processes (nats-server's pid included) while
the stack runs.

With ``--nats-cluster 3`` it runs three nats-servers routed into one cluster
(:class:`~services.runtime.natscluster.NatsCluster`, each under
``<data-dir>/nats/n<i>``), every service gets every server's URL and
``HOPS_NATS_REPLICAS=3``, so that every stream and KV bucket keeps a copy on
each; each member is kept alive on its own (docs/live.md, *A NATS cluster*).

Authentication is on unless ``--no-auth`` (for measurements only): on first
start ``hops up`` generates every identity's credential, the tokens and the
effective tenants file into ``<data-dir>/credentials/`` (cli/up/credentials.py,
reused after), nats-server admits only those identities, each process
connects as its own, and ``<data-dir>/cli.yaml`` gives the CLI the gateway
and the admin's token (docs/security.md). With ``--tls-cert``/``--tls-key``
NATS and the gateway serve TLS.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import IO

import httpx

from cli.up.credentials import (
    Credentials,
    CredentialsError,
    prepare,
    write_cli_config,
    write_private,
)
from cli.up.launcher import SOURCE_ROOT, Child, Launcher, Say, become_subreaper, port_free
from cli.up.slurm import SlurmUpError, describe
from cli.up.stack import StackConfig, describe_exit, modules, processes, restart_delay
from scheduling.live.cells import cluster_nodes, tenant_cells
from services.runtime.identity import ADMIN, IdentityError
from services.runtime.natscluster import CLUSTER_PORT, MONITOR_PORT, NatsCluster
from services.runtime.natsd import EmbeddedNats, NatsServerError
from shared.specs import SpecError
from shared.tenants import TenantsError, TenantsFile, load_tenants
from world.clusters import cluster_arg

_POLL_S = 0.1


class UpError(RuntimeError):
    """The stack cannot start; the message says why."""


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(launcher: Launcher, gateway: Child, timeout: float) -> None:
    """Until the gateway answers ``/healthz``; UpError if it dies or takes
    longer than ``timeout``; returns early (quietly) on a stop request."""
    deadline = time.monotonic() + timeout
    see = f"see {gateway.log}"
    ca = launcher.config.trusted_ca
    verify = ssl.create_default_context(cafile=str(ca)) if ca else True
    with httpx.Client(timeout=1.0, verify=verify) as client:
        while not launcher.stopping.is_set():
            if _healthy(client, launcher.config.gateway_url):
                return
            if gateway.proc.poll() is not None:
                raise UpError(f"the gateway exited with {gateway.proc.returncode}; {see}")
            if time.monotonic() > deadline:
                raise UpError(f"the gateway did not become healthy in {timeout:g} s; {see}")
            launcher.tick(time.monotonic())
            launcher.stopping.wait(_POLL_S)


def _check_ports(config: StackConfig, nats: NatsCluster) -> None:
    wanted = [("gateway", config.gateway_port, config.gateway_host),
              ("metrics", config.metrics_port, config.metrics_host)]
    for server in nats.servers:
        wanted += [(f"NATS {what}", port, server.host) for what, port in
                   (("client", server.port), ("route", server.routes and server.routes.port),
                    ("monitoring", server.monitor_port)) if port]
    for name, port, host in wanted:
        if not port_free(port, host):
            flag = "--nats-port" if name.startswith("NATS") else f"--{name}-port"
            raise UpError(f"port {port} ({name}) is in use; choose another with {flag}")


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that ``python -m`` cannot run from :data:`SOURCE_ROOT`."""
    if SOURCE_ROOT not in sys.path:
        sys.path.append(SOURCE_ROOT)  # as the children will have it on PYTHONPATH
    missing = []
    for name in names:
        try:
            runnable = importlib.util.find_spec(f"{name}.__main__") is not None
        except ImportError:
            runnable = False
        if not runnable and not _is_plain_module(name):
            missing.append(name)
    return missing


def _is_plain_module(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return False
    return spec is not None and spec.submodule_search_locations is None


def stack_nats(config: StackConfig, port: int) -> NatsCluster:
    """The stack's nats-servers: authorization from the credentials folder
    unless authentication is off, TLS if asked for. A cluster's members
    listen on ``port`` and the ports after it (routes from 6222, monitoring
    from 8222), or on free ports with ``port`` 0."""
    auth = config.credentials_dir / "nats-auth.conf" if config.auth else None
    size = config.nats_cluster
    fixed = port != 0 and size > 1
    return NatsCluster(
        config.nats_dir, size, ports=[port + i for i in range(size)] if port or size == 1
        else None, route_ports=[CLUSTER_PORT + i for i in range(size)] if fixed else None,
        monitor_ports=[MONITOR_PORT + i for i in range(size)] if fixed else None,
        auth_conf=auth, tls_cert=config.tls_cert, tls_key=config.tls_key)


def _tenants(config: StackConfig) -> TenantsFile | None:
    if config.tenants is None:
        return None
    try:
        file = load_tenants(config.tenants.read_text())
    except OSError as e:
        raise UpError(f"cannot read the tenants file: {e}") from None
    except TenantsError as e:
        raise UpError(f"{config.tenants}: {e}") from None
    try:  # the cells, against the cluster this stack runs
        tenant_cells(file, cluster_nodes(cluster_arg(config.cluster)), str(config.tenants))
    except TenantsError as e:
        raise UpError(str(e)) from None
    return file


def secure(config: StackConfig) -> Credentials | None:
    """Generate (or reuse) the stack's credentials; None with
    authentication off."""
    if not config.auth:
        return None
    try:
        servers = [s.id for s in cluster_arg(config.cluster).servers]
        return prepare(config.credentials_dir, servers, _tenants(config))
    except (SpecError, CredentialsError, IdentityError, TenantsError) as e:
        raise UpError(f"cannot prepare the credentials: {e}") from None


def _write_state(config: StackConfig, nats: NatsCluster, children: list[Child]) -> None:
    members = [{"url": s.url, "pid": s.pid, "log": str(s.log_path), "name": s.server_name}
               for s in nats.servers]
    state = {
        "pid": os.getpid(),
        "gateway": config.gateway_url,
        "metrics": config.metrics_url,
        "credentials": str(config.credentials_dir) if config.auth else None,
        "nats": members[0],  # the first (or only) server, as before clusters
        "nats_servers": members,
        "components": {
            c.component.name: {"pid": c.proc.pid, "argv": c.proc.args, "log": str(c.log)}
            for c in children
        },
    }
    # atomically: `hops auth` and the tests read it while nats-server restarts
    write_private(config.state_file, (json.dumps(state, indent=2) + "\n").encode(), mode=0o644)


class NatsKeeper:
    """Restarts nats-server when it dies, as the launcher restarts every other
    process (:func:`cli.up.stack.restart_delay`), on the same port and data dir:
    JetStream's streams and KV buckets are on disk and every service
    reconnects forever, so accepted jobs survive (docs/live.md, *Faults*)."""

    def __init__(self, nats: EmbeddedNats, say: Say, on_restart: Callable[[], None]) -> None:
        self.nats = nats
        self.say = say
        self.on_restart = on_restart
        self.started = time.monotonic()
        self.delay: float | None = None
        self.restart_at: float | None = None

    def tick(self, now: float) -> None:
        if self.restart_at is None:
            code = self.nats.returncode
            if code is not None:
                # a cluster's member by its name (hops-1 ...), as its peers and /jsz name it
                name = "nats-server" if self.nats.routes is None \
                    else f"nats-server {self.nats.server_name}"
                self._schedule(now, describe_exit(name, code, self.nats.log_path))
        elif now >= self.restart_at:
            self._restart(now)

    def _schedule(self, now: float, note: str) -> None:
        self.delay = restart_delay(self.delay, now - self.started)
        self.restart_at = now + self.delay
        self.say(f"{note}; restarting it in {self.delay:g} s")

    def _restart(self, now: float) -> None:
        self.nats.stop()  # forget the dead process and its ports file
        try:
            url = self.nats.start()
        except NatsServerError as e:  # e.g. its port taken meanwhile: try again later
            self.started = now
            reason = str(e).splitlines()[0]  # the log tail is in the log file
            self._schedule(now, f"hops up: nats-server did not start again ({reason})")
            return
        self.started, self.restart_at = time.monotonic(), None
        self.say(f"hops up: nats-server restarted on {url} (same data dir)")
        self.on_restart()


def _keep(nats: NatsCluster, say: Say, on_restart: Callable[[], None]
          ) -> Callable[[float], None]:
    """One keeper per member: each is restarted on its own port and data dir."""
    keepers = [NatsKeeper(s, say, on_restart) for s in nats.servers]

    def tick(now: float) -> None:
        for keeper in keepers:
            keeper.tick(now)

    return tick


def _executors(config: StackConfig) -> str:
    if config.executor == "slurm":
        jobs = ("real jobs as Slurm jobs, in real time" if config.slurm_jobs == "real"
                else f"emulated jobs as Slurm jobs, time x{config.time_scale:g}")
        return f"Slurm partition {config.slurm.get('HOPS_SLURM_PARTITION') or 'hops'}, {jobs}"
    if config.executor == "real":
        who = config.job_user or ("root" if config.allow_root_jobs else "the executors' user")
        return f"real executors, jobs run as {who}, job files in {config.runs_dir}/"
    return f"emulated, time x{config.time_scale:g}"


def _access(config: StackConfig) -> list[str]:
    if not config.auth:
        return ["  auth     OFF (--no-auth: anyone who reaches NATS may do anything; "
                "for measurements only)"]
    creds = Credentials(config.credentials_dir)
    return [f"  admin    token in {creds.token(ADMIN)}; the CLI reads {config.cli_config}",
            f"  secrets  {creds.dir}/ (NATS seeds, tokens, tenants file)"]


def banner(config: StackConfig, nats_url: str) -> str:
    return "\n".join(
        [
            f"Hops is up: cluster {config.cluster} ({_executors(config)}), "
            f"rounds of {config.round_wall_s:g} s",
            f"  gateway  {config.gateway_url}   (API docs {config.gateway_url}/docs)",
            f"  metrics  {config.metrics_url}",
            f"  NATS     {nats_url}",
            f"  logs     {config.logs_dir}/",
            *_access(config),
            "Ctrl-C stops everything.",
        ]
    )


def _install_signals(stopping: threading.Event) -> Callable[[], None]:
    def handler(_sig: int, _frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def up(
    config: StackConfig,
    nats_port: int,
    say: Say,
    health_timeout: float = 90.0,
) -> int:
    """Run the stack until SIGINT/SIGTERM; the exit code (0 after a requested
    stop, 1 when it could not start). See the module docstring."""
    nats = stack_nats(config, nats_port)
    launcher = Launcher(config, say)
    launcher.reaper = become_subreaper()
    restore = _install_signals(launcher.stopping)
    try:
        _check_ports(config, nats)
        missing = missing_modules(modules())
        if missing:
            raise UpError(f"cannot run {', '.join(missing)}: not found from {SOURCE_ROOT}")
        config.data_dir.mkdir(parents=True, exist_ok=True)
        if config.executor == "slurm":
            launcher.config = config = describe(config)
        creds = secure(config)
        nats.start()
        launcher.config = config = replace(config, nats_url=nats.url)
        if creds is not None:
            write_cli_config(config.cli_config, config.gateway_url,
                             creds.token(ADMIN).read_text().strip())
        started = [launcher.start(comp) for comp in processes(config)]
        launcher.on_restart = lambda: _write_state(config, nats, launcher.children)
        launcher.on_tick = _keep(nats, say, launcher.on_restart)
        launcher.on_restart()
        wait_healthy(launcher, started[-1], health_timeout)
        if not launcher.stopping.is_set():
            say(banner(config, nats.url))
        while not launcher.stopping.wait(_POLL_S * 5):
            launcher.tick(time.monotonic())
        return 0
    except (UpError, NatsServerError, OSError, SlurmUpError) as e:
        say(f"hops up: {e}")
        return 1
    finally:
        if launcher.children:
            say("hops up: stopping")
        launcher.stop()
        nats.stop()
        config.state_file.unlink(missing_ok=True)
        restore()


def stdout_say(out: IO[str] | None = None) -> Say:
    stream = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    return say
