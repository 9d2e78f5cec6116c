"""Job keys (shared/jobkeys.py): a job addressed by (tenant, id) has one key,
which splits back, is a valid KV key and subject token, and names one
directory of its own on an executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor.launch import job_paths
from gateway import access
from scheduling.live import admission as adm
from scheduling.live import tenancy as tn
from shared import events as ev
from shared import jobkeys as keys
from shared import subjects
from shared.ids import JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.tenants import Principal, TenantsError, load_tenants


def test_a_key_is_the_bare_id_for_the_default_tenant_and_tenant_slash_id_otherwise() -> None:
    assert keys.job_key("default", "j1") == "j1"
    assert keys.job_key("alice", "j1") == "alice/j1"
    assert keys.split_key("alice/j1") == ("alice", "j1")
    assert keys.split_key("j1") == (None, "j1")
    assert keys.local_id("alice/j1") == keys.local_id("j1") == "j1"
    # two tenants' jobs of one id are two keys, and neither is the default's
    assert len({keys.job_key(t, "j1") for t in ("default", "alice", "bob")}) == 3


def test_a_tenants_record_written_before_keys_were_qualified_is_still_found() -> None:
    assert keys.candidates("alice", "j1") == ("alice/j1", "j1")
    assert keys.candidates("default", "j1") == ("j1",)


def test_a_key_is_a_subject_token_and_a_valid_key_only_of_valid_parts() -> None:
    assert subjects.job_events(keys.job_key("alice", "j1")) == "hops.v1.jobs.events.alice/j1"
    assert adm.valid_key("alice/j1") and adm.valid_key("j1")
    for bad in ("alice/", "/j1", "a/b/c", "a b/j1", "alice/j 1", ""):
        assert not adm.valid_key(bad), bad


def _spec(job_id: str, tenant: str = "default") -> JobSpec:
    return JobSpec(id=JobId(job_id), model="m", batch_size=32, params=1.0, total_samples=10.0,
                   requirements=(1,), tenant=TenantId(tenant))


def test_admission_keys_the_spec_by_its_tenant() -> None:
    assert adm.keyed_spec(_spec("j1", "alice")).id == "alice/j1"
    assert adm.keyed_spec(_spec("j1")).id == "j1"
    # an id with '/' is refused before it could pose as another tenant's key
    assert adm.check_spec(_spec("bob/j1")) is not None


def test_a_tenant_feed_names_the_job_by_its_id() -> None:
    event = ev.JobCancelled(job_id=JobId("alice/j1"), at=1.0)
    assert tn.feed_event(event).job_id == "j1"


def test_a_command_line_names_a_job_as_tenant_slash_id_or_with_tenant() -> None:
    assert keys.parse_ref("j1") == (None, "j1")
    assert keys.parse_ref("j1", "bob") == ("bob", "j1")
    assert keys.parse_ref("bob/j1") == keys.parse_ref("bob/j1", "bob") == ("bob", "j1")
    with pytest.raises(ValueError, match="names tenant bob"):
        keys.parse_ref("bob/j1", "alice")


def test_a_keys_directory_is_its_own_never_inside_another_jobs(tmp_path: Path) -> None:
    server = ServerId("s0")
    theirs = job_paths(tmp_path, keys.job_key("alice", "j1"), server).root
    default = job_paths(tmp_path, "alice", server).root  # the default tenant's job "alice"
    assert theirs.parent == default.parent == tmp_path
    assert theirs.name == "alice.j1" and theirs != default


def test_a_tenant_name_that_cannot_be_part_of_a_key_is_refused() -> None:
    for name in ("a/b", "a@b", "a:b"):
        with pytest.raises(TenantsError, match="part of its jobs' KV keys"):
            load_tenants(f"tenants: {{'{name}': {{tokens: [t]}}}}\n")
    assert "team-a_1" in load_tenants("tenants: {team-a_1: {tokens: [t]}}\n").tenants


def test_the_gateway_resolves_a_one_job_request_to_its_tenant() -> None:
    alice, admin = Principal(name="alice", tenant="alice"), Principal(name="root", admin=True)
    assert access.job_tenant(alice, None) == access.job_tenant(alice, "alice") == "alice"
    denied = access.job_tenant(alice, "bob")
    assert isinstance(denied, access.Denied) and denied.status == 403
    assert access.job_tenant(admin, None) == "default"
    assert access.job_tenant(admin, "bob") == "bob"
    assert access.job_location(alice, "alice/j1") == "/jobs/j1"
    assert access.job_location(admin, "bob/j1") == "/jobs/j1?tenant=bob"
    assert access.job_location(admin, "j1") == "/jobs/j1"


def test_a_tenant_sees_its_jobs_by_id_and_others_as_another_tenant() -> None:
    slots = [{"index": 0, "job_id": "alice/j1"}, {"index": 1, "job_id": "bob/j1"},
             {"index": 2, "job_id": None}]
    view = {"servers": [{"gpu_slots": slots, "jobs": ["alice/j1", "bob/j1"]}]}
    shown = access.redact_cluster(view, {"alice/j1"})["servers"][0]
    assert [g["job_id"] for g in shown["gpu_slots"]] == ["j1", access.OTHER_JOB, None]
    assert shown["jobs"] == sorted(["j1", access.OTHER_JOB])


def test_a_tenants_own_cells_view_names_its_jobs_by_id() -> None:
    record = {"view": {"tenant": "bob", "guaranteed_jobs": ["bob/g"],
                       "opportunistic_jobs": ["bob/o", "o2"]}}
    (mine,) = access.tenants_body([record], "bob", by_id=True)["tenants"]
    assert (mine["view"]["guaranteed_jobs"], mine["view"]["opportunistic_jobs"]) == (
        ["g"], ["o", "o2"])
    assert access.tenants_body([record], None)["tenants"] == [record]  # an admin's: keys
