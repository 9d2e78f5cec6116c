"""Drain and undrain on the live system, every component a real process
(:mod:`tests.livestack`: nats-server, the services, the gateway and a
two-server EMULATED cluster).

* Drain is for admins (a tenant's token: 403 ``forbidden``); an unknown
  server is 404 ``not_found``.
* A drained node keeps its running job, gets no new one while the other
  node has room, and shows so in ``/cluster``, ``hops nodes``, its
  ``hops_nodes`` record and the metric ``hops_nodes{state="drained"}``.
* Drained with ``--move``, its job is stopped with a checkpoint and runs on
  the other node from where it was; undrained, a new job can go there again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.jobkeys import job_key
from tests.helpers import catalog_spec, timeline_of
from tests.livestack import LiveStack, until
from tests.test_live_hardening import CLUSTER, cluster, heartbeats, hops
from tests.test_live_monitor import scrape

TENANTS = """\
tenants:
  alice: {tokens: ["alice-token"]}
"""
NEVER = 10**13  # samples: a job that runs until something stops it


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    root = tmp_path_factory.mktemp("drain")
    tenants = root / "tenants.yaml"
    tenants.write_text(TENANTS)
    with LiveStack(root / "stack", CLUSTER, schedulers=1, tenants=tenants) as s:
        yield s


# alice's jobs, by their keys (shared/jobkeys.py): their records', allocations'
# and heartbeats'
LONG, NEW, AFTER = (job_key("alice", j) for j in ("long", "new", "after"))


def server_of(stack: LiveStack, job_id: str) -> str | None:
    alloc = stack.allocs().get(job_id) or {}
    servers = list(alloc.get("gpu_indices", {})) if alloc.get("mode") == "run" else []
    return servers[0] if len(servers) == 1 else None


def running_on(stack: LiveStack, job_id: str) -> str:
    server: str = until(lambda: stack.phase(job_id) == "running" and server_of(stack, job_id),
                        f"{job_id} running", 60, stack.logs)
    return server


def state_of(stack: LiveStack, server: str) -> str:
    view: dict[str, Any] = next(s for s in cluster(stack)["servers"] if s["id"] == server)
    return str(view["state"])


def test_drain_is_for_admins_and_known_servers(stack: LiveStack) -> None:
    r = httpx.post(f"{stack.config.gateway_url}/nodes/rtx-0/drain", json={"move": False},
                   headers={"Authorization": "Bearer alice-token"}, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    assert not stack.nodes()["rtx-0"].get("drained")
    code, out = hops(stack, "nodes", "drain", "nowhere")
    assert code == 1 and "404 not_found" in out


def test_a_drained_node_keeps_its_job_and_takes_no_new_one(stack: LiveStack) -> None:
    assert stack.submit(catalog_spec("long", NEVER, requirements=[2], tenant="alice"))["ok"]
    drained = running_on(stack, LONG)
    other = ({"rtx-0", "rtx-1"} - {drained}).pop()
    code, out = hops(stack, "nodes", "drain", drained, "--reason", "maintenance")
    assert (code, out.strip()) == (0, f"{drained}: drained")
    until(lambda: state_of(stack, drained) == "drained", "drained in /cluster", 10)
    assert stack.nodes()[drained]["drained"] is True
    code, out = hops(stack, "nodes")
    assert code == 0 and "state" in out.splitlines()[0] and "drained" in out
    until(lambda: scrape(stack.config.metrics_port)["hops_nodes[state=drained]"] == 1,
          "the drained metric", 15)
    assert stack.submit(catalog_spec("new", NEVER, requirements=[2], tenant="alice"))["ok"]
    assert running_on(stack, NEW) == other
    assert server_of(stack, LONG) == drained and not stack.bus_().job_events(LONG,
                                                                              "job_stopped")


def test_drain_with_move_moves_the_job_and_undrain_takes_work_again(stack: LiveStack) -> None:
    drained = server_of(stack, LONG)
    assert drained is not None
    progress = heartbeats(stack, LONG)
    until(lambda: progress and progress[-1] > 0, "progress", 15)
    code, out = hops(stack, "nodes", "drain", drained, "--move")
    assert code == 0, out
    other = ({"rtx-0", "rtx-1"} - {drained}).pop()
    until(lambda: server_of(stack, LONG) == other, "long moved", 60, stack.logs)
    # stopped with a checkpoint and resumed there: its progress goes on from where it was
    before, seen = max(progress), len(progress)
    until(lambda: len(progress) > seen + 2, "heartbeats after the move", 15)
    assert min(progress[seen + 1:]) >= before > 0
    # its timeline shows the move (a restart elsewhere: job_resized), and the
    # stop's receipt names the drain
    until(lambda: any(e["kind"] == "started" and "resized" in e["note"]
                      for e in timeline_of(stack.bus_().stored, LONG)),
          "the move on the timeline", 15)
    stops = [e for e in timeline_of(stack.bus_().stored, LONG) if e["kind"] == "stopped"]
    assert stops and stops[0]["receipt"]["rule"] == "Drain", stops
    code, out = hops(stack, "nodes", "undrain", drained)
    assert (code, out.strip()) == (0, f"{drained}: undrained")
    assert not stack.nodes()[drained]["drained"] and state_of(stack, drained) == "alive"
    assert stack.submit(catalog_spec("after", NEVER, requirements=[4], tenant="alice"))["ok"]
    assert running_on(stack, AFTER) == drained
