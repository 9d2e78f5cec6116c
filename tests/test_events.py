"""The wire contract: every message round-trips; bad payloads fail clearly."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import msgspec
import pytest

from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from shared.sequence import GpuTasks, TaskEntry
from shared.snapshot import Assignment, PassStats, Plan, PlanReasons, ProfilingTask
from tests.helpers import cluster, flat_estimate

J1 = JobId("j1")
S0 = ServerId("rtx-0")
SPEC = JobSpec(J1, "resnet50", 32, 25_557_032, 1_000_000, requirements=(1, 2, 4))
CONFIG = Configuration.of({"rtx-0": 2, "rtx-1": 2})
RTX = GpuTypeSpec(GpuType("rtx"), 2.5e9, 1e9)
PLAN = Plan(
    assignments=(Assignment(J1, CONFIG, throughput=900.0, gain=1.5),),
    profiling=(ProfilingTask(JobId("j2"), GpuType("rtx"), S0),),
    reasons=PlanReasons(
        policy="hops",
        priorities={J1: 0.5},
        window=(J1,),
        passes=(PassStats("first", 1, 4, 1.0, math.inf, 0.0, 0.01, "optimal", "direct"),),
    ),
)
SAMPLE = ThroughputSample(J1, S0, GpuType("rtx"), 2, 2, 4, 210.5, (0.01, 0.02), (0.0, 0.001),
                          comm_times=(0.004, 0.0031))
REPORT = ProfileReport(J1, GpuType("rtx"), S0, TimeModules(0.1, 0.2, 0.01, 2, (0.01,), (0.0,)))

MESSAGES: list[ev.Message] = [
    ev.SubmitJob(spec=SPEC),
    ev.CancelJob(job_id=J1, reason="user"),
    ev.HoldJob(job_id=J1, hold=False, reason="after the deadline"),
    ev.Reply(ok=True, job_id="j1"),
    ev.Reply(ok=False, error="no such job", code="not_found"),
    ev.ReloadTenants(),
    ev.TenantsReloaded(ok=False, service="scheduler", replica="r1", source="t.toml",
                       tenants=("team",), error="bad", code="invalid"),
    ev.RegisterNode(server=Server(S0, GpuType("rtx"), 4, cpu="epyc"), gpu_type=RTX, order=3),
    ev.EstimateRequest(jobs=(SPEC,), cluster=cluster([("rtx", 2, 4)])),
    ev.EstimateReply(estimates={J1: flat_estimate("j1", {"rtx": 100.0})}),
    ev.ListSignatures(),
    ev.SignaturesReply(signatures=(ev.SharedSignature(signature="0123456789abcdef",
                                                      current=(GpuType("rtx"),), batch_size=32),)),
    ev.StartJob(
        key="k1",
        job_id=J1,
        server_id=S0,
        spec=SPEC,
        configuration=CONFIG,
        gpu_indices=(0, 1),
        samples_done=10.0,
    ),
    ev.StopJob(key="k2", job_id=J1, reason="resize"),
    ev.SetCores(key="k3", job_id=J1, server_id=S0, cores=3, at=5.0),
    ev.RemoveNode(server_id=S0, force=True, reason="retired"),
    ev.DrainNode(server_id=S0, move=True, reason="maintenance"),
    ev.CommandAck(key="k2", ok=True, samples_done=5000.0),
    ev.JobSubmitted(job_id=J1, spec=SPEC, at=1.0),
    ev.JobProfiled(job_id=J1, gpu_types=(GpuType("rtx"),), at=2.0),
    ev.JobStarted(job_id=J1, configuration=CONFIG, at=3.0),
    ev.JobResized(job_id=J1, configuration=Configuration.of({"rtx-0": 4}), at=4.0),
    ev.JobStopped(job_id=J1, at=5.0, reason="preempted"),
    ev.JobFinished(job_id=J1, at=6.0),
    ev.JobFailed(job_id=J1, at=7.0, reason="oom"),
    ev.JobCancelled(job_id=J1, at=8.0),
    ev.JobHeld(job_id=J1, at=8.5, reason="until the data is in"),
    ev.JobReleased(job_id=J1, at=9.0),
    ev.SampleReported(sample=SAMPLE, at=9.0),
    ev.ProfileReported(report=REPORT),
    ev.ProfileStale(signature="0123456789abcdef", reason="disagreement", at=9.5,
                    gpu_types=(GpuType("rtx"),), job_id=J1, estimated=100.0, measured=60.0),
    ev.NodeHeartbeat(server_id=S0, at=10.0, running=(J1,)),
    ev.JobHeartbeat(job_id=J1, server_id=S0, samples_done=123.0, at=11.0),
    ev.PlanIssued(round=7, term=2, plan=PLAN, at=12.0),
    ev.ResourcesReleased(job_id=J1, server_ids=(S0,), at=13.0, reason="finished"),
    ev.ErrorRecord(service="scheduler", subject="s", error="e", at=14.0, code="invalid"),
    ev.PlanEntrySkipped(job_id=J1, reason="job_ended", detail="job j1 is finished", at=15.0),
    ev.TaskSequence(term=3, revision=2, server_id=S0, at=16.0, policy="hare-eft", gpus=(
        GpuTasks(0, (TaskEntry(J1, 4, 0, 2, 16.0, 17.5, hold=True),
                     TaskEntry(JobId("j2"), 0, 0, 1, 17.5, 18.0))),
        GpuTasks(1, (TaskEntry(J1, 4, 2, 4, 16.0, 16.5),))),
        specs=(msgspec.structs.replace(SPEC, sync_scale=4),
               msgspec.structs.replace(SPEC, id=JobId("j2"), requirements=(1,), sync_scale=1))),
    ev.TaskDone(term=3, revision=2, job_id=J1, round=4, lo=0, hi=2, server_id=S0, gpu_index=0,
                started_at=16.1, ended_at=17.4, at=17.4),
]

DECODERS = {
    ev.SubmitJob: ev.decode_submit,
    ev.CancelJob: ev.decode_cancel,
    ev.HoldJob: ev.decode_hold,
    ev.Reply: ev.decode_reply,
    ev.ReloadTenants: ev.decode_reload_tenants,
    ev.TenantsReloaded: ev.decode_tenants_reloaded,
    ev.RegisterNode: ev.decode_register,
    ev.RemoveNode: ev.decode_remove_node,
    ev.DrainNode: ev.decode_drain_node,
    ev.EstimateRequest: ev.decode_estimate_request,
    ev.EstimateReply: ev.decode_estimate_reply,
    ev.StartJob: ev.decode_command,
    ev.StopJob: ev.decode_command,
    ev.SetCores: ev.decode_command,
    ev.CommandAck: ev.decode_ack,
    ev.SampleReported: ev.decode_sample_event,
    ev.ProfileReported: ev.decode_sample_event,
    ev.ProfileStale: ev.decode_sample_event,
    ev.ListSignatures: ev.decode_list_signatures,
    ev.SignaturesReply: ev.decode_signatures_reply,
    ev.NodeHeartbeat: ev.decode_node_heartbeat,
    ev.JobHeartbeat: ev.decode_job_heartbeat,
    ev.PlanIssued: ev.decode_plan_event,
    ev.ResourcesReleased: ev.decode_plan_event,
    ev.ErrorRecord: ev.decode_error_record,
    ev.PlanEntrySkipped: ev.decode_plan_entry_skipped,
    ev.TaskSequence: ev.decode_task_event,
    ev.TaskDone: ev.decode_task_event,
}


def test_every_message_type_is_covered() -> None:
    # the feed's own message (shared.explain_events) is decoded by decode_feed
    # and tested with it; its tag is still unique among all messages
    ours = {t for t in ev.Message.__subclasses__() if t.__module__ == ev.__name__}
    assert {type(m) for m in MESSAGES} == ours
    tags = [t.__struct_config__.tag for t in ev.Message.__subclasses__()]
    assert len(set(tags)) == len(tags)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: ev.Message) -> None:
    data = ev.encode(msg)
    body = json.loads(data)
    assert body["type"] == msg.__struct_config__.tag and body["v"] == 1
    assert DECODERS.get(type(msg), ev.decode_job_event)(data) == msg
    assert ev.decode_any(data) == msg


def test_non_finite_floats_travel_as_strings() -> None:
    msg = ev.PlanIssued(round=1, term=1, plan=PLAN, at=0.0)
    data = ev.encode(msg)
    assert b'"bound":"inf"' in data
    assert ev.decode_plan_event(data) == msg
    assert msg.plan.reasons.passes[0].bound == math.inf


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    body = json.loads(ev.encode(ev.JobFinished(job_id=J1, at=1.0)))
    body.update(v=2, cpu_seconds=12.5)
    decoded = ev.decode_job_event(json.dumps(body).encode())
    assert decoded == ev.JobFinished(job_id=J1, at=1.0, v=2)


def test_submit_accepts_a_bare_job_spec() -> None:
    assert ev.decode_submit(msgspec.json.encode(SPEC)) == ev.SubmitJob(spec=SPEC)


def wire_error(decode: object, data: bytes, **kw: int) -> ev.WireError:
    with pytest.raises(ev.WireError) as info:
        decode(data, **kw)  # type: ignore[operator]
    return info.value


def test_unknown_type_names_the_known_ones() -> None:
    err = wire_error(ev.decode_job_event, b'{"type": "job_exploded", "job_id": "j1"}')
    assert err.code == ev.UNKNOWN_TYPE
    assert "'job_exploded'" in str(err) and "job_finished" in str(err)
    err = wire_error(ev.decode_command, b'{"job_id": "j1"}')
    assert err.code == ev.UNKNOWN_TYPE and 'no "type" field' in str(err)
    assert "start_job, stop_job" in str(err)


@pytest.mark.parametrize("data", [b"", b"{", b"not json", b'{"type": "reply", "ok": tru}'])
def test_malformed_json(data: bytes) -> None:
    err = wire_error(ev.decode_reply, data)
    assert err.code == ev.MALFORMED and str(err).startswith("malformed JSON in reply")


def test_schema_violations_name_the_field() -> None:
    err = wire_error(ev.decode_job_event, b'{"type": "job_finished", "job_id": "j1"}')
    assert err.code == ev.INVALID and "`at`" in str(err)
    err = wire_error(ev.decode_reply, b'{"type": "reply", "ok": []}')
    assert err.code == ev.INVALID and "$.ok" in str(err)
    err = wire_error(ev.decode_reply, b"[1, 2]")
    assert err.code == ev.INVALID and "object" in str(err)


def test_invalid_job_spec_is_a_wire_error() -> None:
    bad = msgspec.to_builtins(SPEC) | {"batch_size": 0}
    for data in (json.dumps(bad), json.dumps({"type": "submit_job", "spec": bad})):
        err = wire_error(ev.decode_submit, data.encode())
        assert err.code == ev.INVALID and "batch_size must be > 0" in str(err)
    unknown = msgspec.to_builtins(SPEC) | {"gpu": "a100"}
    err = wire_error(ev.decode_submit, json.dumps(unknown).encode())
    assert err.code == ev.INVALID and "gpu" in str(err)


@pytest.mark.parametrize("job_id", ["a.b", "a*", "a>", "a b", ""])
def test_submit_rejects_ids_unusable_in_subjects(job_id: str) -> None:
    bare = msgspec.to_builtins(SPEC) | {"id": job_id}
    err = wire_error(ev.decode_submit, json.dumps(bare).encode())
    assert err.code == ev.INVALID and "id" in str(err)


def test_payload_size_limit() -> None:
    err = wire_error(ev.decode_reply, b" " * (ev.MAX_PAYLOAD + 1))
    assert err.code == ev.TOO_LARGE and str(ev.MAX_PAYLOAD) in str(err)
    small = ev.encode(ev.Reply(ok=True))
    assert wire_error(ev.decode_reply, small, max_payload=10).code == ev.TOO_LARGE
    assert wire_error(ev.decode_submit, small, max_payload=10).code == ev.TOO_LARGE
    big = ev.ErrorRecord(service="s", subject="x", error="e" * ev.MAX_PAYLOAD, at=0.0)
    with pytest.raises(ev.WireError, match="is larger than the limit of") as info:
        ev.encode(big)
    assert info.value.code == ev.TOO_LARGE


def test_messages_check_their_own_consistency() -> None:
    with pytest.raises(ValueError, match="gpu_indices"):
        ev.StartJob(
            key="k",
            job_id=J1,
            server_id=S0,
            spec=SPEC,
            configuration=CONFIG,
            gpu_indices=(0,),
        )
    with pytest.raises(ValueError, match="not in"):
        ev.StartJob(
            key="k",
            job_id=J1,
            server_id=ServerId("elsewhere"),
            spec=SPEC,
            configuration=CONFIG,
            gpu_indices=(0, 1),
        )
    with pytest.raises(ValueError, match="describes"):
        ev.RegisterNode(
            server=Server(S0, GpuType("rtx"), 4), gpu_type=GpuTypeSpec(GpuType("v100"), 1, 1)
        )
    with pytest.raises(ValueError, match="differs"):
        ev.JobSubmitted(job_id=JobId("other"), spec=SPEC, at=0.0)


def test_subject_builders() -> None:
    assert subjects.job_events("j1") == "hops.v1.jobs.events.j1"
    assert subjects.samples("j1") == "hops.v1.samples.j1"
    assert subjects.profiles("j1") == "hops.v1.profiles.j1"
    assert subjects.job_heartbeat("rtx-0", "j1") == "hops.v1.jobs.heartbeat.rtx-0.j1"
    assert subjects.node_heartbeat("rtx-0") == "hops.v1.nodes.heartbeat.rtx-0"
    assert subjects.nodes_register("rtx-0") == "hops.v1.nodes.register.rtx-0"
    assert subjects.reports("rtx-0", "j1") == "hops.v1.reports.rtx-0.j1"
    assert subjects.exec_commands("rtx-0") == "hops.v1.exec.rtx-0"
    assert subjects.last_token("hops.v1.jobs.events.j1", subjects.JOB_EVENTS_ALL) == "j1"
    assert subjects.last_two_tokens("hops.v1.reports.rtx-0.j1", subjects.REPORTS_ALL) == (
        "rtx-0",
        "j1",
    )


@pytest.mark.parametrize(
    "subject",
    ["hops.v1.reports.a", "hops.v1.reports.a.b.c", "hops.v1.reports..j", "hops.v1.samples.a.b"],
)
def test_last_two_tokens_rejects_other_subjects(subject: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.last_two_tokens(subject, subjects.REPORTS_ALL)


@pytest.mark.parametrize(
    ("build", "granted"),
    [
        (subjects.job_heartbeat, "hops.v1.jobs.heartbeat.a0.*"),
        (subjects.reports, "hops.v1.reports.a0.*"),
    ],
)
def test_node_scoped_subjects_name_the_server_first(
    build: Callable[[str, str], str], granted: str
) -> None:
    """NATS permissions grant executor a0 ``...a0.*``: the server id must be
    the token before the job id, and both must be single tokens."""
    assert _matches(granted, build("a0", "j"))
    assert not _matches(granted, build("a1", "j"))
    with pytest.raises(subjects.SubjectError):
        build("a.0", "j")
    with pytest.raises(subjects.SubjectError):
        build("a0", "j.1")


@pytest.mark.parametrize("bad", ["", "a.b", "a*", ">", "a b", "a\tb", "a\n"])
def test_subject_ids_are_validated(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.job_events(bad)
    with pytest.raises(subjects.SubjectError):
        subjects.exec_commands(bad)


def test_last_token_rejects_other_subjects() -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.last_token("hops.v1.samples.j1", subjects.JOB_EVENTS_ALL)
    with pytest.raises(subjects.SubjectError):
        subjects.last_token("hops.v1.jobs.events.j1.x", subjects.JOB_EVENTS_ALL)


def test_streams_do_not_capture_request_subjects() -> None:
    """A stream capturing a request subject would answer requests itself."""
    requests = (subjects.JOBS_SUBMIT, subjects.JOBS_CANCEL, subjects.ESTIMATE)
    captured = [p for s in subjects.STREAMS for p in s.subjects]
    assert not any(">" in p for p in captured)
    node = (subjects.nodes_register("s0"), subjects.job_heartbeat("s0", "j1"))
    for subject in (*requests, *node):
        assert not any(_matches(p, subject) for p in captured), subject
    assert _matches(subjects.JOB_EVENTS_ALL, subjects.job_events("j1"))


def _matches(pattern: str, subject: str) -> bool:
    """NATS matching for patterns with ``*`` (the streams use no ``>``)."""
    p, s = pattern.split("."), subject.split(".")
    return len(p) == len(s) and all(a in ("*", b) for a, b in zip(p, s, strict=True))
