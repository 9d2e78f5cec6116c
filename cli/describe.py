"""``hops describe JOB``: one job in full, as ``kubectl describe`` shows an
object, from the gateway's ``GET /jobs/{id}`` and ``GET
/jobs/{id}/timeline``: its spec and tenant, where it runs, its throughput
as estimated against as measured, why it waits, its forecast with the
10th-90th percentile interval and the what-if alternatives, its last stop,
its conditions and its timeline (docs/explain.md, "Where to look")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cli.jobs_view import duration, estimate, relative, when
from cli.tables import gpus_text, table

Body = Mapping[str, Any]
_LABEL = 14


def _line(label: str, value: Any) -> str:
    return f"{label + ':':<{_LABEL}}{value}"


def _indent(lines: Sequence[str]) -> list[str]:
    return [f"  {line}" for line in lines]


def _spec(job: Body) -> list[str]:
    spec = job.get("spec", {})
    needs = (f"{spec.get('cores', 0)} CPU cores" if spec.get("kind") == "cpu" else
             f"GPUs {', '.join(str(n) for n in spec.get('requirements', ())) or 'any'}")
    limit = spec.get("time_limit")
    return [
        _line("Name", job.get("job_id", "?")),
        _line("Tenant", spec.get("tenant", "-")),
        _line("Phase", job.get("phase", "?") + (" (held)" if job.get("held") else "")),
        _line("Model", f"{spec.get('model', '?')}, batch {spec.get('batch_size', '?')}, "
                       f"{spec.get('total_samples', '?')} samples"),
        _line("Requires", needs + (f", time limit {duration(limit)}" if limit else "")),
        _line("Submitted", f"{when(job.get('submitted_at'))} (waited "
                           f"{duration(job.get('waited_s'))}, ran {duration(job.get('ran_s'))}, "
                           f"restarts {job.get('restarts', 0)})"),
        _line("Placement", gpus_text(job.get("configuration"))),
    ]


def _progress(job: Body) -> str:
    total = job.get("spec", {}).get("total_samples") or 0
    done = float(job.get("samples_done", 0.0))
    return f"{done:.0f} of {total} samples ({100.0 * done / total:.1f}%)" if total else "-"


def _throughput(job: Body) -> str:
    t = job.get("throughput") or {}
    estimated, measured = float(t.get("estimated") or 0), float(t.get("measured") or 0)
    if not estimated and not measured:
        return "-"
    parts = [f"estimated {estimated:.4g} samples/s" if estimated else "estimated -",
             f"measured {measured:.4g} samples/s" if measured else "measured -"]
    if estimated and measured:
        parts.append(f"({100.0 * (measured - estimated) / estimated:+.0f}%)")
    return ", ".join(parts[:2]) + (f" {parts[2]}" if len(parts) > 2 else "")


def _reason(job: Body) -> str:
    why = job.get("why")
    if not why:
        return str(job.get("reason") or "-")
    layer = f" [{why['layer']}]" if why.get("layer") else ""
    return f"{why['code']}{layer}: {why.get('message', '')}"


def _forecast(job: Body, now: float) -> list[str]:
    f = job.get("forecast")
    if not f:
        return [_line("Forecast", "-")]
    place = (f"position {f.get('position')} ({f.get('tenant_position')} in its tenant)"
             if f.get("position") else "running")
    lines = [_line("Forecast", place),
             _line("  Start", estimate(f, "start", now)),
             _line("  Finish", estimate(f, "finish", now))]
    whatif = f.get("whatif") or []
    if whatif:
        lines.append("What-if:")
        lines += _indent([f"{w.get('kind')}: {w.get('message')} (start "
                          f"{relative(w['start'], now)}, finish {relative(w['finish'], now)})"
                          for w in whatif])
    return lines


def _receipt(job: Body) -> str:
    r = job.get("receipt")
    if not r:
        return "-"
    kept = (f"; kept {r.get('samples_kept', 0):.0f} of {r.get('total_samples', 0):.0f} samples"
            if r.get("total_samples") else "")
    resume = f"; resumes about {when(r['resume_at'])}" if r.get("resume_at") else ""
    return f"{r.get('rule')} at {when(r.get('at'))}: {r.get('message', '')}{kept}{resume}"


def _conditions(job: Body) -> list[str]:
    rows = [[c["type"], c["status"], c["reason"], when(c["since"]) if c.get("since") else "-",
             c.get("message", "")] for c in job.get("conditions", [])]
    if not rows:
        return ["Conditions:    -"]
    return ["Conditions:", *_indent(table(["type", "status", "reason", "since", "message"],
                                          rows))]


def entry_text(entry: Body) -> str:
    """One timeline entry's note, reason, receipt or forecast in a line."""
    why = entry.get("why")
    note = entry.get("note")
    # a reason's entry notes its message: said once, after its code
    said = why is not None and str(why.get("message", "")).startswith(str(note))
    parts = [str(note)] if note and not said else []
    if why:
        parts.append(f"{why['code']}: {why.get('message', '')}")
    if entry.get("receipt"):
        parts.append(f"{entry['receipt']['rule']}: {entry['receipt'].get('message', '')}")
    f = entry.get("forecast")
    if f:
        parts.append(f"position {f.get('position')}, start {when(f.get('start'))}, "
                     f"finish {when(f.get('finish'))}")
    return "; ".join(parts)


def _timeline(timeline: Body | None) -> list[str]:
    if timeline is None:
        return ["Timeline:      (not available from this gateway)"]
    entries = timeline.get("entries", [])
    if not entries:
        return ["Timeline:      -"]
    rows = [[when(e.get("at")), str(e.get("kind", "")), entry_text(e)] for e in entries]
    more = ["  (more entries: raise --limit)"] if timeline.get("truncated") else []
    return ["Timeline:", *_indent(table(["at", "kind", "what"], rows)), *more]


def render_describe(job: Body, timeline: Body | None, now: float) -> str:
    """The job (``GET /jobs/{id}``) and its timeline (None: the gateway
    serves none) as ``hops describe`` prints them, times relative to ``now``."""
    return "\n".join([
        *_spec(job),
        _line("Progress", _progress(job)),
        _line("Throughput", _throughput(job)),
        _line("Reason", _reason(job)),
        *_forecast(job, now),
        _line("Last stop", _receipt(job)),
        *_conditions(job),
        *_timeline(timeline),
    ])
