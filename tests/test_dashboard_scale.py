"""The dashboard at scale, measured in a real browser (headless Chromium):
a gateway over a real nats-server holding 2,000 jobs on 64 servers of 8
GPUs (512 GPUs, every one held) and a queue of 1,744 waiting jobs with
reasons and forecasts (a responder on ``hops.v1.queue`` stands for the
scheduler leader). Each page's weight (the page and every asset it loads)
must stay under 500 KB, and its first paint come at all (within 5 s: a page
that hangs); the figures are printed, and the 1 s target of the first paint
is read from them on an idle machine, as a benchmark's figure is
(docs/dashboard.md): on the shared 2-core machine under load a paint of
0.4 s took over 1 s."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import uvicorn
from nats.aio.msg import Msg

from gateway.app import create_app
from services.runtime.natsd import EmbeddedNats
from shared import subjects
from shared.explain import JobForecast, Why
from shared.ids import JobId
from shared.records import QueueEntry, QueueView
from tests.browser import chromium, log_in
from tests.helpers import free_port
from tests.livestack import Bus, until
from tests.natsfix import nats_server, nats_url
from tests.test_gateway import gateway_settings, node, placement, record
from tests.test_gateway_explain import TENANTS

__all__ = ["nats_server", "nats_url"]  # fixtures

SERVERS, GPUS, JOBS, RUNNING = 64, 8, 2000, 256  # 256 jobs of 2 GPUs: all 512 held
PAINT_HANG_MS, WEIGHT_KB = 5000.0, 500.0
# The page's own timing: first contentful paint, and the bytes of the page
# and of every asset it loaded (the event stream, never finished, is left out;
# an asset from the browser's cache counts its size, not the 0 it transferred).
MEASURE = """
const paint = performance.getEntriesByType('paint').find(p => p.name === 'first-contentful-paint');
const nav = performance.getEntriesByType('navigation')[0];
const res = performance.getEntriesByType('resource').filter(r => !r.name.includes('/ui/events'));
return {paint: paint ? paint.startTime : null,
        bytes: nav.transferSize
               + res.reduce((n, r) => n + (r.transferSize || r.encodedBodySize), 0)};
"""


def queue_view() -> QueueView:
    now = time.time()
    why = Why(code="Resources", message="", layer="hops")
    entries = tuple(QueueEntry(
        job_id=JobId(f"j{i:04d}"), priority=1.0 / (i + 1), latency_ratio=1.0, in_window=True,
        why=why, position=n + 1, tenant_position=n + 1,
        forecast=JobForecast(job_id=JobId(f"j{i:04d}"), position=n + 1, tenant_position=n + 1,
                             start=now + 60 * n, start_lo=now + 50 * n, start_hi=now + 90 * n,
                             finish=now + 60 * n + 600, finish_lo=now + 50 * n + 500,
                             finish_hi=now + 90 * n + 900))
        for n, i in enumerate(range(RUNNING, JOBS)))
    return QueueView(entries=entries, at=now, leader="bench", term=1)


def seed(bus: Bus) -> None:
    """The records of 64 servers, 2,000 jobs and 256 placements, and the
    queue's responder."""
    js = bus.nc.jetstream()
    answer = msgspec.json.encode(queue_view())

    async def respond(msg: Msg) -> None:
        await msg.respond(answer)

    async def write() -> None:
        nodes = await js.key_value(subjects.KV_NODES)
        for s in range(SERVERS):
            await nodes.put(f"s{s:02d}", msgspec.json.encode(node(f"s{s:02d}", GPUS, order=s)))
        jobs, alloc = await js.key_value(subjects.KV_JOBS), await js.key_value(subjects.KV_ALLOC)
        for i in range(JOBS):
            phase = "running" if i < RUNNING else "queued"
            await jobs.put(f"j{i:04d}", msgspec.json.encode(record(f"j{i:04d}", phase, at=i)))
        for i in range(RUNNING):
            s, first = divmod(2 * i, GPUS)
            held = placement(f"j{i:04d}", {f"s{s:02d}": (first, first + 1)})
            await alloc.put(f"j{i:04d}", msgspec.json.encode(held))
        await bus.nc.subscribe(subjects.QUEUE, cb=respond)
        await bus.nc.flush()

    bus.call(write(), timeout=120)


@pytest.fixture
def gateway(nats_url: str) -> Iterator[str]:
    settings = dataclasses.replace(gateway_settings(nats_url), ui_sample_s=0.2)
    app = create_app(settings, tenants=TENANTS)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started, "the gateway serving", 30)
    bus = Bus(nats_url)
    try:
        seed(bus)
        yield f"http://127.0.0.1:{port}"
    finally:
        bus.close()
        server.should_exit = True
        thread.join(10)


def test_pages_paint_and_weigh_under_500_kb(
        gateway: str, nats_server: EmbeddedNats) -> None:
    browser = chromium()
    figures: dict[str, dict[str, Any]] = {}
    try:
        log_in(browser, gateway, "admin-token")
        for page in ("cluster", "queue", "jobs", "tenants"):
            browser.get(f"{gateway}/ui/{page}")
            until(lambda: browser.execute_script(MEASURE)["paint"] is not None,
                  f"{page}: a first paint", 10)
            figures[page] = browser.execute_script(MEASURE)
    finally:
        browser.quit()
    for page, f in figures.items():
        print(f"{page}: first paint {f['paint']:.0f} ms, {f['bytes'] / 1000:.1f} KB "
              f"({JOBS} jobs, {SERVERS * GPUS} GPUs)")
    for page, f in figures.items():
        assert f["paint"] <= PAINT_HANG_MS, (page, f)
        assert f["bytes"] <= WEIGHT_KB * 1000, (page, f)
