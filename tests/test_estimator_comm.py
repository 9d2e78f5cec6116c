"""Communication in the estimator: measured all-reduce times, the overlap
residual of Eq. (1) and the latency term added to Eq. (2)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bench.accuracy_bw import fit_latency_and_slope
from estimation.database import DatabaseState, ThroughputDatabase
from estimation.estimator import estimate_job, theoretical_per_gpu
from estimation.formulas import (
    OVERLAP_RESIDUAL,
    _grad_sync_time,
    comm_time,
    expected_conditional_iter_time,
    iter_time,
)
from shared import events as ev
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from tests.helpers import free_port

A = GpuType("A")
A0, A1, A2 = (ServerId(s) for s in ("a0", "a1", "a2"))
SPEC = GpuTypeSpec(A, 1e10, 1e9)  # B_link 1e10, B_net 1e9 params/s
SERVERS = (Server(A0, A, 4), Server(A1, A, 4), Server(A2, A, 4))
CLUSTER = Cluster(gpu_types=(SPEC,), servers=SERVERS)
JOB = JobSpec(id=JobId("job"), model="m", batch_size=32, params=110_000_000,
              total_samples=1_200_000, requirements=(1, 2, 4))
# Pattern 2 and no data-time samples: T = T_d (0) + max(T_b + r·T_c, T_c) + T_u + T_f.
MODULES = TimeModules(t_f=0.02, t_b=0.03, t_u=0.03, pattern=2)


def profiled_db() -> ThroughputDatabase:
    db = ThroughputDatabase()
    db.record_profile(ProfileReport(JOB.id, A, A0, MODULES))
    return db


def comm_sample(local: int, nodes: int, total: int, *times: float) -> ThroughputSample:
    """A sample that carries only all-reduce times (no throughput, so the
    type layer's tables stay empty and the theoretical layer answers)."""
    return ThroughputSample(JOB.id, A0, A, local, nodes, total, comm_times=times)


def with_spec(**fields: float) -> tuple[Cluster, GpuTypeSpec]:
    spec = msgspec.structs.replace(SPEC, **fields)
    return Cluster(gpu_types=(spec,), servers=SERVERS), spec


# --- measured T_c ---------------------------------------------------------


def test_measured_comm_time_replaces_eq2_for_its_shape_only() -> None:
    db = profiled_db()
    rec = db.record(JOB.id, A)
    assert rec is not None
    before = estimate_job(db, JOB, CLUSTER).by_type[A]
    # Eq. (2): 2 GPUs T_c = 1.1e8/1e10 · 1/2 = 0.0055 → T = 0.0311 + 0.05 → 394.6;
    # 2 nodes T_c = 0.11 → T = 0.16 → 200.
    assert before.agg[1] == 394.6 and before.dist == (200.0, 200.0)
    # Fill the layer's memo, then measure T_c = mean(0.04, 0.06) = 0.05 on 2 GPUs
    # of one node: Eq. (1) max(0.03 + 0.2·0.05, 0.05) = 0.05; T = 0.05 + 0.05 → 320.
    assert theoretical_per_gpu(rec.theory, JOB, SPEC, 2, 1) == pytest.approx(32 / 0.0811)
    db.record_sample(comm_sample(2, 1, 2, 0.04, 0.06))
    assert theoretical_per_gpu(rec.theory, JOB, SPEC, 2, 1) == pytest.approx(320.0)
    # A 2-node run of 4 GPUs is another shape than the 2-node cell (one GPU
    # per node), and one GPU has nothing to reduce: both leave Eq. (2) in place.
    db.record_sample(comm_sample(2, 2, 4, 0.5))
    db.record_sample(comm_sample(1, 1, 1, 0.5))
    after = estimate_job(db, JOB, CLUSTER).by_type[A]
    assert after.agg[1] == 320.0
    assert (after.agg[0], after.agg[2], after.agg[3]) == (before.agg[0], before.agg[2],
                                                          before.agg[3])
    assert after.dist == before.dist
    assert rec.theory.measured_comm(1, 1) is None and rec.theory.measured_comm(2, 2) is None
    # A second sample moves the running mean to 0.06: T = 0.06 + 0.05 → 290.9.
    db.record_sample(comm_sample(2, 1, 2, 0.07))
    assert estimate_job(db, JOB, CLUSTER).by_type[A].agg[1] == 290.9


def test_measured_comm_time_across_nodes_and_state_round_trip() -> None:
    db = profiled_db()
    # Two nodes with one GPU each, T_c measured 0.05 (Eq. 2 gave 0.11):
    # max(0.03 + 0.01, 0.05) = 0.05 → T = 0.10 → 320 on the 2-node cell only.
    db.record_sample(comm_sample(1, 2, 2, 0.05))
    est = estimate_job(db, JOB, CLUSTER)
    assert est.by_type[A].dist == (320.0, 200.0)
    blob = msgspec.json.encode(db.to_state())
    rebuilt = ThroughputDatabase.from_state(msgspec.json.decode(blob, type=DatabaseState))
    assert rebuilt.to_state() == db.to_state()
    assert estimate_job(rebuilt, JOB, CLUSTER) == est
    rec = rebuilt.record(JOB.id, A)
    assert rec is not None and rec.theory.measured_comm(2, 2) == pytest.approx(0.05)
    # A state written before the field existed still loads (default: none).
    old = msgspec.json.decode(blob)
    del old["records"][0]["comm"]
    legacy = ThroughputDatabase.from_state(msgspec.convert(old, DatabaseState))
    rec = legacy.record(JOB.id, A)
    assert rec is not None and rec.theory.comm == {}


# --- overlap residual and latency -----------------------------------------


def test_defaults_are_the_papers_model() -> None:
    assert (SPEC.overlap_residual, SPEC.link_latency_s, SPEC.net_latency_s) == (0.2, 0.0, 0.0)
    assert OVERLAP_RESIDUAL == 0.2
    assert comm_time(1e9, 4, 1, 1e10, 2e9) == 1e9 / 1e10 * 3 / 4
    assert iter_time(0.1, 0.2, 0.3, 0.05, 0.0, 0.5, 2) == iter_time(
        0.1, 0.2, 0.3, 0.05, 0.0, 0.5, 2, residual=0.2)


def test_residual_one_makes_communication_serial() -> None:
    t_b, t_c = 0.03, 0.0055
    assert _grad_sync_time(t_b, t_c, residual=1.0) == t_b + t_c
    assert _grad_sync_time(t_b, 0.5, residual=1.0) == t_b + 0.5  # no max(·, T_c) left
    # Pattern 2: T_d + (T_b + T_c) + T_u + T_f + T_w.
    got = iter_time(0.01, 0.02, t_b, 0.03, 0.004, t_c, 2, residual=1.0)
    assert got == 0.01 + (t_b + t_c) + 0.03 + 0.02 + 0.004
    assert expected_conditional_iter_time(0.01, 0.0, 0.02, t_b, 0.03, 0.004, t_c, 2,
                                          residual=1.0) == got
    # Through the estimator: 2 GPUs T = 0.03 + 0.0055 + 0.05 = 0.0855 → 374.3.
    cluster, _ = with_spec(overlap_residual=1.0)
    curve = estimate_job(profiled_db(), JOB, cluster).by_type[A]
    assert curve.agg[:2] == (400.0, 374.3)


def test_latency_is_added_for_any_all_reduce_and_never_to_one_gpu() -> None:
    kw = {"link_latency": 0.003, "net_latency": 0.01}
    assert comm_time(1e9, 1, 1, 1e10, 2e9, **kw) == 0.0
    assert comm_time(1e9, 4, 1, 1e10, 2e9, **kw) == pytest.approx(0.003 + 0.075)
    assert comm_time(1e9, 8, 2, 1e10, 2e9, **kw) == pytest.approx(0.01 + 0.5)
    cluster, spec = with_spec(link_latency_s=0.0045, net_latency_s=0.01)
    db = profiled_db()
    curve = estimate_job(db, JOB, cluster).by_type[A]
    # 1 GPU unchanged (400); 2 GPUs T_c = 0.0045 + 0.0055 = 0.01:
    # max(0.03 + 0.002, 0.01) = 0.032 → T = 0.082 → 390.2; 2 nodes T_c = 0.12 → 188.2.
    assert curve.agg[:2] == (400.0, 390.2)
    assert curve.dist[0] == 188.2
    # Another spec is another memo entry, not the default spec's value.
    rec = db.record(JOB.id, A)
    assert rec is not None
    assert theoretical_per_gpu(rec.theory, JOB, SPEC, 2, 1) == pytest.approx(32 / 0.0811)
    assert theoretical_per_gpu(rec.theory, JOB, spec, 2, 1) == pytest.approx(32 / 0.082)


# --- validation and the wire ------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"link_latency_s": -0.001}, "link_latency_s must be finite and >= 0"),
    ({"net_latency_s": math.inf}, "net_latency_s must be finite and >= 0"),
    ({"overlap_residual": 1.5}, r"overlap_residual must lie in \[0, 1\]"),
    ({"overlap_residual": -0.1}, r"overlap_residual must lie in \[0, 1\]"),
    ({"overlap_residual": math.nan}, r"overlap_residual must lie in \[0, 1\]"),
])
def test_invalid_communication_parameters_are_refused(fields: dict[str, float],
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        msgspec.structs.replace(SPEC, **fields)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.001])
def test_invalid_comm_times_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="sample comm times: every time must be finite"):
        comm_sample(2, 1, 2, 0.01, bad)


def test_a_sample_event_with_comm_times_round_trips() -> None:
    msg = ev.SampleReported(sample=comm_sample(2, 1, 2, 0.004, 0.0031), at=3.0)
    blob = msgspec.json.encode(msg)
    assert b'"comm_times":[0.004,0.0031]' in blob
    assert ev.decode_sample_event(blob) == msg
    # Without the field (an older sender) it reads as empty.
    legacy = blob.replace(b',"comm_times":[0.004,0.0031]', b"")
    decoded = ev.decode_sample_event(legacy)
    assert isinstance(decoded, ev.SampleReported) and decoded.sample.comm_times == ()
    with pytest.raises(ev.WireError, match="comm times"):
        ev.decode_sample_event(blob.replace(b"0.0031", b"-1"))


# --- calibration ------------------------------------------------------------


def test_latency_and_bandwidth_fit() -> None:
    # Exact alpha-beta data: α = 2 ms, k = 1e-9 s per parameter.
    times = {p: 0.002 + 1e-9 * p for p in (100_000, 200_000, 400_000)}
    alpha, k = fit_latency_and_slope(times)
    assert alpha == pytest.approx(0.002) and k == pytest.approx(1e-9)
    # A negative intercept is clamped: through the origin, k = Σp·T / Σp².
    alpha, k = fit_latency_and_slope({100: 1.0, 200: 3.0})
    assert alpha == 0.0 and k == pytest.approx(0.014)
    with pytest.raises(ValueError, match="does not grow with size"):
        fit_latency_and_slope({100: 0.003, 200: 0.0029})


# --- collectives counted per iteration ----------------------------------------


def test_each_collective_of_an_iteration_pays_the_latency() -> None:
    # Two gradient buckets, one buffer broadcast, the plugin's agreement.
    counted = msgspec.structs.replace(MODULES, buckets=2, broadcasts=1, agreement=True)
    db = ThroughputDatabase()
    db.record_profile(ProfileReport(JOB.id, A, A0, counted))
    cluster, spec = with_spec(link_latency_s=0.0045, net_latency_s=0.01, overlap_residual=1.0)
    curve = estimate_job(db, JOB, cluster).by_type[A]
    # 1 GPU: no collective at all, 32 / 0.08 = 400.
    # 2 GPUs: T_c = 2·0.0045 + 0.0055 = 0.0145, in series with BP (residual 1);
    # broadcast and agreement 2·0.0045 more: T = 0.08 + 0.0145 + 0.009 = 0.1035.
    assert curve.agg[:2] == (400.0, round(32 / 0.1035, 1))
    # Across 2 nodes: T_c = 2·0.01 + 0.11, plus 2·0.01: T = 0.08 + 0.13 + 0.02.
    assert curve.dist[0] == round(32 / 0.23, 1)
    # Uncounted modules keep one all-reduce and nothing else (the test above).
    rec = db.record(JOB.id, A)
    assert rec is not None
    assert theoretical_per_gpu(rec.theory, JOB, spec, 2, 1) == pytest.approx(32 / 0.1035)


def test_a_measured_wait_holds_the_agreements_latency() -> None:
    counted = msgspec.structs.replace(MODULES, buckets=1, broadcasts=0, agreement=True)
    db = ThroughputDatabase()
    db.record_profile(ProfileReport(JOB.id, A, A0, counted))
    cluster, spec = with_spec(link_latency_s=0.0045, net_latency_s=0.01, overlap_residual=1.0)
    before = estimate_job(db, JOB, cluster).by_type[A].agg[1]
    assert before == round(32 / (0.08 + 0.01 + 0.0045), 1)
    # A running sample with 3 ms waits: T_w = 3 ms replaces the agreement's α.
    db.record_sample(ThroughputSample(JOB.id, A0, A, 2, 1, 2, data_times=(0.0,) * 4,
                                      wait_times=(0.003,) * 4))
    rec = db.record(JOB.id, A)
    assert rec is not None
    assert theoretical_per_gpu(rec.theory, JOB, spec, 2, 1) == pytest.approx(
        32 / (0.08 + 0.01 + 0.003), rel=1e-3)


def test_the_plugin_counts_ddps_buckets_as_ddp_makes_them() -> None:
    """A real DistributedDataParallel (gloo, one rank, in a subprocess so the
    group dies with it) counts its bucket all-reduces with a comm hook; the
    count without a group must agree, for small and large first buckets."""
    script = r'''
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from hops.plugin.dist import ddp_collectives
sys.path.insert(0, "examples")
from train_lm import TinyLM, parse_args
a = parse_args([])
dist.init_process_group("gloo", rank=0, world_size=1)
for kwargs in ({}, {"bucket_cap_mb": 0.5}, {"bucket_cap_mb": 100}):
    model = TinyLM(a.vocab, a.d_model, a.layers, a.seq_len)
    expected = ddp_collectives(model, **kwargs)[0]
    ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
    calls = []
    def hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(None, bucket)
    ddp.register_comm_hook(None, hook)
    for _ in range(3):  # DDP rebuilds its buckets after the first iteration
        calls.clear()
        ddp(torch.randint(0, a.vocab, (4, a.seq_len))).sum().backward()
    print(expected, len(calls))
dist.destroy_process_group()
'''
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, timeout=120,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    pairs = [tuple(map(int, line.split())) for line in out.stdout.split("\n") if line]
    assert len(pairs) == 3 and all(a == b for a, b in pairs), pairs
    assert pairs[1][0] > pairs[0][0] > pairs[2][0] == 1, pairs
