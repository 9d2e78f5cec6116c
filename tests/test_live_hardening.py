"""The live system against plans no leader issued, and operators' views of
the nodes, with every component a real process (:mod:`tests.livestack`:
nats-server, the services, the gateway and a two-server EMULATED cluster).

* A ``plan_issued`` with a term no leader held is refused by the placer (a
  log line and an ``error_record``), which goes on applying the leader's
  plans: a job submitted afterwards runs to the end.
* ``hops_nodes`` shows current heartbeat times; ``/cluster`` and the
  metrics count the same nodes and GPUs; an operator removes a lost node
  (``hops nodes remove``), an alive one only with ``--force`` (its job is
  requeued with its progress and runs again elsewhere), and a removed node
  whose executor registers again is back.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from nats.aio.msg import Msg
from typer.testing import CliRunner

from cli.main import app
from shared import events as ev
from shared.cluster import GpuTypeSpec, Server
from shared.ids import GpuType, ServerId
from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until
from tests.test_live_monitor import scrape

CLUSTER = """\
name: hardening
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: rtx-1, gpu_type: RTX3090, gpus: 4}
"""
NODE_WRITE_S = 1.0
FORGED_TERM = 10**15


def spec(job_id: str, total: int, requirements: list[int]) -> dict[str, Any]:
    return catalog_spec(job_id, total, requirements=requirements)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    env = {"HOPS_NODE_WRITE_S": str(NODE_WRITE_S)}
    with LiveStack(tmp_path_factory.mktemp("hardening"), CLUSTER, schedulers=1, env=env) as s:
        yield s


def hops(stack: LiveStack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--gateway", stack.config.gateway_url],
                                env={"HOPS_TOKEN": stack.admin_token})
    return result.exit_code, result.output


def heartbeats(stack: LiveStack, job_id: str) -> list[float]:
    """The ``samples_done`` of the job's heartbeats from now on, as they come."""
    bus, seen = stack.bus_(), []

    async def follow() -> None:
        async def on_beat(msg: Msg) -> None:
            seen.append(float(json.loads(msg.data)["samples_done"]))

        await bus.nc.subscribe(f"hops.v1.jobs.heartbeat.*.{job_id}", cb=on_beat)

    bus.call(follow())
    return seen


def cluster(stack: LiveStack) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{stack.config.gateway_url}/cluster", timeout=10,
                                        headers=stack.headers).json()
    return body


def test_a_plan_of_a_term_no_leader_held_does_not_wedge_the_placer(stack: LiveStack) -> None:
    bus = stack.bus_()
    t0 = time.monotonic()
    lease = stack.leader()
    assert lease is not None
    forged = {"type": "plan_issued", "round": 10**6, "term": FORGED_TERM, "at": time.time(),
              "first_plan": True, "plan": {"assignments": [], "profiling": []}}
    bus.call(bus.nc.jetstream().publish("hops.v1.plans", json.dumps(forged).encode()))

    def refused() -> list[dict[str, Any]]:
        return [e for e in bus.errors(since=t0)
                if e["service"] == "placer" and str(FORGED_TERM) in e["error"]]

    (record,) = until(refused, "the placer's error record for the forged plan", 15, stack.logs)
    assert record["code"] == "invalid" and "no leader has held it" in record["error"]
    assert "plan ignored" in (stack.data_dir / "logs" / "placer.log").read_text()
    # the leader's plans are still applied: a job submitted now is profiled, runs, ends
    assert stack.submit(spec("after-forged", 10_000_000, [1, 2]))["ok"]
    assert stack.wait_final(["after-forged"], 60) == {"after-forged": "finished"}


def agree(stack: LiveStack) -> tuple[dict[str, Any], dict[str, float]]:
    """``/cluster``'s totals and the metrics, once they count the same."""
    def both() -> tuple[dict[str, Any], dict[str, float]] | None:
        totals, m = cluster(stack)["totals"], scrape(stack.config.metrics_port)
        same = (totals["gpus"], totals["used"], totals["alive_servers"],
                totals["lost_servers"]) == (m["hops_gpus_alive"], m["hops_gpus_used"],
                                            m["hops_nodes[state=alive]"],
                                            m["hops_nodes[state=lost]"])
        return (totals, m) if same else None

    return until(both, "/cluster and the metrics agree", 15,
                 lambda: f"{cluster(stack)['totals']}\n{scrape(stack.config.metrics_port)}")


def test_heartbeat_times_are_current(stack: LiveStack) -> None:
    first = stack.nodes()["rtx-0"]["last_heartbeat"]
    until(lambda: stack.nodes()["rtx-0"]["last_heartbeat"] > first, "a newer heartbeat time",
          NODE_WRITE_S + 5)
    age = time.time() - cluster(stack)["servers"][0]["last_heartbeat"]
    assert age < NODE_WRITE_S + 3, age


def test_a_dead_node_is_counted_alike_and_can_be_removed(stack: LiveStack) -> None:
    bus = stack.bus_()
    ghost = ev.RegisterNode(server=Server(ServerId("ghost"), GpuType("RTX3090"), 8),
                            gpu_type=GpuTypeSpec(GpuType("RTX3090"), 2.5e9, 1e9), order=9)
    assert bus.request("hops.v1.nodes.register.ghost", ev.encode(ghost))["ok"]
    # it never beats: lost after the deadline, listed as lost, counted apart
    until(lambda: stack.nodes().get("ghost", {}).get("alive") is False, "the ghost lost", 10)
    totals, _ = agree(stack)
    assert (totals["gpus"], totals["lost_gpus"], totals["lost_servers"]) == (8, 8, 1)
    assert [s["state"] for s in cluster(stack)["servers"]] == ["alive", "alive", "lost"]
    code, out = hops(stack, "nodes", "remove", "ghost")
    assert (code, out.strip()) == (0, "ghost: removed")
    assert "ghost" not in stack.nodes()
    totals, metrics = agree(stack)
    assert totals["servers"] == 2 and metrics["hops_nodes[state=lost]"] == 0
    code, out = hops(stack, "nodes", "remove", "ghost")
    assert code == 1 and "404 not_found" in out


def test_an_alive_node_is_removed_only_by_force_and_comes_back(stack: LiveStack) -> None:
    assert stack.submit(spec("long", 10**13, [4]))["ok"]
    placed = until(lambda: (stack.allocs().get("long") or {}).get("mode") == "run"
                   and stack.allocs()["long"], "the long job placed", 60, stack.logs)
    (server,) = placed["gpu_indices"]
    progress = heartbeats(stack, "long")
    until(lambda: progress and progress[-1] > 0, "progress", 15)
    code, out = hops(stack, "nodes", "remove", server)
    assert code == 1 and "409 conflict" in out and "alive" in out
    assert stack.nodes()[server]["alive"]
    code, out = hops(stack, "nodes", "remove", server, "--force", "--reason", "maintenance")
    assert code == 0, out
    # requeued with its progress, then running on the other server
    stopped = until(lambda: stack.bus_().job_events("long", "job_stopped"), "job_stopped", 15)
    assert stopped[0].body["reason"] == "node removed" and stopped[0].body["samples_done"] > 0
    other = ({"rtx-0", "rtx-1"} - {server}).pop()
    until(lambda: (stack.allocs().get("long") or {}).get("gpu_indices", {}).keys() == {other},
          "the long job running on the other server", 30, stack.logs)
    # The placer books the GPUs before the leader applies job_started.
    until(lambda: stack.phase("long") == "running", "the long job's record running", 10,
          stack.logs)
    assert server not in stack.nodes()
    # its executor registers again (restarted by the cluster's supervisor): it is back
    os.kill(stack.executor_pid(server), signal.SIGKILL)
    until(lambda: stack.nodes().get(server, {}).get("alive"), "the node back", 30, stack.logs)
    agree(stack)
