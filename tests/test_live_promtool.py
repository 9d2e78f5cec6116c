"""A live scrape passes ``promtool check metrics`` (issue 35, item 3).

A live stack (:mod:`tests.livestack`: nats-server and every service as its
own process) runs two jobs to completion and refuses one that can never
run; the monitor's ``/metrics`` then shows the histograms and counters
those fed (queue wait, admission latency, plan solve time, jobs ended by
outcome, refusals by code, the booked share per GPU type), the scrape is
piped into Prometheus' own linter, which must find nothing, and every
query of the Grafana dashboard names a metric of that scrape.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until
from tests.test_monitor_observe import DASHBOARD, dashboard_metrics

CLUSTER = """\
name: promtool
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 2}
  - {id: titan-0, gpu_type: TitanXP, gpus: 2}
"""
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("promtool"), CLUSTER) as s:
        yield s


def scrape_text(stack: LiveStack) -> str:
    url = f"http://127.0.0.1:{stack.config.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def samples(text: str) -> dict[str, float]:
    """``{name[label=value,...]: value}``, labels sorted, summed over any left out."""
    return {s.name + "".join(f"[{k}={v}]" for k, v in sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def total(m: dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "["))


def test_a_live_scrape_passes_promtool_and_shows_what_ran(stack: LiveStack) -> None:
    assert PROMTOOL, "promtool is not installed: Debian's prometheus package (.ci/run installs it)"
    jobs = ["p-0", "p-1"]
    for job in jobs:
        reply = stack.submit(catalog_spec(job, 2_000_000, requirements=[1]))
        assert reply["ok"], reply
    refused = stack.submit(catalog_spec("p-big", 1000, requirements=[64]))
    assert not refused["ok"] and refused["code"] == "unschedulable", refused
    assert set(stack.wait_final(jobs, 120).values()) == {"finished"}

    def fed() -> dict[str, float] | None:
        m = samples(scrape_text(stack))
        done = (m.get("hops_jobs_finished_total[outcome=finished]") == 2
                and total(m, "hops_queue_wait_seconds_count") >= 2
                and m.get("hops_admission_latency_seconds_count", 0) >= 2
                and m.get("hops_plan_solve_seconds_count", 0) >= 1
                and m.get("hops_refusals_total[code=unschedulable]", 0) >= 1)
        return m if done else None

    m = until(fed, "the event-fed metrics", 30, stack.logs)
    assert set(m) >= {"hops_gpus_booked_ratio[gpu_type=RTX3090]",
                      "hops_gpus_booked_ratio[gpu_type=TitanXP]",
                      "hops_preemptions_total[rule=Fairness]"}

    text = scrape_text(stack)
    labels = {k for f in text_string_to_metric_families(text) for s in f.samples for k in s.labels}
    assert not labels & {"job", "job_id"}, labels
    lint = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, text=True,
                          capture_output=True, timeout=60, check=False)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (
        lint.stdout, lint.stderr)

    names = {f.name + "_total" if f.type == "counter" else f.name
             for f in text_string_to_metric_families(text)}
    missing = dashboard_metrics(json.loads(DASHBOARD.read_text())) - names
    assert not missing, sorted(missing)
