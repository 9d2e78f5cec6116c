"""compose.yaml run for real (issue 36): every container of it on a real
Docker engine, from the stand-in base images that
deploy/images/build-standins.sh makes from Debian's packages
(:mod:`tests.composestack`; docs/compose.md).

One deployment serves the module's tests, in order: all services healthy; a
job through the gateway finishes on the emulated cluster's container;
``--scale estimator=3``; the leader scheduler's container killed; ``down``
(volumes kept) and ``up`` again. Without Docker, Compose, debootstrap or
root the module skips, saying which (a failure under ``CI=true``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared import events as ev
from shared import subjects
from shared.ids import JobId
from shared.job import JobSpec
from tests.composestack import (
    SHORT,
    Deployment,
    deployed,
    record,
    submit,
    try_submit,
    wait_finished,
)
from tests.helpers import cluster
from tests.livestack import until

REPLICAS = {"scheduler": 2}  # compose.yaml's deploy.replicas
PAPER_TYPES = {"GTX1080Ti", "TitanXP", "RTX3090"}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with deployed(tmp_path_factory.mktemp("compose"), REPLICAS) as d:
        yield d


def estimate(d: Deployment) -> ev.EstimateReply:
    job = JobSpec(JobId("probe"), "resnet18-cifar10", 128, 11_689_512, 10**6,
                  requirements=(1,))
    req = ev.EstimateRequest(jobs=(job,), cluster=cluster([("RTX3090", 1, 4)]))
    return ev.decode_estimate_reply(d.request(subjects.ESTIMATE, ev.encode(req)))


def test_every_service_becomes_healthy(deployment: Deployment) -> None:
    assert deployment.unhealthy(REPLICAS) == {}
    assert set(deployment.services()) == {
        "nats", "monitor", "estimator", "profiler", "scheduler", "placer", "cluster", "gateway"}
    assert len(deployment.containers("scheduler")) == 2


def test_a_job_through_the_gateway_finishes_on_the_emulated_cluster(
    deployment: Deployment,
) -> None:
    submit(deployment, "first")
    wait_finished(deployment, ["first"])
    body = record(deployment, "first")
    assert body["samples_done"] == SHORT and body["first_start"] is not None, body
    with deployment.http() as api:
        servers = api.get("/cluster").json()["servers"]
        logs = api.get("/jobs/first/logs")
    # the cluster container's executors: the paper's physical cluster
    assert {s["gpu_type"] for s in servers} == PAPER_TYPES, servers
    assert logs.status_code == 200 and logs.text.strip(), logs.text  # shipped by its executor


def test_scaled_to_three_estimators_any_of_them_answers(deployment: Deployment) -> None:
    first = deployment.containers("estimator")
    assert len(first) == 1
    deployment.compose("up", "-d", "--scale", "estimator=3")
    deployment.wait_healthy({**REPLICAS, "estimator": 3})
    assert estimate(deployment).ok
    # the first replica stopped, the two new ones answer alone
    deployment.docker("stop", first[0])
    for _ in range(6):  # a queue group spreads requests: every one is answered
        reply = estimate(deployment)
        assert reply.ok and reply.code == "", reply
    submit(deployment, "scaled")
    wait_finished(deployment, ["scaled"])
    deployment.docker("start", first[0])


def test_killing_the_leader_schedulers_container_loses_nothing(deployment: Deployment) -> None:
    leader = until(deployment.leader, "a scheduler leads", 30, deployment.logs)
    before = ["before-kill-1", "before-kill-2"]
    for job_id in before:
        submit(deployment, job_id, SHORT * 3)
    deployment.docker("kill", leader)
    during = ["during-failover"]
    for job_id in during:  # admitted by the other replica
        until(lambda j=job_id: try_submit(deployment, j), f"{job_id} admitted", 30)  # type: ignore[misc]
    other = [c for c in deployment.containers("scheduler") if c != leader]
    assert other
    until(lambda: deployment.leader() in other, "the other replica leads", 60,
          lambda: deployment.logs("scheduler"))
    wait_finished(deployment, before + during)


def test_down_and_up_keep_accepted_jobs(deployment: Deployment) -> None:
    submit(deployment, "across-down", SHORT * 10)
    until(lambda: record(deployment, "across-down")["phase"] == "running",
          "across-down running", 120, deployment.logs)
    with deployment.http() as api:
        kept = {j["job_id"]: j["phase"] for j in api.get("/jobs").json()["jobs"]}
    assert {"first", "scaled", "during-failover", "across-down"} <= set(kept), kept
    deployment.compose("down")  # no -v: the nats-data volume stays
    deployment.compose("up", "-d")
    deployment.wait_healthy(REPLICAS)
    with deployment.http() as api:
        after = {j["job_id"]: j["phase"] for j in api.get("/jobs").json()["jobs"]}
    finished = {j: p for j, p in kept.items() if p == "finished"}
    assert {j: after.get(j) for j in finished} == finished, after
    assert "across-down" in after, after


def test_the_job_running_at_down_finishes_after_up(deployment: Deployment) -> None:
    wait_finished(deployment, ["across-down"], 180)
