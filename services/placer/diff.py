"""The placer's decisions (pure): what a plan changes, and which GPUs each
start gets (§3.1, step 9: "the placer executes the resource allocation").

:func:`changes` compares a plan with the placements in ``hops_alloc``:

* a job assigned the configuration it holds keeps running untouched;
* a job assigned another configuration is stopped and started again on the
  new one (a resize: restart from its checkpoint);
* a running job assigned the same GPU parts and memory but other CPU cores
  or another memory-bandwidth cap (CODA's core tuning, or its contention
  eliminator halving a CPU job's cores or capping it by MBA) is *retuned*:
  it keeps running on its GPUs and only its cores or cap change, with a
  ``set_cores`` to each server where they do (:class:`Retune`);
* on a round's first plan, every other running job is stopped; a plan later
  in the round only adds (§3.6), so it stops nothing else;
* a profiling task (§3.2) starts a profiling run of the job on one server;
  the runs of one job on several GPU types share its placement, and a run
  already going on that server is left alone. Profiling runs are never
  stopped by a plan: they end by themselves.

Requests the placer cannot carry out are :class:`Problem`\\ s and the rest of
the plan still applies: unknown or ended jobs, a run for a job still
profiling (or the reverse), a job assigned twice. Those the cluster
overtook after the plan was made (an ended job, a profiling run not yet
released, a profiling task for a job an earlier plan started) are benign
races (``race`` set, :data:`services.placer.commands.RACES`), not errors.

:func:`services.placer.booking.book` then picks GPU indices on servers that
are alive and books the other resources each start demands (see there).
:func:`diff` is both steps for a plan whose stops all succeed. The commands
both steps produce, and their keys, are :mod:`services.placer.commands`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.placer.booking import book_all
from services.placer.commands import (
    ALREADY_RUNNING,
    CONFLICT,
    INVALID,
    JOB_ENDED,
    NOT_FOUND,
    NOT_IN_PLAN,
    RESIZE,
    STILL_PROFILING,
    Changes,
    Commands,
    Problem,
    Retune,
    Stop,
    Want,
)
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.records import JobRecord, Placement
from shared.resources import Resources
from shared.snapshot import Plan


def _refuse(job: JobId, jobs: Mapping[JobId, JobRecord]) -> Problem | None:
    rec = jobs.get(job)
    if rec is None:
        return Problem(job, NOT_FOUND, f"job {job} is unknown to the scheduler")
    if rec.final:
        return Problem(job, INVALID, f"job {job} is {rec.phase}", JOB_ENDED)
    return None


@dataclass
class _Assigned:
    """What the assignments of a plan change, as :func:`_assignments` finds it."""

    stops: list[Stop] = field(default_factory=list)
    wants: list[Want] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    retunes: list[Retune] = field(default_factory=list)
    kept: set[JobId] = field(default_factory=set)  # unchanged, resized, retuned, profiling
    seen: set[JobId] = field(default_factory=set)  # assigned


def _assignments(current: Mapping[JobId, Placement], plan: Plan,
                 jobs: Mapping[JobId, JobRecord]) -> _Assigned:
    """Stops, wants, retunes and problems of the assignments."""
    out = _Assigned()
    stops, wants, problems, seen, kept = out.stops, out.wants, out.problems, out.seen, out.kept
    for a in plan.assignments:
        job = a.job_id
        if job in seen:
            problems.append(Problem(job, INVALID, f"job {job} is assigned twice in the plan"))
            continue
        seen.add(job)
        refusal = _refuse(job, jobs)
        cur = current.get(job)
        if refusal is not None:
            problems.append(refusal)
        elif cur is None:
            wants.append(Want(job, a.config, "run"))
        elif cur.mode == "profile":
            kept.add(job)
            problems.append(Problem(job, CONFLICT, f"job {job} is still profiling",
                                    STILL_PROFILING))
        elif cur.configuration == a.config:
            kept.add(job)
        elif _cores_only(cur.configuration, a.config):
            kept.add(job)
            out.retunes.append(Retune(job, cur, a.config))
        else:
            kept.add(job)
            stops.append(Stop(job, cur, resize=True, reason=RESIZE))
            wants.append(Want(job, a.config, "run", resize=True))
    return out


def _cores_only(old: Configuration, new: Configuration) -> bool:
    """Whether ``new`` differs from ``old`` in CPU cores or bandwidth cap alone."""
    return old.parts == new.parts and all(
        old.demand_on(s).memory_mb == new.demand_on(s).memory_mb for s in new.servers)


def _profiling(current: Mapping[JobId, Placement], plan: Plan, jobs: Mapping[JobId, JobRecord],
               assigned: set[JobId]) -> tuple[list[Want], list[Problem]]:
    added: dict[JobId, dict[ServerId, int]] = {}
    problems: list[Problem] = []
    for task in plan.profiling:
        job = task.job_id
        refusal = _refuse(job, jobs)
        cur = current.get(job)
        if refusal is not None:
            problems.append(refusal)
        elif job in assigned:
            problems.append(Problem(job, CONFLICT, f"job {job} cannot profile on "
                                                   f"{task.server}: it is assigned to run"))
        elif cur is not None and cur.mode == "run":
            problems.append(Problem(job, CONFLICT, f"job {job} cannot profile on "
                                                   f"{task.server}: it runs already",
                                    ALREADY_RUNNING))
        elif cur is not None and task.server in cur.configuration.servers:
            continue  # that profiling run is already going
        else:
            added.setdefault(job, {})[task.server] = task.gpus
    wants = [Want(job, Configuration.of(parts), "profile") for job, parts in added.items()]
    return wants, problems


def changes(current: Mapping[JobId, Placement], plan: Plan, first_plan: bool,
            jobs: Mapping[JobId, JobRecord]) -> Changes:
    """What ``plan`` changes in ``current`` (see the module docstring)."""
    a = _assignments(current, plan, jobs)
    if first_plan:
        for job, p in sorted(current.items()):
            if p.mode == "run" and job not in a.kept:
                a.stops.append(Stop(job, p, resize=False, reason=NOT_IN_PLAN))
    profile_wants, profile_problems = _profiling(current, plan, jobs, a.seen)
    return Changes(tuple(a.stops), tuple(profile_wants + a.wants),
                   tuple(a.problems + profile_problems), tuple(a.retunes))


def diff(current: Mapping[JobId, Placement], plan: Plan, first_plan: bool,
         jobs: Mapping[JobId, JobRecord], capacity: Mapping[ServerId, Resources], prefix: str,
         at: float = 0.0) -> Commands:
    """:func:`changes` then :func:`book`, assuming every stop succeeds."""
    ch = changes(current, plan, first_plan, jobs)
    stopped = {s.job_id for s in ch.stops}
    left = {j: p for j, p in current.items() if j not in stopped}
    booked = book_all(ch.wants, ch.retunes, left, capacity, prefix, at)
    return Commands(ch.stops, booked.starts, ch.problems + booked.problems, booked.retunes)
