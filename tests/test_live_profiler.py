"""The profiler service as a real process: it checks profile reports against
the registered nodes and the job, and publishes the cumulative profiled types."""

from __future__ import annotations

import time

import msgspec

from scheduling.live.state import encode_record, new_record
from services.profiler.tracker import (
    TYPE_MISMATCH,
    UNKNOWN_GPU_TYPE,
    UNKNOWN_JOB,
    UNKNOWN_SERVER,
    ProfileTracker,
    check_report,
    profiled_msg_id,
)
from shared import events as ev
from shared import subjects
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ProfileReport
from tests.natsfix import nats_server, nats_url
from tests.test_live_scheduler import Bus, Stack, bus, eventually, job, stack

__all__ = ["bus", "nats_server", "nats_url", "stack"]  # fixtures


async def profiled(bus: Bus) -> list[tuple[str, tuple[str, ...]]]:
    """The ``job_profiled`` events the stream holds (a deduplicated publish
    still reaches plain subscribers, so the stream is what counts)."""
    info = await bus.js.stream_info("HOPS_JOBS")
    out = []
    first = info.state.first_seq if info.state.messages else info.state.last_seq + 1
    for seq in range(first, info.state.last_seq + 1):
        event = ev.decode_job_event((await bus.js.get_msg("HOPS_JOBS", seq)).data or b"")
        if isinstance(event, ev.JobProfiled):
            out.append((event.job_id, event.gpu_types))
    return out


async def test_reports_are_checked_and_profiles_accumulate(stack: Stack, bus: Bus) -> None:
    await bus.put_nodes()
    jobs = await bus.js.key_value(subjects.KV_JOBS)
    await jobs.put("j1", encode_record(new_record(job("j1"), time.time())))
    profiler = await stack.start("services.profiler")
    await profiler.wait_log("consuming profile reports")

    refused = [
        ("zz", "A", "j1", "unknown_server"),
        ("a0", "C", "j1", "unknown_gpu_type"),
        ("a0", "B", "j1", "type_mismatch"),
        ("a0", "A", "ghost", "unknown_job"),
    ]
    for server, gpu_type, job_id, code in refused:
        await bus.profile(job_id, server, gpu_type)
        record = await bus.wait_error(code)
        assert record.service == "profiler" and server in record.error
        assert record.subject == subjects.profiles(job_id)

    await bus.profile("j1", "a0", "A")
    await eventually(lambda: _has(bus, 1), what="j1 profiled on A")
    assert await profiled(bus) == [("j1", ("A",))]
    await bus.profile("j1", "a1", "A")  # the same set again: deduplicated by its msg id
    await bus.profile("j1", "b0", "B")
    await profiler.wait_log("job profiled", server_id="b0")
    assert await profiled(bus) == [("j1", ("A",)), ("j1", ("A", "B"))]
    info = await bus.js.consumer_info("HOPS_SAMPLES", "profiler")
    assert info.num_pending == 0 and info.num_ack_pending == 0  # every report handled
    assert (await bus.js.stream_info("HOPS_JOBS")).state.messages == 2
    assert len(bus.errors) == len(refused)  # no state change for the refused ones

    # A job that has ended: its late report is ignored, no error.
    done = msgspec.structs.replace(new_record(job("j2"), time.time()), phase="finished")
    await jobs.put("j2", encode_record(done))
    await bus.profile("j2", "a0", "A")
    await profiler.wait_log("profile ignored", job_id="j2")  # logged once handled
    assert len(await profiled(bus)) == 2 and len(bus.errors) == len(refused)


async def _has(bus: Bus, count: int) -> bool:
    return len(await profiled(bus)) >= count


# --- the tracker, without NATS ---------------------------------------------------------


def report(server: str, gpu_type: str, job: str = "j") -> ProfileReport:
    return ProfileReport(JobId(job), GpuType(gpu_type), ServerId(server))


def test_profile_reports_are_checked_against_the_nodes_and_the_job() -> None:
    known = {GpuType("A"), GpuType("B")}
    assert check_report(report("a0", "A"), GpuType("A"), known, "profiling").outcome == "accept"
    cases = [
        (report("zz", "A"), None, "profiling", UNKNOWN_SERVER),
        (report("a0", "C"), GpuType("A"), "profiling", UNKNOWN_GPU_TYPE),
        (report("a0", "B"), GpuType("A"), "profiling", TYPE_MISMATCH),
        (report("a0", "A"), GpuType("A"), None, UNKNOWN_JOB),
    ]
    for rep, server_type, phase, code in cases:
        verdict = check_report(rep, server_type, known, phase)
        assert (verdict.outcome, verdict.code) == ("reject", code)
        assert rep.server_id in verdict.message
    assert check_report(report("a0", "A"), GpuType("A"), known, "finished").outcome == "ignore"


def test_the_tracker_is_cumulative() -> None:
    tracker = ProfileTracker()
    assert not tracker.knows(JobId("j"))
    tracker.seed(JobId("j"), [GpuType("B")])
    assert tracker.accept(report("a0", "A")) == ("A", "B")
    assert tracker.accept(report("a1", "A")) == ("A", "B")
    assert profiled_msg_id(JobId("j"), ["B", "A"]) == "j:job_profiled:A+B"  # type: ignore[list-item]
    tracker.forget(JobId("j"))
    assert tracker.types(JobId("j")) == ()
