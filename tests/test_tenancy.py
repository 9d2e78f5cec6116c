"""The pure decisions of identity: the gateway's (:mod:`gateway.access`), the
scheduler admission's (:mod:`scheduling.live.tenancy`), where the
CLI finds its token (:mod:`cli.config`), and the settings that name the
tenants file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cli import config as cliconfig
from gateway import access
from gateway.__main__ import main as gateway_main
from gateway.settings import from_env, parse
from scheduling.live import tenancy as tn
from services.runtime.settings import SettingsError
from services.scheduler.settings import scheduler_settings
from shared import events as ev
from shared import subjects
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import JobRecord, QueueEntry, QueueView
from shared.tenants import (
    DEFAULT_TENANTS,
    AdminSpec,
    Principal,
    TenantsError,
    TenantsFile,
    TenantSpec,
    read_tenants,
    tenants_from_env,
)
from shared.wire import FORBIDDEN, UNAUTHORIZED

TENANTS = TenantsFile(
    tenants={"alice": TenantSpec(tokens=("alice-token",)),
             "bob": TenantSpec(tokens=("bob-token",), run_commands=True)},
    admins={"ops": AdminSpec(tokens=("admin-token",))},
)
ALICE = Principal(name="alice", tenant="alice")
ADMIN = Principal(name="ops", admin=True)


def spec(job_id: str = "j1", **kw: Any) -> JobSpec:
    body = {"id": job_id, "model": "resnet50", "batch_size": 32, "params": 25_557_032,
            "total_samples": 1_000_000, "requirements": [1, 2], **kw}
    return msgspec.convert(body, JobSpec)


def record(job_id: str, tenant: str) -> JobRecord:
    return JobRecord(spec=spec(job_id, tenant=tenant), submitted_at=1.0)


# --- the gateway ----------------------------------------------------------------------


def test_a_request_is_identified_by_its_bearer_token() -> None:
    assert access.identify(TENANTS, "Bearer alice-token") == ALICE
    assert access.identify(TENANTS, "bearer admin-token") == ADMIN
    for header, reason in ((None, "no Authorization header"), ("", "no Authorization header"),
                           ("Basic YWxpY2U6eA==", "scheme"), ("Bearer ", "scheme"),
                           ("Bearer nope", "unknown token")):
        denied = access.identify(TENANTS, header)
        assert isinstance(denied, access.Denied), header
        assert (denied.status, denied.code) == (401, UNAUTHORIZED)
        assert reason in denied.reason and "bearer" in denied.error.lower()
    # without a tenants file (--insecure) every caller is an admin
    assert access.identify(None, None) == access.INSECURE and access.INSECURE.admin


def test_identities_as_the_audit_names_them() -> None:
    assert access.identity(None) == "anonymous"
    assert access.identity(ALICE) == "tenant-alice"
    assert access.identity(ADMIN) == "admin-ops"


def body(**kw: Any) -> bytes:
    return json.dumps({"id": "j1", "model": "m", **kw}).encode()


def test_a_tenant_submits_for_itself_only() -> None:
    for given in ({}, {"tenant": "default"}, {"tenant": "alice"}):
        out = access.submit_body(ALICE, body(**given))
        assert isinstance(out, bytes) and json.loads(out)["tenant"] == "alice", given
    denied = access.submit_body(ALICE, body(tenant="bob"))
    assert isinstance(denied, access.Denied)
    assert (denied.status, denied.code) == (403, FORBIDDEN) and "tenant bob" in denied.error
    tagged = json.dumps({"type": "submit_job", "spec": {"id": "j1", "tenant": "bob"}}).encode()
    assert isinstance(access.submit_body(ALICE, tagged), access.Denied)
    tagged = json.dumps({"type": "submit_job", "spec": {"id": "j1"}}).encode()
    out = access.submit_body(ALICE, tagged)
    assert isinstance(out, bytes) and json.loads(out)["spec"]["tenant"] == "alice"


def test_what_is_no_submission_goes_as_it_came_and_admins_choose_the_tenant() -> None:
    for raw in (b"{", b"[1]", b'{"type": "nope"}', b'{"type": "submit_job", "spec": 3}',
                body(tenant=5)):
        assert access.submit_body(ALICE, raw) == raw
    assert access.submit_body(ADMIN, body(tenant="bob")) == body(tenant="bob")


def test_tenants_see_list_and_remove_only_what_is_theirs() -> None:
    assert access.may_see(ALICE, "alice") and not access.may_see(ALICE, "bob")
    assert access.may_see(ADMIN, "bob")
    hidden = access.hidden(ALICE, "b1", "bob")
    assert (hidden.status, hidden.code, hidden.audit_code) == (404, "not_found", FORBIDDEN)
    assert hidden.error == "no job 'b1'" and "bob" in hidden.reason
    assert access.list_tenant(ALICE, None) == "alice" == access.list_tenant(ALICE, "alice")
    assert isinstance(access.list_tenant(ALICE, "bob"), access.Denied)
    assert access.list_tenant(ADMIN, None) is None and access.list_tenant(ADMIN, "bob") == "bob"
    assert access.admin_only(ADMIN, "x") is None
    refused = access.admin_only(ALICE, "removing a node")
    assert refused is not None and refused.status == 403 and "admins" in refused.error


def test_a_tenant_sees_its_own_queue_and_others_jobs_redacted() -> None:
    entries = tuple(QueueEntry(job_id=JobId(j), priority=1.0, latency_ratio=1.0,
                               in_window=True) for j in ("a1", "b1"))
    assert [e.job_id for e in access.own_queue(QueueView(entries=entries), {"a1"}).entries] == [
        "a1"]
    view = {"servers": [{"id": "s", "jobs": ["a1", "b1"], "used": 2,
                         "gpu_slots": [{"index": 0, "job_id": "a1"},
                                       {"index": 1, "job_id": "b1"},
                                       {"index": 2, "job_id": None}]}],
            "totals": {"used": 2}, "unknown_servers": {"x": ["b2"]},
            "double_booked": [{"jobs": ["b1"]}]}
    out = access.redact_cluster(view, {"a1"})
    server = out["servers"][0]
    assert [g["job_id"] for g in server["gpu_slots"]] == ["a1", access.OTHER_JOB, None]
    assert server["jobs"] == sorted(["a1", access.OTHER_JOB]) and server["used"] == 2
    assert out["unknown_servers"] == {} and out["double_booked"] == []


# --- admission -----------------------------------------------------------------------


def test_the_tenant_of_a_scoped_subject_is_its_last_token() -> None:
    assert subjects.tenant_submit("alice") == "hops.v1.jobs.submit.alice"
    assert subjects.tenant_cancel("alice") == "hops.v1.jobs.cancel.alice"
    assert subjects.tenant_events("alice", "j1") == "hops.v1.tenants.alice.events.j1"
    assert subjects.tenant_events_all("alice") == "hops.v1.tenants.alice.events.*"
    with pytest.raises(subjects.SubjectError):
        subjects.tenant_submit("a.b")
    pattern = subjects.JOBS_SUBMIT_TENANT_ALL
    assert tn.scope_of("hops.v1.jobs.submit.alice", pattern) == "alice"
    assert tn.scope_of(subjects.JOBS_SUBMIT, pattern) is None


def test_a_scoped_submission_is_its_subjects_tenants() -> None:
    for given in ("default", "alice"):
        out, refusal = tn.submit_refusal(TENANTS, spec(tenant=given), "alice")
        assert refusal is None and out.tenant == "alice"
    _, refusal = tn.submit_refusal(TENANTS, spec(tenant="bob"), "alice")
    assert refusal is not None and refusal.code == FORBIDDEN and "for tenant bob" in refusal.message
    # a trusted caller's spec keeps its tenant
    out, refusal = tn.submit_refusal(TENANTS, spec(tenant="bob"), None)
    assert refusal is None and out.tenant == "bob"


def test_unknown_tenants_and_commands_without_run_commands_are_forbidden() -> None:
    for scope, tenant in ((None, "default"), (None, "mallory"), ("mallory", "default")):
        _, refusal = tn.submit_refusal(TENANTS, spec(tenant=tenant), scope)
        assert refusal is not None and refusal.code == FORBIDDEN
        assert "is not in the tenants file" in refusal.message
    command = ("python", "train.py")
    for scope in (None, "alice"):
        _, refusal = tn.submit_refusal(TENANTS, spec(tenant="alice", command=command), scope)
        assert refusal is not None and refusal.code == FORBIDDEN
        assert "may not run commands" in refusal.message
    assert tn.submit_refusal(TENANTS, spec(tenant="bob", command=command), "bob")[1] is None
    # without a tenants file: one tenant, default, that may run commands
    assert tn.submit_refusal(DEFAULT_TENANTS, spec(command=command), None)[1] is None


def test_a_tenant_cancels_only_its_own_jobs() -> None:
    j = JobId("b1")
    assert tn.cancel_scope_refusal(TENANTS, j, record("b1", "bob"), None) is None
    assert tn.cancel_scope_refusal(TENANTS, j, record("b1", "bob"), "bob") is None
    assert tn.cancel_scope_refusal(TENANTS, j, None, "alice") is None  # scheduler: not_found
    hidden = tn.cancel_scope_refusal(TENANTS, j, record("b1", "bob"), "alice")
    assert hidden == tn.TenantRefusal("not_found", "no job b1", audit=FORBIDDEN)
    unknown = tn.cancel_scope_refusal(TENANTS, j, record("b1", "bob"), "mallory")
    assert unknown is not None and unknown.code == FORBIDDEN


def test_each_event_goes_on_its_tenants_feed_once() -> None:
    event = ev.JobCancelled(job_id=JobId("a1"), at=1.0)
    rec = record("a1", "alice")
    assert tn.feed_subject(rec, event, True, False) == "hops.v1.tenants.alice.events.a1"
    assert tn.feed_subject(rec, event, False, True) == "hops.v1.tenants.alice.events.a1"
    assert tn.feed_subject(rec, event, False, False) is None  # a redelivery: sent already
    assert tn.feed_subject(None, event, True, True) is None  # no such job


# --- settings -------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return path


def test_the_tenants_file_is_read_from_hops_tenants(tmp_path: Path) -> None:
    path = write(tmp_path, "tenants:\n  alice: {tokens: [t1]}\n")
    assert set(read_tenants(path).tenants) == {"alice"}
    assert tenants_from_env({}) is None and tenants_from_env({"HOPS_TENANTS": " "}) is None
    assert tenants_from_env({"HOPS_TENANTS": str(path)}) == read_tenants(path)
    with pytest.raises(TenantsError, match="cannot read the tenants file"):
        read_tenants(tmp_path / "nope.yaml")
    with pytest.raises(TenantsError, match=str(write(tmp_path, "tenants: {a: {x: 1}}"))):
        read_tenants(path)
    # the scheduler: the file, else the one default tenant
    assert scheduler_settings({}).tenants == DEFAULT_TENANTS
    good = write(tmp_path, "tenants:\n  alice: {}\n")
    assert set(scheduler_settings({"HOPS_TENANTS": str(good)}).tenants.tenants) == {"alice"}
    flagged = scheduler_settings({"HOPS_TENANTS": "/nope"}, {"tenants": str(good)})
    assert set(flagged.tenants.tenants) == {"alice"}


def test_gateway_settings_for_auth_and_https() -> None:
    base = from_env({})
    assert (base.tenants, base.insecure, base.tls_cert, base.tls_key) == ("", False, "", "")
    env = {"HOPS_TENANTS": "/t.yaml", "HOPS_GATEWAY_INSECURE": "1",
           "HOPS_GATEWAY_CERT": "c.pem", "HOPS_GATEWAY_KEY": "k.pem"}
    s = from_env(env)
    assert (s.tenants, s.insecure, s.tls_cert, s.tls_key) == ("/t.yaml", True, "c.pem", "k.pem")
    s = parse(["--tenants", "/u.yaml", "--insecure", "--tls-cert", "a", "--tls-key", "b"], {})
    assert (s.tenants, s.insecure, s.tls_cert, s.tls_key) == ("/u.yaml", True, "a", "b")
    with pytest.raises(SettingsError, match="both"):
        from_env({"HOPS_GATEWAY_CERT": "c.pem"})
    with pytest.raises(SettingsError, match="HOPS_GATEWAY_INSECURE"):
        from_env({"HOPS_GATEWAY_INSECURE": "yes please"})


def test_gateway_insecure_is_a_switch(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    for on in ("1", "true", "Yes", "on"):
        assert from_env({"HOPS_GATEWAY_INSECURE": on}).insecure, on
    for off in ("", "0", "false", "no", "OFF"):
        assert not from_env({"HOPS_GATEWAY_INSECURE": off}).insecure, off
    with pytest.raises(SettingsError, match=r"HOPS_GATEWAY_INSECURE must be on \(1, true, "
                                            r"yes, on\) or off \(0, false, no, off\), got 'maybe'"):
        from_env({"HOPS_GATEWAY_INSECURE": "maybe"})
    # the gateway says so and exits 2 before it serves anything
    monkeypatch.setenv("HOPS_GATEWAY_INSECURE", "maybe")
    assert gateway_main([]) == 2
    err = capsys.readouterr().err
    assert "hops gateway: HOPS_GATEWAY_INSECURE must be on" in err and "'maybe'" in err


# --- the CLI's token ---------------------------------------------------------------------


def test_the_token_comes_from_the_flag_then_the_environment_then_the_config() -> None:
    config = cliconfig.CliConfig(gateway="http://cfg:1", token="cfg-token")
    env = {"HOPS_TOKEN": "env-token", "HOPS_GATEWAY_URL": "http://env:1"}
    assert cliconfig.resolve("http://flag:1", "flag-token", env, config) == cliconfig.Target(
        "http://flag:1", "flag-token")
    assert cliconfig.resolve(None, None, env, config) == cliconfig.Target(
        "http://env:1", "env-token")
    assert cliconfig.resolve(None, None, {}, config) == cliconfig.Target(
        "http://cfg:1", "cfg-token")
    assert cliconfig.resolve(None, None, {}, cliconfig.CliConfig()) == cliconfig.Target(
        cliconfig.DEFAULT_GATEWAY, None)


def test_the_config_file_is_the_flag_then_hops_config_then_the_default(tmp_path: Path) -> None:
    assert cliconfig.config_path("a.yaml", {"HOPS_CONFIG": "b.yaml"}) == (Path("a.yaml"), True)
    assert cliconfig.config_path(None, {"HOPS_CONFIG": "b.yaml"}) == (Path("b.yaml"), True)
    assert cliconfig.config_path(None, {}) == (cliconfig.DEFAULT_CONFIG, False)
    assert Path(".hops/cli.yaml") == cliconfig.DEFAULT_CONFIG
    path = tmp_path / "cli.yaml"
    path.write_text("gateway: http://x:1\ntoken: t\n")
    assert cliconfig.read_config(path, True) == cliconfig.CliConfig("http://x:1", "t")
    assert cliconfig.read_config(tmp_path / "none.yaml", False) == cliconfig.CliConfig()
    with pytest.raises(cliconfig.ConfigError, match="does not exist"):
        cliconfig.read_config(tmp_path / "none.yaml", True)
    path.write_text("tokn: t\n")
    with pytest.raises(cliconfig.ConfigError, match="tokn"):
        cliconfig.read_config(path, True)
    path.write_text("token: t2\n")
    assert cliconfig.target(None, None, None, {"HOPS_CONFIG": str(path)}).token == "t2"
