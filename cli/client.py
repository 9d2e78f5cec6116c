"""What ``hops submit/jobs/queue/describe/nodes/cancel`` use: an HTTP client of the
gateway (:mod:`gateway.app`) and the one-line rendering of its answers to
one job (the tables of its listings are :mod:`cli.tables`').

The gateway's address and the bearer token come from flags, the
environment or the config file (:mod:`cli.config`). When nothing
answers there, :class:`GatewayUnreachable` says so and how to point
elsewhere, rather than a connection traceback. A 401 (no token, or one the
gateway does not know) is a :class:`GatewayError` at once, never retried.

A submission answered 503 (no scheduler answered in time: a replica
restarting or failing over, NATS reconnecting) is retried after the
answer's ``Retry-After`` or the next of :data:`RETRY_DELAYS_S`, whichever is
longer. The job id makes that safe: the scheduler accepts one job per id,
so a retry never makes a second job. A retry answered 409 because an
earlier attempt was accepted after all (its answer lost in the failure) is
that acceptance when the stored job has the very spec submitted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from cli.config import DEFAULT_GATEWAY, GATEWAY_ENV
from cli.tables import render_jobs, render_nodes, render_queue
from gateway.pages import MAX_LIMIT
from shared.events import SubmitJob, encode
from shared.job import JobSpec
from shared.tenants import DEFAULT_TENANT

# The tables of the gateway's answers live in cli/tables.py; named here too,
# where the commands and their tests have always found them.
__all__ = ["DEFAULT_GATEWAY", "GATEWAY_ENV", "GatewayClient", "render_jobs", "render_nodes",
           "render_queue"]
# The gateway's largest page: the fewest requests for a whole listing.
PAGE = MAX_LIMIT
# Waits before the 2nd..5th attempt of a submission answered 503: 7.5 s in
# all, more than a lease takeover takes at the default TTL (5 s + 5/3 s) and
# than a restart of every scheduler replica (1 s, then their start).
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
RETRY_AFTER_MAX_S = 10.0  # a larger Retry-After is not waited for in full
# How long a retry answered 409 looks for the job an earlier attempt stored
# (the record is written right after the stream's ack, or by the leader).
_STORED_WAIT_S = 5.0
_STORED_POLL_S = 0.25


@dataclass(frozen=True)
class JobsQuery:
    """What ``hops jobs`` lists: the filters (None: any) and how many at most
    (None: every job)."""

    phase: str | None = None
    tenant: str | None = None
    limit: int | None = None


class GatewayUnreachable(Exception):
    """No gateway answers at the URL."""


class GatewayError(Exception):
    """The gateway answered with an error status."""

    def __init__(self, status: int, code: str, error: str) -> None:
        super().__init__(f"{status} {code}: {error}" if code else f"{status}: {error}")
        self.status = status
        self.code = code

    @classmethod
    def of(cls, response: httpx.Response, body: Mapping[str, Any]) -> GatewayError:
        return cls(response.status_code, str(body.get("code", "")), _error_text(response, body))


@dataclass(frozen=True)
class Answer:
    """A submit or cancel answer: the HTTP status, the JSON body, the
    ``Retry-After`` seconds of a 503 and how many attempts it took."""

    status: int
    body: Mapping[str, Any]
    retry_after: float | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class GatewayClient:
    """A synchronous client of the gateway's REST API."""

    def __init__(
        self,
        base_url: str = DEFAULT_GATEWAY,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers=headers)
        self.sleep = sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            reason = str(e) or type(e).__name__
            raise GatewayUnreachable(
                f"cannot reach the Hops gateway at {self.base_url} ({reason}); is `hops up` "
                f"running? Point to another gateway with --gateway or ${GATEWAY_ENV}."
            ) from None

    def _answer(self, response: httpx.Response) -> Answer:
        """The answer; a 401 raises: no job of the call can succeed without a token."""
        body = _json(response)
        if response.status_code == 401:
            raise GatewayError.of(response, body)
        retry_after = _seconds(response.headers.get("Retry-After"))
        return Answer(response.status_code, body, retry_after)

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        response = self._call("GET", path, params=params)
        body = _json(response)
        if response.status_code != 200:
            raise GatewayError.of(response, body)
        return body

    def submit(self, spec: JobSpec) -> Answer:
        """Submit ``spec``, retrying a 503 (see the module docstring)."""
        data = encode(SubmitJob(spec=spec))
        headers = {"Content-Type": "application/json"}
        answer = self._answer(self._call("POST", "/jobs", content=data, headers=headers))
        attempts = 1
        for delay in RETRY_DELAYS_S:
            if answer.status != 503:
                break
            self.sleep(min(max(delay, answer.retry_after or 0.0), RETRY_AFTER_MAX_S))
            answer = self._answer(self._call("POST", "/jobs", content=data, headers=headers))
            attempts += 1
        if attempts > 1 and answer.status == 409 and self._stored(spec):
            answer = Answer(201, {"ok": True, "job_id": spec.id})
        return replace(answer, attempts=attempts)

    def _stored(self, spec: JobSpec) -> bool:
        """Whether the job stored under ``spec.id`` is ``spec`` (an earlier
        attempt's), waiting a little for its record to be written."""
        mine = _comparable(json.loads(encode(spec)))
        for poll in range(round(_STORED_WAIT_S / _STORED_POLL_S) + 1):
            if poll:
                self.sleep(_STORED_POLL_S)
            # a spec of the default tenant is the caller's (the gateway sets it)
            tenant = None if spec.tenant == DEFAULT_TENANT else spec.tenant
            response = self._call("GET", f"/jobs/{spec.id}", params=_params(tenant=tenant))
            if response.status_code == 200:
                stored = _comparable(_json(response).get("spec", {}))
                if mine.get("tenant") == DEFAULT_TENANT:  # the gateway set the caller's
                    stored["tenant"] = DEFAULT_TENANT
                return stored == mine
        return False

    def submit_raw(self, body: bytes) -> Answer:
        headers = {"Content-Type": "application/json"}
        return self._answer(self._call("POST", "/jobs", content=body, headers=headers))

    def cancel(self, job_id: str, reason: str = "", tenant: str | None = None) -> Answer:
        """Cancel ``job_id`` (of ``tenant``, an admin's choice; None: the
        caller's own, or for an admin the ``default`` tenant's)."""
        params = _params(reason=reason or None, tenant=tenant)
        return self._answer(self._call("DELETE", f"/jobs/{job_id}", params=params))

    def hold(self, job_id: str, reason: str = "", release: bool = False,
             tenant: str | None = None) -> Answer:
        """Hold a waiting job out of every plan, or (``release``) lift the hold."""
        params = _params(reason=reason or None, tenant=tenant)
        verb = "release" if release else "hold"
        return self._answer(self._call("POST", f"/jobs/{job_id}/{verb}", params=params))

    def jobs_page(self, query: JobsQuery, limit: int, cursor: str | None = None) -> dict[str, Any]:
        """One page of ``GET /jobs``."""
        params = {"phase": query.phase, "tenant": query.tenant, "cursor": cursor}
        chosen = {k: v for k, v in params.items() if v is not None}
        return self._get("/jobs", {**chosen, "limit": str(limit)})

    def jobs(self, query: JobsQuery | None = None) -> dict[str, Any]:
        """The jobs matching ``query``, following ``next_cursor`` page after
        page until ``query.limit`` jobs are in (all of them without a limit).
        The answer has the page's shape: ``next_cursor`` is where the
        listing would go on, None when nothing is left out."""
        query = query or JobsQuery()
        jobs: list[Any] = []
        body: dict[str, Any] = {}
        cursor: str | None = None
        while query.limit is None or len(jobs) < query.limit:
            want = PAGE if query.limit is None else min(PAGE, query.limit - len(jobs))
            body = self.jobs_page(query, want, cursor)
            jobs += body.get("jobs", [])
            if body.get("next_cursor") in (None, cursor):  # the same again would loop
                break
            cursor = body["next_cursor"]
        return {"jobs": jobs, "count": len(jobs), "total": body.get("total", len(jobs)),
                "next_cursor": body.get("next_cursor")}

    def job(self, job_id: str, tenant: str | None = None) -> dict[str, Any]:
        """``GET /jobs/{id}``: the record, its reason, last stop, forecast and conditions."""
        return self._get(f"/jobs/{job_id}", _params(tenant=tenant))

    def final_params(self, job_id: str, tenant: str | None = None) -> bytes:
        """``GET /jobs/{id}/params``: a task job's final parameters, as its
        aggregator saved them (``hops.aggregator.codec.decode_params`` reads
        them); :class:`GatewayError` ``no_final_params`` for a job without."""
        response = self._call("GET", f"/jobs/{job_id}/params", params=_params(tenant=tenant))
        if response.status_code != 200:
            raise GatewayError.of(response, _json(response))
        return response.content

    def timeline(self, job_id: str, tenant: str | None = None,
                 limit: int | None = None) -> dict[str, Any]:
        """``GET /jobs/{id}/timeline``: the job's history, oldest first."""
        return self._get(f"/jobs/{job_id}/timeline",
                         _params(tenant=tenant, limit=None if limit is None else str(limit)))

    def log_lines(self, job_id: str, tenant: str | None = None, rank: int | None = None,
                  since: str | None = None, tail: int | None = None,
                  follow: bool = False) -> Iterator[dict[str, Any]]:
        """``GET /jobs/{id}/logs``: each line as it comes (``follow``: until
        the job has ended and its output is drained)."""
        params = _params(tenant=tenant, since=since, rank=None if rank is None else str(rank),
                         tail=None if tail is None else str(tail),
                         follow="true" if follow else None)
        timeout = httpx.Timeout(self._http.timeout.connect, read=None if follow else 60.0)
        try:
            with self._http.stream("GET", f"/jobs/{job_id}/logs", params=params,
                                   timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    raise GatewayError.of(response, _json(response))
                for line in response.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.TransportError as e:
            raise GatewayUnreachable(f"the Hops gateway at {self.base_url} stopped answering "
                                     f"({str(e) or type(e).__name__})") from None

    def remove_node(self, server_id: str, force: bool = False, reason: str = "") -> Answer:
        params = {"force": "true" if force else "false", "reason": reason}
        return self._answer(self._call("DELETE", f"/nodes/{server_id}", params=params))

    def drain_node(self, server_id: str, drain: bool = True, move: bool = False,
                   reason: str = "") -> Answer:
        """Drain the node (``move``: its jobs move at the next round), or undrain it."""
        body = {"move": move, "reason": reason} if drain else {"reason": reason}
        verb = "drain" if drain else "undrain"
        return self._answer(self._call("POST", f"/nodes/{server_id}/{verb}", json=body))

    def signatures(self) -> dict[str, Any]:
        """``GET /signatures``: the shared profiles, per signature."""
        return self._get("/signatures")

    def reprofile_signature(self, signature: str, gpu_types: Sequence[str] = (),
                            reason: str = "") -> Answer:
        """Mark ``signature``'s shared profiles stale on ``gpu_types`` (none: all)."""
        body = {"gpu_types": list(gpu_types), "reason": reason}
        return self._answer(self._call("POST", f"/signatures/{signature}/reprofile", json=body))

    def queue(self) -> dict[str, Any]:
        return self._get("/queue")

    def cluster(self) -> dict[str, Any]:
        return self._get("/cluster")

    def tenants(self) -> dict[str, Any]:
        return self._get("/tenants")

    def reload_tenants(self) -> Answer:
        """Reload the tenants file everywhere (``POST /tenants/reload``)."""
        return self._answer(self._call("POST", "/tenants/reload"))


def _params(**values: str | None) -> dict[str, str] | None:
    """The query parameters that are set (None: none)."""
    chosen = {k: v for k, v in values.items() if v is not None}
    return chosen or None


def _seconds(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (its HTTP-date form is not used here)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's JSON without ``submit_time``, which the scheduler sets."""
    return {k: v for k, v in spec.items() if k != "submit_time"}


def _json(response: httpx.Response) -> dict[str, Any]:
    """The body as a gateway writes it; anything else (an HTML error page, a
    JSON value of another shape) becomes an ``error`` that says so in one
    sentence instead of being printed as it came."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and (response.is_success or isinstance(body.get("error"), str)):
        return body
    if response.is_success:
        raise GatewayError(response.status_code, "", f"{response.url} {_NOT_A_GATEWAY}")
    return {**(body if isinstance(body, dict) else {}), "error": _error_text(response, {})}


_NOT_A_GATEWAY = "answered with something a Hops gateway never sends; is it the gateway's address?"


def _error_text(response: httpx.Response, body: Mapping[str, Any]) -> str:
    if isinstance(body.get("error"), str) and body["error"]:
        return str(body["error"])
    return f"{response.url} {_NOT_A_GATEWAY}"


# --- the rendering of an answer ---------------------------------------------------


def render_answer(what: str, answer: Answer, verb: str = "accepted") -> str:
    """One line per submitted or cancelled job."""
    if answer.ok:
        tries = f" (attempt {answer.attempts})" if answer.attempts > 1 else ""
        return f"{what}: {verb}{tries}"
    code = answer.body.get("code", "")
    error = answer.body.get("error", "")
    return f"{what}: rejected ({answer.status}{f' {code}' if code else ''}): {error}"
