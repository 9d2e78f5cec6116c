"""NATS identities: each one's permissions (pure), the generated
authorization block, and its enforcement by a real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from cli.up.credentials import Credentials, enrol, ensure_credentials, write_auth
from services.monitor.natsaudit import auth_error_record, watch_auth_errors
from services.runtime.bus import ErrorReporter, JetStreamLayout, connect, ensure_jetstream
from services.runtime.identity import (
    ADMIN,
    AUDIT,
    SERVICES,
    IdentityError,
    executor_identity,
    inbox_prefix,
    permissions,
    render_authorization,
    tenant_identity,
)
from services.runtime.logging import get_logger
from services.runtime.natsd import EmbeddedNats
from services.runtime.objects import get_object, put_object
from services.runtime.service import ServiceContext
from services.runtime.settings import RuntimeSettings
from shared import subjects

T = TypeVar("T")


def matches(pattern: str, subject: str) -> bool:
    """Whether NATS subject ``pattern`` (with ``*`` and ``>``) matches ``subject``."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def may_publish(identity: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions(identity).publish)


def may_subscribe(identity: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions(identity).subscribe)


def test_matches() -> None:
    assert matches("a.*", "a.b") and not matches("a.*", "a.b.c")
    assert matches("a.>", "a.b.c") and not matches("a.>", "a")
    assert not matches("a.b", "a.c")


def test_an_executor_publishes_only_its_own_node_scoped_subjects() -> None:
    me = executor_identity("rtx-0")
    for subject in ("hops.v1.nodes.register.rtx-0", "hops.v1.nodes.heartbeat.rtx-0",
                    "hops.v1.jobs.heartbeat.rtx-0.j1", "hops.v1.reports.rtx-0.j1",
                    "hops.v1.logs.rtx-0.j1", "hops.v1.logs.rtx-0.alice/j1", "hops.v1.errors"):
        assert may_publish(me, subject), subject
    for subject in ("hops.v1.nodes.register.rtx-1", "hops.v1.nodes.heartbeat.rtx-1",
                    "hops.v1.jobs.heartbeat.rtx-1.j1", "hops.v1.reports.rtx-1.j1",
                    "hops.v1.logs.rtx-1.j1", "hops.v1.exec.rtx-0", "hops.v1.exec.rtx-1",
                    "hops.v1.plans",
                    "hops.v1.cluster.released", "$KV.hops_alloc.j1", "hops.v1.jobs.submit",
                    "hops.v1.jobs.events.j1", "hops.v1.samples.j1", "hops.v1.profiles.j1",
                    "$JS.API.STREAM.INFO.HOPS_JOBS", "hops.v1.nodes.register"):
        assert not may_publish(me, subject), subject
    assert may_subscribe(me, "hops.v1.exec.rtx-0")
    assert may_subscribe(me, "_INBOX.executor-rtx-0.abc.1")
    assert not may_subscribe(me, "hops.v1.exec.rtx-1")
    assert not may_subscribe(me, "_INBOX.executor-rtx-1.abc.1")
    assert not may_subscribe(me, "hops.v1.>")
    assert permissions(me).allow_responses  # it answers the placer's commands


def test_a_tenant_submits_cancels_and_reads_only_its_own() -> None:
    alice = tenant_identity("alice")
    assert may_publish(alice, "hops.v1.jobs.submit.alice")
    assert may_publish(alice, "hops.v1.jobs.cancel.alice")
    assert may_subscribe(alice, "hops.v1.tenants.alice.events.j1")
    assert may_subscribe(alice, "_INBOX.tenant-alice.x.1")
    for subject in ("hops.v1.jobs.submit.bob", "hops.v1.jobs.submit", "hops.v1.jobs.cancel",
                    "hops.v1.exec.rtx-0", "hops.v1.jobs.events.j1", "hops.v1.plans",
                    "$JS.API.STREAM.INFO.HOPS_JOBS", "$KV.hops_jobs.j1"):
        assert not may_publish(alice, subject), subject
    for subject in ("hops.v1.tenants.bob.events.j1", "hops.v1.jobs.events.j1",
                    "_INBOX.tenant-bob.x.1", "_INBOX.scheduler.x.1"):
        assert not may_subscribe(alice, subject), subject
    assert not permissions(alice).allow_responses


def test_only_the_scheduler_publishes_plans_and_only_admin_everything() -> None:
    others = [*SERVICES, executor_identity("a"), tenant_identity("t")]
    assert [i for i in others if may_publish(i, "hops.v1.plans")] == ["scheduler"]
    assert [i for i in others if may_publish(i, "$KV.hops_leader.scheduler")] == ["scheduler"]
    assert sorted(i for i in others if may_publish(i, "hops.v1.exec.rtx-0")) == [
        "monitor", "placer"]
    # each job's timeline is the leader's word alone
    assert [i for i in others if may_publish(i, "hops.v1.timeline.alice/j1")] == ["scheduler"]
    assert may_publish(ADMIN, "anything.at.all") and may_subscribe(ADMIN, "x")


def test_skipped_plan_entries_go_from_the_placer_to_the_monitor_alone() -> None:
    """The placer's skipped entries are counted by the monitor (hops_placer_skipped_total):
    both ends must be allowed, by nats-server as much as by the code."""
    others = [*SERVICES, executor_identity("a"), tenant_identity("t")]
    assert [i for i in others if may_publish(i, subjects.PLACER_SKIPPED)] == ["placer"]
    assert [i for i in others if may_subscribe(i, subjects.PLACER_SKIPPED)] == ["monitor"]


def test_hares_sequences_come_from_the_scheduler_and_reports_from_their_server() -> None:
    others = [*SERVICES, executor_identity("a"), executor_identity("b"), tenant_identity("t")]
    seq_a, done_a = subjects.task_sequence("a"), subjects.task_done("a", "j1")
    assert [i for i in others if may_publish(i, seq_a)] == ["scheduler"]
    # the aggregator reads them too: its grants (docs/hare.md §7, step 3b);
    # and the monitor: where a task job runs (the executor's job_failed of it)
    assert sorted(i for i in others if may_subscribe(i, seq_a)) == [
        "aggregator", executor_identity("a"), "monitor"]
    assert [i for i in others if may_publish(i, done_a)] == [executor_identity("a")]


def test_gradients_come_from_their_server_and_the_aggregator_alone_applies() -> None:
    """Hare's aggregator (docs/hare.md §7, step 3b): executor-a alone
    publishes a's gradients, any executor may ask for a job's parameters,
    only the aggregator answers them, publishes the rounds applied, reads
    the sequences and writes (and purges) its own object store."""
    others = [*SERVICES, executor_identity("a"), executor_identity("b"), tenant_identity("t")]
    grads_a = subjects.grads("a", "j1", 3)
    assert [i for i in others if may_publish(i, grads_a)] == [executor_identity("a")]
    assert [i for i in others if may_subscribe(i, grads_a)] == []  # read through JetStream
    params = subjects.agg_params("j1")
    assert [i for i in others if may_publish(i, params)] == [
        executor_identity("a"), executor_identity("b")]
    assert [i for i in others if may_subscribe(i, params)] == ["aggregator"]
    assert permissions("aggregator").allow_responses
    applied = subjects.agg_applied("j1")
    assert [i for i in others if may_publish(i, applied)] == ["aggregator"]
    assert sorted(i for i in others if may_subscribe(i, subjects.task_sequence("a"))) == [
        "aggregator", executor_identity("a"), "monitor"]  # the monitor: where tasks run
    store = "$O.hops_aggregator.M.ajEvY2hlY2twb2ludA=="
    assert [i for i in others if may_publish(i, store)] == ["aggregator"]
    denied = permissions("aggregator").publish_deny
    assert not any(matches(p, "$JS.API.STREAM.PURGE.OBJ_hops_aggregator") for p in denied)
    for stream in ("HOPS_GRADS", "HOPS_JOBS", "OBJ_hops_state", "KV_hops_jobs"):
        assert any(matches(p, f"$JS.API.STREAM.PURGE.{stream}") for p in denied), stream
    assert any(matches(p, "$JS.API.DIRECT.GET.OBJ_hops_state.x") for p in denied)
    for service in SERVICES:
        if service != "scheduler":
            assert any(matches(p, "$JS.API.STREAM.PURGE.HOPS_GRADS")
                       for p in permissions(service).publish_deny), service


def test_services_write_only_their_own_buckets_and_use_their_own_inbox() -> None:
    owners = {"hops_jobs": ["scheduler"], "hops_leader": ["scheduler"],
              "hops_alloc": ["monitor", "placer"], "hops_nodes": ["monitor"],
              "hops_explain": ["scheduler"]}
    for bucket, expected in owners.items():
        writers = [s for s in SERVICES if may_publish(s, f"$KV.{bucket}.k")]
        assert writers == expected, bucket
    for service in SERVICES:
        assert may_publish(service, "$JS.API.STREAM.INFO.HOPS_JOBS")  # the residual
        assert may_subscribe(service, f"{inbox_prefix(service)}.x.1")
        assert not any(may_subscribe(service, f"_INBOX.{o}.x.1") for o in SERVICES
                       if o != service)
    assert may_subscribe("monitor", "hops.v1.nodes.register.rtx-0")
    assert may_subscribe("scheduler", "hops.v1.jobs.submit.alice")
    assert not may_subscribe("gateway", "hops.v1.jobs.submit")


def test_the_audit_user_reads_auth_errors_only() -> None:
    p = permissions(AUDIT)
    assert p.publish == () and not p.allow_responses
    assert may_subscribe(AUDIT, "$SYS.SERVER.NABC.CLIENT.AUTH.ERR")
    assert not may_subscribe(AUDIT, "$SYS.REQ.SERVER.PING")


@pytest.mark.parametrize("bad", ["", "nobody", "executor-", "tenant-", "a.b", "x/y",
                                 "executor-a.b", "tenant-*", "-x", ".hidden"])
def test_what_is_no_identity(bad: str) -> None:
    with pytest.raises(IdentityError):
        permissions(bad)


KEY_A = "U" + "A" * 55
KEY_B = "U" + "B" * 55


def test_render_authorization_is_deterministic_and_puts_audit_in_the_system_account() -> None:
    users = {KEY_B: "executor-rtx-0", KEY_A: "monitor", "U" + "C" * 55: AUDIT}
    text = render_authorization(users)
    assert text == render_authorization(dict(reversed(users.items())))
    assert text.index(KEY_B) < text.index(KEY_A)  # by identity: executor-... < monitor
    assert '"hops.v1.exec.rtx-0"' in text and "allow_responses: true" in text
    assert "system_account: SYS" in text
    assert "system_account" not in render_authorization({KEY_A: "monitor"})
    with pytest.raises(IdentityError):
        render_authorization({"not-a-key": "monitor"})


# --- a real nats-server ----------------------------------------------------------------


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, Credentials]]:
    creds = Credentials(tmp_path / "credentials")
    ensure_credentials(creds.dir, [ADMIN, "monitor", executor_identity("rtx-0"),
                                   executor_identity("rtx-1"), tenant_identity("alice")])
    write_auth(creds.dir)
    with EmbeddedNats(tmp_path / "nats", auth_conf=creds.auth_conf) as server:
        yield server, creds


def test_credential_files_are_private(secured: tuple[EmbeddedNats, Credentials]) -> None:
    _, creds = secured
    assert creds.dir.stat().st_mode & 0o777 == 0o700
    for path in creds.dir.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path


async def _client(server: EmbeddedNats, creds: Credentials, identity: str,
                  errors: list[str] | None = None) -> NATS:
    settings = RuntimeSettings(nats_servers=(server.url,), nats_nkey=str(creds.seed(identity)))
    nc = await connect(settings, identity)
    if errors is not None:
        async def on_error(e: Exception) -> None:
            errors.append(str(e))
        nc._error_cb = on_error  # nats-py: errors after connect (permission violations)
    return nc


async def recorder(nc: NATS, subject: str, keep: Callable[[Msg], T]) -> list[T]:
    """What ``nc`` receives on ``subject`` from now on, as ``keep`` makes it."""
    seen: list[T] = []

    async def record(msg: Msg) -> None:
        seen.append(keep(msg))

    await nc.subscribe(subject, cb=record)
    await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
    await nc.flush()
    return seen


async def test_nats_server_enforces_the_permissions(
    secured: tuple[EmbeddedNats, Credentials],
) -> None:
    server, creds = secured
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                           connect_timeout=2)
    admin = await _client(server, creds, ADMIN)
    seen = await recorder(admin, "hops.v1.>", lambda m: m.subject)
    errors: list[str] = []
    rtx0 = await _client(server, creds, executor_identity("rtx-0"), errors)
    alice = await _client(server, creds, tenant_identity("alice"), errors)
    await rtx0.publish("hops.v1.nodes.heartbeat.rtx-0", b"{}")
    await rtx0.publish("hops.v1.nodes.heartbeat.rtx-1", b"{}")  # as another server
    await rtx0.publish("hops.v1.exec.rtx-1", b"{}")  # a command to another server
    await alice.publish("hops.v1.exec.rtx-0", b'{"type": "stop_job"}')
    await alice.publish("hops.v1.jobs.submit.alice", b"{}")
    await alice.publish("hops.v1.jobs.submit.bob", b"{}")
    await alice.publish("hops.v1.jobs.events.j1", b'{"type": "job_finished"}')
    await rtx0.publish("hops.v1.nodes.register.rtx-1", b"{}")  # register as another
    monitor = await _client(server, creds, "monitor", errors)
    for nc in (rtx0, alice, monitor):  # a plan from anything but the scheduler
        await nc.publish("hops.v1.plans", b'{"type": "plan_issued"}')
    for nc in (rtx0, alice, monitor):
        await nc.flush()
    await asyncio.sleep(0.3)
    await admin.flush()
    assert sorted(seen) == ["hops.v1.jobs.submit.alice", "hops.v1.nodes.heartbeat.rtx-0"]
    assert len([e for e in errors if "permissions violation" in e]) == 9, errors
    await monitor.close()
    log = server.log_path.read_text()
    assert 'Publish Violation - Subject "hops.v1.exec.rtx-0"' in log
    for nc in (admin, rtx0, alice):
        await nc.close()


async def test_an_enrolled_executor_connects_after_a_reload(
    secured: tuple[EmbeddedNats, Credentials],
) -> None:
    server, creds = secured
    seed = enrol(creds.dir, "far-away-0")
    assert seed == creds.seed("executor-far-away-0")
    server.reload()
    for _ in range(50):  # the reload is asynchronous
        try:
            nc = await nats.connect(server.url, nkeys_seed=str(seed), allow_reconnect=False,
                                    max_reconnect_attempts=0, connect_timeout=2,
                                    inbox_prefix="_INBOX.executor-far-away-0")
            break
        except (nats.errors.Error, OSError):  # refused before the reload: the server hangs up
            await asyncio.sleep(0.1)
    else:
        raise AssertionError("the enrolled executor could not connect")
    await nc.publish("hops.v1.nodes.heartbeat.far-away-0", b"{}")
    await nc.flush()
    await nc.close()


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


async def test_tls_and_nkey_together(tmp_path: Path, self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    creds = Credentials(tmp_path / "credentials")
    ensure_credentials(creds.dir, ["monitor"])
    write_auth(creds.dir)
    with EmbeddedNats(tmp_path / "nats", auth_conf=creds.auth_conf, tls_cert=cert,
                      tls_key=key) as server:
        assert server.url.startswith("tls://")
        settings = RuntimeSettings(nats_servers=(server.url,), nats_nkey=str(creds.seed("monitor")),
                                   nats_ca=str(cert))
        nc = await connect(settings, "monitor")
        assert nc.is_connected
        await nc.publish("hops.v1.errors", b"{}")
        await nc.flush()
        await nc.close()
        with pytest.raises(Exception):  # noqa: B017  # not trusted: no CA given
            await nats.connect(server.url, nkeys_seed=str(creds.seed("monitor")),
                               allow_reconnect=False, max_reconnect_attempts=0,
                               connect_timeout=2)


ADVISORY = (b'{"type":"io.nats.server.advisory.v1.client_disconnect","id":"x","timestamp":"t",'
            b'"client":{"host":"127.0.0.1","id":6,"acc":"$G","lang":"python3",'
            b'"name":"intruder"},"reason":"Authentication Failure"}')


def test_an_auth_error_advisory_becomes_an_unauthorized_error_record() -> None:
    record = auth_error_record(ADVISORY, 5.0)
    assert record is not None
    assert (record.service, record.code, record.at) == ("nats", "unauthorized", 5.0)
    assert "127.0.0.1 intruder" in record.error and "Authentication Failure" in record.error
    assert auth_error_record(b"not json", 1.0) is None
    assert auth_error_record(b'{"client": 3}', 1.0) is None


async def test_the_monitor_republishes_nats_refusals(tmp_path: Path) -> None:
    creds = Credentials(tmp_path / "credentials")
    ensure_credentials(creds.dir, [ADMIN, AUDIT])
    write_auth(creds.dir)
    with EmbeddedNats(tmp_path / "nats", auth_conf=creds.auth_conf) as server:
        admin = await _client(server, creds, ADMIN)
        records = await recorder(admin, "hops.v1.errors", lambda m: m.data)
        settings = RuntimeSettings(nats_servers=(server.url,))
        ctx = ServiceContext("monitor", settings, admin, admin.jetstream(), get_logger(),
                             ErrorReporter(admin, "monitor"))
        task = asyncio.create_task(watch_auth_errors(ctx, str(creds.seed(AUDIT))))
        await asyncio.sleep(0.5)  # subscribed
        with pytest.raises(nats.errors.Error):
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                               connect_timeout=2, name="intruder")
        for _ in range(50):
            if records:
                break
            await asyncio.sleep(0.1)
        ctx.stopping.set()
        await task
        await admin.close()
    assert records and b'"code":"unauthorized"' in records[0] and b'"service":"nats"' in records[0]


def test_only_the_scheduler_reads_or_writes_the_leaders_state() -> None:
    state = [s for s in SERVICES if may_publish(s, "$O.hops_state.M.bGF5ZXIuaGl2ZWQ=")]
    assert state == ["scheduler"]
    for service in SERVICES:
        denied = permissions(service).publish_deny
        reads = ["$JS.API.DIRECT.GET.OBJ_hops_state.$O.hops_state.M.x",
                 "$JS.API.STREAM.MSG.GET.OBJ_hops_state", "$JS.API.STREAM.PURGE.OBJ_hops_state",
                 "$JS.API.CONSUMER.CREATE.OBJ_hops_state.c.$O.hops_state.C.n",
                 "$JS.API.CONSUMER.DURABLE.CREATE.OBJ_hops_state.c"]
        expected = service != "scheduler"
        reads.append("$JS.API.STREAM.UPDATE.OBJ_hops_state")  # its limits are its owner's
        assert all(any(matches(p, r) for p in denied) == expected for r in reads), service
        # the layout stays every service's to ensure
        assert not any(matches(p, "$JS.API.STREAM.CREATE.OBJ_hops_state") for p in denied)
        assert not any(matches(p, "$JS.API.STREAM.INFO.OBJ_hops_state") for p in denied)
        assert not any(matches(p, "$JS.API.STREAM.UPDATE.HOPS_JOBS") for p in denied)
        # no service deletes or purges a stream of the layout
        for stream in ("HOPS_JOBS", "KV_hops_jobs", "KV_hops_leader", "OBJ_hops_state"):
            assert any(matches(p, f"$JS.API.STREAM.DELETE.{stream}") for p in denied), stream
        for stream in ("HOPS_JOBS", "HOPS_LOGS", "KV_hops_jobs", "KV_hops_explain"):
            assert any(matches(p, f"$JS.API.STREAM.PURGE.{stream}") for p in denied), stream
    assert '"deny": ' not in render_authorization({KEY_A: "scheduler"})
    assert ', deny: ["$JS.API.STREAM.MSG.GET.OBJ_hops_state"' in render_authorization(
        {KEY_A: "gateway"})


async def _only_the_scheduler_changes_the_states_limits(gateway: NATS, scheduler: NATS) -> None:
    """A gateway's ``STREAM.UPDATE`` of hops_state (its limits shrunk) is
    refused, its ensure of a smaller layout leaves the stream alone, and the
    scheduler still updates it and writes to it."""
    other, js = gateway.jetstream(timeout=1), scheduler.jetstream()
    info = await js.stream_info("OBJ_hops_state")
    shrunk = dataclasses.replace(info.config, max_bytes=1024)
    with pytest.raises(nats.errors.TimeoutError):
        await other.update_stream(shrunk)
    with pytest.raises(nats.errors.TimeoutError):
        await other.delete_stream("HOPS_JOBS")
    layout = JetStreamLayout(state_max_bytes=2**31, owns_state=False)
    await ensure_jetstream(gateway.jetstream(), layout)  # the state's limits not its to change
    assert (await js.stream_info("OBJ_hops_state")).config.max_bytes == info.config.max_bytes
    await ensure_jetstream(js, dataclasses.replace(layout, owns_state=True))
    assert (await js.stream_info("OBJ_hops_state")).config.max_bytes == 2**31
    for n in range(3):  # a write purges the chunks of the version two before
        await put_object(js, "hops_state", "layer.hived", b'{"cells": %d}' % n)
    assert await get_object(js, "hops_state", "layer.hived") == b'{"cells": 2}'
    assert (await js.stream_info("HOPS_JOBS")).config.name == "HOPS_JOBS"


async def test_nats_server_keeps_the_leaders_state_from_other_identities(
        tmp_path: Path) -> None:
    creds = Credentials(tmp_path / "credentials")
    ensure_credentials(creds.dir, [ADMIN, "scheduler", "gateway", "monitor"])
    write_auth(creds.dir)
    with EmbeddedNats(tmp_path / "nats", auth_conf=creds.auth_conf) as server:
        errors: list[str] = []
        gateway = await _client(server, creds, "gateway", errors)
        await ensure_jetstream(gateway.jetstream())  # any service ensures the layout
        scheduler = await _client(server, creds, "scheduler")
        js = scheduler.jetstream()
        await put_object(js, "hops_state", "layer.hived", b'{"cells": "bound"}')
        assert await get_object(js, "hops_state", "layer.hived") == b'{"cells": "bound"}'
        monitor = await _client(server, creds, "monitor", errors)
        for nc in (gateway, monitor):
            other = nc.jetstream(timeout=1)
            with pytest.raises(nats.errors.TimeoutError):
                await get_object(other, "hops_state", "layer.hived", timeout=1)
            with pytest.raises(nats.errors.TimeoutError):
                await other.subscribe("$O.hops_state.C.>", stream="OBJ_hops_state",
                                      ordered_consumer=True)
            with pytest.raises(nats.errors.TimeoutError):
                await other.purge_stream("OBJ_hops_state")
            with pytest.raises(nats.errors.TimeoutError):
                await put_object(other, "hops_state", "layer.hived", b"{}", within=1)
        assert await get_object(js, "hops_state", "layer.hived") == b'{"cells": "bound"}'
        assert any("permissions violation" in e for e in errors), errors
        await _only_the_scheduler_changes_the_states_limits(gateway, scheduler)
        for nc in (gateway, monitor, scheduler):
            await nc.close()
