"""A NATS cluster of embedded servers on one host: ``hops up --nats-cluster 3``
and the tests.

:class:`NatsCluster` runs ``size`` :class:`~services.runtime.natsd.EmbeddedNats`
servers, each with its own data dir (``<data_dir>/n<i>``), client port,
route port and HTTP monitoring port, routed to each other on ``host``. Every
one runs JetStream; streams and KV buckets made at ``replicas=size``
(:class:`services.runtime.bus.JetStreamLayout`) keep a copy on each, so
that losing one server loses no acknowledged write. A cluster of one is a
single server with no routes, as before clusters existed.

:meth:`NatsCluster.start` launches every member at once (a member's
JetStream waits for a quorum of its peers), then waits until the members
agree on a JetStream meta leader, so that the first service to connect can
create its streams. Members can be killed, stopped and started again one by
one (:meth:`member`), on their ports and data dirs.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from services.runtime.natsd import EmbeddedNats, NatsServerError, Routes

CLUSTER_NAME = "hops"
CLUSTER_PORT = 6222  # nats-server's customary route port
MONITOR_PORT = 8222  # nats-server's customary monitoring port
_POLL_S = 0.1


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` ports free on ``host`` now (held together while chosen, so distinct)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def member_name(index: int) -> str:
    return f"hops-{index + 1}"


class NatsCluster:
    """``size`` routed nats-servers with JetStream; see the module docstring.

    ``ports``, ``route_ports`` and ``monitor_ports`` give each member's
    ports (``None``: free ones, chosen now; a cluster of one may pass
    ``ports=[0]`` as EmbeddedNats does). Other keywords go to every
    :class:`EmbeddedNats` (authorization, TLS)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        size: int,
        *,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
        route_ports: Sequence[int] | None = None,
        monitor_ports: Sequence[int] | None = None,
        start_timeout: float = 20.0,
        auth_conf: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        if size < 1:
            raise NatsServerError(f"a NATS cluster needs at least one server, got {size}")
        self.size = size
        self.start_timeout = start_timeout
        self.data_dir = Path(data_dir)
        self.host = host
        client = list(ports) if ports is not None else free_ports(size, host)
        if len(client) != size:
            raise NatsServerError(f"{size} servers need {size} client ports, got {len(client)}")
        make = partial(EmbeddedNats, host=host, auth_conf=auth_conf, tls_cert=tls_cert,
                       tls_key=tls_key)
        if size == 1:  # today's single server, in its own folder, with no routes
            self.servers = [make(self.data_dir, port=client[0])]
            return
        routes = list(route_ports) if route_ports is not None else free_ports(size, host)
        monitors = list(monitor_ports) if monitor_ports is not None else free_ports(size, host)
        peers = tuple(f"nats://{host}:{p}" for p in routes)
        self.servers = [
            make(self.data_dir / f"n{i + 1}", port=client[i], server_name=member_name(i),
                 start_timeout=start_timeout, monitor_port=monitors[i],
                 routes=Routes(CLUSTER_NAME, host, routes[i], peers))
            for i in range(size)
        ]

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(s.url for s in self.servers)

    @property
    def url(self) -> str:
        """Every member's URL, comma-separated (``HOPS_NATS_URL``)."""
        return ",".join(self.urls)

    def member(self, name: str) -> EmbeddedNats:
        """The member with server name ``name`` (as JetStream names a leader)."""
        for s in self.servers:
            if s.server_name == name:
                return s
        raise KeyError(name)

    def start(self) -> str:
        """Start every member, wait for a JetStream meta leader; the URLs."""
        try:
            for s in self.servers:
                if not s.running:
                    s.launch()
            for s in self.servers:
                s.wait_ready()
            if self.size > 1:
                self.wait_meta_leader()
                self.wait_meshed()
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def meta_leader(self) -> str:
        """The JetStream meta leader's server name as some running member
        sees it ('' while there is none)."""
        for s in self.servers:
            if s.running and s.monitor_port is not None:
                leader = str(_jsz(s).get("meta_cluster", {}).get("leader", "") or "")
                if leader:
                    return leader
        return ""

    def wait_meta_leader(self, timeout: float | None = None) -> str:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while time.monotonic() < deadline:
            leader = self.meta_leader()
            if leader:
                return leader
            time.sleep(_POLL_S)
        raise NatsServerError(f"no JetStream meta leader after {timeout or self.start_timeout}s")

    def wait_meshed(self, timeout: float | None = None) -> None:
        """Wait until every member lists every member's client URL: the
        routes are all up, so a client connecting now is told the whole
        cluster (a meta leader needs only a quorum of them)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while time.monotonic() < deadline:
            if all(len(_monitor(s, "varz").get("connect_urls") or ()) >= self.size
                   for s in self.servers):
                return
            time.sleep(_POLL_S)
        raise NatsServerError(f"the cluster's routes not all up after "
                              f"{timeout or self.start_timeout}s")

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _jsz(server: EmbeddedNats) -> dict[str, dict[str, object]]:
    """The member's ``/jsz`` monitoring page; empty when it does not answer."""
    return _monitor(server, "jsz")


def _monitor(server: EmbeddedNats, page_name: str) -> dict[str, Any]:
    """The member's monitoring page ``page_name``; empty when it does not
    answer (or has no monitoring port)."""
    if server.monitor_port is None:
        return {}
    url = f"http://{server.host}:{server.monitor_port}/{page_name}"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as reply:
            page = json.loads(reply.read())
    except (OSError, ValueError, urllib.error.URLError):
        return {}
    return page if isinstance(page, dict) else {}


async def stream_leader(js: JetStreamContext, stream: str) -> str:
    """The server name of ``stream``'s JetStream leader ('' if none now)."""
    info = await js.stream_info(stream)
    return (info.cluster.leader if info.cluster is not None else None) or ""
