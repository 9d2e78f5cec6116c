"""``hops tenants``: the tenants' virtual clusters as a table (HiveD §3.1,
Figure 2, with the binding to servers users of HiveD asked for,
microsoft/pai#4932), from the gateway's ``GET /tenants``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HEADER = ("tenant", "chain", "cells (bound/reserved)", "bound cells -> servers", "used", "free",
          "bad", "opportunistic")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(HEADER, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*HEADER).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def _levels(chain: Mapping[str, Any]) -> str:
    return ", ".join(f"{lv['bound']}/{lv['reserved']} {lv['cell_type']}"
                     for lv in chain.get("levels", ())) or "-"


def _bound(chain: Mapping[str, Any]) -> str:
    parts = []
    for cell in chain.get("bound", ()):
        servers = " ".join(f"{s['server']}:{s['gpus']}" for s in cell.get("servers", ()))
        doomed = " DOOMED" if cell.get("doomed") else ""
        parts.append(f"{cell['address']} -> {servers}{doomed}")
    return "; ".join(parts) or "-"


def _opportunistic(view: Mapping[str, Any]) -> str:
    jobs = view.get("opportunistic_jobs", ())
    head = f"{view.get('opportunistic_gpus', 0)} GPUs"
    return f"{head} ({' '.join(jobs)})" if jobs else head


def rows_of(view: Mapping[str, Any]) -> list[list[str]]:
    """One row per chain of the tenant (one row when it reserves none)."""
    name = str(view["tenant"]) + (" (low-priority)" if view.get("low_priority") else "")
    chains = view.get("chains", ())
    if not chains:
        return [[name, "-", "-", "-", "-", "-", "-", _opportunistic(view)]]
    return [[name if i == 0 else "", c["gpu_type"], _levels(c), _bound(c), str(c["used_gpus"]),
             str(c["free_gpus"]), str(c["bad_gpus"]), _opportunistic(view) if i == 0 else ""]
            for i, c in enumerate(chains)]


def render_tenants(body: Mapping[str, Any]) -> str:
    records = body.get("tenants", [])
    if not records:
        return "no tenant views yet (the scheduler leader writes them when it plans)"
    first = records[0]
    head = f"leader {first.get('leader') or '?'}, term {first.get('term', 0)}"
    rows = [row for r in records for row in rows_of(r["view"])]
    return "\n".join([head, *_table(rows)])


def render_reload(body: Mapping[str, Any]) -> str:
    """``hops tenants reload``: one line per process that answered, then
    the refusal or the missing scheduler, when there is one."""
    lines = []
    for a in body.get("answers", []):
        who = f"{a.get('service', '?')} {a.get('replica', '?')}"
        tenants = ", ".join(a.get("tenants", [])) or "-"
        if a.get("ok"):
            lines.append(f"{who}: reloaded {a.get('source', '')}; tenants: {tenants}")
        else:
            lines.append(f"{who}: refused ({a.get('code', '')}): {a.get('error', '')}; "
                         f"keeps tenants: {tenants}")
    if not body.get("ok", False):
        lines.append(f"error ({body.get('code', '')}): {body.get('error', '')}")
    return "\n".join(lines)
