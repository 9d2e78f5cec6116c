"""compose.yaml's profile ``nats-cluster`` run for real (issue 36): three
nats-servers routed into one cluster, brought up as an operator does, with
``docker-compose --env-file deploy/nats-cluster.env up`` (docs/compose.md).

One deployment serves the module's tests, in order: every service healthy,
the three servers included; every stream and KV bucket kept on all three;
the container of the server that leads JetStream's meta group killed
(``docker kill``) while a job runs: the job finishes, and a job submitted
after the kill is accepted within :data:`REFUSED_MAX_S`. The engine rule is
tests/test_compose_live.py's: without Docker, Compose, debootstrap or root
the module skips, saying which (a failure under ``CI=true``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from shared import subjects
from tests.composestack import (
    ROOT,
    SHORT,
    Deployment,
    deployed,
    record,
    submit,
    try_submit,
    wait_finished,
)
from tests.livestack import until

ENV_FILE = ROOT / "deploy" / "nats-cluster.env"
COUNTS = {"scheduler": 2}  # compose.yaml's deploy.replicas
MEMBERS = ("nats", "nats-2", "nats-3")  # the services, and the servers' names
# No submission refused for longer: whole attempts of the client's about 5 s,
# and an election's stall of up to 8 s spans three when it begins late in
# the first (as tests/test_live_nats_cluster.py).
REFUSED_MAX_S = 15.0
EXPECTED = {s.name for s in subjects.STREAMS} | {f"KV_{b}" for b in subjects.KV_BUCKETS}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployed(tmp_path_factory.mktemp("compose-nats"), COUNTS, ENV_FILE) as d:
        yield d


def member(d: Deployment, service: str) -> str:
    (container,) = d.containers(service)
    return container


def meta_leader(d: Deployment, members: tuple[str, ...] = MEMBERS) -> str:
    """The meta group's leader as the first of ``members`` that answers
    sees it ('' while there is none)."""
    for service in members:
        try:
            leader = str(d.jsz(member(d, service)).get("meta_cluster", {}).get("leader") or "")
        except subprocess.CalledProcessError:  # that container is down
            continue
        if leader:
            return leader
    return ""


def peers(d: Deployment) -> dict[str, int]:
    """Every stream (a KV bucket's is ``KV_<bucket>``) as server ``nats``
    sees it: its configured replicas where it has a leader and is kept by
    as many servers, else -1. (``/jsz`` lists the streams the server keeps
    itself, each with the other servers that keep it.)"""
    found = {}
    for account in d.jsz(member(d, "nats")).get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            cluster = stream.get("cluster") or {}
            copies = 1 + len(cluster.get("replicas") or [])
            replicas = int(stream["config"]["num_replicas"])
            agreed = cluster.get("leader") and copies == replicas
            found[str(stream["name"])] = replicas if agreed else -1
    return found


def test_every_service_and_all_three_nats_servers_become_healthy(deployment: Deployment) -> None:
    assert deployment.unhealthy(COUNTS) == {}
    assert set(MEMBERS) <= set(deployment.services())
    meta = deployment.jsz(member(deployment, "nats"))["meta_cluster"]
    assert meta["cluster_size"] == 3 and meta["leader"] in MEMBERS, meta


def test_every_stream_and_kv_bucket_is_kept_on_all_three(deployment: Deployment) -> None:
    def made() -> dict[str, int] | None:  # the services make them as they start
        found = peers(deployment)
        return found if set(found) >= EXPECTED else None

    found = until(made, "every stream and bucket made", 60, lambda: str(peers(deployment)))
    assert found == dict.fromkeys(found, 3), found


def test_killing_the_meta_leaders_container_loses_no_job(deployment: Deployment) -> None:
    submit(deployment, "before-kill", SHORT * 5)
    until(lambda: record(deployment, "before-kill")["phase"] == "running",
          "before-kill running", 120, deployment.logs)
    leader = until(lambda: meta_leader(deployment), "a meta leader", 30)
    deployment.docker("kill", member(deployment, leader))
    killed = time.monotonic()
    until(lambda: try_submit(deployment, "after-kill"), "after-kill accepted", REFUSED_MAX_S,
          deployment.logs)
    print(f"\nkilled {leader} (meta leader); a submission accepted after "
          f"{time.monotonic() - killed:.1f} s")
    others = tuple(m for m in MEMBERS if m != leader)
    until(lambda: meta_leader(deployment, others) in others, "a new meta leader", 30)
    wait_finished(deployment, ["before-kill", "after-kill"])
