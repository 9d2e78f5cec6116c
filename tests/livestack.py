"""The whole live system for tests: nats-server (or, with ``nats_cluster=3``,
three in one cluster), every service and an
EMULATED GPU cluster (or, with ``executor="real"``, real executors running
jobs' commands), each its own OS process.

:class:`LiveStack` runs the process table of :mod:`cli.up.stack` with the
launcher of ``hops up`` (:class:`cli.up.launcher.Launcher`), so a test runs the
same commands as ``hops up``. What differs is environment only: a temp data
dir, free ports, short intervals (rounds of 2 s, a short leader lease), a
large time scale, a health port per service and, by default, two scheduler
replicas (compose runs two as well). It does not restart what dies (the
launcher only restarts on ``tick``), so a test may kill a process and watch
the rest of the system cope.

A :class:`Bus` (a NATS client on its own thread) records every event
(:data:`RECORDED`) and every KV change (``$KV.>``) from the start, so a test can
check what happened in between (a placement that existed for half a
second, a ``job_started``), and reads KV buckets and streams for what is
stored. Authentication is on, as under ``hops up`` (credentials in
``<data>/credentials``); the Bus connects as ``admin``. Tests are plain
functions; they wait on conditions with :func:`until`, never on fixed
sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, NotFoundError

from cli.up.launcher import Child, Launcher
from cli.up.slurm import slurm_jobs_of
from cli.up.stack import Component, ExecutorKind, StackConfig, components
from cli.up.up import secure, stack_nats, wait_healthy
from services.runtime.bus import auth_options
from services.runtime.kv import read_bucket
from services.runtime.objects import get_object
from services.runtime.settings import RuntimeSettings
from shared import subjects
from tests.helpers import free_port
from world.clusters import cluster_arg

T = TypeVar("T")

# Short intervals for every process of a test stack (each is documented in
# docs/events.md); heartbeats and deadlines stay at their defaults.
TEST_ENV = {
    "HOPS_LEADER_TTL": "3",  # a standby takes over within TTL + TTL/3 = 4 s
    "HOPS_REPLAN_DELAY_S": "0.5", "HOPS_PRIORITY_REFRESH_S": "5",
    "HOPS_ESTIMATE_TIMEOUT_S": "3", "HOPS_PLACEMENT_GRACE_S": "20", "HOPS_QUEUE_POLL_S": "1",
    "HOPS_SAMPLE_S": "1", "HOPS_STOP_GRACE_S": "2", "HOPS_COMMAND_TIMEOUT_S": "5",
    "HOPS_ORPHAN_GRACE_S": "20",
}
FINAL = ("finished", "failed", "cancelled")
# What the Bus records: events and KV changes, never a request subject (a
# listener there would turn the requester's "no responders" into a timeout).
RECORDED = ("hops.v1.jobs.events.>", "hops.v1.profiles.>", "hops.v1.samples.>", "hops.v1.plans",
            "hops.v1.cluster.released", "hops.v1.errors", "$KV.>")


def until(condition: Callable[[], T | None], what: str, timeout: float = 30.0,
          detail: Callable[[], str] | None = None) -> T:
    """The first truthy value of ``condition()``, polled every 0.1 s; an
    assertion naming ``what`` (and ``detail()``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s\n{detail() if detail else ''}")
        time.sleep(0.1)


@dataclass(frozen=True)
class Seen:
    """One message the :class:`Bus` saw: its subject, JSON body (``None``
    when the body is not JSON) and KV operation (``PUT``/``DEL``/``PURGE``
    for ``$KV`` subjects), with the monotonic time it arrived."""

    subject: str
    body: Any
    op: str
    at: float

    @property
    def type(self) -> str:
        return str(self.body.get("type", "")) if isinstance(self.body, dict) else ""


class Bus:
    """A NATS client on a thread of its own: records what is published and
    runs coroutines for the (synchronous) tests."""

    def __init__(self, url: str, seed: Path | None = None, ca: Path | None = None) -> None:
        self.url = url
        self.seed, self.ca = seed, ca  # the admin's credential; the CA of a tls:// URL
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.nc: NATS = self.call(self._connect())

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the bus's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _connect(self) -> NATS:
        settings = RuntimeSettings(nats_servers=(self.url,),
                                   nats_nkey=str(self.seed) if self.seed else None,
                                   nats_ca=str(self.ca) if self.ca else None)
        nc = await nats.connect(servers=self.url.split(","), max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2, **auth_options(settings))
        for subject in RECORDED:
            await nc.subscribe(subject, cb=self._record)
        await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
        await nc.flush()
        return nc

    async def _record(self, msg: Msg) -> None:
        try:
            body = json.loads(msg.data) if msg.data else None
        except ValueError:
            body = None
        kv = msg.subject.startswith("$KV.")
        op = (msg.headers or {}).get("KV-Operation", "PUT") if kv else ""
        with self.lock:
            self.seen.append(Seen(msg.subject, body, op, time.monotonic()))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self.nc.close(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    # --- what was seen -------------------------------------------------------------

    def messages(self, prefix: str = "", kind: str = "", since: float = 0.0) -> list[Seen]:
        """Messages on subjects starting with ``prefix`` of type ``kind``."""
        with self.lock:
            seen = list(self.seen)
        return [m for m in seen if m.subject.startswith(prefix)
                and (not kind or m.type == kind) and m.at >= since]

    def job_events(self, job_id: str, kind: str = "") -> list[Seen]:
        return self.messages(f"hops.v1.jobs.events.{job_id}", kind)

    def alloc_changes(self, job_id: str) -> list[Seen]:
        return [m for m in self.messages("$KV.hops_alloc.") if m.subject.endswith(f".{job_id}")]

    def errors(self, since: float = 0.0) -> list[dict[str, Any]]:
        return [m.body for m in self.messages("hops.v1.errors", since=since)]

    def plans(self) -> list[dict[str, Any]]:
        return [m.body for m in self.messages("hops.v1.plans", "plan_issued")]

    # --- requests and stored state -------------------------------------------------

    def request(self, subject: str, body: bytes, timeout: float = 5.0) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:
            msg = await self.nc.request(subject, body, timeout=timeout)
            out: dict[str, Any] = json.loads(msg.data)
            return out

        return self.call(ask(), timeout + 5)

    def bucket(self, name: str) -> dict[str, Any]:
        """Every key of KV ``name`` with its JSON value."""

        async def read() -> dict[str, Any]:
            values = await read_bucket(self.nc.jetstream(), name)
            return {k: json.loads(v.data or b"null") for k, v in values.items()}

        return self.call(read())

    def get(self, bucket: str, key: str) -> dict[str, Any] | None:
        async def read() -> dict[str, Any] | None:
            kv = await self.nc.jetstream().key_value(bucket)
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                return None
            out: dict[str, Any] | None = json.loads(entry.value or b"null")
            return out

        return self.call(read())

    def state(self, name: str) -> dict[str, Any] | None:
        """Object ``name`` of the leader's state (hops_state), as JSON."""
        data = self.call(get_object(self.nc.jetstream(), subjects.OBJ_STATE, name))
        out: dict[str, Any] | None = None if data is None else json.loads(data)
        return out

    def stored(self, stream: str, subject: str,
               decode: Callable[[bytes], Any] = json.loads) -> list[Any]:
        """Every message of ``stream`` on ``subject`` (a filter), oldest
        first, each ``decode``d (JSON by default)."""

        async def read() -> list[Any]:
            sub = await self.nc.jetstream().subscribe(subject, stream=stream,
                                                      ordered_consumer=True)
            out: list[Any] = []
            pending = 1
            try:  # until the last one pending, or nothing at all within 0.5 s
                with contextlib.suppress(nats.errors.TimeoutError):
                    while pending:
                        msg = await sub.next_msg(timeout=0.5)
                        out.append(decode(msg.data))
                        pending = msg.metadata.num_pending
            finally:
                await sub.unsubscribe()
            return out

        try:
            return self.call(read())
        except NotFoundError:
            return []

    def connected(self) -> bool:
        return bool(self.nc.is_connected)


@dataclass
class LiveStack:
    """See the module docstring. ``start()`` returns once every service
    answers its health endpoint, every server is registered and alive, a
    scheduler leads and an estimator serves."""

    root: Path
    cluster_yaml: str
    schedulers: int = 2
    time_scale: float = 600.0
    round_s: float = 2.0
    policy: str = "hops"  # the scheduler's policy spec (hops up --policy)
    env: Mapping[str, str] = field(default_factory=dict)
    executor: ExecutorKind = "emulated"
    cpu_affinity: str = ""
    auth: bool = True
    tenants: Path | None = None  # the operator's tenants file (hops up --tenants)
    nats_cluster: int = 1  # nats-servers in one cluster (hops up --nats-cluster)
    # Another module for a component (e.g. the scheduler as tests.cores_layer:
    # the real scheduler with a test layer); its arguments and identity stay.
    modules: Mapping[str, str] = field(default_factory=dict)
    said: list[str] = field(default_factory=list)
    procs: dict[str, Child] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data_dir = self.root / "data"
        self.cluster_file = self.root / "cluster.yaml"
        self.config = StackConfig(cluster=str(self.cluster_file), time_scale=self.time_scale,
                                  data_dir=self.data_dir, gateway_port=free_port(),
                                  metrics_port=free_port(), round_s=self.round_s,
                                  policy=self.policy,
                                  executor=self.executor, cpu_affinity=self.cpu_affinity,
                                  auth=self.auth, tenants=self.tenants,
                                  nats_cluster=self.nats_cluster,
                                  # what hops up makes of $HOPS_EXECUTOR_BACKEND
                                  slurm_jobs=slurm_jobs_of("", {**os.environ, **self.env},
                                                           slurm=self.executor == "slurm"))
        # a cluster's members on free ports of their own (0), one server on a port known now
        self.nats = stack_nats(self.config, free_port() if self.nats_cluster == 1 else 0)
        self.launcher = Launcher(self.config, self.said.append, grace=10.0)
        self.bus: Bus | None = None

    # --- start and stop ----------------------------------------------------------

    def start(self, timeout: float = 60.0) -> LiveStack:
        self.root.mkdir(parents=True, exist_ok=True)
        self.cluster_file.write_text(self.cluster_yaml)
        try:
            creds = secure(self.config)
            url = self.nats.start()
            self.launcher.config = self.config = replace(self.config, nats_url=url)
            self.bus = Bus(url, creds.seed("admin") if creds else None)
            for comp in components(self.config):
                module = self.modules.get(comp.name, comp.module)
                for name, env in self._instances(comp):
                    self.procs[name] = self.launcher.start(replace(comp, name=name, env=env,
                                                                   module=module))
            wait_healthy(self.launcher, self.procs["gateway"], timeout)
            until(self.ready, "the stack ready", timeout, self.logs)
        except BaseException:
            self.stop()  # nothing left behind by a stack that did not come up
            raise
        return self

    def _instances(self, comp: Component) -> list[tuple[str, dict[str, str]]]:
        """Each process of ``comp`` (two scheduler replicas by default) with its
        environment on top of the stack's: the test intervals and a health port."""
        count = self.schedulers if comp.name == "scheduler" else 1
        out = []
        for i in range(count):
            name = f"scheduler-{'abcdefgh'[i]}" if comp.name == "scheduler" else comp.name
            env = {**TEST_ENV, **self.env, **comp.env}
            if comp.name not in ("cluster", "gateway"):  # neither serves the runtime's
                self.health[name] = free_port()
                env["HOPS_HEALTH_PORT"] = str(self.health[name])
            if comp.name == "scheduler":
                env["HOPS_REPLICA_ID"] = name
            out.append((name, env))
        return out

    def ready(self) -> bool:
        alive = {k for k, n in self.nodes().items() if n.get("alive")}
        return alive >= set(self.cluster_servers()) and self.all_healthy() \
            and self.leader() is not None and self.estimator_serves()

    def stop(self) -> None:
        self.launcher.stop()
        if self.bus is not None:
            self.bus.close()
        self.nats.stop()

    def __enter__(self) -> LiveStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- processes ---------------------------------------------------------------

    @property
    def admin_token(self) -> str:
        """The admin's bearer token; empty with authentication off."""
        if not self.auth:
            return ""
        return (self.config.credentials_dir / "admin.token").read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of the admin's requests to the gateway."""
        token = self.admin_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def admin_seed(self) -> Path | None:
        """The admin's NATS credential, None with authentication off."""
        return self.config.credentials_dir / "admin.nk" if self.auth else None

    def bus_(self) -> Bus:
        assert self.bus is not None, "the stack has not started"
        return self.bus

    def pid(self, name: str) -> int:
        return self.procs[name].proc.pid

    def running(self, name: str) -> bool:
        return self.procs[name].proc.poll() is None

    def kill(self, name: str) -> None:
        """SIGKILL one component's process (not its process group)."""
        os.kill(self.pid(name), signal.SIGKILL)
        self.procs[name].proc.wait(10)

    def healthy(self, name: str) -> bool:
        port = self.config.gateway_port if name == "gateway" else self.health[name]
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and r.json().get("ok") is True

    def all_healthy(self) -> bool:
        return all(self.healthy(n) for n in [*self.health, "gateway"] if self.running(n))

    def cluster_servers(self) -> list[str]:
        return [s.id for s in cluster_arg(str(self.cluster_file)).servers]

    def executor_pid(self, server_id: str) -> int:
        """The emulated executor of ``server_id`` (a child of the cluster's supervisor)."""
        found = [p for p, argv in descendants(self.pid("cluster"))
                 if "executor" in argv and "--server-id" in argv
                 and argv[argv.index("--server-id") + 1] == server_id]
        assert len(found) == 1, f"executors of {server_id}: {found}"
        return found[0]

    def job_pids(self, job_id: str, role: str = "") -> list[int]:
        """The emulated job processes of ``job_id`` (of ``role``, if given)."""
        out = []
        for pid, argv in descendants(self.pid("cluster")):
            if "executor.job" in argv and argv[argv.index("--job-id") + 1] == job_id and (
                not role or argv[argv.index("--role") + 1] == role
            ):
                out.append(pid)
        return out

    # --- the system's state ------------------------------------------------------

    def leader(self) -> dict[str, Any] | None:
        return self.bus_().get("hops_leader", "scheduler")

    def estimator_serves(self) -> bool:
        body = json.dumps({"type": "estimate_request", "jobs": [],
                           "cluster": {"gpu_types": [], "servers": []}}).encode()
        try:
            return bool(self.bus_().request("hops.v1.estimate", body, timeout=1).get("ok"))
        except Exception:
            return False

    def record(self, job_id: str) -> dict[str, Any] | None:
        return self.bus_().get("hops_jobs", job_id)

    def phase(self, job_id: str) -> str:
        rec = self.record(job_id)
        return str(rec["phase"]) if rec else ""

    def allocs(self) -> dict[str, Any]:
        return self.bus_().bucket("hops_alloc")

    def nodes(self) -> dict[str, Any]:
        return self.bus_().bucket("hops_nodes")

    def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        body = json.dumps({"type": "submit_job", "spec": dict(spec)}).encode()
        return self.bus_().request("hops.v1.jobs.submit", body)

    def wait_final(self, job_ids: list[str], timeout: float) -> dict[str, str]:
        """Until every job is final; their phases."""
        def phases() -> dict[str, str] | None:
            now = {j: self.phase(j) for j in job_ids}
            return now if all(p in FINAL for p in now.values()) else None

        return until(phases, f"jobs {job_ids} ended", timeout,
                     lambda: f"{ {j: self.phase(j) for j in job_ids} }\n{self.logs()}")

    def log_events(self, name: str, event: str) -> list[dict[str, Any]]:
        """The JSON lines of ``name``'s log whose ``event`` is ``event``."""
        out = []
        for line in (self.data_dir / "logs" / f"{name}.log").read_text(
                errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and entry.get("event") == event:
                out.append(entry)
        return out

    def logs(self, tail: int = 2500) -> str:
        parts = [f"launcher said: {self.said}"]
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-tail:])
        return "\n".join(parts)


def descendants(pid: int) -> Iterator[tuple[int, list[str]]]:
    """Every process below ``pid`` with its argv (Linux ``/proc``)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    todo = list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        todo.extend(parents.get(child, []))
        with contextlib.suppress(OSError):
            raw = (Path("/proc") / str(child) / "cmdline").read_bytes()
            argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
            if argv:
                yield child, argv
