"""The Themis baseline (Mahajan et al., "Themis: Fair and Efficient GPU
Cluster Scheduling", NSDI'20) behind ``plan(snapshot) -> Plan``: finish-time
fairness (:mod:`.fairness`), offers to the jobs furthest from fair, a
partial-allocation auction over their placement-aware bids
(:mod:`.auction`), the leftover GPUs to the other jobs, and leases
(:mod:`.leases`) (docs/baselines.md, "Themis").

A round's first plan is an arbiter's round: running jobs whose lease still
runs keep their GPUs; every other plannable job contends. The contenders
are ranked by rho, furthest from fair first, and the ``1 - f`` fraction
at the head (at least one) is offered the free GPUs. Each bids, per GPU
type it runs on, its request placed as it would run there (consolidated
on the free GPUs of that type), and a running job its own configuration
too, without a restart. The winners of the auction that keep their
bundle are placed; the GPUs left over go to the other contenders in rho
order, each its request where it fits (the rigid baselines' placement,
:func:`~scheduling.policies.rigid.place`), so no GPU idles while a job
fits. A later plan offers the GPUs that came free to the waiting jobs the
same way: Themis' arbiter offers GPUs whenever they come back.

Jobs ask for one GPU count, the rule Hops §4.2 gives the rigid baselines
(:func:`~scheduling.policies.rigid.rigid_requirement`), and Themis knows
each job's speed by GPU type, not by server
(:func:`~scheduling.policies.rigid.type_curves`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduling.layers.base import LayeredPolicy
from scheduling.policies import rigid
from scheduling.policies.gavel.rounds import pack
from scheduling.policies.rigid import Avail, RigidSettings
from scheduling.policies.themis import fairness
from scheduling.policies.themis.auction import Bid, kept, partial_shares
from scheduling.policies.themis.leases import STATE, decode, encode, live, renewed
from scheduling.priorities import latency_ratios
from scheduling.rounds import restart_cost
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import config_throughput
from shared.ids import GpuType, JobId
from shared.snapshot import (
    Assignment,
    JobState,
    LayerRecord,
    PassStats,
    Plan,
    PlanReasons,
    Snapshot,
)

# The fairness knob f: the auction is offered to the 1 - f fraction of the
# contenders furthest from fair. 0.8 as recalled from the paper's
# evaluation, not checked against its text (docs/baselines.md, "Themis").
FAIRNESS_KNOB = 0.8
# A lease: 10 minutes, two of this project's rounds (as recalled, not checked).
LEASE_S = 600.0


class ThemisSettings(RigidSettings, frozen=True, forbid_unknown_fields=True):
    """Themis' knobs: the fairness knob f in [0, 1] and the lease in seconds."""

    fairness_knob: float = FAIRNESS_KNOB
    lease_s: float = LEASE_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.fairness_knob <= 1.0:
            raise ValueError(f"fairness_knob must be in [0, 1], got {self.fairness_knob}")
        if not (math.isfinite(self.lease_s) and self.lease_s > 0):
            raise ValueError(f"lease_s must be finite and > 0, got {self.lease_s}")


class _Jobs(rigid.Known):
    """What one plan knows of each plannable job, and its rho."""

    def __init__(self, snapshot: Snapshot, r_num: int) -> None:
        super().__init__(snapshot, r_num)
        cluster, now = snapshot.cluster, snapshot.now
        self.standing: dict[JobId, fairness.Standing] = {}
        self.rho: dict[JobId, float] = {}
        for jid, job in self.jobs.items():
            est, cur = self.ests[jid], job.current
            request = fairness.mix_rate(est, cluster, self.gpus[jid])
            running = job.phase == "running" and cur is not None
            st = fairness.Standing(
                elapsed_s=max(0.0, now - job.spec.submit_time), total=job.spec.total_samples,
                remaining=job.remaining_samples, request_rate=request,
                current_rate=config_throughput(est, cluster, cur) if running and cur else 0.0)
            x_id = fairness.fair_rate(request, self.gpus[jid], cluster.total_gpus, len(self.jobs))
            self.standing[jid], self.rho[jid] = st, fairness.rho(st, x_id)
        self.ranked = fairness.ranked(
            self.rho, {j: job.spec.submit_time for j, job in self.jobs.items()})


class ThemisPolicy(LayeredPolicy):
    """Finish-time fairness by partial-allocation auction (module docstring)."""

    name = "themis"

    def __init__(self, settings: ThemisSettings | None = None) -> None:
        self.settings = settings or ThemisSettings()

    def plan_inner(self, snapshot: Snapshot) -> Plan:
        s, now = self.settings, snapshot.now
        leases = decode(snapshot.layer_state.get(STATE))
        known = _Jobs(snapshot, s.r_num)
        avail: Avail = snapshot.free_gpus()
        configs: dict[JobId, Configuration] = {}
        running = [j for j in known.ranked if known.jobs[j].phase == "running"]
        if snapshot.first_plan:
            held = [j for j in running if live(leases, j, now, s.lease_s) and _stays(
                known.jobs[j], avail, configs)]
            contenders = [j for j in known.ranked if j not in configs]
        else:
            held = running
            contenders = [j for j in known.ranked if known.jobs[j].phase == "queued"]
        label = _allocate(snapshot, known, contenders, avail, configs, s)
        won = [j for j in configs if j not in held]
        assignments = tuple(
            Assignment(jid, cfg, config_throughput(known.ests[jid], snapshot.cluster, cfg))
            for jid, cfg in configs.items())
        record = LayerRecord(STATE, state=encode(renewed(leases, held, won, now)))
        stats = PassStats(kind="first" if snapshot.first_plan else "fill", jobs=len(known.jobs),
                          variables=0, objective=0.0, bound=0.0, gap=0.0, solve_s=0.0,
                          status="auction", formulation=label,
                          assigned=tuple(j for j in won if known.jobs[j].phase != "running"))
        reasons = PlanReasons(
            policy=self.name, priorities=dict(known.rho),
            latency_ratios=latency_ratios(snapshot, known.jobs, s.r_num),
            passes=(stats,), layers=(record,))
        return Plan(assignments, (), reasons)


def _stays(job: JobState, avail: Avail, configs: dict[JobId, Configuration]) -> bool:
    """Keep a running job where it runs if its GPUs are still free (booked
    in ``avail`` and ``configs`` in place)."""
    cur = job.current
    if cur is None or not rigid.fits(cur, avail):
        return False
    rigid.take(avail, cur)
    configs[job.id] = cur
    return True


def _allocate(snapshot: Snapshot, known: _Jobs, contenders: Sequence[JobId], avail: Avail,
              configs: dict[JobId, Configuration], s: ThemisSettings) -> str:
    """The auction among the head of ``contenders``, then the leftover to the
    rest; ``avail`` and ``configs`` are filled in place. Returns the pass's
    label."""
    cluster = snapshot.cluster
    n = len(contenders)
    bidders = list(contenders[:max(1, math.ceil((1.0 - s.fairness_knob) * n))]) if n else []
    idle = _idle(known, contenders, avail)
    bids = [b for jid in bidders for b in _bids(snapshot, known, jid, avail, idle, s.lease_s)]
    shares = partial_shares(bids, cluster.free_by_type(avail))
    winners = [(j, b) for j, (b, c) in shares.items() if kept(b, c)]
    for jid, bid in sorted(winners, key=lambda w: not w[1].keep):
        job = known.jobs[jid]
        if bid.keep and _stays(job, avail, configs):
            continue
        config = _placed(cluster, bid.gpu_type, bid.gpus, avail, _idle(known, contenders, avail))
        if config is not None and config_throughput(known.ests[jid], cluster, config) > 0:
            rigid.take(avail, config)
            configs[jid] = config
    rest = [j for j in contenders if j not in bidders] + [j for j in bidders if j not in configs]
    # The leftover: running jobs stay where they run while their GPUs are
    # left, then the others, each in rho order.
    for jid in rest:
        if known.jobs[jid].phase == "running":
            _stays(known.jobs[jid], avail, configs)
    for jid in (j for j in rest if j not in configs):
        config = rigid.place(cluster, known.gpus[jid], avail, known.types[jid], known.ests[jid])
        if config is not None:
            rigid.take(avail, config)
            configs[jid] = config
    return (f"themis-auction, f={s.fairness_knob:g}, bidders={len(bidders)}/{n}, "
            f"won={len(shares)}, kept={len(winners)}")


def _bids(snapshot: Snapshot, known: _Jobs, jid: JobId, avail: Avail, idle: Avail,
          lease_s: float) -> list[Bid]:
    """One job's bids on the offer ``avail``: its own configuration kept, if
    it runs and its GPUs are offered, and its request placed on each other
    type it runs on (:func:`_placed`), after a restart if it runs."""
    cluster, job, est = snapshot.cluster, known.jobs[jid], known.ests[jid]
    st, gpus = known.standing[jid], known.gpus[jid]
    bids: list[Bid] = []
    cur = job.current if job.phase == "running" else None
    own: GpuType | None = None
    if cur is not None and rigid.fits(cur, avail):
        own = cluster.by_id[cur.parts[0][0]].gpu_type
        bids.append(Bid(jid, own, cur.total_gpus,
                        fairness.value(st, st.current_rate, 0.0, lease_s), keep=True))
    restart = restart_cost(job) if cur is not None else 0.0
    for t in known.types[jid]:
        if t == own:
            continue
        config = _placed(cluster, t, gpus, avail, idle)
        if config is not None:
            rate = config_throughput(est, cluster, config)
            bids.append(Bid(jid, t, gpus, fairness.value(st, rate, restart, lease_s)))
    return bids


def _idle(known: _Jobs, contenders: Sequence[JobId], avail: Avail) -> Avail:
    """``avail`` less the GPUs the running contenders (leases ended) hold."""
    idle = dict(avail)
    for jid in contenders:
        cur = known.jobs[jid].current
        if known.jobs[jid].phase == "running" and cur is not None and rigid.fits(cur, idle):
            rigid.take(idle, cur)
    return idle


def _placed(cluster: Cluster, gpu_type: GpuType, gpus: int, avail: Avail, idle: Avail
            ) -> Configuration | None:
    """``gpus`` GPUs of ``gpu_type`` consolidated on the idle GPUs if they
    hold them, else on every offered GPU (a running contender's too)."""
    servers = [x.id for x in cluster.servers_of_type(gpu_type)]
    return (pack(gpus, servers, {k: min(v, avail.get(k, 0)) for k, v in idle.items()},
                 cluster.server_index)
            or pack(gpus, servers, avail, cluster.server_index))
