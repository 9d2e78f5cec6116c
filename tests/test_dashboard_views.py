"""The dashboard's decisions without I/O: which live events a principal's
page receives (gateway/ui/hub.py), where a login may send the browser, and
that the markup escapes what jobs and servers are named
(gateway/ui/render.py)."""

from __future__ import annotations

import datetime

from gateway.ui import render
from gateway.ui.hub import visible
from gateway.ui.routes import safe_next
from shared.tenants import Principal

ALICE = Principal(name="alice", tenant="alice")
ADMIN = Principal(name="ops", admin=True)


def job_event(key: str, tenant: str) -> dict[str, object]:
    return {"kind": "job", "id": key, "tenant": tenant, "phase": "queued", "new": True}


def test_a_tenant_receives_only_its_own_jobs_named_by_their_ids() -> None:
    assert visible(ALICE, job_event("bob/x", "bob")) is None
    assert visible(ALICE, {"kind": "explain", "id": "bob/x", "tenant": "bob"}) is None
    assert visible(ALICE, job_event("alice/x", "alice")) == job_event("x", "alice")
    # the default tenant's bare keys are not alice's either
    assert visible(ALICE, job_event("x", "default")) is None


def test_an_admin_receives_every_job_by_its_key_and_everyone_the_cluster() -> None:
    assert visible(ADMIN, job_event("bob/x", "bob")) == job_event("bob/x", "bob")
    assert visible(ALICE, {"kind": "cluster"}) == {"kind": "cluster"}


def test_a_login_sends_the_browser_only_to_a_page_of_this_gateway() -> None:
    assert safe_next("/ui/jobs?tenant=a") == "/ui/jobs?tenant=a"
    for elsewhere in ("//evil.example/", "https://evil.example/", "/\\evil.example", ""):
        assert safe_next(elsewhere) == "/ui/cluster", elsewhere


def test_names_are_escaped_and_another_tenants_gpu_is_not_named() -> None:
    row = render.job_row({"key": "a/<b>", "job_id": "<b>", "phase": "queued",
                          "spec": {"tenant": "a\"x", "requirements": [1]}}, admin=True)
    assert "<b>" not in row and "&lt;b&gt;" in row and 'a&quot;x' in row
    assert "another tenant" in render.gpu_cell({"index": 0, "job_id": "(another tenant)"}, False)
    held = render.gpu_cell({"index": 1, "job_id": "bob/train"}, admin=True)
    assert "train (bob)" in held


def test_a_forecast_beyond_the_calendar_is_said_in_words() -> None:
    assert render.when(1e300) == "much later"
    assert render.when(0) == "-"
    # a forecast in another year names it: "10-28" alone would read as this year's
    far = datetime.datetime(2333, 10, 28, 21, 48, tzinfo=datetime.UTC).timestamp()
    assert render.when(far) == "2333-10-28 21:48"
