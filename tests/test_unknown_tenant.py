"""Jobs whose tenant the tenants file no longer names: held with the reason
``unknown_tenant`` naming the tenant, never planned, released when a reload
names the tenant again (scheduling.live.tenancy, state.hold_tenant)."""

from __future__ import annotations

import msgspec

from scheduling.live import refresh as rf
from scheduling.live import state as st
from scheduling.live.clock import Inflight
from scheduling.live.snapshot import build_snapshot, queue_view
from scheduling.live.state import LiveJobRecord
from shared.ids import JobId, TenantId
from shared.snapshot import PlanReasons
from shared.tenants import TenantsFile, TenantSpec
from shared.wire import UNKNOWN_TENANT, UNSCHEDULABLE
from tests.helpers import flat_estimate
from tests.test_live_pure_control import A, live, node

ONLY_TEAM = TenantsFile(tenants={"team": TenantSpec()})
WITH_DEFAULT = TenantsFile(tenants={"team": TenantSpec(), "default": TenantSpec()})
NODES = [node("s0", A, 4, 0)]


def refreshed(rec: LiveJobRecord, tenants: TenantsFile | None) -> LiveJobRecord:
    cluster = rf.Cluster(NODES, frozenset(), frozenset(), 1, False, tenants)
    flight = rf.InFlight(False, False, None)
    for step in rf.steps(rec, cluster, flight, 10.0):
        rec = step(rec) or rec
    return rec


def queued(job_id: str = "j1", tenant: str = "default") -> LiveJobRecord:
    rec = live(job_id, "queued")
    return msgspec.structs.replace(
        rec, spec=msgspec.structs.replace(rec.spec, tenant=TenantId(tenant)))


def test_a_job_of_a_tenant_not_in_the_file_is_held_with_a_reason_naming_it() -> None:
    rec = refreshed(queued(), ONLY_TEAM)
    assert rec.reason.startswith(f"{UNKNOWN_TENANT}: ")
    assert "tenant 'default' is not in the tenants file" in rec.reason
    assert rec.phase == "queued" and not rec.held


def test_it_is_released_when_the_file_names_the_tenant_again() -> None:
    held = refreshed(queued(), ONLY_TEAM)
    assert refreshed(held, WITH_DEFAULT).reason == ""
    assert refreshed(held, None).reason == ""  # no file: nothing checked


def test_a_known_tenant_and_other_reasons_are_untouched() -> None:
    assert refreshed(queued(tenant="team"), ONLY_TEAM).reason == ""
    other = msgspec.structs.replace(queued(), reason=f"{UNSCHEDULABLE}: too big")
    assert st.hold_tenant(other, None) is None
    assert st.hold_tenant(msgspec.structs.replace(queued(), phase="running"), "x") is None
    assert st.hold_tenant(msgspec.structs.replace(queued(), held=True), "x") is None


def test_jobs_waiting_in_any_phase_are_held() -> None:
    for phase in ("submitted", "profiling"):
        rec = msgspec.structs.replace(queued(), phase=phase)
        assert refreshed(rec, ONLY_TEAM).reason.startswith(UNKNOWN_TENANT)


def test_a_held_job_is_never_planned_and_shows_in_the_queue_with_its_reason() -> None:
    held = refreshed(queued("j1"), ONLY_TEAM)
    other = queued("j2", tenant="team")
    records = {JobId("j1"): held, JobId("j2"): other}
    ests = {j: flat_estimate(j, {"A": 100.0}) for j in records}
    snap = build_snapshot(10.0, records, NODES, {}, ests, {}, Inflight(60.0), True).snapshot
    assert [j.id for j in snap.jobs] == ["j2"]
    view = queue_view(PlanReasons("hops"), records, 10.0, "r", 1)
    entry = next(e for e in view.entries if e.job_id == "j1")
    assert entry.reason.startswith(UNKNOWN_TENANT) and "'default'" in entry.reason
