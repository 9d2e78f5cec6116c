"""The Sia baseline (Jayaram Subramanya et al., "Sia: Heterogeneity-aware,
goodput-optimized ML-cluster scheduling", SOSP'23), configured as the Hops
paper configures it (§2.1, §4.2 "Baseline Settings", §4.4).

One call at the start of a round:

1. the shared profiling queue has taken GPUs first: the registry wraps the
   policy in the profiling-first layer
   (:mod:`scheduling.layers.profiling_first`);
2. every job with an estimate, queued or running, gets one configuration per
   (GPU type, requirement R_k) with the type's goodput; Sia sees GPU types
   only, so per-server curves (``JobEstimate.by_server``) are ignored;
3. a binary ILP at type level (Sia §3.3, Eq. 1) picks at most one
   configuration per job subject to the free GPUs of each type, trading the
   normalised goodput G raised to ``p`` against the no-allocation penalty
   ``lam``, with the restart factor (Sia Eq. 2) on configurations that would
   change a running job's allocation;
4. the Placer (:mod:`scheduling.policies.sia.placement`) maps each
   (type, count) onto servers; an allocation that the server-level
   fragmentation defeats gets nothing this round.

Later plans in a round plan nothing (the layer still serves the profiling
queue): "Sia and Gavel only plan once at the beginning of each round" (Hops §3.6).

Sources read (``siasosp23/artifacts``): ``sia-simulator/sia.py``
(``populate_valid_configs``, ``optimize_mip``, ``__solve_mip_rescaled``,
``alloc_to_placement_smart``, ``get_restart_penalty``),
``sia-simulator/simulator_config.py`` (defaults), ``sia-simulator/cluster.py``
(job age), ``adaptdl/sched/adaptdl_sched/policy/mip.py`` (``get_valid_configs``)
and the paper ``sia-sosp23.pdf`` (§3.1-§3.3, §4). How this follows and departs
from them is written down in ``docs/baselines.md`` ("Sia"); in short:

* objective: for p < 0 Sia minimises ``sum A_ij * G'_ij^p + lam * (#jobs
  left out)``; the equivalent maximisation solved here gives each column the
  coefficient ``lam - G'^p`` (for p > 0: ``G'^p + lam``). As in the artifact,
  ``G^p`` is rounded to two decimals and clipped at 3000, and a row is scaled
  so its minimum equals the job's smallest requirement R_1 (Sia §3.3: "normalize
  the row to have a minimum non-zero value of N_min");
* ``G' = r_i * G`` for every configuration other than the job's current one,
  ``r_i = max(T_i - N_i * S, 0) / (T_i + S)`` with T_i the job's age, N_i its
  restarts and S ``restart_penalty`` seconds, and ``r_i = 1`` while
  ``T_i < S`` (artifact);
* configurations: one per requirement R_k (Hops §4.2) instead of Sia's powers
  of two up to a node and whole nodes beyond; goodput = throughput, since the
  per-GPU batch size is fixed (Hops §2.2) and there is no statistical
  efficiency term to add;
* latency-ratio priority (Hops §4.2) orders the queue. Sia's objective has no
  job weights (the artifact's ``job_weights`` are all ones), so the queue
  order enters only where Sia is indifferent: after the solve, an unserved
  job takes an allocation that a job behind it holds and that it values at
  least as much (:mod:`.ties`), and the Placer serves equal-sized
  allocations in queue order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from scheduling.ilp import (
    MipOptions,
    MipResult,
    solve_mip,
    solve_relaxation_duals,
)
from scheduling.layers.base import LayeredPolicy
from scheduling.policies.hops.window import order_queue
from scheduling.policies.sia.bootstrap import STATE, StateCodec, bootstrapped, observe
from scheduling.policies.sia.goodput import current_allocation, job_row, restart_factor
from scheduling.policies.sia.ilp import SiaColumn, build_model, index_columns
from scheduling.policies.sia.placement import Placement, TypeAllocation, place
from scheduling.policies.sia.start import good_start, lp_homes
from scheduling.policies.sia.ties import prefer_queue_order
from scheduling.priorities import latency_ratios, priority_fn, queue_priorities
from scheduling.profiling import PROFILE_PREEMPT, PROFILE_SHARE
from scheduling.rounds import restart_cost
from shared.estimate import config_throughput
from shared.ids import GpuType, JobId
from shared.job import R_NUM
from shared.reuse import BASELINE_PROFILE_REUSE
from shared.snapshot import (
    Assignment,
    JobState,
    LayerRecord,
    PassStats,
    Plan,
    PlanReasons,
    Snapshot,
)

STARTS = ("rounded-lp", "search")
THROUGHPUTS = ("bootstrap", "estimator")


class SiaSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Sia's knobs with the defaults of Sia §4.3 and the artifact's
    ``simulator_config.py`` (p = -0.5, lambda = 1.1, restarts cost 30 s,
    relative MIP gap 1e-4), and the Hops paper's queue priority."""

    p: float = -0.5
    lam: float = 1.1
    # S_i of Sia Eq. (2), seconds lost per restart: None, each job's own
    # (scheduling.rounds.restart_cost: the artifact's per-model penalties in
    # the simulator); a number, the same for every job.
    restart_penalty: float | None = None
    priority: str = "lr"
    r_num: int = R_NUM
    scale_to_min_gpus: bool = True
    round_decimals: int | None = 2
    goodput_clip: float = 3000.0
    mip_rel_gap: float = 1e-4
    # The artifact's CBC call has no time limit; this one is only a safety
    # net. A 10 s limit ended the hardest rounds wherever the machine's speed
    # let it (up to 70 s to prove 1e-4 under load), so runs differed.
    time_limit_s: float = 300.0
    threads: int = 1
    # The profiling-first layer's knobs (layers/profiling_first.py), set per
    # policy spec; Sia itself does not read them.
    profile_gpus: int = 1
    profile_share: float = PROFILE_SHARE  # of each GPU type, at once (profiling.py)
    profile_preempt: bool = PROFILE_PREEMPT  # at round boundaries (profiling.py)
    # Jobs of one profile signature share profiles (shared.reuse).
    profile_reuse: bool = BASELINE_PROFILE_REUSE
    # HiGHS's starting solution: the search of :mod:`.start` ("search"),
    # or the LP optimum rounded down ("rounded-lp"), from which HiGHS takes
    # about twice as long on the same ILPs (docs/performance.md). Either way
    # the answer is proven to the same gap.
    start: str = "search"
    # Sia's throughput information: "bootstrap", its own model from one-GPU
    # profiles and what it measured (:mod:`.bootstrap`, Sia §3.2), or
    # "estimator", Hops' estimator's curves per type.
    throughput: str = "bootstrap"

    def __post_init__(self) -> None:
        if self.p == 0 or not math.isfinite(self.p):
            raise ValueError(f"p must be finite and non-zero, got {self.p}")
        if self.lam < 0 or not math.isfinite(self.lam):
            raise ValueError(f"lam must be finite and >= 0, got {self.lam}")
        if self.restart_penalty is not None and self.restart_penalty < 0:
            raise ValueError(f"restart_penalty must be >= 0, got {self.restart_penalty}")
        if self.r_num < 1:
            raise ValueError(f"r_num must be >= 1, got {self.r_num}")
        if self.start not in STARTS:
            raise ValueError(f"start must be one of {', '.join(STARTS)}, got {self.start!r}")
        if self.throughput not in THROUGHPUTS:
            raise ValueError(f"throughput must be one of {', '.join(THROUGHPUTS)}, "
                             f"got {self.throughput!r}")


def coefficient(g: float, settings: SiaSettings) -> float | None:
    """A column's worth against leaving the job out: ``lam - G^p`` for p < 0
    (Sia minimises cost G^p against the penalty lam), ``G^p + lam`` for p > 0.
    None when the column could never improve the objective."""
    if g <= 0:
        return None
    value = g**settings.p
    if settings.round_decimals is not None:
        value = round(value, settings.round_decimals)
    value = min(value, settings.goodput_clip)
    coeff = settings.lam - value if settings.p < 0 else value + settings.lam
    return coeff if coeff > 0 else None


class SiaPolicy(LayeredPolicy):
    """Sia's type-level goodput ILP plus its Placer, behind ``plan(snapshot)``."""

    name = "sia"

    def __init__(self, settings: SiaSettings | None = None) -> None:
        self.settings = settings or SiaSettings()
        self._priority = priority_fn(self.settings.priority)
        self._codec = StateCodec()

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        free = snapshot.free_gpus()
        observed = observe(self._codec.decode(snapshot.layer_state.get(STATE)), snapshot)
        record = (LayerRecord(STATE, state=self._codec.encode(observed)),)
        if not snapshot.first_plan:
            return Plan((), (), PlanReasons(policy=self.name, layers=record))
        if self.settings.throughput == "bootstrap":
            snapshot = msgspec.structs.replace(snapshot, estimates={
                j: bootstrapped(e, observed.jobs.get(j, ()), snapshot.cluster)
                for j, e in snapshot.estimates.items()})
        jobs, prios = self._queue(snapshot)
        capacity = snapshot.cluster.free_by_type(free)
        columns = self._columns(snapshot, jobs, capacity)
        result = self._solve(snapshot, jobs, columns, capacity)
        values = prefer_queue_order(index_columns(jobs, columns, capacity), result.values)
        chosen = [c for c, x in zip(columns, values, strict=True) if x > 0.5]
        placement = place(snapshot.cluster, free, self._allocations(snapshot, jobs, chosen))
        assignments = self._assignments(snapshot, jobs, chosen, placement)
        stats = _stats(len(jobs), len(columns), result, placement, assignments)
        ratios = latency_ratios(snapshot, {j.id: j for j in jobs}, self.settings.r_num)
        reasons = PlanReasons(
            policy=self.name, priorities=prios, latency_ratios=ratios, passes=(stats,),
            layers=record,
        )
        return Plan(tuple(assignments), (), reasons)

    def _queue(self, snapshot: Snapshot) -> tuple[list[JobState], dict[JobId, float]]:
        """Every plannable job (Sia replans all of them each round), in
        descending priority order."""
        plannable = {
            j.id: j
            for j in snapshot.jobs
            if j.phase in ("queued", "running") and j.id in snapshot.estimates
        }
        prios = queue_priorities(snapshot, plannable, self._priority, self.settings.r_num)
        submit = {jid: j.spec.submit_time for jid, j in plannable.items()}
        return [plannable[j] for j in order_queue(prios, submit)], prios

    def _columns(
        self, snapshot: Snapshot, jobs: Sequence[JobState], capacity: Mapping[GpuType, int]
    ) -> list[SiaColumn]:
        """The ILP's columns in queue order; a configuration larger than the
        free GPUs of its type is not offered this round."""
        s = self.settings
        columns: list[SiaColumn] = []
        for job in jobs:
            reqs = job.spec.requirement_set(s.r_num)
            row = job_row(snapshot.cluster, snapshot.estimates[job.id], reqs, s.scale_to_min_gpus)
            current = current_allocation(snapshot.cluster, job)
            penalty = restart_cost(job) if s.restart_penalty is None else s.restart_penalty
            r = restart_factor(job, snapshot.now, penalty)
            for gpu_type, gpus, nodes, g in row:
                if gpus > capacity[gpu_type]:
                    continue
                factor = 1.0 if (gpu_type, gpus) == current else r
                coeff = coefficient(factor * g, s)
                if coeff is not None:
                    columns.append(SiaColumn(job.id, gpu_type, gpus, nodes, g, coeff))
        return columns

    def _solve(
        self,
        snapshot: Snapshot,
        jobs: Sequence[JobState],
        columns: Sequence[SiaColumn],
        capacity: Mapping[GpuType, int],
    ) -> MipResult:
        """At most one column per job; per type, GPUs <= the type's free GPUs."""
        s = self.settings
        model = build_model(jobs, columns, capacity)
        options = MipOptions(
            mip_rel_gap=s.mip_rel_gap, time_limit_s=s.time_limit_s, threads=s.threads
        )
        # Every row is a packing row (<=, non-negative entries), so the LP
        # optimum rounded down is feasible; the search (the default) does
        # better. A start spares HiGHS part of its search for a good
        # incumbent without changing the gap the answer is proven to.
        relaxed = solve_relaxation_duals(model, options, maximize=True)
        start = None
        if relaxed.values is not None and relaxed.reduced is not None:
            if s.start == "search":
                start = search_start(
                    snapshot, jobs, columns, capacity, relaxed.values, relaxed.reduced
                )
            else:
                start = np.floor(relaxed.values + 1e-9).tolist()
        result = solve_mip(model, options, maximize=True, incumbent=start)
        return dataclasses.replace(result, solve_s=result.solve_s + relaxed.solve_s)

    def _allocations(
        self, snapshot: Snapshot, jobs: Sequence[JobState], chosen: Sequence[SiaColumn]
    ) -> list[TypeAllocation]:
        rank = {j.id: i for i, j in enumerate(jobs)}
        by_id = {j.id: j for j in jobs}
        allocations: list[TypeAllocation] = []
        for c in chosen:
            job = by_id[c.job_id]
            same = current_allocation(snapshot.cluster, job) == (c.gpu_type, c.gpus)
            keep = job.current if same else None
            allocations.append(
                TypeAllocation(c.job_id, c.gpu_type, c.gpus, c.nodes, rank[c.job_id], keep)
            )
        return allocations

    def _assignments(
        self,
        snapshot: Snapshot,
        jobs: Sequence[JobState],
        chosen: Sequence[SiaColumn],
        placement: Placement,
    ) -> list[Assignment]:
        """Placed jobs in queue order; throughput from the type curves only."""
        gain = {c.job_id: c.gain for c in chosen}
        out: list[Assignment] = []
        for job in jobs:
            config = placement.configs.get(job.id)
            if config is None:
                continue
            blind = msgspec.structs.replace(snapshot.estimates[job.id], by_server={})
            tput = config_throughput(blind, snapshot.cluster, config)
            out.append(Assignment(job.id, config, tput, gain[job.id]))
        return out


def search_start(
    snapshot: Snapshot,
    jobs: Sequence[JobState],
    columns: Sequence[SiaColumn],
    capacity: Mapping[GpuType, int],
    relaxed: npt.NDArray[np.float64],
    reduced: npt.NDArray[np.float64],
) -> list[float]:
    """A start for HiGHS (:mod:`.start`): homes from the LP relaxation,
    from the reduced costs, and the running jobs' current types."""
    cols = index_columns(jobs, columns, capacity)
    type_index = {t: i for i, t in enumerate(capacity)}
    by_share, by_reduced = lp_homes(cols, relaxed, reduced)
    current = list(by_share)
    for i, job in enumerate(jobs):
        now = current_allocation(snapshot.cluster, job)
        if now is not None and now[0] in type_index:
            current[i] = type_index[now[0]]
    start: list[float] = good_start(cols, (by_share, by_reduced, current)).tolist()
    return start


def _stats(
    considered: int,
    variables: int,
    result: MipResult,
    placement: Placement,
    assignments: Sequence[Assignment],
) -> PassStats:
    """The round's one pass. Allocations the Placer could not realise (server
    fragmentation the type-level ILP cannot see) are counted in
    ``formulation`` as ``unplaced=<n>`` with their ids."""
    unplaced = placement.unplaced
    note = f"sia-type-level, unplaced={len(unplaced)}"
    if unplaced:
        note += " (" + ", ".join(unplaced) + ")"
    return PassStats(
        kind="first",
        jobs=considered,
        variables=variables,
        objective=result.objective,
        bound=result.bound,
        gap=result.gap,
        solve_s=result.solve_s,
        status=result.status,
        formulation=note,
        assigned=tuple(a.job_id for a in assignments),
    )
