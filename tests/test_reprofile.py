"""Profiling a signature again (shared.reuse): the estimator's automatic
rule (a job's first samples that disagree with the shared profile's
estimate publish ``profile_stale``), the event applied in stream order, the
listing, the gateway's view and checks, and who may publish the event."""

from __future__ import annotations

import msgspec
import pytest

from estimation.database import ThroughputDatabase
from gateway.signatures import signatures_view, targets
from services.estimator.service import estimates_for
from services.estimator.signatures import (
    Served,
    apply_stale,
    listing,
    stale_msg_id,
    stale_of_sample,
)
from services.runtime.identity import executor_permissions, permissions, tenant_permissions
from shared import events as ev
from shared import subjects
from shared.estimate import JobEstimate
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ThroughputSample
from shared.records import JobRecord
from shared.reuse import STALE_MARGIN, Signature, first_samples_disagree, profile_signature
from tests.test_profile_reuse import RTX, V100, cluster2, report, spec


def sample(job: JobSpec, per_gpu: float, gpus: int = 1) -> ThroughputSample:
    return ThroughputSample(job.id, ServerId("r0"), RTX, local_gpus=gpus, nodes=1,
                            total_gpus=gpus, per_gpu_throughput=per_gpu)


def served_db(reuse_job: JobSpec) -> tuple[ThroughputDatabase, Served, JobEstimate]:
    """A replica's database with ``a``'s profile on RTX and V100, after it
    served an estimate of ``reuse_job`` (estimated from the shared profile)."""
    db = ThroughputDatabase(reuse=True)
    a = spec("a")
    db.record_profile(report(a, RTX, "r0"))
    db.record_profile(report(a, V100, "v0"))
    req = ev.EstimateRequest(jobs=(reuse_job,), cluster=cluster2())
    reply, _ = estimates_for(db, req)
    served = Served()
    served.remember(req, reply)
    return db, served, reply.estimates[reuse_job.id]


def test_first_samples_disagree_is_the_stale_margin_on_the_gpus_total() -> None:
    s = [sample(spec("b"), 10.0, 2), sample(spec("b"), 12.0, 2)]
    # Measured: the mean per GPU (11) times the 4 GPUs.
    assert first_samples_disagree(44.0, s, 4) is None
    assert first_samples_disagree(100.0, s, 4) == pytest.approx(44.0)
    assert first_samples_disagree(44.0 / (1 + STALE_MARGIN) + 1, s, 4) is None
    assert first_samples_disagree(44.0 / (1 + STALE_MARGIN) - 1, s, 4) == pytest.approx(44.0)
    assert first_samples_disagree(44.0, (), 4) is None


def test_a_disagreeing_first_sample_calls_for_profile_stale_once() -> None:
    b = spec("b")
    db, served, est = served_db(b)
    predicted = est.by_type[RTX].agg_per_gpu(1)
    stale = stale_of_sample(db, served, sample(b, predicted * 2), at=5.0)
    assert stale is not None
    assert (stale.signature, stale.reason, stale.gpu_types, stale.job_id) == (
        profile_signature(b), "disagreement", (RTX,), "b")
    assert stale.estimated == pytest.approx(predicted)
    assert stale.measured == pytest.approx(2 * predicted)
    assert stale_msg_id(stale) == f"stale:{profile_signature(b)}:RTX3090:b"
    # Within the margin: nothing. Once the job has a sample of its own: nothing.
    assert stale_of_sample(db, served, sample(b, predicted * 1.1), 5.0) is None
    db.record_sample(sample(b, predicted * 2))
    assert stale_of_sample(db, served, sample(b, predicted * 2), 6.0) is None


def test_a_job_not_served_or_profiled_itself_calls_for_nothing() -> None:
    b = spec("b")
    db, served, est = served_db(b)
    far = est.by_type[RTX].agg_per_gpu(1) * 3
    assert stale_of_sample(db, Served(), sample(b, far), 1.0) is None
    served.forget(JobId("b"))
    assert stale_of_sample(db, served, sample(b, far), 1.0) is None
    a = spec("a")  # profiled on RTX itself: its own record is not a reused one
    db2, served2, _ = served_db(a)
    assert stale_of_sample(db2, served2, sample(a, far), 1.0) is None


def test_profile_stale_applied_marks_the_types_and_the_listing_shows_them() -> None:
    b = spec("b")
    db, _, _ = served_db(b)
    sig = profile_signature(b)
    assert sig is not None
    before = listing(db)
    assert [(s.signature, s.current, s.stale) for s in before.signatures] == [
        (sig, (RTX, V100), ())]
    event = ev.ProfileStale(signature=sig, reason="operator", at=1.0, gpu_types=(RTX,))
    assert apply_stale(db, event) == (RTX,)
    after = listing(db).signatures[0]
    assert (after.current, after.stale) == ((V100,), (RTX,))
    assert db.shared_types(sig) == {V100}
    everything = ev.ProfileStale(signature=sig, reason="operator", at=2.0)
    assert apply_stale(db, everything) == (V100,)
    # On the wire it is a sample event of HOPS_SAMPLES.
    assert ev.decode_sample_event(ev.encode(event)) == event


def record(job: JobSpec, phase: str) -> JobRecord:
    return msgspec.convert({"job_id": job.id, "spec": msgspec.to_builtins(job), "phase": phase,
                            "submitted_at": 0.0},
                           JobRecord)


def test_gateway_view_joins_the_jobs_and_checks_the_types() -> None:
    b = spec("b")
    sig = profile_signature(b)
    assert sig is not None
    entry = ev.SharedSignature(signature=sig, current=(V100,), stale=(RTX,))
    reply = ev.SignaturesReply(signatures=(entry,))
    other = spec("o", model="vgg16-cifar10")
    body = signatures_view(reply, [record(b, "running"), record(spec("c"), "finished"),
                                   record(other, "queued")])
    assert body["count"] == 1
    view = body["signatures"][0]
    assert (view["model"], view["batch_size"], view["jobs"]) == (b.model, b.batch_size, ["b"])
    assert targets(entry, []) == (RTX, V100)
    assert targets(entry, ["TitanXP"]) == (V100,)
    refused = targets(entry, ["K80"])
    assert isinstance(refused, str) and "K80" in refused
    assert Signature(sig) == sig


def test_only_the_gateway_and_the_estimators_publish_profile_stale() -> None:
    assert subjects.SIGNATURES_STALE in subjects.STREAM_SAMPLES.subjects
    assert subjects.SIGNATURES_STALE in permissions("gateway").publish
    assert subjects.SIGNATURES_LIST in permissions("gateway").publish
    assert subjects.SIGNATURES_STALE in permissions("estimator").publish
    assert subjects.SIGNATURES_LIST in permissions("estimator").subscribe
    for who in (tenant_permissions("alice"), executor_permissions("rtx-0")):
        assert subjects.SIGNATURES_STALE not in who.publish
        assert subjects.SIGNATURES_LIST not in who.publish


def test_cli_renders_one_line_per_signature() -> None:
    from cli.signatures import render_signatures

    assert "no shared profiles yet" in render_signatures({"signatures": []})
    jobs = [f"j{i}" for i in range(7)]
    out = render_signatures({"signatures": [{
        "signature": "0123456789abcdef", "model": "resnet18-cifar10", "batch_size": 128,
        "current": ["TitanXP"], "stale": ["RTX3090"], "jobs": jobs}]}).splitlines()
    assert out[0].split() == ["signature", "model", "batch", "profiled", "on", "stale", "on",
                              "jobs"]
    assert out[1].split() == ["0123456789abcdef", "resnet18-cifar10", "128", "TitanXP",
                              "RTX3090", "j0", "j1", "j2", "j3", "j4", "(+2)"]
