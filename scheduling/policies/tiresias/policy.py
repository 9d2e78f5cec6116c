"""The Tiresias baseline (Gu et al., NSDI'19) behind ``plan(snapshot) ->
Plan``: discretised two-dimensional least-attained-service (2D-LAS) over
whole-GPU, rigid requests, with preemption between queues and consolidated
placement (docs/baselines.md, "Tiresias").

A round's first plan walks the jobs queue by queue (:mod:`.queues`) and
takes every job whose GPU count still fits the cluster's free GPUs, skipping
the ones that do not (all-or-nothing, as the artifact's ``dlas_sim_jobs``
counts free GPUs); a running job not taken is preempted. The jobs taken are
then placed: running ones where they run, the rest consolidated
(:func:`~scheduling.policies.rigid.place`); a job left without servers by
fragmentation gives its turn to the next job that can be placed, so no GPU
idles while a waiting job fits. A later plan in the round starts waiting
jobs on the GPUs that came free, in the same order, without preempting:
Tiresias schedules on every arrival and completion.

Read in SymbioticLab/Tiresias: ``simulator/run_sim.py`` (``dlas_sim_jobs``
with ``gputime=True``, the ``dlas-gpu`` scheme, and its ``solve_starvation``
knob) and ``simulator/jobs.py`` (``queue_limit``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scheduling.layers.base import LayeredPolicy
from scheduling.policies import rigid
from scheduling.policies.rigid import Avail, RigidSettings
from scheduling.policies.tiresias.queues import (
    STATE,
    QueueState,
    advance,
    decode,
    encode,
    order,
    started,
)
from scheduling.priorities import latency_ratios
from shared.configuration import Configuration
from shared.estimate import config_throughput
from shared.ids import JobId
from shared.snapshot import Assignment, LayerRecord, PassStats, Plan, PlanReasons, Snapshot


class TiresiasSettings(RigidSettings, frozen=True, forbid_unknown_fields=True):
    """Tiresias' knobs, at the paper's defaults: K = 2 queues, the threshold
    between them in GPU-seconds (the artifact's first ``queue_limit``, 3250),
    and PROMOTEKNOB (8, the artifact's ``dlas-gpu-8``; 0 turns promotion off,
    as the plain ``dlas-gpu`` runs)."""

    threshold_gpu_s: float = 3250.0
    promote_knob: float = 8.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold_gpu_s) and self.threshold_gpu_s > 0):
            raise ValueError(f"threshold_gpu_s must be finite and > 0, got {self.threshold_gpu_s}")
        if not (math.isfinite(self.promote_knob) and self.promote_knob >= 0):
            raise ValueError(f"promote_knob must be finite and >= 0, got {self.promote_knob}")

    @property
    def thresholds(self) -> tuple[float, ...]:
        """The K-1 queue thresholds (K = 2)."""
        return (self.threshold_gpu_s,)


_Jobs = rigid.Known  # what one plan knows of each plannable job


class TiresiasPolicy(LayeredPolicy):
    """Discretised 2D-LAS with starvation promotion (module docstring)."""

    name = "tiresias"

    def __init__(self, settings: TiresiasSettings | None = None) -> None:
        self.settings = settings or TiresiasSettings()

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        s, now = self.settings, snapshot.now
        known = _Jobs(snapshot, s.r_num)
        marks, queues = advance(decode(snapshot.layer_state.get(STATE)), known.jobs,
                                known.gpus, s.thresholds, s.promote_knob, now)
        ranked = order(known.jobs, queues, marks)
        avail: Avail = snapshot.free_gpus()
        if snapshot.first_plan:
            configs = _first(snapshot, known, ranked, avail)
        else:
            waiting = [jid for jid in ranked if known.jobs[jid].phase == "queued"]
            configs = _fill(snapshot, known, waiting, avail, {})
        for jid in configs:
            marks[jid] = started(marks, known.jobs[jid], now)
        assignments = tuple(
            Assignment(jid, cfg, config_throughput(known.ests[jid], snapshot.cluster, cfg))
            for jid, cfg in configs.items())
        record = LayerRecord(STATE, state=encode(QueueState(marks)))
        reasons = PlanReasons(
            policy=self.name,
            priorities={jid: -float(q) for jid, q in queues.items()},
            latency_ratios=latency_ratios(snapshot, known.jobs, s.r_num),
            passes=(_stats(snapshot.first_plan, known, queues, configs),),
            layers=(record,))
        return Plan(assignments, (), reasons)


def _first(snapshot: Snapshot, known: _Jobs, ranked: Sequence[JobId],
           avail: Avail) -> dict[JobId, Configuration]:
    """Take jobs by GPU count in queue order, place the taken ones (running
    ones where they are), then give the turns of those fragmentation left
    out to the next jobs that can be placed."""
    left = sum(avail.values())
    taken: list[JobId] = []
    for jid in ranked:
        if known.gpus[jid] <= left:
            taken.append(jid)
            left -= known.gpus[jid]
    configs: dict[JobId, Configuration] = {}
    for jid in taken:
        cur = known.jobs[jid].current
        if cur is not None and known.jobs[jid].phase == "running" and rigid.fits(cur, avail):
            rigid.take(avail, cur)
            configs[jid] = cur
    _fill(snapshot, known, [j for j in taken if j not in configs], avail, configs)
    return _fill(snapshot, known, [j for j in ranked if j not in configs], avail, configs)


def _fill(snapshot: Snapshot, known: _Jobs, ranked: Sequence[JobId], avail: Avail,
          configs: dict[JobId, Configuration]) -> dict[JobId, Configuration]:
    """Each of ``ranked`` in turn where it fits: a running job (a first
    plan's) where it runs if still free, else consolidated; ``configs`` and
    ``avail`` are filled in place."""
    for jid in ranked:
        job = known.jobs[jid]
        cur = job.current
        if cur is not None and job.phase == "running" and rigid.fits(cur, avail):
            config: Configuration | None = cur
        else:
            config = rigid.place(snapshot.cluster, known.gpus[jid], avail, known.types[jid],
                           known.ests[jid])
        if config is not None:
            rigid.take(avail, config)
            configs[jid] = config
    return configs


def _stats(first: bool, known: _Jobs, queues: Mapping[JobId, int],
           configs: Mapping[JobId, Configuration]) -> PassStats:
    """No solver: ``formulation`` gives the jobs per queue and the running
    jobs preempted (a first plan's)."""
    sizes = [sum(1 for q in queues.values() if q == k) for k in range(max(queues.values(),
                                                                           default=0) + 1)]
    jobs = known.jobs
    preempted = sum(1 for jid, j in jobs.items() if j.phase == "running" and jid not in configs)
    label = (f"tiresias-2d-las, queues={'/'.join(map(str, sizes))}, "
             f"preempted={preempted if first else 0}")
    return PassStats(kind="first" if first else "fill", jobs=len(jobs), variables=0,
                     objective=0.0, bound=0.0, gap=0.0, solve_s=0.0, status="2d-las",
                     formulation=label,
                     assigned=tuple(j for j in configs if jobs[j].phase != "running"))
