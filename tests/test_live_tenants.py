"""Tenants over raw NATS: a scheduler process given a tenants file serves
the tenant-scoped ``hops.v1.jobs.submit.<tenant>``/``cancel.<tenant>``
(the tenant is the subject's), refuses what the tenant may not do with
``forbidden`` (audited), keeps each tenant's ids its own (a job's key is
``tenant/id``: another tenant's job is ``not_found``), and its
leader republishes each job event on ``hops.v1.tenants.<tenant>.events.<job>``.
nats-server's permissions (which subjects a tenant's credential may use)
are tested with the credentials, in the stack's tests."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared import events as ev
from shared import subjects
from shared.explain_events import JobExplained, decode_feed
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import ROOT, nc, spec_json
from tests.test_gateway_auth import errors, eventually, scheduler, tenants_file

__all__ = ["errors", "nats_server", "nats_url", "nc", "scheduler", "tenants_file"]  # fixtures


async def ask(nc: NATS, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=5)
    reply: dict[str, Any] = json.loads(msg.data)
    return reply


async def admitted(nc: NATS) -> None:
    """Until the scheduler answers on the tenant subjects."""
    async def up() -> bool:
        try:
            await nc.request(subjects.tenant_submit("alice"), b"{", timeout=1)
            return True
        except Exception:
            return False
    await eventually(up, "admission on the tenant subjects")


@pytest.fixture
async def feed(nc: NATS) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
    """Every message on any tenant's live feed: (subject, event)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def on(msg: Msg) -> None:
        seen.append((msg.subject, json.loads(msg.data)))

    sub = await nc.subscribe(f"{subjects.PREFIX}.tenants.>", cb=on)
    await nc.flush()
    yield seen
    await sub.unsubscribe()


async def test_a_tenant_client_submits_and_cancels_on_its_own_subjects(
    nc: NATS, scheduler: subprocess.Popen[bytes], errors: list[ev.ErrorRecord],
    feed: list[tuple[str, dict[str, Any]]],
) -> None:
    await admitted(nc)
    alice_submit, alice_cancel = subjects.tenant_submit("alice"), subjects.tenant_cancel("alice")
    reply = await ask(nc, alice_submit, spec_json("a1"))
    assert (reply["ok"], reply["job_id"]) == (True, "a1"), reply
    reply = await ask(nc, alice_submit, {"type": "submit_job", "spec": spec_json("a2")})
    assert reply["ok"] is True, reply
    reply = await ask(nc, subjects.tenant_submit("bob"), spec_json("b1", tenant="bob"))
    assert reply["ok"] is True, reply
    # the subject's tenant, never the payload's
    reply = await ask(nc, alice_submit, spec_json("a3", tenant="bob"))
    assert (reply["ok"], reply["code"]) == (False, "forbidden"), reply
    assert "tenant alice may not submit job a3 for tenant bob" in reply["error"]
    command = ["sh", "-c", "cat /etc/passwd"]
    reply = await ask(nc, alice_submit, spec_json("a4", command=command))
    assert (reply["ok"], reply["code"]) == (False, "forbidden"), reply
    assert "may not run commands" in reply["error"]
    assert (await ask(nc, subjects.tenant_submit("bob"), spec_json("b2", command=command)))["ok"]
    reply = await ask(nc, subjects.tenant_submit("mallory"), spec_json("m1"))
    assert (reply["ok"], reply["code"]) == (False, "forbidden"), reply
    # each tenant's ids are its own: alice's b1 is no job; her own she cancels
    cancel_b1 = {"type": "cancel_job", "job_id": "b1"}
    reply = await ask(nc, alice_cancel, cancel_b1)
    assert (reply["ok"], reply["code"], reply["error"]) == (False, "not_found", "no job b1")
    reply = await ask(nc, alice_cancel, {"type": "cancel_job", "job_id": "a2"})
    assert (reply["ok"], reply["job_id"]) == (True, "a2"), reply
    kv = await nc.jetstream().key_value(subjects.KV_JOBS)
    stored = {}
    for key in ("alice/a1", "alice/a2", "bob/b1", "bob/b2"):  # shared/jobkeys.py
        stored[key] = json.loads((await kv.get(key)).value or b"{}")
    assert {k: (r["spec"]["tenant"], r["spec"]["id"]) for k, r in stored.items()} == {
        "alice/a1": ("alice", "alice/a1"), "alice/a2": ("alice", "alice/a2"),
        "bob/b1": ("bob", "bob/b1"), "bob/b2": ("bob", "bob/b2")}
    assert not {"a1", "b1", "alice/a3", "alice/a4", "mallory/m1"} & set(await kv.keys())
    await eventually(lambda: _audited(errors), "audit records of every refusal")
    # alice's b1 touched no job of bob's: it is recorded as any unknown job
    # is (not_found), never as a refusal that would tell a job was there
    seen = {(e.subject, e.code) for e in errors}
    assert ("hops.v1.jobs.cancel.alice", "forbidden") not in seen
    await _check_feed(feed)


def _audited(errors: list[ev.ErrorRecord]) -> bool:
    got = {(e.subject, e.code) for e in errors if e.service == "scheduler"}
    return {("hops.v1.jobs.submit.alice", "forbidden"),
            ("hops.v1.jobs.submit.mallory", "forbidden")} <= got


async def _check_feed(feed: list[tuple[str, dict[str, Any]]]) -> None:
    """The leader republishes each event of a tenant's job on its feed, once."""
    def kinds() -> set[tuple[str, str]]:
        return {(s, e["type"]) for s, e in feed}

    wanted = {("hops.v1.tenants.alice.events.a1", "job_submitted"),
              ("hops.v1.tenants.alice.events.a2", "job_submitted"),
              ("hops.v1.tenants.alice.events.a2", "job_cancelled"),
              ("hops.v1.tenants.bob.events.b1", "job_submitted")}
    await eventually(lambda: wanted <= kinds(), "the tenants' feeds")
    await asyncio.sleep(0.5)
    subjects_seen = [s for s, e in feed if e["type"] == "job_submitted"]
    assert len(subjects_seen) == len(set(subjects_seen)), feed  # each once
    assert not [s for s, _ in feed if s.endswith((".a3", ".a4", ".m1"))]
    # job events and, told apart by their type, the jobs' timeline entries
    # (shared.explain_events); each names the job by the tenant's id, never its key
    decoded = [decode_feed(json.dumps(e).encode()) for _, e in feed]
    assert all(d.job_id and "/" not in d.job_id for d in decoded), feed
    explained = {(s, d.entry.kind) for (s, _), d in zip(feed, decoded, strict=True)
                 if isinstance(d, JobExplained)}
    assert {("hops.v1.tenants.alice.events.a1", "submitted"),
            ("hops.v1.tenants.alice.events.a2", "cancelled")} <= explained, feed
    assert not [e for s, e in feed if ".alice." in s and "bob" in json.dumps(e)], feed


def test_the_scheduler_refuses_to_start_with_a_tenants_file_it_cannot_use(tmp_path: Path) -> None:
    for args, said in ((["--tenants", str(tmp_path / "none.yaml")], "cannot read the tenants file"),
                       ([], "tenants.yaml")):
        bad = tmp_path / "tenants.yaml"
        bad.write_text("tenants: {a: {tokens: [x]}, b: {tokens: [x]}}\n")
        env = {**os.environ, "HOPS_TENANTS": str(bad), "HOPS_HEALTH_PORT": ""}
        done = subprocess.run([sys.executable, "-m", "services.scheduler", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr, done.stderr
