"""Admission of submissions and cancels: the decisions, without I/O.

Every scheduler replica admits (queue group ``admission``), the leader and
the standbys alike, so that jobs are accepted during a failover. Decoding
has already checked the spec's schema and values (``shared.job.JobSpec``);
this module adds what the live system needs on top:

- the job id must also be a valid KV key (``hops_jobs`` is keyed by it,
  after its tenant: :mod:`shared.jobkeys`): letters, digits, ``-``, ``_``
  and ``=``, at most :data:`MAX_ID_LENGTH`;
- the requirement set must be usable: at most :data:`MAX_GPUS` GPUs, and
  at most :data:`MAX_CORES` CPU cores;
- an explicit ``requirements`` list is a set written in order: distinct
  counts, increasing, at most :data:`MAX_REQUIREMENTS` of them. An unsorted
  or repeated list is refused rather than silently sorted, so that what is
  stored (and shown) is what the client sent; ``JobSpec`` itself stays
  lenient, because the simulator's workloads build specs with lists in any
  order (:meth:`shared.job.JobSpec.requirement_set` sorts them);
- ``total_samples`` is at most :data:`MAX_TOTAL_SAMPLES`;
- ``submit_time`` is the time the scheduler accepted the job (a client's
  value is overwritten), because the queue orders ties by it (§3.6).

A duplicate id of the same tenant is a ``conflict`` (another tenant's job
of that id is another job, :func:`keyed_spec`); cancelling an unknown job is ``not_found``
and cancelling a job that already ended is a ``conflict``. Holding or
releasing follows cancel, and a hold of a running job is ``not_pending``
(:func:`hold_refusal`, as Slurm holds only pending jobs).

Against the registered nodes (``hops_nodes``, alive or not: a node that is
down for a while is still the cluster's until an operator removes it), as
Kueue refuses a workload no flavor can ever hold:

- a job none of whose requirements fits any GPU type (a configuration never
  mixes types, §3.4) is ``unschedulable``, naming its smallest requirement
  and the most GPUs one type holds;
- a model no node can run is ``invalid`` when every node names the models it
  can run (emulated executors do; real ones run any command);
- a ``command`` is ``invalid`` when every node is emulated (names its
  models): an emulated executor runs no command, it would be ignored.

- a CPU job (CODA, ``kind: cpu``) asking more cores than the largest
  registered server has is ``unschedulable``, naming that server; a GPU
  job's ``cores`` is a request the core policies may trim, never refused;
- a CPU job under a policy that does not schedule cores
  (:func:`scheduling.registry.schedules_cores`) is ``unschedulable``
  (:func:`policy_refusal`): nothing would ever place it.

With no node registered yet (a cluster starting) nothing can be judged and
the job is admitted; the leader holds it as unschedulable until it fits.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

from shared.ids import GpuType, ServerId
from shared.job import JobSpec
from shared.jobkeys import job_key, split_key
from shared.records import JobRecord, NodeRecord
from shared.wire import INVALID, NOT_PENDING, UNSCHEDULABLE

MAX_ID_LENGTH = 128
MAX_GPUS = 4096
MAX_CORES = 1 << 20
# Samples of one job: 1e15 is ~10,000 epochs of a 100-billion-sample corpus,
# years of a whole cluster's throughput at the paper's rates (hundreds to
# thousands of samples/s per GPU), yet far below where a float's integer
# precision ends (2**53, ~9e15), which the estimates' remaining-time
# arithmetic (Eq. 2) relies on. Larger is a typo or a unit mistake.
MAX_TOTAL_SAMPLES = 10**15
# Entries of an explicit requirement list: a set of distinct GPU counts, one
# configuration space each for the planner; 64 covers every count from 1 to
# 64, or powers of two far beyond any cluster, while a list of thousands only
# costs every plan time (a list of 20,000 was once stored as sent).
MAX_REQUIREMENTS = 64
# The registry's policies that schedule CPU cores (scheduling/cores), named in
# the refusal of a CPU job under any other.
CORE_POLICIES = "coda, fifo, drf or fixed-cores"
NOT_FOUND = "not_found"
CONFLICT = "conflict"
_ID = re.compile(r"[A-Za-z0-9_=-]+")


class Refusal(msgspec.Struct, frozen=True):
    """Why a request is refused: an error code and a message for the client."""

    code: str
    message: str


def valid_id(job_id: str) -> bool:
    """Whether ``job_id`` could name a job (the rules of :func:`check_spec`)."""
    return len(job_id) <= MAX_ID_LENGTH and _ID.fullmatch(job_id) is not None


def valid_key(key: str) -> bool:
    """Whether ``key`` could name a job inside the system: a valid id, or
    ``tenant/id`` of a valid tenant name and id (:mod:`shared.jobkeys`)."""
    tenant, job_id = split_key(key)
    return valid_id(job_id) and (tenant is None or _ID.fullmatch(tenant) is not None)


def keyed_spec(spec: JobSpec) -> JobSpec:
    """``spec`` as the system stores it once admitted: its ``id`` is the
    job's key (its tenant's, :func:`shared.jobkeys.job_key`)."""
    return msgspec.structs.replace(spec, id=job_key(spec.tenant, spec.id))


def check_spec(spec: JobSpec) -> str | None:
    """What is wrong with ``spec`` for the live system, or ``None``."""
    problem = spec_problem(spec)
    return problem[1] if problem else None


def spec_problem(spec: JobSpec) -> tuple[str, str] | None:
    """The field of ``spec`` the live system cannot take and why, or ``None``
    (``hops submit`` checks a whole file with it before sending anything)."""
    return _id_problem(spec.id) or _size_problem(spec) or _requirements_problem(spec)


def _id_problem(job_id: str) -> tuple[str, str] | None:
    if len(job_id) > MAX_ID_LENGTH:
        return "id", (
            f"job id is {len(job_id)} characters long; at most {MAX_ID_LENGTH} are allowed"
        )
    if not _ID.fullmatch(job_id):
        return "id", (
            f"job id {job_id!r} may only contain letters, digits, '-', '_' and '=' "
            "(it is a subject token and a KV key)"
        )
    return None


def _size_problem(spec: JobSpec) -> tuple[str, str] | None:
    if not spec.model.strip():
        return "model", "model must not be empty"
    if spec.total_samples > MAX_TOTAL_SAMPLES:
        return "total_samples", (f"total_samples is {spec.total_samples}; at most "
                                 f"{MAX_TOTAL_SAMPLES} (1e15) are allowed")
    if spec.cores > MAX_CORES:
        return "cores", f"the job asks for {spec.cores} CPU cores; at most {MAX_CORES} are allowed"
    return None


def _requirements_problem(spec: JobSpec) -> tuple[str, str] | None:
    if spec.kind == "cpu":
        return None  # no GPUs (the spec itself refuses requirements on a CPU job)
    listed = spec.requirements
    if len(listed) > MAX_REQUIREMENTS:
        return "requirements", (f"requirements lists {len(listed)} entries; a requirement "
                                f"set holds at most {MAX_REQUIREMENTS} distinct GPU counts")
    repeated = sorted(r for r, n in Counter(listed).items() if n > 1)
    if repeated:
        return "requirements", (f"requirements repeats {_counts(repeated)}; a requirement "
                                "set lists each GPU count once")
    if list(listed) != sorted(listed):
        return "requirements", (f"requirements {_counts(listed)} is not in increasing "
                                f"order; write the set sorted, as {_counts(sorted(listed))}")
    top = spec.max_gpus if spec.max_gpus is not None else max(listed)
    if top > MAX_GPUS:
        field = "max_gpus" if spec.max_gpus is not None else "requirements"
        return field, f"requirements ask for {top} GPUs; at most {MAX_GPUS} are allowed"
    return None


def _counts(counts: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, counts)) + "]"


def accepted_spec(spec: JobSpec, now: float) -> JobSpec:
    """The spec as stored: stamped with the acceptance time."""
    return msgspec.structs.replace(spec, submit_time=now)


def resubmission(spec: JobSpec, stored: JobSpec | None) -> bool:
    """Whether ``spec`` (as the tenant rules left it, not yet keyed) is the
    very submission that ``stored`` (as admission stored it) records: the
    same tenant and the same spec but for the key and the acceptance time.
    Such a resubmission is answered as that acceptance, not as a conflict,
    as Kubernetes takes an identical re-apply: a client that was answered
    503 while a NATS cluster elected a leader, and tries again, gets its own
    job back rather than a 409 (docs/live.md, *A NATS cluster*)."""
    if stored is None or stored.tenant != spec.tenant:
        return False
    return msgspec.structs.replace(keyed_spec(spec), submit_time=stored.submit_time) == stored


def duplicate(job_id: str, tenant: str, existing: JobRecord | None) -> Refusal | None:
    """A ``conflict`` when ``tenant``'s job ``job_id`` exists already. Under
    the key of a default tenant's job, a record of another tenant can only
    be one written before keys were qualified (:mod:`shared.jobkeys`): the
    key is taken, and the answer names neither its tenant nor its phase."""
    if existing is None:
        return None
    if existing.spec.tenant != tenant:
        return Refusal(CONFLICT, f"job id {job_id} is taken; choose another")
    return Refusal(CONFLICT, f"job {job_id} exists already (phase {existing.phase})")


def cancel_refusal(job_id: str, record: JobRecord | None) -> Refusal | None:
    """Why ``job_id`` cannot be cancelled, or ``None`` when it can."""
    if record is None:
        return Refusal(NOT_FOUND, f"no job {job_id}")
    if record.final:
        return Refusal(CONFLICT, f"job {job_id} is {record.phase} already")
    return None


def hold_refusal(job_id: str, record: JobRecord | None, hold: bool) -> Refusal | None:
    """Why ``job_id`` cannot be held (``hold``) or released, or ``None``
    when it can: as a cancel, and a hold of a running job is ``not_pending``."""
    refusal = cancel_refusal(job_id, record)
    if refusal is not None or record is None:
        return refusal
    if hold and record.phase == "running":
        return Refusal(NOT_PENDING, f"job {job_id} is running; only a waiting job can be held "
                                    f"(cancel it, or hold it once it waits again)")
    return None


def type_capacity(nodes: Iterable[NodeRecord]) -> dict[GpuType, int]:
    """GPUs of each type over ``nodes``."""
    out: dict[GpuType, int] = {}
    for n in nodes:
        out[n.server.gpu_type] = out.get(n.server.gpu_type, 0) + n.server.gpus
    return out


def unfit(spec: JobSpec, capacity: dict[GpuType, int], r_num: int) -> str | None:
    """Why no requirement of ``spec`` fits ``capacity`` (GPUs per type), or
    ``None`` when one does (or nothing is known of the cluster yet, or it
    asks for no GPUs: a CPU job, :func:`cores_unfit`)."""
    if not capacity or spec.kind == "cpu":
        return None
    smallest = spec.requirement_set(r_num)[0]
    most = max(capacity.values())
    if smallest <= most:
        return None
    types = ", ".join(f"{g} {t}" for t, g in sorted(capacity.items()))
    return (
        f"the job needs at least {smallest} GPUs of one type, but the cluster holds at most "
        f"{most} GPUs of one type ({types})"
    )


def largest_cores(nodes: Iterable[NodeRecord]) -> tuple[ServerId, int] | None:
    """The server with the most CPU cores and how many (the first by id on
    a tie); ``None`` without nodes."""
    ranked = sorted((-n.server.cores, n.server.id) for n in nodes)
    return (ranked[0][1], -ranked[0][0]) if ranked else None


def cores_unfit(spec: JobSpec, nodes: Iterable[NodeRecord]) -> str | None:
    """Why no server of ``nodes`` could ever hold the CPU job ``spec`` (its
    cores live on one server), or ``None`` when one could, it is a GPU job,
    or nothing is known of the cluster yet."""
    if spec.kind != "cpu":
        return None
    largest = largest_cores(nodes)
    if largest is None or spec.cores <= largest[1]:
        return None
    sid, most = largest
    if most == 0:
        return f"the job asks for {spec.cores} CPU cores, but no server declares any CPU cores"
    return (f"the job asks for {spec.cores} CPU cores, but the largest server, {sid}, "
            f"has {most}")


def policy_refusal(spec: JobSpec, schedules_cores: bool, policy: str) -> Refusal | None:
    """A CPU job under a policy that does not schedule CPU cores: nothing
    would ever place it, so it is refused rather than left waiting."""
    if spec.kind != "cpu" or schedules_cores:
        return None
    return Refusal(UNSCHEDULABLE, f"job {spec.id} is a CPU job, but policy {policy} does not "
                                  f"schedule CPU cores; run {CORE_POLICIES}")


def hold_problem(spec: JobSpec, alive: Sequence[NodeRecord], r_num: int,
                 schedules_cores: bool) -> str | None:
    """Why a waiting job cannot be planned on the ``alive`` nodes now (the
    leader holds it, :func:`scheduling.live.state.hold`), or ``None``."""
    if spec.kind == "cpu" and not schedules_cores:
        return f"it is a CPU job and the policy does not schedule CPU cores; run {CORE_POLICIES}"
    return unfit(spec, type_capacity(alive), r_num) or cores_unfit(spec, alive)


def fit_refusal(spec: JobSpec, nodes: Iterable[NodeRecord], r_num: int) -> Refusal | None:
    """Whether the registered ``nodes`` could ever run ``spec`` (see the module docstring)."""
    nodes = list(nodes)
    problem = unfit(spec, type_capacity(nodes), r_num) or cores_unfit(spec, nodes)
    if problem is not None:
        return Refusal(UNSCHEDULABLE, f"job {spec.id} can never run here: {problem}")
    if spec.kind == "gpu" and nodes and all(n.models for n in nodes):
        known = sorted({m for n in nodes for m in n.models})
        if spec.model not in known:
            return Refusal(
                INVALID,
                f"model {spec.model!r} cannot run on this cluster, whose nodes emulate "
                f"only these models: {', '.join(known)}",
            )
    if spec.command and nodes and all(n.models for n in nodes):
        return Refusal(
            INVALID,
            f"command: job {spec.id} gives a command, but every node of this cluster is "
            "emulated and runs no command (it would be ignored); drop the command, or run "
            "real executors (hops up --executor real)",
        )
    return None
