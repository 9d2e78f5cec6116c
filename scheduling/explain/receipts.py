"""Preemption receipts: why a running job was stopped by a round's first
plan, who took its GPUs and what progress it kept (docs/explain.md).

A running job (phase ``running`` with a configuration) gets a receipt when
the first plan leaves it out or gives it other GPUs. Its rule is the first
that applies of: ``Drain`` (a server it ran on is drained), ``NodeLost``
(one stopped answering, or left the cluster), ``CellReclaim`` (a layer's
reason for it is HiveD's reclaim), ``Profiling`` (profiling runs of the
plan took GPUs of its servers), ``Resize`` (the plan gives it another
configuration) and else ``Fairness`` (the round's replan gave its GPUs to
others, Eq. 8). A plan later in the round only adds, so it stops no one.
``TimeLimit`` stops are the mechanism's, outside any plan.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from scheduling.explain.reasons import layer_whys
from scheduling.explain.records import is_reclaim
from shared.explain import Receipt, StopRule
from shared.ids import JobId, ServerId
from shared.snapshot import JobState, Plan, Snapshot

MESSAGES: dict[StopRule, str] = {
    "Drain": "stopped: a node it ran on is drained",
    "NodeLost": "stopped: a node it ran on stopped answering",
    "CellReclaim": "stopped: a guaranteed job of the cells' owner reclaimed its cells",
    "Profiling": "stopped: profiling runs took GPUs of its nodes",
    "Resize": "restarted on another configuration",
    "Fairness": "stopped: the round's replan gave its GPUs to jobs with a higher priority",
    "TimeLimit": "stopped: it reached its time limit",
}


def _rule(job: JobState, plan: Plan, drained: set[ServerId], lost: set[ServerId],
          present: Collection[ServerId], reclaimed: bool, moved: bool) -> StopRule:
    assert job.current is not None
    servers = set(job.current.servers)
    if servers & drained:
        return "Drain"
    if servers & lost or any(s not in present for s in servers):
        return "NodeLost"
    if reclaimed:
        return "CellReclaim"
    if any(t.server in servers for t in plan.profiling):
        return "Profiling"
    if moved:
        return "Resize"
    return "Fairness"


def _takers(job: JobState, plan: Plan,
            before: dict[JobId, Counter[ServerId]]) -> tuple[JobId, ...]:
    """The jobs whose new assignments take GPUs of ``job``'s old servers
    that they did not hold before, highest priority first."""
    assert job.current is not None
    mine = set(job.current.servers)
    prio = plan.reasons.priorities
    out = [a.job_id for a in plan.assignments if a.job_id != job.id and any(
        s in mine and g > before.get(a.job_id, Counter())[s] for s, g in a.config.parts)]
    return tuple(sorted(out, key=lambda j: (-prio.get(j, float("-inf")), j)))


def receipts(snapshot: Snapshot, plan: Plan, *, drained: Collection[ServerId] = (),
             lost: Collection[ServerId] = (), round_no: int = 0) -> tuple[Receipt, ...]:
    """One receipt per running job of ``snapshot`` that the first plan
    ``plan`` stops or moves (none for a later plan)."""
    if not snapshot.first_plan:
        return ()
    chosen = {a.job_id: a.config.parts for a in plan.assignments}
    stopped = [j for j in snapshot.jobs if j.phase == "running" and j.current is not None
               and chosen.get(j.id) != j.current.parts]
    if not stopped:
        return ()
    whys = layer_whys(plan)
    before = {j.id: Counter(j.current.as_dict()) for j in snapshot.jobs
              if j.phase == "running" and j.current is not None}
    gone, dead, present = set(drained), set(lost), snapshot.cluster.by_id
    out: list[Receipt] = []
    for job in stopped:
        why = whys.get(job.id)
        rule = _rule(job, plan, gone, dead, present, why is not None and is_reclaim(why),
                     job.id in chosen)
        out.append(Receipt(job_id=job.id, at=snapshot.now, rule=rule, message=MESSAGES[rule],
                           takers=_takers(job, plan, before),
                           samples_kept=job.done_samples,
                           total_samples=float(job.spec.total_samples), round=round_no))
    return tuple(out)
