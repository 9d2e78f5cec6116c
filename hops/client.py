"""What ``hops submit/jobs/queue/nodes/cancel`` use: an HTTP client of the
gateway (:mod:`gateway.app`) and plain-text renderings of its answers.

The gateway's address comes from ``--gateway`` or ``HOPS_GATEWAY_URL``
(default ``http://127.0.0.1:8080``, where ``hops up`` puts it). When nothing
answers there, :class:`GatewayUnreachable` says so and how to point
elsewhere, rather than a connection traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from shared.events import SubmitJob, encode
from shared.job import JobSpec

DEFAULT_GATEWAY = "http://127.0.0.1:8080"
GATEWAY_ENV = "HOPS_GATEWAY_URL"


class GatewayUnreachable(Exception):
    """No gateway answers at the URL."""


class GatewayError(Exception):
    """The gateway answered with an error status."""

    def __init__(self, status: int, code: str, error: str) -> None:
        super().__init__(f"{status} {code}: {error}" if code else f"{status}: {error}")
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Answer:
    """A submit or cancel answer: the HTTP status and the JSON body."""

    status: int
    body: Mapping[str, Any]

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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

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
        return Answer(response.status_code, _json(response))

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        response = self._call("GET", path, params=params)
        body = _json(response)
        if response.status_code != 200:
            raise GatewayError(
                response.status_code, str(body.get("code", "")), str(body.get("error", body))
            )
        return body

    def submit(self, spec: JobSpec) -> Answer:
        data = encode(SubmitJob(spec=spec))
        headers = {"Content-Type": "application/json"}
        return self._answer(self._call("POST", "/jobs", content=data, headers=headers))

    def submit_raw(self, body: bytes) -> Answer:
        headers = {"Content-Type": "application/json"}
        return self._answer(self._call("POST", "/jobs", content=body, headers=headers))

    def cancel(self, job_id: str, reason: str = "") -> Answer:
        params = {"reason": reason} if reason else None
        return self._answer(self._call("DELETE", f"/jobs/{job_id}", params=params))

    def jobs(self, phase: str | None = None) -> dict[str, Any]:
        return self._get("/jobs", {"phase": phase} if phase else None)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._get(f"/jobs/{job_id}")

    def remove_node(self, server_id: str, force: bool = False, reason: str = "") -> Answer:
        params = {"force": "true" if force else "false", "reason": reason}
        return self._answer(self._call("DELETE", f"/nodes/{server_id}", params=params))

    def queue(self) -> dict[str, Any]:
        return self._get("/queue")

    def cluster(self) -> dict[str, Any]:
        return self._get("/cluster")


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"error": response.text[:500] or response.reason_phrase}
    return body if isinstance(body, dict) else {"value": body}


# --- renderings ------------------------------------------------------------------


def render_answer(what: str, answer: Answer, verb: str = "accepted") -> str:
    """One line per submitted or cancelled job."""
    if answer.ok:
        return f"{what}: {verb}"
    code = answer.body.get("code", "")
    error = answer.body.get("error", "")
    return f"{what}: rejected ({answer.status} {code}): {error}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def _gpus(config: Mapping[str, Any] | None) -> str:
    if not config:
        return "-"
    return " ".join(f"{sid}:{n}" for sid, n in config.get("parts", ()))


def _num(x: Any, digits: int = 3) -> str:
    if isinstance(x, str):  # "inf"/"nan" as the wire writes them
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def render_jobs(body: Mapping[str, Any]) -> str:
    jobs = body.get("jobs", [])
    if not jobs:
        return "no jobs"
    rows = []
    for j in jobs:
        total = j["spec"]["total_samples"]
        done = 100.0 * float(j.get("samples_done", 0.0)) / total if total else 0.0
        rows.append(
            [j["job_id"], j["phase"], j["spec"]["model"], f"{done:.1f}%",
             _gpus(j.get("configuration")), str(j.get("restarts", 0)), j.get("reason", "")]
        )
    header = ["job", "phase", "model", "done", "gpus", "restarts", "reason"]
    return "\n".join(_table(header, rows))


def render_queue(body: Mapping[str, Any]) -> str:
    entries = body.get("entries", [])
    head = f"leader {body.get('leader') or '?'}, term {body.get('term', 0)}"
    if not entries:
        return f"{head}: no job waits"
    rows = [
        [str(i), e["job_id"], _num(e["priority"]), _num(e["latency_ratio"]),
         "yes" if e.get("in_window") else "no", e.get("phase", "")]
        for i, e in enumerate(entries, 1)
    ]
    header = ["#", "job", "priority", "latency ratio", "in window", "phase"]
    return "\n".join([head, *_table(header, rows)])


def render_nodes(body: Mapping[str, Any]) -> str:
    servers = body.get("servers", [])
    t = body.get("totals", {})
    if not servers:
        return "no servers registered"
    rows = [
        [s["id"], s["gpu_type"], str(s["gpus"]), str(s["used"]), str(s["free"]),
         "yes" if s["alive"] else "NO", " ".join(s.get("jobs", []))]
        for s in servers
    ]
    header = ["server", "gpu type", "gpus", "used", "free", "alive", "jobs"]
    lines = _table(header, rows)
    lines.append(
        f"{t.get('alive_servers', 0)}/{t.get('servers', 0)} servers alive; "
        f"GPUs {t.get('used', 0)} used, {t.get('free', 0)} free of {t.get('gpus', 0)} alive"
        + (f" ({t['lost_gpus']} more on lost servers)" if t.get("lost_gpus") else "")
    )
    for problem in ("unknown_servers", "double_booked"):
        if body.get(problem):
            lines.append(f"WARNING {problem.replace('_', ' ')}: {body[problem]}")
    return "\n".join(lines)
