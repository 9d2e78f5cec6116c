"""``GET /jobs/{id}/params`` and ``hops params`` on a real nats-server: the
test stores a task job's final parameters as its aggregator does (object
``<job>/final`` in ``hops_aggregator``) and reads them through the gateway
as an admin and as tenants: a tenant reads its own job's, another tenant's
job is a 404 like a missing one; a job without them (not a task job, not
finished, failed) is refused ``no_final_params`` with why. The gateway reads
them under its own NATS identity too; the CLI writes them to a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import torch
from nats.aio.client import Client as NATS
from typer.testing import CliRunner

from cli.main import app
from gateway.params_routes import NO_FINAL_PARAMS, no_params_words
from hops.aggregator.codec import decode_params, encode_params
from services.runtime.objects import put_object
from shared import subjects
from shared.gradients import final_name
from shared.job import JobSpec
from shared.records import JobRecord
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import gateway_settings, nc
from tests.test_gateway_explain import ADMIN, ALICE, BOB, _served, as_gateway

__all__ = ["nats_server", "nats_url", "nc"]  # fixtures

PARAMS = {"fc.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
          "fc.bias": torch.tensor([0.5, -1.0])}
COMMAND = ("python", "examples/train_cnn.py")


def task_record(key: str, phase: str, command: tuple[str, ...] = COMMAND,
                sync_scale: int = 3) -> JobRecord:
    tenant = key.split("/")[0]
    spec = JobSpec(key, "small-cnn", 8, 100, 240, requirements=(1,), sync_scale=sync_scale,
                   command=command, tenant=tenant)
    return JobRecord(spec=spec, submitted_at=10.0, phase=phase)  # type: ignore[arg-type]


RECORDS = [task_record("alice/t1", "finished"), task_record("bob/b1", "finished"),
           task_record("alice/r1", "finished", command=()),
           task_record("alice/s0", "finished", sync_scale=0),
           task_record("alice/t2", "running"), task_record("alice/t3", "failed"),
           task_record("alice/t4", "finished")]


async def store(nc: NATS) -> None:
    js = nc.jetstream()
    jobs = await js.key_value(subjects.KV_JOBS)
    for r in RECORDS:
        await jobs.put(r.job_id, msgspec.json.encode(r))
    for key in ("alice/t1", "bob/b1"):  # t4 finished without them
        await put_object(js, subjects.OBJ_AGGREGATOR, final_name(key), encode_params(PARAMS))


def params_of(answer: httpx.Response) -> dict[str, torch.Tensor]:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/octet-stream"
    return decode_params(answer.content)


def same(got: dict[str, torch.Tensor]) -> bool:
    return got.keys() == PARAMS.keys() and all(torch.equal(got[k], PARAMS[k]) for k in PARAMS)


async def test_a_tenant_reads_its_own_task_jobs_final_parameters(nats_url: str,
                                                                 nc: NATS) -> None:
    await store(nc)
    async with _served(gateway_settings(nats_url, timeout=0.5)) as api:
        assert same(params_of(await api.get("/jobs/t1/params", headers=ALICE)))
        assert same(params_of(await api.get("/jobs/t1/params", params={"tenant": "alice"},
                                            headers=ADMIN)))
        for path, who in (("/jobs/t1/params", BOB), ("/jobs/b1/params", ALICE),
                          ("/jobs/nope/params", ALICE)):
            answer = await api.get(path, headers=who)
            assert (answer.status_code, answer.json()["code"]) == (404, "not_found"), path
        other = await api.get("/jobs/t1/params", params={"tenant": "alice"}, headers=BOB)
        assert other.status_code == 403


@pytest.mark.parametrize(("job", "words"), [
    ("r1", "job r1 is not a task job"), ("s0", "job s0 is not a task job"),
    ("t2", "job t2 is running: its final parameters are saved once it finishes"),
    ("t3", "job t3 failed before its last round"),
    ("t4", "job t4 finished without final parameters")])
async def test_a_job_without_final_parameters_is_refused_with_why(
        nats_url: str, nc: NATS, job: str, words: str) -> None:
    await store(nc)
    async with _served(gateway_settings(nats_url, timeout=0.5)) as api:
        answer = await api.get(f"/jobs/{job}/params", headers=ALICE)
    assert (answer.status_code, answer.json()["code"]) == (409, NO_FINAL_PARAMS), answer.text
    assert answer.json()["error"].startswith(words), answer.text


def test_the_words_name_the_job_by_its_own_id() -> None:
    assert no_params_words(task_record("alice/x", "queued")).startswith("job x is queued")


async def test_the_gateway_reads_them_under_its_own_identity(tmp_path: Path) -> None:
    async with as_gateway(tmp_path, store) as client:
        assert same(params_of(await client.get("/jobs/t1/params", headers=ALICE)))


def test_hops_params_writes_them_to_a_file(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        job = request.url.path.split("/")[2]
        if job == "t1" and request.url.params.get("tenant") == "alice":
            return httpx.Response(200, content=encode_params(PARAMS),
                                  headers={"content-type": "application/octet-stream"})
        return httpx.Response(409, json={"ok": False, "code": NO_FINAL_PARAMS,
                                         "error": f"job {job} is running"})

    real = httpx.Client

    def mocked(*args: Any, **kwargs: Any) -> httpx.Client:
        return real(*args, **{**kwargs, "transport": httpx.MockTransport(answer)})

    monkeypatch.setattr(httpx, "Client", mocked)
    env = {"HOPS_GATEWAY_URL": "http://gateway.test"}
    out = tmp_path / "t1.params"
    done = CliRunner().invoke(app, ["params", "alice/t1", "--out", str(out)], env=env)
    assert done.exit_code == 0, done.output
    assert same(decode_params(out.read_bytes()))
    refused = CliRunner().invoke(app, ["params", "t2", "-o", str(tmp_path / "t2")], env=env)
    assert refused.exit_code == 1
    assert f"409 {NO_FINAL_PARAMS}: job t2 is running" in refused.output
    assert not (tmp_path / "t2").exists()
