"""``hops up --policy sia`` and ``hops up --policy gavel``: a real ``hops up``
subprocess per policy (nats-server, every service, one scheduler replica,
the gateway and a two-server EMULATED cluster; rounds of 2 s) runs jobs
submitted over REST to completion, every plan is the named policy's, and
``GET /queue`` ranks the waiting jobs by that policy's own plan reasons.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.up.stack import modules
from cli.up.up import missing_modules
from tests.helpers import catalog_spec
from tests.livestack import FINAL, TEST_ENV, Bus, until
from tests.upstack import UpProcess, hops_up

MISSING = missing_modules(modules())
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"the live system is incomplete: cannot run {', '.join(MISSING)}"
)
# Each job takes all eight GPUs for a few seconds at x600, so the others wait
# in the queue meanwhile, ranked by the policy.
JOBS = ("p1", "p2", "p3")
TOTAL = 40_000_000


class Up:
    """One ``hops up --policy P``, a REST client and a NATS client of it."""

    def __init__(self, up: UpProcess, policy: str) -> None:
        self.up, self.policy = up, policy
        self.bus = Bus(up.state()["nats"]["url"], up.admin_seed)
        self.http = httpx.Client(base_url=up.gateway, timeout=10, headers=up.headers)

    def phase(self, job_id: str) -> str:
        reply = self.http.get(f"/jobs/{job_id}")
        return str(reply.json()["phase"]) if reply.status_code == 200 else ""


@pytest.fixture(scope="module", params=["sia", "gavel"])
def up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    policy = str(request.param)
    base = tmp_path_factory.mktemp(policy)
    with hops_up(base, "--policy", policy, "--schedulers", "1", env=TEST_ENV) as proc:
        u = Up(proc, policy)
        try:
            until(lambda: u.bus.get("hops_leader", "scheduler"), "a leader", 30, proc.logs)
            # Admission refuses a job no registered type can hold: wait for both servers.
            until(lambda: len(u.bus.bucket("hops_nodes")) == 2, "both servers", 30, proc.logs)
            yield u
        finally:
            u.http.close()
            u.bus.close()


def test_submitted_jobs_run_to_completion_under_the_named_policy(up: Up) -> None:
    for job_id in JOBS:
        reply = up.http.post("/jobs", json=catalog_spec(job_id, TOTAL, requirements=[8]))
        assert reply.status_code == 201, reply.text
    views: list[dict[str, Any]] = []

    def ended() -> bool:
        queue = up.http.get("/queue")
        if queue.status_code == 200:
            views.append(queue.json())
        return all(up.phase(j) in FINAL for j in JOBS)

    until(ended, f"{up.policy}: jobs ended", 90, up.up.logs)
    assert {j: up.phase(j) for j in JOBS} == dict.fromkeys(JOBS, "finished"), up.up.logs()
    plans = up.bus.plans()
    assert {p["plan"]["reasons"]["policy"] for p in plans} == {up.policy}
    for job_id in JOBS:
        assert any(a["job_id"] == job_id for p in plans for a in p["plan"]["assignments"])
    # The queue view is the plans' ranking: the jobs' own ids, no window
    # (neither Sia nor Gavel has one), and some waiting job ranked above 0.
    entries = [e for v in views for e in v["entries"]]
    assert {e["job_id"] for e in entries} <= set(JOBS)
    assert not any(e["in_window"] for e in entries)
    ranked = [e for e in entries if e["phase"] == "queued" and e["priority"] > 0]
    assert ranked, views
    assert up.http.get("/queue").json()["entries"] == []
