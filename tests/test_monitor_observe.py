"""The monitor's event-fed metrics (issue 35, item 3): what
:mod:`services.monitor.observe` makes of job events, plans, receipts,
forecasts and error records, as ``prometheus_client`` exposes it in the
monitor's own registry; and the Grafana dashboard's every query names a
metric the monitor exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.monitor import observe as ob
from services.monitor.instruments import Instruments
from services.monitor.metrics import (
    LatencyBook,
    cluster_metrics,
    refused_family,
    skipped_family,
    to_prometheus,
)
from shared import events as ev
from shared.configuration import Configuration
from shared.explain import Receipt, TimelineEntry
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import JobRecord
from shared.snapshot import Plan

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "hops.json"
J = JobId("acme/j1")
CONFIG = Configuration.of({"a": 1})


def spec(job: JobId = J, tenant: str = "acme") -> JobSpec:
    return JobSpec(job, "resnet18-cifar10", 32, 1000, 10**9, requirements=(1,), tenant=tenant)


def scrape(inst: Instruments) -> dict[str, float]:
    text = generate_latest(inst.registry).decode()
    return {s.name + "".join(f"[{v}]" for v in s.labels.values()): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_queue_wait_forecast_error_and_restarts_from_job_events() -> None:
    inst, watch = Instruments(CollectorRegistry()), ob.JobWatch()
    inst.apply(watch.on_job_event(ev.JobSubmitted(job_id=J, spec=spec(), at=100.0,
                                                  admission_s=0.004), None))
    watch.on_forecast(J, 130.0)
    inst.apply(watch.on_job_event(ev.JobStarted(job_id=J, configuration=CONFIG, at=142.0), None))
    inst.apply(watch.on_job_event(ev.JobStopped(job_id=J, at=150.0), None))
    watch.on_forecast(J, 500.0)  # a forecast after the first start is not the start's
    inst.apply(watch.on_job_event(ev.JobStarted(job_id=J, configuration=CONFIG, at=160.0), None))
    m = scrape(inst)
    assert m["hops_queue_wait_seconds_count[acme]"] == 1
    assert m["hops_queue_wait_seconds_sum[acme]"] == 42.0
    assert m["hops_queue_wait_seconds_bucket[60.0][acme]"] == 1
    assert m["hops_queue_wait_seconds_bucket[30.0][acme]"] == 0
    assert (m["hops_forecast_error_seconds_count"], m["hops_forecast_error_seconds_sum"]) == (
        1, 12.0)
    assert m["hops_restarts_total[acme]"] == 1
    assert (m["hops_admission_latency_seconds_count"],
            m["hops_admission_latency_seconds_sum"]) == (1, 0.004)
    inst.apply(watch.on_job_event(ev.JobFinished(job_id=J, at=200.0), None))
    assert J not in watch.submitted and J not in watch.started and not watch.forecasts


def test_a_start_without_its_submission_takes_the_record() -> None:
    watch = ob.JobWatch()
    record = JobRecord(spec=spec(tenant="beta"), submitted_at=10.0)
    out = watch.on_job_event(ev.JobStarted(job_id=J, configuration=CONFIG, at=70.0), record)
    assert out == [ob.Observation(ob.QUEUE_WAIT, "histogram", 60.0, (("tenant", "beta"),))]
    # an old admission stamped nothing: no admission latency
    assert watch.on_job_event(ev.JobSubmitted(job_id=J, spec=spec(), at=1.0), None) == []


def test_plans_receipts_and_refusals() -> None:
    inst = Instruments(CollectorRegistry())
    inst.apply(ob.on_plan(ev.PlanIssued(round=1, term=1, plan=Plan(), at=0.0, solve_s=0.2)))
    inst.apply(ob.on_plan(ev.PlanIssued(round=2, term=1, plan=Plan(), at=0.0)))  # older leader
    receipt = Receipt(job_id=J, at=5.0, rule="Fairness", message="gave its GPUs")
    inst.apply(ob.on_timeline(TimelineEntry(job_id=J, at=5.0, kind="stopped", receipt=receipt)))
    inst.apply(ob.on_timeline(TimelineEntry(job_id=J, at=5.0, kind="started")))
    for code, subject in (("forbidden", "hops.v1.nodes.register.a"),
                          ("unschedulable", "hops.v1.jobs.submit"),
                          ("invalid", "hops.v1.jobs.submit.acme"),
                          ("invalid", "kv.hops_jobs.x"),  # a bad record: no refusal
                          ("internal", "hops.v1.jobs.submit")):
        inst.apply(ob.on_error(ev.ErrorRecord(service="s", subject=subject, error="e",
                                              at=0.0, code=code)))
    m = scrape(inst)
    assert (m["hops_plan_solve_seconds_count"], m["hops_plan_solve_seconds_sum"]) == (1, 0.2)
    assert m["hops_preemptions_total[Fairness]"] == 1 and m["hops_preemptions_total[Drain]"] == 0
    assert (m["hops_refusals_total[forbidden]"], m["hops_refusals_total[unschedulable]"],
            m["hops_refusals_total[invalid]"]) == (1, 1, 1)
    assert "hops_refusals_total[internal]" not in m


def test_plan_issued_and_job_submitted_of_older_services_still_decode() -> None:
    plan = msgspec.json.encode({"type": "plan_issued", "round": 1, "term": 2,
                                "plan": {}, "at": 3.0})
    assert ev.decode_plan_event(plan).solve_s is None  # type: ignore[union-attr]
    sub = ev.JobSubmitted(job_id=J, spec=spec(), at=1.0)
    raw = msgspec.json.decode(ev.encode(sub))
    del raw["admission_s"]
    decoded = ev.decode_job_event(msgspec.json.encode(raw))
    assert isinstance(decoded, ev.JobSubmitted) and decoded.admission_s is None


def exported_names() -> set[str]:
    """Every series name the monitor exports: its registry's histograms and
    counters, and a scrape's families (of an empty cluster: the names are
    the same whatever the cluster)."""
    families = [*to_prometheus([*cluster_metrics({}, {}, {}, LatencyBook(), {}, 0.0, 1.0),
                                refused_family({}), skipped_family({})]),
                *Instruments(CollectorRegistry()).registry.collect()]
    return {f.name + "_total" if f.type == "counter" else f.name for f in families}


def dashboard_metrics(dashboard: dict[str, object]) -> set[str]:
    """The metric names the dashboard's PromQL expressions name (a
    histogram's ``_bucket``, ``_sum`` and ``_count`` as the histogram)."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]  # type: ignore[attr-defined]
    assert exprs
    names = {n for e in exprs for n in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", e)
             if n.startswith("hops_")}
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    named = dashboard_metrics(dashboard)
    exported = exported_names()
    assert not named - exported, sorted(named - exported)
    for wanted in ("hops_queue_length", "hops_queue_wait_seconds", "hops_gpus_booked_ratio",
                   "hops_preemptions_total", "hops_refusals_total", "hops_plan_solve_seconds",
                   "hops_forecast_error_seconds"):
        assert wanted in named, wanted


def test_a_query_of_a_metric_not_exported_is_caught() -> None:
    bad = {"panels": [{"targets": [{"expr": "rate(hops_no_such_seconds_bucket[5m])"}]}]}
    assert dashboard_metrics(bad) - exported_names() == {"hops_no_such_seconds"}


def test_exported_families_follow_the_conventions() -> None:
    """Counters end in ``_total``, nothing else does; no job id is a label."""
    inst = Instruments(CollectorRegistry())
    for tenant in ("acme", "beta"):
        inst.apply(ob.JobWatch().on_job_event(ev.JobStarted(
            job_id=J, configuration=CONFIG, at=1.0), JobRecord(spec=spec(tenant=tenant),
                                                               submitted_at=0.0)))
    families = [*to_prometheus(cluster_metrics({}, {}, {}, LatencyBook(), {"x": 1}, 0.0, 1.0)),
                *inst.registry.collect()]
    for f in families:
        assert re.fullmatch(r"hops_[a-z0-9_]+", f.name), f.name
        assert f.name.endswith("_total") is False, f.name  # the client adds it to a counter's
        for sample in f.samples:
            assert sample.name.endswith("_total") == (f.type == "counter"), sample.name
            assert not {"job", "job_id"} & set(sample.labels), sample
