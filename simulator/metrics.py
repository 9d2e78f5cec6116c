"""What a simulation run measures (Hops §4.2-4.4).

Per job: JCT, queueing wait, latency ratio (Eq. 6, with the age of Eq. 9
computed from the ground truth), and Themis' finish-time fairness rho.
Per round: idle GPUs while jobs wait (the paper's fragments), cluster
throughput, RAQLR (Eq. 7) and planner time.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence

import msgspec

from shared.cluster import Cluster
from shared.ids import JobId
from simulator.forecasting import ForecastRecord
from simulator.state import JobRecord
from world.truth import GroundTruth


class RoundRecord(msgspec.Struct, frozen=True):
    t: float
    idle: int
    waiting: int
    frag: int  # idle GPUs if any job still waits after the round's planning, else 0
    running: int
    throughput: float  # samples/s of all running jobs
    planner_s: float
    raqlr: float
    # GPUs idle without a free core beside them while a GPU job waits
    # (CODA §VI-C; 0 on clusters that schedule no cores).
    short_of_cores: int = 0


class JobOutcome(msgspec.Struct, frozen=True):
    id: JobId
    model: str
    submit: float
    first_start: float | None
    finish: float | None
    wait_s: float
    age_s: float  # Eq. (9) on the ground truth
    lr: float  # wait / age, Eq. (6)
    jct_s: float | None
    restarts: int
    min_gpus: int
    max_gpus: int
    r_avg: float
    kind: str = "gpu"
    # Cores (CODA): GPU time held and spent busy at the cores held, and
    # in-place core changes.
    held_gpu_s: float = 0.0
    busy_gpu_s: float = 0.0
    retunes: int = 0


RUNNING = "Running"  # a reason history's entry while a plan runs the job


class SimResult(msgspec.Struct, frozen=True):
    jobs: tuple[JobOutcome, ...]
    rounds: tuple[RoundRecord, ...]
    plan_seconds: tuple[float, ...]
    end_time: float
    # Each job's JCT floor in seconds (experiments/common/floor.py), when the caller
    # computed it (experiments.common.simrun.simulate does); summarize reports it.
    floor_s: dict[JobId, float] = msgspec.field(default_factory=dict)
    # Each job's reason codes (shared.explain.REASON_CODES, RUNNING while
    # it runs) with the time each began, one entry per change from plan to
    # plan (scheduling.explain).
    reasons: dict[JobId, tuple[tuple[float, str], ...]] = msgspec.field(default_factory=dict)
    # Each waiting job's forecast at each round's first plan, with what
    # happened (SimSettings.forecast; empty when off).
    forecasts: tuple[ForecastRecord, ...] = ()


def true_age(rec: JobRecord, truth: GroundTruth, cluster: Cluster, r_num: int) -> float:
    """Eq. (9) with the true single-GPU throughputs: the run time the job
    would expect without waiting, over the requirement set of the run's
    R_num."""
    reqs = rec.spec.requirement_set(r_num)
    r_avg = sum(reqs) / len(reqs)
    terms = [
        (p, rec.spec.total_samples / (tput * r_avg))
        for t, p in cluster.type_share().items()
        if p > 0
        and truth.supports(rec.model, t)
        and (tput := truth.single_gpu_throughput(rec.model, t)) > 0
    ]
    mass = sum(p for p, _ in terms)
    return sum(p * a for p, a in terms) / mass if mass else math.inf


def job_outcome(rec: JobRecord, truth: GroundTruth, cluster: Cluster, r_num: int) -> JobOutcome:
    if rec.spec.kind == "cpu":
        return _cpu_outcome(rec)
    reqs = rec.spec.requirement_set(r_num)
    age = true_age(rec, truth, cluster, r_num)
    return JobOutcome(
        id=rec.id,
        model=rec.model,
        submit=rec.spec.submit_time,
        first_start=rec.first_start,
        finish=rec.finish,
        wait_s=rec.wait_s,
        age_s=age,
        lr=rec.wait_s / age if age > 0 and math.isfinite(age) else 0.0,
        jct_s=None if rec.finish is None else rec.finish - rec.spec.submit_time,
        restarts=rec.restarts,
        min_gpus=reqs[0],
        max_gpus=reqs[-1],
        r_avg=sum(reqs) / len(reqs),
        held_gpu_s=rec.attained_gpu_s,
        busy_gpu_s=rec.busy_gpu_s,
        retunes=rec.retunes,
    )


def _cpu_outcome(rec: JobRecord) -> JobOutcome:
    """A CPU job's outcome; its age is its run time at the cores it asked
    for (its work is core-seconds)."""
    age = rec.spec.total_samples / rec.spec.cores
    return JobOutcome(
        id=rec.id, model=rec.model, submit=rec.spec.submit_time, first_start=rec.first_start,
        finish=rec.finish, wait_s=rec.wait_s, age_s=age, lr=rec.wait_s / age,
        jct_s=None if rec.finish is None else rec.finish - rec.spec.submit_time,
        restarts=rec.restarts, min_gpus=0, max_gpus=0, r_avg=0.0, kind="cpu",
        retunes=rec.retunes,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class _Contention:
    """Mean jobs contending (waiting or running) over the rounds of a time
    span, from prefix sums over the rounds (in time order): reading every
    round for every job made long traces quadratic. The counts are integers,
    so the sums are exact."""

    def __init__(self, rounds: Sequence[RoundRecord]) -> None:
        self.times = [r.t for r in rounds]
        self.prefix = [0, *itertools.accumulate(r.waiting + r.running for r in rounds)]

    def mean(self, start: float, end: float) -> float:
        lo = bisect.bisect_left(self.times, start)
        hi = bisect.bisect_right(self.times, end)
        return (self.prefix[hi] - self.prefix[lo]) / (hi - lo) if hi > lo else 1.0


def ftf_rhos(result: SimResult, cluster: Cluster) -> dict[JobId, float]:
    """Finish-time fairness rho = T_sh / T_id (Themis; heterogeneous as in Sia:
    T_id is the Eq. (9) run time on an equal 1/N share of the whole cluster,
    N the mean number of jobs contending over the job's life)."""
    out: dict[JobId, float] = {}
    contention = _Contention(result.rounds)
    for j in result.jobs:
        if j.jct_s is None or j.finish is None or not math.isfinite(j.age_s):
            continue
        n = max(1.0, contention.mean(j.submit, j.finish))
        share = min(float(j.max_gpus), max(1.0, cluster.total_gpus / n))
        isolated = j.age_s * j.r_avg / share
        out[j.id] = j.jct_s / isolated if isolated > 0 else 0.0
    return out


def summarize(result: SimResult, cluster: Cluster,
              floor: Mapping[JobId, float] | None = None) -> dict[str, float | int]:
    """The headline numbers of a run (the keys of summary.json).

    ``floor`` (default: ``result.floor_s``) is each job's JCT floor in
    seconds (experiments/common/floor.py): ``floor_avg_jct_h`` is its mean over the
    finished jobs that have one, ``excess_avg_jct_h`` = ``avg_jct_h`` minus
    it, ``floor_makespan_h`` the latest submit + floor after the first
    submit. Without floors the three are 0."""
    floors = result.floor_s if floor is None else floor
    done = [j for j in result.jobs if j.jct_s is not None]
    jcts = [j.jct_s for j in done if j.jct_s is not None]
    first_submit = min((j.submit for j in result.jobs), default=0.0)
    last_finish = max((j.finish for j in done if j.finish is not None), default=first_submit)
    rhos = list(ftf_rhos(result, cluster).values())
    busy = [r for r in result.rounds if r.t <= last_finish]
    avg_jct_h = sum(jcts) / len(jcts) / 3600 if jcts else 0.0
    done_floors = [floors[j.id] for j in done if j.id in floors]
    floor_avg_h = sum(done_floors) / len(done_floors) / 3600 if done_floors else 0.0
    floor_end = max((j.submit + floors[j.id] for j in result.jobs if j.id in floors),
                    default=first_submit)
    return {
        "jobs": len(result.jobs),
        "jobs_finished": len(done),
        "makespan_h": (last_finish - first_submit) / 3600,
        "avg_jct_h": avg_jct_h,
        "floor_avg_jct_h": floor_avg_h,
        "excess_avg_jct_h": avg_jct_h - floor_avg_h if done_floors else 0.0,
        "floor_makespan_h": (floor_end - first_submit) / 3600,
        "p99_jct_h": percentile(jcts, 99) / 3600,
        "avg_wait_h": sum(j.wait_s for j in done) / len(done) / 3600 if done else 0.0,
        "max_lr": max((j.lr for j in done), default=0.0),
        "avg_frag": sum(r.frag for r in busy) / len(busy) if busy else 0.0,
        "max_ftf": max(rhos, default=0.0),
        "unfair_fraction": sum(1 for r in rhos if r > 1) / len(rhos) if rhos else 0.0,
        "rounds": len(result.rounds),
        "planner_p95_s": percentile([r.planner_s for r in result.rounds], 95),
        "planner_median_s": percentile([r.planner_s for r in result.rounds], 50),
        "planner_max_s": max((r.planner_s for r in result.rounds), default=0.0),
        "restarts": sum(j.restarts for j in result.jobs),
    }
