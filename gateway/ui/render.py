"""The dashboard's HTML, without I/O: each function takes the JSON views
the API answers (:mod:`gateway.views`, :mod:`gateway.explain_view`) and
returns markup. Every value is escaped (:func:`e`); pages stay compact
(no whitespace between rows) so that 2,000 jobs and 512 GPUs stay under
the page-weight budget (docs/dashboard.md)."""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Rows a table shows before its "more" control (the rest come a page at a time).
PAGE_ROWS = 200
NAV = (("cluster", "Cluster"), ("queue", "Queue"), ("jobs", "Jobs"), ("tenants", "Tenants"))


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(epoch: float | None) -> str:
    """``epoch`` as UTC ``HH:MM:SS`` (the day too when not today, and the year
    when not this year: a job behind one that never ends is forecast centuries
    out); ``-`` for none."""
    if not epoch or epoch <= 0:
        return "-"
    try:
        at = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    except (OverflowError, ValueError, OSError):  # a forecast beyond the calendar
        return "much later"
    today = datetime.datetime.now(datetime.UTC).date()
    if at.date() == today:
        return at.strftime("%H:%M:%S")
    return at.strftime("%m-%d %H:%M" if at.year == today.year else "%Y-%m-%d %H:%M")


def shell(title: str, page: str, who: str, body: str, on: str = "") -> str:
    """The page around ``body``: navigation, who is logged in, the assets."""
    nav = "".join(f'<a href="/ui/{p}"{" class=on" if p == page else ""}>{e(label)}</a>'
                  for p, label in NAV)
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{e(title)} · Hops</title>"
            '<meta name=viewport content="width=device-width,initial-scale=1">'
            '<link rel=stylesheet href="/ui/static/ui.css"></head>'
            f'<body data-page="{e(page)}" data-on="{e(on)}"><header><b>Hops</b>{nav}'
            f'<a href="/docs">API</a><span class=who>{e(who)} · '
            '<a href="/ui/logout">log out</a></span></header>'
            f"<main><h1>{e(title)}</h1>{body}</main>"
            '<script src="/ui/static/ui.js" defer></script></body></html>')


def login_page(error: str = "", next_url: str = "/ui/cluster") -> str:
    err = f"<p class=err>{e(error)}</p>" if error else ""
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>Log in · Hops"
            '</title><link rel=stylesheet href="/ui/static/ui.css"></head><body><main class=login>'
            f"<h1>Hops</h1>{err}<form method=post action=/ui/login>"
            f'<input type=hidden name=next value="{e(next_url)}">'
            "<label>Token <input type=password name=token id=token autofocus required></label>"
            "<button type=submit id=login>Log in</button></form>"
            "<p class=hint>An admin's token is in <code>.hops/credentials/admin.token</code> "
            "after <code>hops up</code>; a tenant's is in the tenants file.</p>"
            "</main></body></html>")


def table(head: Sequence[str], rows: Iterable[str], tbody_id: str = "rows") -> str:
    cells = "".join(f"<th>{e(h)}</th>" for h in head)
    return (f'<table><thead><tr>{cells}</tr></thead><tbody id="{tbody_id}">'
            f'{"".join(rows)}</tbody></table>')


def more(shown: int, total: int, url: str) -> str:
    """The "more" control of a table that shows ``shown`` of ``total`` rows."""
    if shown >= total:
        return f"<p class=count>{total} rows</p>"
    return (f'<p class=count><span id=shown>{shown}</span> of {total} rows '
            f'<button id=more data-url="{e(url)}" data-offset="{shown}">more</button></p>')


# --- the cluster ---------------------------------------------------------------------


def plot(points: Sequence[tuple[float, float]], label: str, top: float) -> str:
    """A small inline SVG line of ``points`` (time, value) scaled to ``top``."""
    w, h = 300, 60
    if len(points) < 2 or top <= 0:
        return f"<figure><svg width={w} height={h}></svg><figcaption>{e(label)}: no samples yet" \
               "</figcaption></figure>"
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1e-9)
    path = " ".join(f"{(t - t0) / span * w:.1f},{h - min(v / top, 1) * (h - 2) - 1:.1f}"
                    for t, v in points)
    last = points[-1][1]
    return (f'<figure><svg width={w} height={h} viewBox="0 0 {w} {h}">'
            f'<polyline fill=none stroke=currentColor points="{path}"/></svg>'
            f"<figcaption>{e(label)}: {last:g} (max {top:g}), "
            f"{(t1 - t0) / 60:.0f} min</figcaption></figure>")


def gpu_cell(slot: Mapping[str, Any], admin: bool) -> str:
    job = slot.get("job_id")
    if job is None:
        return f'<i class=free title="GPU {slot["index"]}: free"></i>'
    if job == "(another tenant)":
        return f'<i class=other title="GPU {slot["index"]}: another tenant"></i>'
    tenant, _, local = str(job).rpartition("/")
    label = f"{local} ({tenant or 'default'})" if admin else str(job)
    return f'<i class=held title="GPU {slot["index"]}: {e(label)}">{e(local[:3])}</i>'


def server_row(s: Mapping[str, Any], admin: bool) -> str:
    gpus = "".join(gpu_cell(g, admin) for g in s["gpu_slots"])
    return (f'<tr data-id="{e(s["id"])}" class="{e(s["state"])}"><td>{e(s["id"])}</td>'
            f'<td>{e(s["gpu_type"])}</td><td class=state>{e(s["state"])}</td>'
            f'<td>{s["used"]}/{s["gpus"]}</td><td>{s["cores_used"]:g}/{s["cores"]:g}</td>'
            f"<td class=gpus>{gpus}</td></tr>")


def cluster_part(view: Mapping[str, Any], samples: Sequence[Any], admin: bool) -> str:
    totals = view["totals"]
    share = "".join(
        f"<tr><td>{e(t)}</td><td>{c['used']}/{c['gpus']}</td>"
        f"<td>{(c['used'] / c['gpus'] if c['gpus'] else 0):.0%}</td><td>{c['lost_gpus']}</td></tr>"
        for t, c in sorted(totals["by_gpu_type"].items()))
    top = max([s.gpus for s in samples] + [1])
    plots = (plot([(s.at, s.used) for s in samples], "GPUs in use", top)
             + plot([(s.at, s.waiting) for s in samples], "jobs waiting",
                    max([s.waiting for s in samples] + [1])))
    servers = table(("server", "type", "state", "GPUs", "cores", "holders"),
                    (server_row(s, admin) for s in view["servers"]))
    return (f"<p>{totals['alive_servers']} of {totals['servers']} servers alive, "
            f"{totals['used']} of {totals['gpus']} GPUs in use.</p>"
            f"<div class=plots>{plots}</div><h2>Booked share by GPU type</h2>"
            + table(("GPU type", "used", "share", "lost GPUs"), [share], "share")
            + f"<h2>Servers</h2>{servers}")


# --- jobs and the queue ----------------------------------------------------------------


def interval(mid: float, lo: float, hi: float) -> str:
    if not mid:
        return "-"
    return f'{when(mid)} <small>({when(lo)}–{when(hi)})</small>'


def span(forecast: Mapping[str, Any], what: str) -> str:
    """A forecast's ``start`` or ``finish`` with its 10th-90th percentile interval."""
    return interval(forecast.get(what, 0), forecast.get(f"{what}_lo", 0),
                    forecast.get(f"{what}_hi", 0))


def job_link(job_id: str, tenant: str, admin: bool) -> str:
    query = f"?tenant={e(tenant)}" if admin and tenant != "default" else ""
    return f'<a href="/ui/jobs/{e(job_id)}{query}">{e(job_id)}</a>'


def queue_row(q: Mapping[str, Any], job: Mapping[str, Any] | None, admin: bool) -> str:
    why = q.get("why") or {}
    fc = q.get("forecast") or {}
    tenant = (job or {}).get("spec", {}).get("tenant", "")
    local = str(q["job_id"]).rpartition("/")[2]
    needs = ",".join(str(n) for n in (job or {}).get("spec", {}).get("requirements", ()))
    return (f'<tr data-id="{e(q["job_id"])}" data-tenant="{e(tenant)}" data-phase="{e(q["phase"])}"'
            f' data-reason="{e(why.get("code", ""))}"><td>{q.get("position") or "-"}</td>'
            f"<td>{job_link(local, tenant, admin)}</td><td>{e(tenant)}</td>"
            f"<td class=phase>{e(q['phase'])}</td><td>{e(needs)}</td>"
            f'<td class=why title="{e(why.get("message", ""))}">'
            f'{e(why.get("code", q.get("reason")))}</td><td>{span(fc, "start")}</td>'
            f'<td>{span(fc, "finish")}</td></tr>')


QUEUE_HEAD = ("#", "job", "tenant", "phase", "GPUs", "reason", "start (10–90 %)",
              "finish (10–90 %)")
JOBS_HEAD = ("job", "tenant", "phase", "GPUs", "submitted", "reason")


def job_row(j: Mapping[str, Any], admin: bool) -> str:
    spec = j["spec"]
    why = j.get("why") or {}
    needs = ",".join(str(n) for n in spec.get("requirements", ())) or \
        f"{spec.get('cores', 0)} cores"
    row_id = j["key"] if admin else j["job_id"]
    return (f'<tr data-id="{e(row_id)}" data-tenant="{e(spec["tenant"])}"'
            f' data-phase="{e(j["phase"])}" data-reason="{e(why.get("code", ""))}">'
            f"<td>{job_link(j['job_id'], spec['tenant'], admin)}</td><td>{e(spec['tenant'])}</td>"
            f"<td class=phase>{e(j['phase'])}</td><td>{e(needs)}</td>"
            f"<td>{when(j.get('submitted_at'))}</td>"
            f'<td class=why title="{e(why.get("message", ""))}">{e(why.get("code", ""))}</td></tr>')


def filters(choices: Mapping[str, Iterable[str]], chosen: Mapping[str, str]) -> str:
    """The filter form (server side) and the search box (this page's rows)."""
    selects = "".join(
        f'<label>{e(name)} <select name="{e(name)}"><option value="">any</option>'
        + "".join(f'<option{" selected" if chosen.get(name) == v else ""}>{e(v)}</option>'
                  for v in sorted(set(values)) if v)
        + "</select></label>" for name, values in choices.items())
    return (f"<form class=filters method=get>{selects}<button>filter</button>"
            '<input id=q type=search placeholder="search these rows"></form>')


# --- one job ---------------------------------------------------------------------------


def dl(pairs: Iterable[tuple[str, Any]]) -> str:
    return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def job_part(job: Mapping[str, Any], timeline: Sequence[Mapping[str, Any]]) -> str:
    why, fc, receipt = job.get("why") or {}, job.get("forecast") or {}, job.get("receipt")
    tp = job.get("throughput") or {}
    conf = job.get("configuration") or {}
    head = dl((
        ("phase", f"<b id=phase>{e(job['phase'])}</b>"),
        ("reason", f"<span id=why>{e(why.get('code', '-'))}</span> {e(why.get('message', ''))}"),
        ("position", e(fc.get("position") or "-")),
        ("start", f"<span id=start>{span(fc, 'start')}</span>"),
        ("finish", span(fc, "finish")),
        ("placement", e(json.dumps(conf, separators=(",", ":"))) if conf else "-"),
        ("throughput", f"estimated {tp.get('estimated', 0):.3g}, measured "
                       f"{tp.get('measured', 0):.3g} samples/s"),
        ("progress", f"{job.get('samples_done', 0):.4g} of "
                     f"{job['spec'].get('total_samples', 0):.4g} samples"),
        ("restarts", e(job.get("restarts", 0))),
        ("last stop", e(json.dumps(receipt, separators=(",", ":"))) if receipt else "-"),
    ))
    whatif = table(("alternative", "start", "finish"), (
        f"<tr><td>{e(w.get('label') or w.get('kind') or w)}</td>"
        f"<td>{when(w.get('start'))}</td><td>{when(w.get('finish'))}</td></tr>"
        for w in fc.get("whatif", ()) if isinstance(w, dict)), "whatif")
    conds = table(("condition", "status", "reason", "message"), (
        f"<tr><td>{e(c['type'])}</td><td>{e(c['status'])}</td><td>{e(c.get('reason'))}</td>"
        f"<td>{e(c.get('message'))}</td></tr>" for c in job.get("conditions", ())), "conditions")
    steps = table(("at", "kind", "note"), (
        f"<tr><td>{when(t['at'])}</td><td>{e(t['kind'])}</td>"
        f"<td>{e(t.get('note') or (t.get('why') or {}).get('message', ''))}</td></tr>"
        for t in timeline), "timeline")
    return (f"{head}<h2>What if</h2>{whatif}<h2>Conditions</h2>{conds}"
            f"<h2>Timeline</h2>{steps}")


def job_page_body(job: Mapping[str, Any], part: str, logs_url: str) -> str:
    spec = json.dumps(job["spec"], indent=1)
    return (f'<div id=live data-part="?part=1">{part}</div><h2>Log</h2>'
            f'<pre id=logs data-url="{e(logs_url)}"></pre>'
            f"<details><summary>Spec</summary><pre>{e(spec)}</pre></details>")


# --- tenants -------------------------------------------------------------------------


def tenants_part(records: Sequence[Mapping[str, Any]], waiting: Mapping[str, int]) -> str:
    """Each tenant's cells per GPU type (HiveD's VC view) and its jobs: running
    guaranteed or opportunistic, and ``waiting`` (by tenant)."""
    waits = "".join(f"<li>{e(t)}: {n} waiting</li>" for t, n in sorted(waiting.items()))
    waits = f"<ul id=waiting>{waits}</ul>" if waits else "<p>No job waits.</p>"
    if not records:
        return "<p>No tenant views: the cluster has no cells (docs/tenancy.md), or no plan " \
               f"was made yet.</p>{waits}"
    rows = []
    for r in records:
        v = r["view"]
        for c in v.get("chains", ()):
            bound = ", ".join(f"{b.get('address', b)}" if isinstance(b, dict) else str(b)
                              for b in c.get("bound", ()))
            rows.append(
                f'<tr data-tenant="{e(v["tenant"])}"><td>{e(v["tenant"])}</td>'
                f'<td>{e(c["gpu_type"])}</td>'
                f"<td>{c['reserved_gpus']}</td><td>{c['used_gpus']}</td><td>{c['free_gpus']}"
                f"</td><td>{c['bad_gpus']}</td><td>{e(bound) or '-'}</td>"
                f"<td>{len(v.get('guaranteed_jobs', ()))}</td>"
                f"<td>{len(v.get('opportunistic_jobs', ()))} "
                f"({v.get('opportunistic_gpus', 0)} GPUs)</td></tr>")
    return table(("tenant", "GPU type", "reserved", "used", "free", "bad", "bound cells",
                  "guaranteed jobs", "opportunistic"), rows) + waits
