"""Plain-text tables of the gateway's listings for ``hops jobs``, ``hops
job``, ``hops queue`` and ``hops nodes`` (``GET /jobs``, ``/queue``,
``/cluster``); :mod:`cli.client` fetches them."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cli.jobs_view import duration, estimate, reason_of, when


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows under a header, each column as wide as its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def gpus_text(config: Mapping[str, Any] | None) -> str:
    """``server:GPUs`` per part, with ``+Nc`` where the part holds CPU cores
    (a CPU job's parts are ``server:0+Nc``)."""
    if not config:
        return "-"
    parts = config.get("parts", ())
    extras = list(config.get("extras", ())) + [{}] * len(parts)
    return " ".join(
        f"{sid}:{n}" + (f"+{e['cores']}c" if e.get("cores") else "")
        for (sid, n), e in zip(parts, extras, strict=False)
    )


def _num(x: Any, digits: int = 3) -> str:
    if isinstance(x, str):  # "inf"/"nan" as the wire writes them
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def render_jobs(body: Mapping[str, Any]) -> str:
    """The jobs as a table, in the order given; ``submitted`` in local time,
    ``waited`` and ``ran`` as :func:`gateway.views.job_times` defines them;
    ``limit`` (a job's ``time_limit``) when some job listed has one."""
    jobs = body.get("jobs", [])
    if not jobs:
        return "no jobs"
    limits = any(j["spec"].get("time_limit") is not None for j in jobs)
    rows = []
    for j in jobs:
        total = j["spec"]["total_samples"]
        done = 100.0 * float(j.get("samples_done", 0.0)) / total if total else 0.0
        rows.append(
            [j["job_id"], j["spec"].get("tenant", "-"), j["phase"], j["spec"]["model"],
             f"{done:.1f}%", gpus_text(j.get("configuration")), when(j.get("submitted_at")),
             duration(j.get("waited_s")), duration(j.get("ran_s")),
             *([duration(j["spec"].get("time_limit"))] if limits else []),
             str(j.get("restarts", 0)), reason_of(j)]
        )
    header = ["job", "tenant", "phase", "model", "done", "gpus", "submitted", "waited", "ran",
              *(["limit"] if limits else []), "restarts", "reason"]
    lines = table(header, rows)
    left = int(body.get("total", len(jobs))) - len(jobs)
    if body.get("next_cursor") and left > 0:
        lines.append(f"{len(jobs)} of {body['total']} jobs shown; raise --limit to see more")
    return "\n".join(lines)


def render_queue(body: Mapping[str, Any], now: float | None = None) -> str:
    """The waiting jobs in priority order; once the leader has forecast the
    queue, each job's position and its start and finish from ``now`` with
    their 10th-90th percentile intervals (``in 12m (8m–20m)``)."""
    entries = body.get("entries", [])
    head = f"leader {body.get('leader') or '?'}, term {body.get('term', 0)}"
    if not entries:
        return f"{head}: no job waits"
    at = time.time() if now is None else now
    forecast = any(e.get("position") or e.get("forecast") for e in entries)
    rows = [
        [str(i), e["job_id"], _num(e["priority"]), _num(e["latency_ratio"]),
         "yes" if e.get("in_window") else "no",
         *([str(e.get("position") or "-"), estimate(e.get("forecast"), "start", at),
            estimate(e.get("forecast"), "finish", at)] if forecast else []),
         e.get("phase", ""), reason_of(e)]
        for i, e in enumerate(entries, 1)
    ]
    header = ["#", "job", "priority", "latency ratio", "in window",
              *(["position", "start", "finish"] if forecast else []), "phase", "reason"]
    return "\n".join([head, *table(header, rows)])


def _held(server: Mapping[str, Any], what: str) -> str:
    """``used/free`` of ``what`` (cores, memory_mb) on a server; ``-`` where
    it declares none."""
    if not server.get(what):
        return "-"
    return f"{server.get(f'{what}_used', 0)}/{server.get(f'{what}_free', 0)}"


def _drain_state(server: Mapping[str, Any]) -> str:
    if not server.get("drained"):
        return "-"
    return "drained,move" if server.get("drain_move") else "drained"


def render_nodes(body: Mapping[str, Any]) -> str:
    """Servers with their GPUs, CPU cores and memory (MiB, where any server
    declares it) used and free, and who holds them."""
    servers = body.get("servers", [])
    t = body.get("totals", {})
    if not servers:
        return "no servers registered"
    memory = any(s.get("memory_mb") for s in servers)
    drained = any(s.get("drained") for s in servers)  # a state column only then
    rows = [
        [s["id"], s["gpu_type"], str(s["gpus"]), str(s["used"]), str(s["free"]),
         _held(s, "cores"), *([_held(s, "memory_mb")] if memory else []),
         "yes" if s["alive"] else "NO", *([_drain_state(s)] if drained else []),
         " ".join(s.get("jobs", []))]
        for s in servers
    ]
    header = ["server", "gpu type", "gpus", "used", "free", "cores used/free",
              *(["MiB used/free"] if memory else []), "alive",
              *(["state"] if drained else []), "jobs"]
    lines = table(header, rows)
    lines.append(
        f"{t.get('alive_servers', 0)}/{t.get('servers', 0)} servers alive; "
        f"GPUs {t.get('used', 0)} used, {t.get('free', 0)} free of {t.get('gpus', 0)} alive"
        + (f" ({t['lost_gpus']} more on lost servers)" if t.get("lost_gpus") else "")
        + (f"; CPU cores {t.get('cores_used', 0)} used, {t.get('cores_free', 0)} free of "
           f"{t['cores']}" if t.get("cores") else "")
    )
    for problem in ("unknown_servers", "double_booked"):
        if body.get(problem):
            lines.append(f"WARNING {problem.replace('_', ' ')}: {body[problem]}")
    return "\n".join(lines)
