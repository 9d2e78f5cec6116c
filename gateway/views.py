"""The gateway's pure parts: how a bus reply becomes an HTTP status, the size
limit on request bodies, and the JSON views of jobs, the queue and the cluster.

Nothing here does I/O; :mod:`gateway.app` is the shell that calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, get_args

import msgspec

from gateway.pages import JobQuery, select
from shared.events import INTERNAL, INVALID, MALFORMED, TOO_LARGE, UNKNOWN_TYPE, Reply
from shared.jobkeys import local_id
from shared.records import JobPhase, JobRecord, NodeRecord, Placement
from shared.resources import NOTHING, RESOURCE_NAMES, total
from shared.wire import FORBIDDEN, NOT_PENDING, UNAUTHORIZED, UNSCHEDULABLE

PHASES: tuple[str, ...] = get_args(JobPhase)

# Codes the services add to the contract's own (docs/events.md).
CONFLICT = "conflict"
DUPLICATE = "duplicate"
NOT_FOUND = "not_found"
# Codes the gateway itself answers with.
UNAVAILABLE = "unavailable"
BAD_GATEWAY = "bad_gateway"

# Seconds a client should wait before it retries a 503 (``Retry-After``). A 503
# means that no scheduler answered in time: the replica that held the request
# died (another replica admits the retry at once), all of them are restarting
# (1 s under ``hops up`` and compose), or NATS is reconnecting (the clients
# retry every second). A submission is safe to retry: its job id makes it
# idempotent.
RETRY_AFTER_S = 1

# A failed reply's code -> HTTP status. Bad input is the client's fault (4xx);
# a failure inside the service that answered is the upstream's (502).
_STATUS_OF_CODE: Mapping[str, int] = {
    MALFORMED: 400,
    UNKNOWN_TYPE: 400,
    INVALID: 422,
    UNSCHEDULABLE: 422,  # fits no GPU type of the registered cluster
    TOO_LARGE: 413,
    CONFLICT: 409,
    DUPLICATE: 409,
    NOT_PENDING: 409,  # a hold of a running job
    NOT_FOUND: 404,
    UNAUTHORIZED: 401,
    FORBIDDEN: 403,  # e.g. a command from a tenant that may not run commands
    INTERNAL: 502,
    UNAVAILABLE: 503,
    BAD_GATEWAY: 502,
}


def reply_status(reply: Reply, ok_status: int = 200) -> int:
    """The HTTP status for a submit/cancel reply: ``ok_status`` when it
    succeeded, else the status of its code (502 for a code the gateway does
    not know: the service answered something it should not have)."""
    if reply.ok:
        return ok_status
    return _STATUS_OF_CODE.get(reply.code, 502)


def reply_body(reply: Reply) -> dict[str, Any]:
    """The JSON body for a submit/cancel reply."""
    if reply.ok:
        return {"ok": True, "job_id": reply.job_id}
    return {"ok": False, "job_id": reply.job_id, "code": reply.code, "error": reply.error}


def node_reply_body(reply: Reply) -> dict[str, Any]:
    """The JSON body for a node removal reply."""
    if reply.ok:
        return {"ok": True, "server_id": reply.server_id}
    return {"ok": False, "server_id": reply.server_id, "code": reply.code, "error": reply.error}


def error_body(code: str, error: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "error": error}


# The OpenAPI schema of :func:`error_body`.
ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "required": ["ok", "code", "error"],
    "properties": {
        "ok": {"type": "boolean", "const": False},
        "code": {"type": "string", "description": "e.g. invalid, not_found, unavailable"},
        "error": {"type": "string", "description": "what went wrong, as a sentence"},
    },
}


def declared_too_large(content_length: str | None, limit: int) -> bool:
    """Whether a ``Content-Length`` header announces more than ``limit`` bytes
    (a malformed header is left to the body read, which counts for itself)."""
    if content_length is None:
        return False
    try:
        return int(content_length) > limit
    except ValueError:
        return False


def too_large_error(size: int | None, limit: int) -> str:
    """Why a body is refused; ``size`` is None when it came without a
    ``Content-Length`` (chunked) and reading stopped at the limit."""
    if size is None:
        return f"request body is larger than the limit of {limit} bytes"
    return f"request body of {size} bytes is larger than the limit of {limit} bytes"


def nats_error(exc: Exception) -> str:
    """Why a read of NATS failed, as a sentence (nats-py's texts are terse,
    e.g. ``nats: timeout``, and some exceptions have none)."""
    detail = str(exc).removeprefix("nats: ").strip() or type(exc).__name__
    return f"the gateway could not read from NATS ({detail}); try again once NATS is back"


def route_error(status: int, method: str, path: str) -> str:
    """Why the gateway refused a request before any endpoint ran."""
    if status == 404:
        return f"the gateway has no endpoint {path} (its endpoints are listed at /docs)"
    if status == 405:
        return f"{path} does not accept {method} (its methods are listed at /docs)"
    return f"the gateway could not serve {method} {path} (HTTP {status})"


def code_of_status(status: int) -> str:
    """The error code of a status the gateway answers without a reply."""
    return {404: NOT_FOUND, 405: "method_not_allowed"}.get(status, INVALID)


def parameter_error(errors: Sequence[Mapping[str, Any]]) -> str:
    """One sentence for the first parameter FastAPI refused, e.g.
    ``limit=0 is invalid: input should be greater than or equal to 1``."""
    if not errors:
        return "the request's parameters are invalid"
    first = errors[0]
    name = str(first.get("loc", ("", "parameter"))[-1])
    message = str(first.get("msg", "invalid value"))
    message = message[:1].lower() + message[1:]
    if "input" not in first:
        return f"{name} is invalid: {message}"
    return f"{name}={first['input']!r} is invalid: {message}"


def check_phase(phase: str | None) -> str | None:
    """``phase`` if it is a job phase (or None); ValueError naming the phases otherwise."""
    if phase is None or phase in PHASES:
        return phase
    raise ValueError(f"unknown phase {phase!r}; expected one of: {', '.join(PHASES)}")


def jsonable(obj: Any) -> Any:
    """``obj`` as JSON-ready builtins, with infinities and NaN written as the
    strings ``"inf"``, ``"-inf"`` and ``"nan"`` as on the wire (docs/events.md)."""
    return _finite(msgspec.to_builtins(obj))


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):  # a tuple as JSON writes it
        return [_finite(v) for v in obj]
    return obj


def job_times(record: JobRecord, now: float) -> dict[str, float]:
    """How long a job waited and ran, in seconds as of ``now``, from the
    record's times (as Slurm's pending time and elapsed time):

    - ``waited_s``: from ``submitted_at`` to ``first_start`` (profiling
      included); for a job that has not started, to its end or to ``now``;
    - ``ran_s``: from ``first_start`` to ``finished_at`` or ``now``, the
      time back in the queue after a preemption included (``restarts`` says
      how often it was started); 0 for a job that never started.
    """
    end = now if record.finished_at is None else record.finished_at
    started = record.first_start
    waited = (end if started is None else started) - record.submitted_at
    ran = 0.0 if started is None else end - started
    return {"waited_s": max(0.0, waited), "ran_s": max(0.0, ran)}


def job_view(record: JobRecord, now: float) -> dict[str, Any]:
    """One ``hops_jobs`` record for the API: its fields plus ``job_id`` and
    :func:`job_times` as of ``now``. The job is named by the id its owner
    gave it, in ``job_id`` and ``spec.id`` alike, and its tenant is
    ``spec.tenant``: the key's tenant part is never shown
    (:mod:`shared.jobkeys`)."""
    job_id = local_id(record.job_id)
    body: dict[str, Any] = {"job_id": job_id}
    body.update(jsonable(record))
    body["spec"]["id"] = job_id
    body.update(job_times(record, now))
    return body


def jobs_view(records: Iterable[JobRecord], now: float, query: JobQuery | None = None,
              extra: Callable[[JobRecord], Mapping[str, Any]] | None = None
              ) -> dict[str, Any]:
    """One page of the records that match ``query`` (:mod:`gateway.pages`),
    each as :func:`job_view` as of ``now`` with the fields ``extra`` adds
    (the gateway: its reason, :func:`gateway.explain_view.list_fields`)."""
    page, total, cursor = select(records, query or JobQuery())
    jobs = [{**job_view(r, now), **(extra(r) if extra is not None else {})} for r in page]
    return {"jobs": jobs, "count": len(page), "total": total, "next_cursor": cursor}


def cluster_view(nodes: Sequence[NodeRecord], placements: Sequence[Placement]) -> dict[str, Any]:
    """Servers in adjacency order, each GPU with the job holding it, and totals.

    A placement naming a server that never registered is listed under
    ``unknown_servers``; a GPU booked by two jobs (which the placer must never
    do) is listed under ``double_booked``, so that an operator sees it.
    """
    holders: dict[str, dict[int, list[Placement]]] = {}
    for p in placements:
        for sid, indices in p.gpu_indices.items():
            for i in indices:
                holders.setdefault(sid, {}).setdefault(i, []).append(p)
    known = {n.server.id for n in nodes}
    servers = [
        _server_view(n, holders.get(n.server.id, {}),
                     [p for p in placements if n.server.id in p.configuration.servers])
        for n in sorted(nodes, key=lambda n: (n.order, n.server.id))
    ]
    double = [
        {"server_id": sid, "gpu": i, "jobs": sorted(p.job_id for p in ps)}
        for sid, by_gpu in sorted(holders.items())
        for i, ps in sorted(by_gpu.items())
        if len(ps) > 1
    ]
    unknown = {
        sid: sorted({p.job_id for ps in by_gpu.values() for p in ps})
        for sid, by_gpu in sorted(holders.items())
        if sid not in known
    }
    return {
        "servers": servers,
        "totals": _totals(servers, len(placements)),
        "unknown_servers": unknown,
        "double_booked": double,
    }


def node_state(node: NodeRecord) -> str:
    """``lost``, ``drained`` (alive, no new work: ``hops nodes drain``) or ``alive``."""
    if not node.alive:
        return "lost"
    return "drained" if node.drained else "alive"


def _server_view(node: NodeRecord, by_gpu: Mapping[int, list[Placement]],
                 held_here: Sequence[Placement]) -> dict[str, Any]:
    """One server: its GPUs with their holders, and per resource (GPUs, CPU
    cores, memory in MiB) its ``capacity`` and what placements hold on it.
    ``cores_used``/``cores_free`` and ``memory_mb_used``/``memory_mb_free``
    say the same of cores and memory as ``used``/``free`` of GPUs (free is 0
    on a lost server, and where the server declares none); ``jobs`` lists
    the jobs holding its GPUs and those placed here without any (CPU jobs)."""
    s = node.server
    gpus = [
        {"index": i, "job_id": by_gpu[i][0].job_id, "mode": by_gpu[i][0].mode}
        if i in by_gpu
        else {"index": i, "job_id": None, "mode": None}
        for i in range(s.gpus)
    ]
    used = sum(1 for g in gpus if g["job_id"] is not None)
    held = total(p.configuration.demand_on(s.id) for p in held_here)
    free = s.capacity.minus(held) if node.alive else NOTHING
    return {
        "id": s.id,
        "gpu_type": s.gpu_type,
        "gpus": s.gpus,
        "used": used,
        "free": s.gpus - used if node.alive else 0,
        "alive": node.alive,
        "state": node_state(node),
        "drained": node.drained,
        "drain_move": node.drain_move,
        "order": node.order,
        "model": s.model,
        "last_heartbeat": node.last_heartbeat,
        "jobs": sorted({g["job_id"] for g in gpus if g["job_id"] is not None}
                       | {p.job_id for p in held_here if not p.gpu_indices.get(s.id)}),
        "cores": s.cores,
        "cores_used": held.cores,
        "cores_free": free.cores,
        "memory_mb": s.capacity.memory_mb,
        "memory_mb_used": held.memory_mb,
        "memory_mb_free": free.memory_mb,
        "gpu_slots": gpus,
        "capacity": {r: s.capacity[r] for r in RESOURCE_NAMES},
        "allocated": {r: held[r] for r in RESOURCE_NAMES},
    }


# Cores and memory totalled over the alive servers, as their GPUs are.
_EXTRA_TOTALS = ("cores", "cores_used", "cores_free", "memory_mb", "memory_mb_used",
                 "memory_mb_free")


def _totals(servers: Sequence[Mapping[str, Any]], placements: int) -> dict[str, Any]:
    """Totals over the servers; GPU counts are those of alive servers, as in
    the monitor's metrics (``hops_gpus_alive``, ``hops_gpus_used``), and a
    lost server's GPUs are counted apart (``lost_gpus``); so are cores and
    memory (:data:`_EXTRA_TOTALS`)."""
    by_type: dict[str, dict[str, int]] = {}
    for s in servers:
        t = by_type.setdefault(s["gpu_type"], {"gpus": 0, "used": 0, "free": 0, "lost_gpus": 0})
        if s["alive"]:
            t["gpus"] += s["gpus"]
            t["used"] += s["used"]
            t["free"] += s["free"]
        else:
            t["lost_gpus"] += s["gpus"]
    alive = [s for s in servers if s["alive"]]
    return {
        "servers": len(servers),
        "alive_servers": len(alive),
        "lost_servers": len(servers) - len(alive),
        "gpus": sum(s["gpus"] for s in alive),
        "used": sum(s["used"] for s in alive),
        "free": sum(s["free"] for s in alive),
        "lost_gpus": sum(s["gpus"] for s in servers if not s["alive"]),
        **{key: sum(s[key] for s in alive) for key in _EXTRA_TOTALS},
        "placements": placements,
        "by_gpu_type": by_type,
    }
