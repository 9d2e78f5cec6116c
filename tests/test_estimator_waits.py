"""Waits per number of ranks in the estimator: a placement is charged the
synchronisation wait measured with as many ranks, never a bigger
placement's (a one-GPU job has no peers to wait for)."""

from __future__ import annotations

import pytest

from estimation.database import DatabaseState, RecordState, ThroughputDatabase
from estimation.estimator import theoretical_per_gpu
from shared.cluster import GpuTypeSpec
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample, TimeModules

A = GpuType("A")
A0 = ServerId("a0")
SPEC = GpuTypeSpec(A, 1e10, 1e9)
JOB = JobSpec(id=JobId("job"), model="m", batch_size=32, params=110_000_000,
              total_samples=1_200_000, requirements=(1, 2, 4))
# Pattern 2, stable 10 ms data time, no waits in the one-GPU profile:
# T(1 GPU) = 0.01 + 0.03 + 0.03 + 0.02 = 0.09 → 32 / 0.09 per GPU.
MODULES = TimeModules(t_f=0.02, t_b=0.03, t_u=0.03, pattern=2, t_d=(0.01,) * 20,
                      t_w=(0.0,) * 20)


def db_with_waits() -> ThroughputDatabase:
    db = ThroughputDatabase()
    db.record_profile(ProfileReport(JOB.id, A, A0, MODULES))
    # Two-GPU running samples that waited 5 ms each iteration (no throughput:
    # the theoretical layer answers every cell).
    db.record_sample(ThroughputSample(JOB.id, A0, A, 2, 1, 2, data_times=(0.01,) * 50,
                                      wait_times=(0.005,) * 50))
    return db


def cell(db: ThroughputDatabase, gpus: int, nodes: int = 1) -> float:
    rec = db.record(JOB.id, A)
    assert rec is not None
    return theoretical_per_gpu(rec.theory, JOB, SPEC, gpus, nodes)


def test_a_bigger_placements_waits_do_not_slow_one_gpu() -> None:
    db = db_with_waits()
    assert cell(db, 1) == pytest.approx(32 / 0.09)
    # 2 GPUs: T_c = 1.1e8 / 1e10 / 2 = 0.0055, max(0.03 + 0.2·0.0055, 0.0055)
    # = 0.0311, plus the measured 5 ms wait.
    two = 32 / (0.01 + 0.0311 + 0.03 + 0.02 + 0.005)
    assert cell(db, 2) == pytest.approx(two)
    # 4 GPUs, never measured: the two-GPU wait (the most ranks measured below).
    four = 32 / (0.01 + 0.03 + 0.2 * 0.00825 + 0.03 + 0.02 + 0.005)
    assert cell(db, 4) == pytest.approx(four)
    # Two nodes, one GPU each: two ranks.
    assert cell(db, 2, 2) == pytest.approx(32 / (0.01 + 0.11 + 0.03 + 0.02 + 0.005))


def test_ranks_survive_a_state_round_trip() -> None:
    db = db_with_waits()
    state = db.to_state()
    assert state.records[0].wait_ranks == (1,) * 20 + (2,) * 50
    again = ThroughputDatabase.from_state(state)
    assert cell(again, 1) == cell(db, 1) and cell(again, 2) == cell(db, 2)
    # A state written before ranks were kept reads every sample as one rank.
    old = DatabaseState(records=(RecordState(
        job_id=JOB.id, gpu_type=A, modules=MODULES, batch_size=32, profiled_on=A0,
        data_times=state.records[0].data_times, wait_times=state.records[0].wait_times),))
    pooled = ThroughputDatabase.from_state(old)
    assert cell(pooled, 1) == pytest.approx(32 / (0.09 + 0.005 * 50 / 70))
