"""The live leader's explanations without I/O (scheduling/live/explain.py,
scheduling/live/forecasting.py, shared/explain_events.py): reasons of the
jobs the snapshot leaves out, hops_explain records, timeline entries, the
queue view and a tenant's feed, fed known reasons, receipts and forecasts."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import msgspec

from scheduling.cells import BoundCell, ChainView, ServerGpus, TenantView
from scheduling.forecast.calibration import MIN_RESIDUALS
from scheduling.forecast.tracking import Tracker, opened, resolved
from scheduling.live import explain as xp
from scheduling.live import forecasting
from scheduling.live.snapshot import queue_view
from scheduling.live.state import LiveJobRecord
from services.scheduler.forecast_worker import orphan_guard
from shared import events as ev
from shared.configuration import Configuration
from shared.explain import ANOTHER_TENANT, JobExplain, JobForecast, QueueForecast, Receipt, Why
from shared.explain_events import JobExplained, decode_feed, for_tenant
from shared.ids import GpuType, JobId, ServerId, TenantId
from shared.job import JobSpec
from shared.jobkeys import job_key, local_id
from shared.snapshot import Assignment, JobState, Plan, PlanReasons, Snapshot
from tests import test_forecast as fc
from tests.helpers import cluster, state

A1, A2, B1 = job_key("alice", "a1"), job_key("alice", "a2"), job_key("bob", "b1")


def record(job_id: str, phase: str = "queued", tenant: str = "default", **kw: object
           ) -> LiveJobRecord:
    spec = JobSpec(id=JobId(job_id), model="m", batch_size=32, params=10_000_000,
                   total_samples=1000, requirements=(1,), tenant=TenantId(tenant))
    return msgspec.structs.replace(LiveJobRecord(spec=spec, submitted_at=0.0), phase=phase, **kw)  # type: ignore[arg-type]


def forecast(job_id: str, start: float, position: int = 1) -> JobForecast:
    return JobForecast(job_id=JobId(job_id), position=position, tenant_position=position,
                       start=start, start_lo=start - 1, start_hi=start + 1, finish=start + 10,
                       finish_lo=start + 9, finish_hi=start + 11)


def test_jobs_the_snapshot_leaves_out_get_their_records_reason() -> None:
    codes = {
        "held": record("h", held=True),
        "tenant": record("t", reason="unknown_tenant: gone"),
        "unsched": record("u", reason="unschedulable: no type"),
        "new": record("n", phase="submitted"),
    }
    whys = {k: xp.record_why(r, 5.0) for k, r in codes.items()}
    assert {k: w.code if w else None for k, w in whys.items()} == {
        "held": "Held", "tenant": "Held", "unsched": "Unschedulable", "new": "Profiling"}
    assert xp.record_why(record("r", phase="running"), 5.0) is None
    assert xp.record_why(record("f", phase="finished"), 5.0) is None
    assert xp.record_why(record("q"), 5.0) is None  # the plan's reason says why


def test_a_reason_keeps_its_since_while_its_code_stays() -> None:
    snap = Snapshot(now=20.0, cluster=cluster([("A", 1, 1)]),
                    jobs=(state("q", [1]), state("r", [1])))
    plan = Plan(assignments=(Assignment(JobId("r"), Configuration(((ServerId("A-0"), 1),))),),
                reasons=PlanReasons("hops", why={
                    JobId("q"): Why(code="Priority", message="others first"),
                    JobId("r"): Why(code="Resources", message="stale")}))
    records = {JobId("q"): record("q"), JobId("r"): record("r", phase="running"),
               JobId("h"): record("h", held=True)}
    before = {JobId("q"): Why(code="Priority", message="x", since=3.0),
              JobId("h"): Why(code="Resources", message="y", since=4.0)}
    whys = xp.job_whys(plan, snap, records, before, 20.0)
    assert set(whys) == {"q", "h"}  # a job the plan runs has no reason
    assert (whys[JobId("q")].code, whys[JobId("q")].since) == ("Priority", 3.0)
    assert (whys[JobId("h")].code, whys[JobId("h")].since) == ("Held", 20.0)
    entries = xp.reason_entries(before, whys, 20.0)
    assert [(e.job_id, e.kind, e.why.code if e.why else "") for e in entries] == [
        ("h", "reason", "Held")]


def test_only_records_that_changed_beyond_their_time_are_written() -> None:
    src = xp.Sources(at=1.0, round=1, term=1, whys={JobId("a"): Why(code="Held", message="m")},
                     receipts={}, forecasts={JobId("b"): forecast("b", 50.0)})
    old = xp.explains([JobId("a"), JobId("b")], src)
    assert old[JobId("b")].forecast == forecast("b", 50.0) and old[JobId("a")].why
    later = msgspec.structs.replace(src, at=9.0, round=2, term=2)
    assert xp.changed(old, xp.explains([JobId("a"), JobId("b")], later)) == {}
    moved = msgspec.structs.replace(later, forecasts={JobId("b"): forecast("b", 80.0)})
    assert set(xp.changed(old, xp.explains([JobId("a"), JobId("b")], moved))) == {"b"}


def test_job_events_become_timeline_entries() -> None:
    config = Configuration(((ServerId("A-0"), 2),))
    kinds = [
        (ev.JobSubmitted(job_id=JobId("j"), spec=record("j").spec, at=1.0), "submitted"),
        (ev.JobProfiled(job_id=JobId("j"), gpu_types=(), at=2.0), "profiled"),
        (ev.JobStarted(job_id=JobId("j"), configuration=config, at=3.0), "started"),
        (ev.JobResized(job_id=JobId("j"), configuration=config, at=3.5), "started"),
        (ev.JobStopped(job_id=JobId("j"), at=4.0, reason="node lost"), "stopped"),
        (ev.JobHeld(job_id=JobId("j"), at=5.0), "held"),
        (ev.JobReleased(job_id=JobId("j"), at=6.0), "released"),
        (ev.JobCancelled(job_id=JobId("j"), at=7.0, reason="TimeLimit"), "cancelled"),
        (ev.JobFailed(job_id=JobId("j"), at=8.0), "failed"),
        (ev.JobFinished(job_id=JobId("j"), at=9.0), "finished"),
    ]
    for event, kind in kinds:
        entry = xp.event_entry(event)
        assert entry is not None and (entry.kind, entry.at) == (kind, event.at)
    started = xp.event_entry(kinds[2][0])
    assert started is not None and "A-0x2" in started.note
    ids = {xp.entry_id(e) for e in map(xp.event_entry, (k for k, _ in kinds)) if e}
    assert len(ids) == len(kinds)  # each its own message id; the same event the same id


def test_forecast_entries_on_the_first_forecast_and_moves_of_a_round() -> None:
    previous = {JobId("a"): forecast("a", 100.0), JobId("b"): forecast("b", 100.0)}
    new = QueueForecast(at=5.0, jobs=(forecast("a", 159.0), forecast("b", 160.0),
                                      forecast("c", 100.0)))
    moved = xp.forecast_entries(previous, new, round_s=60.0)
    assert [(e.job_id, e.kind) for e in moved] == [("b", "forecast"), ("c", "forecast")]


def test_a_receipt_resumes_at_the_jobs_forecast_start() -> None:
    receipt = Receipt(job_id=JobId("v"), at=3.0, rule="CellReclaim", message="reclaimed",
                      takers=(JobId("g"),))
    assert xp.with_resume(receipt, None).resume_at is None
    # a forecast made while it ran says when it started, not when it resumes
    assert xp.with_resume(receipt, forecast("v", 1.0, position=0)).resume_at is None
    resumed = xp.with_resume(receipt, forecast("v", 120.0))
    assert resumed.resume_at == 120.0
    assert xp.resumed({JobId("v"): receipt}, {JobId("v"): forecast("v", 120.0)}) == {
        JobId("v"): resumed}
    assert xp.resumed({JobId("v"): resumed}, {JobId("v"): forecast("v", 180.0)}) == {}
    entry = xp.receipt_entry(resumed)
    assert (entry.kind, entry.receipt, entry.note) == ("stopped", resumed, "reclaimed")


def test_the_queue_view_carries_each_jobs_reason_position_and_forecast() -> None:
    records = {JobId("q"): record("q", held=True), JobId("p"): record("p")}
    view = queue_view(PlanReasons("hops"), records, 1.0, "me", 3)
    explained = {JobId("p"): JobExplain(job_id=JobId("p"), at=1.0,
                                        why=Why(code="Priority", message="m"),
                                        forecast=forecast("p", 30.0, position=2))}
    filled = {e.job_id: e for e in xp.fill_queue(view, explained).entries}
    assert filled[JobId("p")].position == 2 and filled[JobId("p")].why is not None
    assert filled[JobId("p")].forecast == forecast("p", 30.0, position=2)
    assert filled[JobId("q")] == {e.job_id: e for e in view.entries}[JobId("q")]


def test_a_tenants_feed_names_another_tenants_job_as_such() -> None:
    tenants = {A1: "alice", A2: "alice", B1: "bob"}

    def visible(j: JobId) -> bool:
        return tenants.get(j) == "alice"

    why = Why(code="Priority", message="higher-priority jobs took its GPUs",
              jobs=(B1, A2), ratios=(2.0, 1.5))
    receipt = Receipt(job_id=A1, at=2.0, rule="Fairness", message="replanned",
                      takers=(B1, A2))
    for entry in (xp.reason_entries({}, {A1: why}, 1.0)[0], xp.receipt_entry(receipt)):
        shown = for_tenant(entry, visible, lambda j: JobId(local_id(j)))
        wire = ev.encode(shown)
        assert b"bob" not in wire and b"b1" not in wire, wire
        assert ANOTHER_TENANT in shown.text and "a2" in shown.text
        assert shown.job_id == "a1" and shown.entry.job_id == "a1"
        named = shown.entry.why.jobs if shown.entry.why else shown.entry.receipt.takers  # type: ignore[union-attr]
        assert named == (JobId("a2"),)
        assert decode_feed(wire) == shown  # told apart from the job events
    event = ev.JobFinished(job_id=JobId("a1"), at=1.0)
    assert not isinstance(decode_feed(ev.encode(event)), JobExplained)


def test_the_forecast_task_goes_to_the_worker_and_back_as_bytes() -> None:
    snap = Snapshot(now=20.0, cluster=cluster([("A", 1, 1)]), jobs=(state("q", [1]),),
                    layer_state={"hived": b"\x00\x01"})
    data = forecasting.task_bytes(snap, Plan(), 60.0, 7)
    task = msgspec.msgpack.decode(data, type=forecasting.ForecastTask)
    assert (task.snapshot, task.round_s, task.seed) == (snap, 60.0, 7)
    result = forecasting.decode_result(forecasting.run(data))
    assert isinstance(result, QueueForecast) and result.at == 20.0


def test_the_worker_calibrates_with_the_leaders_state_and_returns_both_forecasts() -> None:
    # one job waiting on a busy server (four rounds of work left on it)
    snap, plan = fc.full_cluster([JobState(spec=fc.spec("q", (4,), 4 * 100.0 * 600.0))],
                                 {}, running_s=240.0)
    plain = forecasting.decode_results(forecasting.run(
        forecasting.task_bytes(snap, plan, 60.0, 7)))
    assert plain.shown == plain.raw and plain.raw.jobs
    (q,) = [f for f in plain.raw.jobs if f.position]
    # a calibration whose every start came three rounds after its forecast
    t = Tracker()
    for _ in range(MIN_RESIDUALS):
        opened(t, msgspec.structs.replace(plain.raw, at=q.start - 60.0), started=())
        resolved(t, q.job_id, q.start + 120.0, finished=False, scale=60.0)
    out = forecasting.decode_results(forecasting.run(forecasting.task_bytes(
        snap, plan, 60.0, 7, calibration=t.calibration)))
    assert out.raw.jobs[1].start == q.start  # as the draws made it
    assert out.shown.jobs[1].start > q.start  # moved later by the calibration
    assert forecasting.decode_result(forecasting.run(forecasting.task_bytes(
        snap, plan, 60.0, 7, calibration=t.calibration))) == out.shown


def test_the_forecast_restricts_only_tenants_whose_cells_are_all_bound() -> None:
    def view(tenant: str, unbound: int, servers: tuple[str, ...], low: bool = False,
             ) -> TenantView:
        cells = tuple(BoundCell(address=f"{tenant}{i}", level=1, gpus=4, used_gpus=0,
                                bad_gpus=0, doomed=False,
                                servers=(ServerGpus(server=ServerId(s), gpus=4),))
                      for i, s in enumerate(servers))
        chain = ChainView(gpu_type=GpuType("A"), levels=(), bound=cells, reserved_gpus=8,
                          used_gpus=0, free_gpus=8, bad_gpus=0, unbound_gpus=unbound,
                          usable=())
        return TenantView(tenant=tenant, low_priority=low, weight=1.0, chains=(chain,),
                          guaranteed_jobs=(), opportunistic_jobs=(), opportunistic_gpus=0)

    got = forecasting.tenant_servers([view("alice", 0, ("n0", "n1")), view("bob", 4, ("n2",)),
                                      view("carol", 0, (), low=True)])
    assert got == {TenantId("alice"): frozenset({ServerId("n0"), ServerId("n1")})}


def test_the_forecast_runs_in_a_forkserver_pool_as_the_leader_runs_it() -> None:
    snap = Snapshot(now=20.0, cluster=cluster([("A", 1, 1)]), jobs=(state("q", [1]),))
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(1, mp_context=context, initializer=orphan_guard) as pool:
        out = pool.submit(forecasting.run, forecasting.task_bytes(snap, Plan(), 60.0, 1))
        assert forecasting.decode_result(out.result(timeout=60)).at == 20.0
