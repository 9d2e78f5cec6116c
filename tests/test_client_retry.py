"""``hops submit``'s client retries a 503 (the gateway's answer while no
scheduler answers): after ``Retry-After`` or its own backoff, a few times,
and a retry answered 409 for the very spec it sent is the acceptance of an
earlier attempt. The gateway here is a stand-in (``httpx.MockTransport``);
tests/test_up_faults.py retries against a real ``hops up``. A 401 is never
retried; a 403 is the job's own refusal."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import pytest

from cli.client import RETRY_DELAYS_S, Answer, GatewayClient, GatewayError, render_answer
from shared.job import JobSpec

SPEC = JobSpec(id="j1", model="m", batch_size=32, params=1000, total_samples=10_000,
               requirements=(1, 2))
UNAVAILABLE = (503, {"ok": False, "code": "unavailable", "error": "no reply"})
CONFLICT = (409, {"ok": False, "code": "conflict", "error": "job j1 exists already"})
ACCEPTED = (201, {"ok": True, "job_id": "j1"})


def stored(**changes: Any) -> tuple[int, dict[str, Any]]:
    """The gateway's ``GET /jobs/j1``: the spec as the scheduler stored it."""
    spec = json.loads(json.dumps(msgspec.to_builtins(SPEC)))
    spec.update(submit_time=1234.5, **changes)
    return 200, {"job_id": "j1", "phase": "queued", "spec": spec}


def gateway(posts: list[tuple[int, dict[str, Any]]], get: tuple[int, dict[str, Any]] = (
        404, {"ok": False, "code": "not_found", "error": "no job"}),
        retry_after: str = "1") -> tuple[GatewayClient, list[float], list[str]]:
    """A client of a stand-in gateway answering ``posts`` in turn (and
    ``get`` to every GET); the client's sleeps and the requests seen."""
    answers: Iterator[tuple[int, dict[str, Any]]] = iter(posts)
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        status, body = next(answers) if request.method == "POST" else get
        headers = {"Retry-After": retry_after} if status == 503 else {}
        return httpx.Response(status, json=body, headers=headers)

    slept: list[float] = []
    sleep: Callable[[float], None] = slept.append
    client = GatewayClient("http://gw", transport=httpx.MockTransport(handle), sleep=sleep)
    return client, slept, seen


def test_a_503_is_retried_with_backoff_until_accepted() -> None:
    client, slept, seen = gateway([UNAVAILABLE, UNAVAILABLE, UNAVAILABLE, ACCEPTED])
    answer = client.submit(SPEC)
    assert (answer.status, answer.attempts) == (201, 4)
    assert slept == [1.0, 1.0, 2.0]  # Retry-After (1 s) when longer than the backoff
    assert seen == ["POST"] * 4
    assert render_answer("j1", answer) == "j1: accepted (attempt 4)"


def test_a_long_retry_after_is_waited_for_up_to_a_bound() -> None:
    client, slept, _ = gateway([UNAVAILABLE, ACCEPTED], retry_after="3600")
    assert client.submit(SPEC).ok
    assert slept == [10.0]


def test_retries_give_up_with_the_last_503() -> None:
    client, slept, _ = gateway([UNAVAILABLE] * (len(RETRY_DELAYS_S) + 1))
    answer = client.submit(SPEC)
    assert (answer.status, answer.attempts) == (503, 5)
    assert len(slept) == len(RETRY_DELAYS_S) and answer.retry_after == 1.0
    assert "rejected (503 unavailable)" in render_answer("j1", answer)


def test_a_conflict_after_a_retry_is_the_earlier_attempts_acceptance() -> None:
    client, _, seen = gateway([UNAVAILABLE, CONFLICT], get=stored())
    answer = client.submit(SPEC)
    assert (answer.status, answer.body["job_id"], answer.attempts) == (201, "j1", 2)
    assert seen == ["POST", "POST", "GET"]


def test_a_conflict_with_another_spec_stays_a_conflict() -> None:
    client, _, _ = gateway([UNAVAILABLE, CONFLICT], get=stored(batch_size=64))
    assert client.submit(SPEC).status == 409


def test_a_conflict_without_a_retry_is_not_looked_into() -> None:
    client, slept, seen = gateway([CONFLICT], get=stored())
    answer = client.submit(SPEC)
    assert (answer.status, slept, seen) == (409, [], ["POST"])


def test_a_conflict_waits_a_little_for_the_record_of_an_earlier_attempt() -> None:
    client, slept, seen = gateway([UNAVAILABLE, CONFLICT])  # the record never appears
    assert client.submit(SPEC).status == 409
    assert seen.count("GET") >= 2 and slept[1:] and set(slept[1:]) == {0.25}


def test_an_answer_without_retry_after_uses_the_backoff() -> None:
    assert Answer(201, {}).attempts == 1
    client, slept, _ = gateway([UNAVAILABLE, ACCEPTED], retry_after="soon")
    assert client.submit(SPEC).ok and slept == [RETRY_DELAYS_S[0]]


UNAUTHORIZED = (401, {"ok": False, "code": "unauthorized",
                      "error": "the bearer token is not valid"})
FORBIDDEN = (403, {"ok": False, "code": "forbidden", "error": "tenant a may not run commands"})


def test_a_401_is_an_error_at_once_and_never_retried() -> None:
    client, slept, seen = gateway([UNAUTHORIZED, ACCEPTED])
    with pytest.raises(GatewayError) as refused:
        client.submit(SPEC)
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    assert str(refused.value) == "401 unauthorized: the bearer token is not valid"
    assert seen == ["POST"] and slept == []


def test_a_403_is_the_jobs_refusal_not_retried() -> None:
    client, slept, seen = gateway([FORBIDDEN, ACCEPTED])
    answer = client.submit(SPEC)
    assert (answer.status, answer.attempts, seen, slept) == (403, 1, ["POST"], [])
    assert render_answer("j1", answer) == (
        "j1: rejected (403 forbidden): tenant a may not run commands")


def test_a_conflict_after_a_retry_is_ours_when_the_gateway_set_our_tenant() -> None:
    client, _, _ = gateway([UNAVAILABLE, CONFLICT], get=stored(tenant="alice"))
    assert client.submit(SPEC).status == 201


def test_the_client_sends_its_token() -> None:
    headers: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"jobs": [], "count": 0, "total": 0,
                                         "next_cursor": None})

    transport = httpx.MockTransport(handle)
    GatewayClient("http://gw", transport=transport, token="t1").jobs()
    GatewayClient("http://gw", transport=transport).jobs()
    assert headers == ["Bearer t1", None]
