"""CODA's contention eliminator (§V-D): throttle CPU jobs, never GPU jobs."""

from __future__ import annotations

import pytest

from scheduling.cores.eliminator import (
    Action,
    CpuJobLoad,
    EliminatorSettings,
    GpuJobLoad,
    ServerLoad,
    eliminate,
    eliminate_all,
    lower_cap,
)
from shared.ids import JobId, ServerId

S = ServerId("s1")
GPU = JobId("train")
CPU_A, CPU_B = JobId("etl-a"), JobId("etl-b")
FALLING = GpuJobLoad(GPU, now=0.80, reference=0.95)  # -16%
STEADY = GpuJobLoad(GPU, now=0.94, reference=0.95)  # -1%


def server(used: float, gpu: GpuJobLoad = FALLING, mba: bool = False,
           cpu: tuple[CpuJobLoad, ...] = (CpuJobLoad(CPU_A, 8), CpuJobLoad(CPU_B, 3)),
           sid: ServerId = S) -> ServerLoad:
    return ServerLoad(sid, capacity_gbps=100.0, used_gbps=used, mba=mba,
                      gpu_jobs=(gpu,), cpu_jobs=cpu)


def test_contention_halves_the_cpu_jobs_and_spares_the_gpu_job() -> None:
    actions = eliminate(server(80.0))
    assert actions == (Action(S, CPU_A, "halve_cores", 4), Action(S, CPU_B, "halve_cores", 1))
    assert GPU not in {a.job for a in actions}


def test_an_mba_server_throttles_by_mba_and_keeps_the_cores() -> None:
    actions = eliminate(server(80.0, mba=True))
    assert actions == (Action(S, CPU_A, "mba_throttle", 8, 50),
                       Action(S, CPU_B, "mba_throttle", 3, 50))


def test_a_steady_gpu_job_means_no_contention() -> None:
    assert eliminate(server(80.0, gpu=STEADY)) == ()


def test_below_the_threshold_nothing_is_throttled() -> None:
    assert eliminate(server(70.0)) == ()


def test_the_threshold_is_inclusive_and_the_drop_strict() -> None:
    assert eliminate(server(75.0)) != ()
    exactly_five = GpuJobLoad(GPU, now=0.95, reference=1.0)
    assert eliminate(server(80.0, gpu=exactly_five)) == ()
    assert eliminate(server(80.0, gpu=exactly_five),
                     EliminatorSettings(drop=0.04)) != ()


def test_halving_repeats_while_contention_lasts_down_to_one_core() -> None:
    cpu = (CpuJobLoad(CPU_A, 4, requested=8), CpuJobLoad(CPU_B, 1, requested=3))
    assert eliminate(server(90.0, cpu=cpu)) == (Action(S, CPU_A, "halve_cores", 2),)


def test_mba_halves_the_cap_while_contention_lasts_down_to_the_floor() -> None:
    cpu = (CpuJobLoad(CPU_A, 8, mba_percent=50), CpuJobLoad(CPU_B, 3, mba_percent=20),
           CpuJobLoad(JobId("floor"), 2, mba_percent=10), CpuJobLoad(JobId("new"), 1))
    assert eliminate(server(90.0, mba=True, cpu=cpu)) == (
        Action(S, CPU_A, "mba_throttle", 8, 20), Action(S, CPU_B, "mba_throttle", 3, 10),
        Action(S, JobId("new"), "mba_throttle", 1, 50))


@pytest.mark.parametrize(("cap", "lower"), [(100, 50), (50, 20), (40, 20), (30, 10),
                                            (20, 10), (15, 10), (10, 10)])
def test_lower_cap_halves_to_a_ten_percent_step(cap: int, lower: int) -> None:
    assert lower_cap(cap) == lower


def test_low_bandwidth_lifts_the_throttles() -> None:
    cpu = (CpuJobLoad(CPU_A, 2, requested=8), CpuJobLoad(CPU_B, 3, mba_percent=20),
           CpuJobLoad(JobId("free"), 5))
    actions = eliminate(server(50.0, gpu=STEADY, cpu=cpu))
    assert actions == (Action(S, CPU_A, "lift", 8), Action(S, CPU_B, "lift", 3))
    assert all(a.mba_percent == 100 for a in actions)


def test_between_release_and_threshold_throttles_stay() -> None:
    """Hysteresis: at 70% (between 60% and 75%) a throttled job stays throttled."""
    cpu = (CpuJobLoad(CPU_A, 2, requested=8),)
    assert eliminate(server(70.0, gpu=STEADY, cpu=cpu)) == ()
    assert eliminate(server(59.0, gpu=STEADY, cpu=cpu)) == (Action(S, CPU_A, "lift", 8),)


def test_an_undeclared_bandwidth_judges_nothing() -> None:
    load = ServerLoad(S, capacity_gbps=0.0, used_gbps=50.0, mba=False,
                      gpu_jobs=(FALLING,), cpu_jobs=(CpuJobLoad(CPU_A, 2, requested=8),))
    assert eliminate(load) == ()


def test_all_servers_in_server_order() -> None:
    loads = [server(80.0, sid=ServerId("s2")), server(70.0), server(80.0, mba=True,
                                                                    sid=ServerId("s0"))]
    assert [a.server for a in eliminate_all(loads)] == ["s0", "s0", "s2", "s2"]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        EliminatorSettings(release=0.8)
    with pytest.raises(ValueError):
        EliminatorSettings(threshold=0.0)
    with pytest.raises(ValueError):
        CpuJobLoad(CPU_A, 0)
    with pytest.raises(ValueError):
        CpuJobLoad(CPU_A, 2, mba_percent=0)
