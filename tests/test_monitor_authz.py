"""The monitor's checks of what executors send (services.monitor.authz, pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.monitor.authz import (
    PlacementHistory,
    Refuse,
    Relay,
    Suspects,
    Wait,
    foreign_jobs,
    heartbeat_refusal,
    job_beat_refusal,
    judge_report,
    planned,
    register_refusal,
    sequenced,
    without_jobs,
)
from services.monitor.metrics import REFUSAL_CODES, refused_family, render
from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample
from shared.sequence import GpuTasks, TaskEntry
from shared.snapshot import Assignment, Plan, ProfilingTask

A, B = ServerId("a0"), ServerId("b0")
J = JobId("j1")


def sample(job: str = "j1", server: str = "a0") -> ev.SampleReported:
    return ev.SampleReported(sample=ThroughputSample(
        job_id=JobId(job), server_id=ServerId(server), gpu_type=GpuType("rtx"), local_gpus=1,
        nodes=1, total_gpus=1, per_gpu_throughput=10.0))


def profile(job: str = "j1", server: str = "a0") -> ev.ProfileReported:
    return ev.ProfileReported(report=ProfileReport(
        job_id=JobId(job), gpu_type=GpuType("rtx"), server_id=ServerId(server)))


def history(*servers: ServerId, job: JobId = J) -> PlacementHistory:
    h = PlacementHistory()
    h.placed(job, servers)
    return h


REPORTS = [sample(), profile(), ev.JobFinished(job_id=J, at=1.0),
           ev.JobFailed(job_id=J, at=1.0, reason="exit 1")]


@pytest.mark.parametrize("msg", REPORTS)
def test_a_report_of_a_job_placed_on_its_server_is_relayed_with_its_id(msg: ev.Message) -> None:
    verdict = judge_report(msg, "a0", "j1", "j1:x", history(A), last_try=False)
    assert isinstance(verdict, Relay)
    assert verdict.msg_id == "j1:x"
    kind = str(msg.__struct_config__.tag)
    expected = {"sample_reported": "hops.v1.samples.j1",
                "profile_reported": "hops.v1.profiles.j1"}.get(kind, "hops.v1.jobs.events.j1")
    assert verdict.subject == expected


@pytest.mark.parametrize("msg", REPORTS)
def test_a_report_of_a_job_placed_elsewhere_waits_then_is_refused(msg: ev.Message) -> None:
    h = history(B)
    assert isinstance(judge_report(msg, "a0", "j1", "m", h, last_try=False), Wait)
    verdict = judge_report(msg, "a0", "j1", "m", h, last_try=True)
    assert verdict == Refuse("job j1 is not placed on server a0")


def test_a_report_must_name_its_subject_job_and_server() -> None:
    h = history(A, B, job=JobId("j2"))
    h.placed(J, (A, B))
    other_job = judge_report(sample(job="j2"), "a0", "j1", "m", h, last_try=False)
    assert isinstance(other_job, Refuse)
    assert "of job j2 on the subject of job j1" in other_job.reason
    # Placed on both, yet a0 may not speak for b0.
    for msg in (sample(server="b0"), profile(server="b0")):
        verdict = judge_report(msg, "a0", "j1", "m", h, last_try=False)
        assert isinstance(verdict, Refuse)
        assert "server b0 on the subject of server a0" in verdict.reason


@pytest.mark.parametrize("msg", [
    ev.JobStarted(job_id=J, configuration=Configuration.of({"a0": 1}), at=1.0),
    ev.JobCancelled(job_id=J, at=1.0),
    ev.JobStopped(job_id=J, at=1.0),
    ev.ResourcesReleased(job_id=J, server_ids=(A,), at=1.0),
])
def test_executors_may_publish_only_reports(msg: ev.Message) -> None:
    verdict = judge_report(msg, "a0", "j1", "m", history(A), last_try=False)
    assert isinstance(verdict, Refuse) and verdict.reason.startswith("executors may not publish")


def test_a_placement_counts_until_the_job_is_submitted_again() -> None:
    h = PlacementHistory()
    h.placed(J, (A,))
    h.submitted(J, 10.0)  # the record of the same submission: kept
    h.placed(J, (B,))  # moved: both still count (late reports of a0)
    assert h.on(J, A) and h.on(J, B)
    h.submitted(J, 10.0, (B,))
    assert h.on(J, A)
    h.submitted(J, 20.0)  # submitted again: a0's old reports no longer count
    assert not h.on(J, A) and not h.on(J, B)
    h.submitted(J, 30.0, (A,))  # the record's own configuration counts
    assert h.on(J, A)
    h.forget(J)
    assert not h.on(J, A)


def test_plans_name_the_servers_of_runs_and_profiling_runs() -> None:
    plan = Plan(assignments=(Assignment(J, Configuration.of({"a0": 2, "b0": 2})),),
                profiling=(ProfilingTask(JobId("p"), GpuType("rtx"), B),))
    assert planned(plan) == {J: frozenset({A, B}), JobId("p"): frozenset({B})}


def test_task_sequences_place_their_jobs_on_their_server_only() -> None:
    """A Hare task job runs where the leader's sequences put it: its
    ``job_failed`` from that server is relayed, from any other refused."""
    on_a = (TaskEntry(J, 1, 0, 2, 0.0, 1.0), TaskEntry(JobId("k"), 0, 0, 1, 1.0, 2.0))
    specs = tuple(JobSpec(j, "resnet18-cifar10", 32, 10, 640, requirements=(1,), sync_scale=2)
                  for j in (J, JobId("k")))
    seq = ev.TaskSequence(term=1, revision=3, server_id=A, at=0.0,
                          gpus=(GpuTasks(0, on_a), GpuTasks(1, ())), specs=specs)
    assert sequenced(seq, A) == {J: frozenset({A}), JobId("k"): frozenset({A})}
    assert sequenced(seq, B) == {}  # a body that lies about its subject places nothing
    h = PlacementHistory()
    for job, servers in sequenced(seq, A).items():
        h.placed(job, servers)
    failed = ev.JobFailed(job_id=J, at=1.0, reason="task_failed: boom")
    assert judge_report(failed, A, J, f"{J}:job_failed", h, last_try=False) == Relay(
        subjects.job_events(J), f"{J}:job_failed")
    assert isinstance(judge_report(failed, B, J, "x", h, last_try=True), Refuse)


def test_registration_and_heartbeats_of_another_server_are_refused() -> None:
    spec = GpuTypeSpec(GpuType("rtx"), 1.0, 1.0)
    req = ev.RegisterNode(server=Server(B, GpuType("rtx"), 4), gpu_type=spec)
    assert register_refusal(req, "b0") is None
    assert register_refusal(req, "a0") == "server a0 may not register server b0"
    beat = ev.NodeHeartbeat(server_id=B, at=1.0)
    assert heartbeat_refusal(beat, "b0") is None
    assert heartbeat_refusal(beat, "a0") == "server a0 may not send the heartbeat of server b0"
    jb = ev.JobHeartbeat(job_id=J, server_id=A, samples_done=1.0, at=1.0)
    assert job_beat_refusal(jb, "a0", "j1") is None
    assert job_beat_refusal(jb, "b0", "j1") is not None
    assert job_beat_refusal(jb, "a0", "j2") is not None


def test_heartbeat_entries_of_jobs_not_placed_there_are_dropped() -> None:
    h = history(A)
    h.placed(JobId("elsewhere"), (B,))
    beat = ev.NodeHeartbeat(server_id=A, at=1.0, running=(J, JobId("elsewhere")),
                            lost=(JobId("unknown"),))
    foreign = foreign_jobs(beat, h)
    assert foreign == (JobId("elsewhere"), JobId("unknown"))
    kept = without_jobs(beat, foreign)
    assert kept.running == (J,) and kept.lost == () and kept.server_id == A


def test_suspects_are_audited_once_after_the_grace_unless_placed_meanwhile() -> None:
    h = PlacementHistory()
    s = Suspects(grace=2.0)
    s.saw(J, A, "subj", 0.0)
    s.saw(J, A, "subj", 1.0)  # the first sighting counts
    s.saw(JobId("late"), A, "subj", 0.5)
    assert s.due(h, 1.9) == []
    h.placed(JobId("late"), (A,))  # its start was only a moment ahead of the monitor
    due = s.due(h, 2.0)
    assert [(x.job, x.server, x.first_seen) for x in due] == [(J, A, 0.0)]
    assert s.due(h, 10.0) == [] and not s.pending


def test_refusals_are_exposed_per_service_and_code() -> None:
    text = render([refused_family({("monitor", "forbidden"): 3, ("gateway", "unauthorized"): 1})])
    assert "# TYPE hops_refused_total counter" in text
    assert 'hops_refused_total{code="forbidden",service="monitor"} 3' in text
    assert 'hops_refused_total{code="unauthorized",service="gateway"} 1' in text


def test_a_refused_plan_is_counted_with_the_refusals() -> None:
    assert {"forbidden", "unauthorized", "plan_refused"} == REFUSAL_CODES
    text = render([refused_family({("scheduler", "plan_refused"): 2})])
    assert 'hops_refused_total{code="plan_refused",service="scheduler"} 2' in text


ids = st.sampled_from(["a0", "b0", "c0"])
jobs = st.sampled_from(["j1", "j2"])


@settings(max_examples=300, deadline=None)
@given(placed=st.lists(st.tuples(jobs, ids), max_size=6), sid=ids, job=jobs,
       payload_job=jobs, payload_server=ids, kind=st.sampled_from(["sample", "profile", "end"]),
       last=st.booleans())
def test_only_a_consistent_report_of_a_placed_job_is_ever_relayed(
        placed: list[tuple[str, str]], sid: str, job: str, payload_job: str,
        payload_server: str, kind: str, last: bool) -> None:
    h = PlacementHistory()
    for j, s in placed:
        h.placed(JobId(j), (ServerId(s),))
    msg: ev.Message = (sample(payload_job, payload_server) if kind == "sample"
                       else profile(payload_job, payload_server) if kind == "profile"
                       else ev.JobFinished(job_id=JobId(payload_job), at=1.0))
    verdict = judge_report(msg, sid, job, "m", h, last_try=last)
    consistent = payload_job == job and (kind == "end" or payload_server == sid)
    on = (job, sid) in placed
    assert isinstance(verdict, Relay) == (consistent and on)
    if isinstance(verdict, Relay):
        assert verdict.subject.endswith(f".{job}")
    # Waiting is only ever for the placement, and never on the last try.
    assert isinstance(verdict, Wait) == (consistent and not on and not last)


events = st.lists(st.one_of(
    st.tuples(st.just("placed"), ids),
    st.tuples(st.just("submitted"), st.sampled_from([1.0, 2.0, 3.0])),
), max_size=12)


@settings(max_examples=300, deadline=None)
@given(seq=events, server=ids)
def test_a_server_counts_iff_placed_since_the_last_new_submission(
        seq: list[tuple[str, object]], server: str) -> None:
    """Watchers deliver placements and records in any order; a record with a
    new ``submitted_at`` starts the history again, the same one does not."""
    h = PlacementHistory()
    expected: set[str] = set()
    current: float | None = None
    for kind, value in seq:
        if kind == "placed":
            h.placed(J, (ServerId(str(value)),))
            expected.add(str(value))
        else:
            assert isinstance(value, float)
            h.submitted(J, value)
            if current is not None and value != current:
                expected = set()
            current = value
    assert h.on(J, ServerId(server)) == (server in expected)
