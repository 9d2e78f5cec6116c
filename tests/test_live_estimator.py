"""The estimator service: replicas in one queue group, each rebuilding the
throughput database from the whole ``HOPS_SAMPLES`` stream (real processes,
real nats-server), and its pure request handling."""

from __future__ import annotations

import msgspec

from estimation.database import ThroughputDatabase
from services.estimator.service import (
    apply_sample_event,
    estimates_for,
    forget_ended,
    measured_on,
    unusable,
)
from services.runtime.bus import publish_event
from shared import events as ev
from shared import subjects
from shared.cluster import Cluster, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from shared.reuse import profile_signature
from tests.natsfix import nats_server, nats_url
from tests.test_live_scheduler import NODES, Bus, Stack, bus, eventually, job, stack

__all__ = ["bus", "nats_server", "nats_url", "stack"]  # fixtures

CLUSTER = Cluster(
    gpu_types=tuple(dict.fromkeys(t for _, t, _ in NODES)),
    servers=tuple(Server(ServerId(sid), t.name, g) for sid, t, g in NODES),
)


async def estimate(bus: Bus, *job_ids: str) -> ev.EstimateReply:
    req = ev.EstimateRequest(jobs=tuple(job(j) for j in job_ids), cluster=CLUSTER)
    reply = await bus.nc.request(subjects.ESTIMATE, ev.encode(req), timeout=5)
    return ev.decode_estimate_reply(reply.data)


async def measurements(bus: Bus, job_id: str, samples: int) -> int:
    """Profiles on both types and running samples; the number of messages."""
    await bus.profile(job_id, "a0", "A")
    await bus.profile(job_id, "b0", "B")
    for i in range(samples):
        await bus.sample(job_id, "a1" if i % 2 else "a0", "A", 180.0 + i)
    return 2 + samples


async def test_replicas_share_the_requests_and_survive_a_kill(stack: Stack, bus: Bus) -> None:
    await bus.put_nodes()
    await measurements(bus, "j1", 4)
    replicas = [await stack.start("services.estimator", HOPS_LOG_LEVEL="debug") for _ in range(2)]
    for replica in replicas:
        assert (await replica.wait_log("serving estimates"))["applied"] == 6
    first = await estimate(bus, "j1", "unprofiled")
    assert first.ok and set(first.estimates) == {"j1"}
    assert set(first.estimates[JobId("j1")].by_type) == {"A", "B"}
    for _ in range(20):
        assert await estimate(bus, "j1", "unprofiled") == first
    answered = [len([x for x in r.lines() if x["event"] == "estimated"]) for r in replicas]
    assert sum(answered) == 21 and min(answered) > 0, answered  # the queue group spreads them
    replicas[0].kill()
    await replicas[0].wait()
    for _ in range(5):
        assert await estimate(bus, "j1") == ev.EstimateReply(estimates=first.estimates)


async def test_a_restarted_replica_rebuilds_the_same_database(stack: Stack, bus: Bus) -> None:
    await bus.put_nodes()
    count = await measurements(bus, "j1", 30)
    await bus.js.publish(subjects.samples("j1"), b'{"type": "sample_reported", "sample": 3}')
    await bus.profile("j1", "zz", "A")  # from no registered server: left out
    await bus.profile("j1", "a0", "B")  # a0 is of type A: left out
    estimator = await stack.start("services.estimator")
    assert (await estimator.wait_log("serving estimates"))["applied"] == count
    assert len(estimator.lines_with("measurement left out")) == 3  # logged, not re-reported
    before = await estimate(bus, "j1")
    assert set(before.estimates[JobId("j1")].by_type) == {"A", "B"}
    assert await estimator.stop() == 0
    again = await stack.start("services.estimator")
    assert (await again.wait_log("serving estimates"))["applied"] == count
    assert await estimate(bus, "j1") == before
    # New measurements reach a running replica.
    await bus.profile("j2", "a0", "A")

    async def j2() -> ev.EstimateReply | None:
        reply = await estimate(bus, "j2")
        return reply if reply.estimates else None

    reply = await eventually(j2, what="an estimate of j2")
    assert set(reply.estimates[JobId("j2")].by_type) == {"A"}
    # Bad measurements arriving now are reported as well as left out.
    await bus.sample("j2", "zz", "A", 100.0)
    assert "zz" in (await bus.wait_error("unknown_server")).error
    await bus.js.publish(subjects.samples("j2"), b"{")
    assert (await bus.wait_error("malformed")).service == "estimator"
    assert await estimate(bus, "j2") == reply


async def test_a_bad_request_gets_a_failed_reply_and_an_error_record(
    stack: Stack, bus: Bus
) -> None:
    estimator = await stack.start("services.estimator")
    await estimator.wait_log("serving estimates")
    bad = b'{"type": "estimate_request", "jobs": [], "cluster": {"servers": 1}}'
    reply = ev.decode_estimate_reply((await bus.nc.request(subjects.ESTIMATE, bad, timeout=5)).data)
    assert (reply.ok, reply.code) == (False, "invalid") and reply.estimates == {}
    record = await bus.wait_error("invalid")
    assert record.service == "estimator" and record.subject == subjects.ESTIMATE
    wrong = await bus.nc.request(subjects.ESTIMATE, b'{"type": "cancel_job"}', timeout=5)
    assert ev.decode_estimate_reply(wrong.data).code == "unknown_type"


def test_the_database_is_fed_in_stream_order_and_answers_per_job() -> None:
    db = ThroughputDatabase()
    modules = TimeModules(t_f=0.05, t_b=0.1, t_u=0.01, t_d=(0.02, 0.02))
    report = ProfileReport(JobId("j1"), GpuType("A"), ServerId("a0"), modules)
    apply_sample_event(db, ev.ProfileReported(report=report))
    sample = ThroughputSample(JobId("j1"), ServerId("a0"), GpuType("A"), per_gpu_throughput=150.0)
    apply_sample_event(db, ev.SampleReported(sample=sample))
    req = ev.EstimateRequest(jobs=(job("j1"), job("j2")), cluster=CLUSTER)
    reply, failed = estimates_for(db, req)
    assert set(reply.estimates) == {"j1"} and failed == {}
    curve = reply.estimates[JobId("j1")].by_type[GpuType("A")]
    assert curve.agg[0] == 150.0  # the type layer's measured cell overrides the formula
    only_b = msgspec.structs.replace(
        CLUSTER, gpu_types=CLUSTER.gpu_types[1:], servers=CLUSTER.servers[2:]
    )
    reply, _ = estimates_for(db, ev.EstimateRequest(jobs=(job("j1"),), cluster=only_b))
    assert reply.estimates == {}  # no profile on any type of that cluster
    profiled = ev.ProfileReported(report=report)
    assert measured_on(profiled) == ("a0", "A") and unusable(profiled, GpuType("A")) is None
    assert unusable(profiled, None) == (
        "unknown_server",
        "measured on a0, which is not a registered server",
    )
    code, message = unusable(ev.SampleReported(sample=sample), GpuType("B")) or ("", "")
    assert code == "type_mismatch" and "server's GPU type is B" in message


async def test_ended_jobs_leave_every_replica_and_late_reports_stay_out(
    stack: Stack, bus: Bus
) -> None:
    await bus.put_nodes()
    await measurements(bus, "j1", 4)
    await bus.profile("j2", "a0", "A")
    estimator = await stack.start("services.estimator")
    await estimator.wait_log("serving estimates")
    assert set((await estimate(bus, "j1", "j2")).estimates) == {"j1", "j2"}
    finished = ev.JobFinished(job_id=JobId("j1"), at=1.0)
    await bus.js.publish(subjects.job_events("j1"), ev.encode(finished))

    async def j1_gone() -> ev.EstimateReply | None:
        reply = await estimate(bus, "j1", "j2")
        return reply if set(reply.estimates) == {"j2"} else None

    await eventually(j1_gone, what="j1 forgotten")
    # A report of j1 that arrives after its end stays out.
    await bus.profile("j1", "a0", "A")
    await bus.profile("j3", "a0", "A")  # arrives after it: the feed has passed j1's report

    async def j3_known() -> ev.EstimateReply | None:
        reply = await estimate(bus, "j1", "j2", "j3")
        return reply if "j3" in reply.estimates else None

    assert set((await eventually(j3_known, what="j3 estimated")).estimates) == {"j2", "j3"}
    # A restarted replica replays both streams and agrees, also when the
    # stream ends with a late report of the ended job.
    await bus.profile("j1", "a0", "A")
    assert await estimator.stop() == 0
    again = await stack.start("services.estimator")
    await again.wait_log("serving estimates")
    assert set((await eventually(j3_known, what="j3 after restart")).estimates) == {"j2", "j3"}


def test_a_final_job_event_drops_the_job_once() -> None:
    db = ThroughputDatabase()
    modules = TimeModules(t_d=(0.01,), t_f=0.02, t_b=0.04, t_u=0.005)
    for job_id in ("j1", "j2"):
        db.record_profile(ProfileReport(JobId(job_id), GpuType("A"), ServerId("a0"), modules, 32))
    ended: set[JobId] = set()
    started = ev.JobStarted(job_id=JobId("j1"), configuration=Configuration.of({"a0": 1}), at=0.0)
    assert not forget_ended(db, ended, started)
    assert set(db.jobs()) == {"j1", "j2"}
    assert forget_ended(db, ended, ev.JobFailed(job_id=JobId("j1"), at=1.0, reason="oom"))
    assert db.jobs() == ("j2",) and ended == {"j1"}
    assert not forget_ended(db, ended, ev.JobCancelled(job_id=JobId("j1"), at=2.0))
    assert forget_ended(db, ended, ev.JobCancelled(job_id=JobId("j2"), at=2.0))
    assert db.jobs() == ()


def shared_profile(job_id: str, server: str, gpu_type: str) -> ev.ProfileReported:
    """A profile of ``job_id`` under the signature every :func:`job` has."""
    modules = TimeModules(t_f=0.05, t_b=0.1, t_u=0.01, t_d=(0.02, 0.021, 0.019, 0.02))
    signature = profile_signature(job(job_id)) or ""
    report = ProfileReport(JobId(job_id), GpuType(gpu_type), ServerId(server), modules,
                           signature=signature)
    return ev.ProfileReported(report=report)


def test_an_ended_jobs_profile_serves_its_signature_whichever_stream_came_first() -> None:
    """j1 was profiled on A and B and finished; j2 of the same signature
    took its profiles and ran on A. A replica replaying the two streams may
    apply j1's end before or after j1's profiles: either way j2 is estimated
    on both types, as it was before the restart (issue 36: a job requeued
    after ``down``/``up`` waited for ever, with no estimate)."""
    profiles = [shared_profile("j1", "a0", "A"), shared_profile("j1", "b0", "B")]
    ran = ev.SampleReported(sample=ThroughputSample(JobId("j2"), ServerId("a0"), GpuType("A"),
                                                    per_gpu_throughput=150.0))
    finished = ev.JobFinished(job_id=JobId("j1"), at=1.0)
    req = ev.EstimateRequest(jobs=(job("j2"),), cluster=CLUSTER)
    replies = []
    for end_first in (False, True):
        db, ended = ThroughputDatabase(reuse=True), set[JobId]()
        if end_first:
            forget_ended(db, ended, finished)
        for event in profiles:
            apply_sample_event(db, event, JobId("j1") in ended)
        forget_ended(db, ended, finished)
        apply_sample_event(db, ran, JobId("j2") in ended)
        reply, failed = estimates_for(db, req)
        assert failed == {} and db.jobs() == ("j2",), (end_first, failed, db.jobs())
        assert set(reply.estimates[JobId("j2")].by_type) == {"A", "B"}, end_first
        assert set(reply.shared[JobId("j2")]) == {"A", "B"}, end_first
        replies.append(reply)
    assert replies[0] == replies[1]


async def test_a_restarted_replica_keeps_the_shared_profiles_of_ended_jobs(
    stack: Stack, bus: Bus
) -> None:
    """The live form of the test above. j1's end is published before its
    profiles, the order in which a restarted replica usually replays the two
    streams (HOPS_JOBS is short); j2, of j1's signature, is estimated from
    them, runs, and a restarted replica answers for it as the running one
    did."""
    await bus.put_nodes()
    estimator = await stack.start("services.estimator")
    await estimator.wait_log("serving estimates")
    await bus.js.publish(subjects.job_events("j1"), ev.encode(ev.JobFinished(job_id=JobId("j1"),
                                                                            at=1.0)))
    for event in (shared_profile("j1", "a0", "A"), shared_profile("j1", "b0", "B")):
        await publish_event(bus.js, subjects.profiles("j1"), event)

    async def shared() -> ev.EstimateReply | None:
        reply = await estimate(bus, "j2")
        return reply if set(reply.shared.get(JobId("j2"), ())) == {"A", "B"} else None

    first = await eventually(shared, what="j1's profiles shared with j2")
    assert set(first.estimates[JobId("j2")].by_type) == {"A", "B"}
    await bus.sample("j2", "a0", "A", 150.0)

    async def measured() -> ev.EstimateReply | None:
        reply = await estimate(bus, "j2")
        return None if reply == first else reply

    live = await eventually(measured, what="j2's sample in its estimate")
    assert await estimator.stop() == 0
    again = await stack.start("services.estimator")
    await again.wait_log("serving estimates")
    assert await estimate(bus, "j2") == live
