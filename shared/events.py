# Kept whole past ~400 lines: one file holds the tagged union of every wire message.
"""The wire contract of the live system: every message on NATS, as msgspec Structs.

Every message is a frozen Struct, tagged in the JSON field ``"type"``, with a
schema version ``v`` (1 today). Fields after the required ones have
defaults, and decoders ignore fields they do not know, so a producer may add
a field without breaking older consumers; an incompatible change gets new
subjects (``hops.v2``). Domain payloads (:class:`~shared.job.JobSpec`,
:class:`~shared.cluster.Server`, ...) are the core's own Structs and stay
strict: unknown fields inside them are errors.

JSON cannot carry infinities or NaN, so :func:`encode` writes non-finite
floats as the strings ``"inf"``, ``"-inf"`` and ``"nan"``; decoders accept
them (and numbers written as strings). Times (``at``) are wall-clock seconds
supplied by the caller: nothing here reads a clock.

Decoding raises one :class:`WireError` (a ``ValueError``) whose ``code`` is
one of ``malformed``, ``unknown_type``, ``invalid`` or ``too_large``.
The encoding and the decoder machinery are in :mod:`shared.wire` (its names
are re-exported here); subjects and streams are in :mod:`shared.subjects`;
``docs/events.md`` documents the whole contract.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample
from shared.node import Device, Rendezvous
from shared.relaxed import split_problem
from shared.sequence import (
    GpuTasks,
    RoundsApplied,
    applied_problem,
    sequence_problem,
    span_problem,
    specs_problem,
    times_problem,
)
from shared.snapshot import Plan
from shared.subjects import check_token
from shared.wire import FORBIDDEN as FORBIDDEN
from shared.wire import INTERNAL as INTERNAL
from shared.wire import INVALID as INVALID
from shared.wire import MALFORMED as MALFORMED
from shared.wire import MAX_PAYLOAD as MAX_PAYLOAD
from shared.wire import TOO_LARGE as TOO_LARGE
from shared.wire import UNAUTHORIZED as UNAUTHORIZED
from shared.wire import UNKNOWN_TYPE as UNKNOWN_TYPE
from shared.wire import Codec, check_size, probe_type
from shared.wire import WireError as WireError
from shared.wire import encode as encode


class Message(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    """Base of every message: the ``type`` tag and the schema version."""

    v: int = 1


# --- requests and replies -----------------------------------------------------


class SubmitJob(Message, frozen=True, tag="submit_job"):
    """Request on ``hops.v1.jobs.submit``; a bare JobSpec object is accepted too."""

    spec: JobSpec

    def __post_init__(self) -> None:
        check_token(self.spec.id, "job id")


class CancelJob(Message, frozen=True, tag="cancel_job"):
    """Request on ``hops.v1.jobs.cancel``."""

    job_id: JobId
    reason: str = ""

    def __post_init__(self) -> None:
        check_token(self.job_id, "job id")


class HoldJob(Message, frozen=True, tag="hold_job"):
    """Request on ``hops.v1.jobs.hold``: hold a waiting job out of every
    plan (``hold``), or release it (``hold`` false), as Slurm's
    ``scontrol hold``/``release``; a running job cannot be held."""

    job_id: JobId
    hold: bool = True
    reason: str = ""

    def __post_init__(self) -> None:
        check_token(self.job_id, "job id")


class Reply(Message, frozen=True, tag="reply"):
    """Reply to submit, cancel and register; ``code`` is set when ``ok`` is false."""

    ok: bool
    job_id: str = ""
    server_id: str = ""
    error: str = ""
    code: str = ""


class ReloadTenants(Message, frozen=True, tag="reload_tenants"):
    """Request on ``hops.v1.reload.tenants`` (trusted callers: admins, the
    gateway): every scheduler replica reads its tenants file again, checks
    it as at start and, when it passes, uses it (docs/tenancy.md)."""


class TenantsReloaded(Message, frozen=True, tag="tenants_reloaded"):
    """One process's answer to ``reload_tenants``: the tenants it uses now
    (the new file's when ``ok``; the old file's, unchanged, when refused with
    ``code`` and ``error``)."""

    ok: bool
    service: str
    replica: str
    source: str = ""
    tenants: tuple[str, ...] = ()
    error: str = ""
    code: str = ""


class RegisterNode(Message, frozen=True, tag="register_node"):
    """Request on ``hops.v1.nodes.register``: a node executor announces its server.

    Servers are ordered by ``(order, id)``; adjacency follows that order.
    """

    server: Server
    gpu_type: GpuTypeSpec
    order: int = 0
    at: float = 0.0
    address: str = ""
    devices: tuple[Device, ...] = ()
    # The models this node can run; empty: any (a real executor runs and
    # profiles whatever command it is given, an emulated one only the models
    # its ground truth knows).
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_token(self.server.id, "server id")
        if self.gpu_type.name != self.server.gpu_type:
            raise ValueError(
                f"server {self.server.id} has gpu_type {self.server.gpu_type!r} "
                f"but gpu_type describes {self.gpu_type.name!r}"
            )


class RemoveNode(Message, frozen=True, tag="remove_node"):
    """Request on ``hops.v1.nodes.remove``: an operator removes a registered
    node; an alive one only with ``force`` (its jobs are requeued)."""

    server_id: ServerId
    force: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        check_token(self.server_id, "server id")


class DrainNode(Message, frozen=True, tag="drain_node"):
    """Request on ``hops.v1.nodes.drain``: an operator drains a registered
    node (``drain``: no new work goes there; with ``move`` its running jobs
    are stopped with a checkpoint at the next round and planned elsewhere),
    or undrains it (``drain`` false), as Slurm's ``state=drain``/``resume``."""

    server_id: ServerId
    drain: bool = True
    move: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        check_token(self.server_id, "server id")


class EstimateRequest(Message, frozen=True, tag="estimate_request"):
    """Request on ``hops.v1.estimate`` (queue group ``estimator``)."""

    jobs: tuple[JobSpec, ...]
    cluster: Cluster


class EstimateReply(Message, frozen=True, tag="estimate_reply"):
    """Estimates keyed by job id; jobs not profiled on any type may be missing.
    ``shared``: per requested job, the GPU types its profile signature holds a
    current shared profile of (:mod:`shared.reuse`), which it need not be
    profiled on where the policy reuses profiles."""

    ok: bool = True
    estimates: dict[JobId, JobEstimate] = {}
    shared: dict[JobId, tuple[GpuType, ...]] = {}
    error: str = ""
    code: str = ""


# --- profile signatures (shared.reuse) ------------------------------------------

StaleReason: TypeAlias = Literal["operator", "disagreement"]


class ProfileStale(Message, frozen=True, tag="profile_stale"):
    """Persisted on ``hops.v1.signatures.stale`` (stream ``HOPS_SAMPLES``):
    the shared profiles of ``signature`` on ``gpu_types`` (empty: every type
    it holds) are stale, so its next job is profiled there again. Every
    estimator replica applies it in stream order. ``reason``: an operator
    asked (the gateway publishes it), or ``job_id``'s first samples on the
    type measured ``measured`` against the ``estimated`` the shared profile
    gave (an estimator publishes it; :func:`shared.reuse.disagrees`)."""

    signature: str
    reason: StaleReason
    at: float
    gpu_types: tuple[GpuType, ...] = ()
    job_id: str = ""
    estimated: float = 0.0
    measured: float = 0.0


class ListSignatures(Message, frozen=True, tag="list_signatures"):
    """Request on ``hops.v1.signatures.list`` (queue group ``estimator``)."""


class SharedSignature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One signature's shared profiles: the types it holds a current one of,
    the stale ones, and the per-GPU batch size its last report was measured
    with (0: the job's own)."""

    signature: str
    current: tuple[GpuType, ...] = ()
    stale: tuple[GpuType, ...] = ()
    batch_size: int = 0


class SignaturesReply(Message, frozen=True, tag="signatures"):
    """An estimator replica's answer to ``list_signatures``, by signature."""

    ok: bool = True
    signatures: tuple[SharedSignature, ...] = ()
    error: str = ""
    code: str = ""


# --- executor commands --------------------------------------------------------


class StartJob(Message, frozen=True, tag="start_job"):
    """Command on ``hops.v1.exec.<server_id>``: run (or profile) this server's
    part of ``configuration`` on ``gpu_indices``, resuming at ``samples_done``.
    ``key`` is an idempotency key: a repeated key is acknowledged, not rerun.
    ``micro_batches``: a relaxed-sync job's split over the configuration's
    ranks (:mod:`shared.relaxed`; empty: the executor splits evenly)."""

    key: str
    job_id: JobId
    server_id: ServerId
    spec: JobSpec
    configuration: Configuration
    gpu_indices: tuple[int, ...]
    samples_done: float = 0.0
    mode: Literal["run", "profile"] = "run"
    rendezvous: Rendezvous | None = None
    micro_batches: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("key must not be empty")
        if self.micro_batches and (why := split_problem(
                self.spec.sync_scale, self.configuration.total_gpus, self.micro_batches)):
            raise ValueError(why)
        if self.spec.id != self.job_id:
            raise ValueError(f"spec.id {self.spec.id!r} differs from job_id {self.job_id!r}")
        local = self.configuration.as_dict().get(self.server_id)
        if local is None:
            raise ValueError(f"server {self.server_id} is not in {self.configuration}")
        idx = self.gpu_indices
        # A CPU job's part names no GPU: its indices are empty.
        if len(idx) != local or len(set(idx)) != len(idx) or (idx and min(idx) < 0):
            raise ValueError(f"gpu_indices {idx} must be {local} distinct indices >= 0")


class StopJob(Message, frozen=True, tag="stop_job"):
    """Command on ``hops.v1.exec.<server_id>``: checkpoint and stop the job."""

    key: str
    job_id: JobId
    reason: str = ""


class SetCores(Message, frozen=True, tag="set_cores"):
    """Command on ``hops.v1.exec.<server_id>``: the running job now holds
    ``cores`` CPU cores on this server, without a restart (CODA's adaptive
    CPU allocation and contention elimination): the executor re-books them,
    re-pins the job's threads and tells the job its new count.
    ``mba_percent`` caps the job's memory bandwidth per core (Intel MBA,
    through resctrl; 100: no cap), CODA's contention eliminator's throttle."""

    key: str
    job_id: JobId
    server_id: ServerId
    cores: int
    at: float = 0.0
    mba_percent: int = 100

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("key must not be empty")
        if self.cores < 0:
            raise ValueError(f"cores must be >= 0, got {self.cores}")
        if not 1 <= self.mba_percent <= 100:
            raise ValueError(f"mba_percent must lie in 1..100, got {self.mba_percent}")


# The ``code`` of a start acknowledged (``ok``) because its job already runs
# on that server exactly as the start asks, started by an earlier start
# (``CommandAck.started_by``): a placer restarted before it saw that ack.
ALREADY_STARTED = "already_started"


class CommandAck(Message, frozen=True, tag="command_ack"):
    """Reply to a command; ``samples_done`` is the job's progress when it
    stopped, ``exit_code`` and ``log_tail`` its process's end (real jobs);
    ``cores`` the core ids a start or ``set_cores`` pinned the job to (empty:
    not pinned by the executor). A start answered :data:`ALREADY_STARTED`
    names in ``started_by`` the key of the start that runs the job and in
    ``gpu_indices`` the GPUs it runs on, and carries its progress now in
    ``samples_done``."""

    key: str
    ok: bool
    samples_done: float = 0.0
    error: str = ""
    code: str = ""
    exit_code: int | None = None
    log_tail: str = ""
    cores: tuple[int, ...] = ()
    started_by: str = ""
    gpu_indices: tuple[int, ...] = ()


# --- job lifecycle (stream HOPS_JOBS) -------------------------------------------


class JobSubmitted(Message, frozen=True, tag="job_submitted"):
    job_id: JobId
    spec: JobSpec
    at: float
    # Admission's time from the submit request to its acceptance, seconds
    # (hops_admission_latency_seconds); None in events of older admissions.
    admission_s: float | None = None

    def __post_init__(self) -> None:
        if self.spec.id != self.job_id:
            raise ValueError(f"spec.id {self.spec.id!r} differs from job_id {self.job_id!r}")


class JobProfiled(Message, frozen=True, tag="job_profiled"):
    """The job now has profiles on ``gpu_types`` (all it needs so far)."""

    job_id: JobId
    gpu_types: tuple[GpuType, ...]
    at: float


class JobStarted(Message, frozen=True, tag="job_started"):
    job_id: JobId
    configuration: Configuration
    at: float


class JobResized(Message, frozen=True, tag="job_resized"):
    """The job was restarted from its checkpoint on a new configuration;
    ``samples_done`` is the progress it resumed from (None: not known)."""

    job_id: JobId
    configuration: Configuration
    at: float
    reason: str = ""
    samples_done: float | None = None


class JobStopped(Message, frozen=True, tag="job_stopped"):
    """The job gave its GPUs back and waits in the queue again;
    ``samples_done`` is its progress at the stop (None: not known)."""

    job_id: JobId
    at: float
    reason: str = ""
    samples_done: float | None = None
    exit_code: int | None = None
    log_tail: str = ""


class JobFinished(Message, frozen=True, tag="job_finished"):
    """``exit_code`` and ``log_tail``: the end of a real job's lead process."""

    job_id: JobId
    at: float
    exit_code: int | None = None
    log_tail: str = ""


class JobFailed(Message, frozen=True, tag="job_failed"):
    """``exit_code`` and ``log_tail``: the end of a real job's failed process."""

    job_id: JobId
    at: float
    reason: str = ""
    exit_code: int | None = None
    log_tail: str = ""


class JobCancelled(Message, frozen=True, tag="job_cancelled"):
    """A user cancelled the job, or the leader ended it at its time limit
    (``reason`` ``TimeLimit``, :mod:`scheduling.live.timelimit`); empty: a
    user's cancel."""

    job_id: JobId
    at: float
    reason: str = ""


class JobHeld(Message, frozen=True, tag="job_held"):
    """A user held the job: it waits, in no plan, until ``job_released``."""

    job_id: JobId
    at: float
    reason: str = ""


class JobReleased(Message, frozen=True, tag="job_released"):
    """The hold of the job is lifted: it is planned again."""

    job_id: JobId
    at: float


# --- measurements (stream HOPS_SAMPLES) -----------------------------------------


class SampleReported(Message, frozen=True, tag="sample_reported"):
    sample: ThroughputSample
    at: float = 0.0


class ProfileReported(Message, frozen=True, tag="profile_reported"):
    report: ProfileReport
    at: float = 0.0


# --- heartbeats ----------------------------------------------------------------


class NodeHeartbeat(Message, frozen=True, tag="node_heartbeat"):
    """``running``: the jobs whose processes run here; ``lost``: jobs this
    node ran before its executor restarted whose processes were gone by then
    (the monitor releases their part at once, as a vanished process)."""

    server_id: ServerId
    at: float
    running: tuple[JobId, ...] = ()
    lost: tuple[JobId, ...] = ()
    # Memory bandwidth in use on the node, GB/s, read through resctrl's
    # memory bandwidth monitoring (0: not measured; executor.membw).
    memory_bandwidth_gbps: float = 0.0


class JobHeartbeat(Message, frozen=True, tag="job_heartbeat"):
    job_id: JobId
    server_id: ServerId
    samples_done: float
    at: float


# --- plans (stream HOPS_PLANS) ----------------------------------------------------


class PlanIssued(Message, frozen=True, tag="plan_issued"):
    """A plan of round ``round`` by the scheduler leader of lease ``term``;
    consumers ignore plans of a term older than the newest they have seen."""

    round: int
    term: int
    plan: Plan
    at: float
    first_plan: bool = True
    # Relaxed-sync jobs' micro-batches per rank of their assignment, from
    # the estimates (shared.relaxed.plan_splits); a job missing splits evenly.
    micro_batches: dict[JobId, tuple[int, ...]] = {}
    # The leader's time making this plan (the policy and the reasons),
    # seconds (hops_plan_solve_seconds); None in plans of older leaders.
    solve_s: float | None = None


class ResourcesReleased(Message, frozen=True, tag="resources_released"):
    job_id: JobId
    server_ids: tuple[ServerId, ...]
    at: float
    reason: str = ""


class ErrorRecord(Message, frozen=True, tag="error_record"):
    """Published on ``hops.v1.errors`` when a service rejects or fails on input."""

    service: str
    subject: str
    error: str
    at: float
    code: str = ""
    excerpt: str = ""


class PlanEntrySkipped(Message, frozen=True, tag="plan_entry_skipped"):
    """Published on ``hops.v1.placer.skipped`` when the placer skips a plan
    entry the cluster overtook after the plan was made (a benign race, not
    an error): ``reason`` is one of ``services.placer.commands.RACES``."""

    job_id: JobId
    reason: str
    detail: str
    at: float


# --- Hare's task sequences (docs/hare.md, "Live mechanism") ----------------------


class TaskSequence(Message, frozen=True, tag="task_sequence"):
    """Revision ``revision`` of the sequences of server ``server_id``'s
    GPUs, from the scheduler leader of lease ``term`` (``policy``: the task
    policy that planned it). A server runs revisions of the newest term
    only, each newer than the last it took, and keeps every entry it has
    started (shared.sequence)."""

    term: int
    revision: int
    server_id: ServerId
    at: float
    gpus: tuple[GpuTasks, ...] = ()
    policy: str = ""
    # The spec of every job with an entry here: what a server needs to run
    # the job's tasks (its model, batch size and S; a real executor's command).
    specs: tuple[JobSpec, ...] = ()
    # Each job's rounds applied when sent: a server holds an entry of a
    # later round until its job's earlier rounds are applied (the leader
    # sends the revision again, these counts grown, as a round is applied).
    applied: tuple[RoundsApplied, ...] = ()

    def __post_init__(self) -> None:
        check_token(self.server_id, "server id")
        if self.term < 1 or self.revision < 1:
            raise ValueError(f"term and revision must be >= 1, got {self.term} and "
                             f"{self.revision}")
        if (why := sequence_problem(self.gpus) or specs_problem(self.gpus, self.specs)
                or applied_problem(self.applied)):
            raise ValueError(why)


class TaskDone(Message, frozen=True, tag="task_done"):
    """Server ``server_id``'s report that GPU ``gpu_index`` computed
    micro-batches ``lo .. hi - 1`` of round ``round`` of ``job_id`` over
    ``[started_at, ended_at]`` and sent their gradients to the job's
    aggregator, under revision ``revision`` of term ``term``."""

    term: int
    revision: int
    job_id: JobId
    round: int
    lo: int
    hi: int
    server_id: ServerId
    gpu_index: int
    started_at: float
    ended_at: float
    at: float

    def __post_init__(self) -> None:
        check_token(self.server_id, "server id")
        if self.term < 1 or self.revision < 1:
            raise ValueError(f"term and revision must be >= 1, got {self.term} and "
                             f"{self.revision}")
        if self.gpu_index < 0:
            raise ValueError(f"gpu_index must be >= 0, got {self.gpu_index}")
        why = span_problem(self.job_id, self.round, self.lo, self.hi) or times_problem(
            f"task of job {self.job_id} round {self.round}", self.started_at, self.ended_at)
        if why is not None:
            raise ValueError(why)


JobEvent: TypeAlias = (
    JobSubmitted
    | JobProfiled
    | JobStarted
    | JobResized
    | JobStopped
    | JobFinished
    | JobFailed
    | JobCancelled
    | JobHeld
    | JobReleased
)
# What stream ``HOPS_SAMPLES`` holds.
SampleEvent: TypeAlias = SampleReported | ProfileReported | ProfileStale
# What an executor may say of a job on ``hops.v1.reports.<server>.<job>``.
Report: TypeAlias = SampleReported | ProfileReported | JobFinished | JobFailed
Command: TypeAlias = StartJob | StopJob | SetCores
PlanEvent: TypeAlias = PlanIssued | ResourcesReleased
TaskEvent: TypeAlias = TaskSequence | TaskDone
AnyMessage: TypeAlias = (
    SubmitJob
    | CancelJob
    | HoldJob
    | Reply
    | ReloadTenants
    | TenantsReloaded
    | RegisterNode
    | RemoveNode
    | DrainNode
    | EstimateRequest
    | EstimateReply
    | ListSignatures
    | SignaturesReply
    | Command
    | CommandAck
    | JobEvent
    | SampleEvent
    | NodeHeartbeat
    | JobHeartbeat
    | PlanEvent
    | TaskEvent
    | ErrorRecord
    | PlanEntrySkipped
)


def error_reply(code: str, error: str) -> Reply:
    """The failed :class:`Reply` for ``code`` and ``error``."""
    return Reply(ok=False, code=code, error=error)


_SUBMIT = Codec[SubmitJob](SubmitJob, "submit_job")
_JOB_SPEC = Codec[JobSpec](JobSpec, "job spec")


def decode_submit(data: bytes, max_payload: int = MAX_PAYLOAD) -> SubmitJob:
    """A :class:`SubmitJob`, or a bare JobSpec object (no ``type``) wrapped in one."""
    check_size(data, max_payload, "submit_job")
    if probe_type(data, "submit_job") is not None:
        return _SUBMIT.decode(data, max_payload)
    spec = _JOB_SPEC.decode(data, max_payload)
    try:
        return SubmitJob(spec=spec)
    except ValueError as e:
        raise WireError(INVALID, f"invalid submit_job: {e}") from None


# Each decoder: (data: bytes, max_payload: int = MAX_PAYLOAD) -> the message.
decode_cancel = Codec[CancelJob](CancelJob, "cancel_job").decode
decode_hold = Codec[HoldJob](HoldJob, "hold_job").decode
decode_reply = Codec[Reply](Reply, "reply").decode
decode_reload_tenants = Codec[ReloadTenants](ReloadTenants, "reload_tenants").decode
decode_tenants_reloaded = Codec[TenantsReloaded](TenantsReloaded, "tenants_reloaded").decode
decode_register = Codec[RegisterNode](RegisterNode, "register_node").decode
decode_remove_node = Codec[RemoveNode](RemoveNode, "remove_node").decode
decode_drain_node = Codec[DrainNode](DrainNode, "drain_node").decode
decode_estimate_request = Codec[EstimateRequest](EstimateRequest, "estimate_request").decode
decode_estimate_reply = Codec[EstimateReply](EstimateReply, "estimate_reply").decode
decode_list_signatures = Codec[ListSignatures](ListSignatures, "list_signatures").decode
decode_signatures_reply = Codec[SignaturesReply](SignaturesReply, "signatures").decode
decode_command = Codec[Command](Command, "command").decode
decode_ack = Codec[CommandAck](CommandAck, "command_ack").decode
decode_job_event = Codec[JobEvent](JobEvent, "job event").decode
decode_sample_event = Codec[SampleEvent](SampleEvent, "sample event").decode
decode_report = Codec[Report](Report, "report").decode
decode_node_heartbeat = Codec[NodeHeartbeat](NodeHeartbeat, "node_heartbeat").decode
decode_job_heartbeat = Codec[JobHeartbeat](JobHeartbeat, "job_heartbeat").decode
decode_plan_event = Codec[PlanEvent](PlanEvent, "plan event").decode
decode_task_event = Codec[TaskEvent](TaskEvent, "task event").decode
decode_error_record = Codec[ErrorRecord](ErrorRecord, "error_record").decode
decode_plan_entry_skipped = Codec[PlanEntrySkipped](PlanEntrySkipped,
                                                    "plan_entry_skipped").decode
decode_any = Codec[AnyMessage](AnyMessage, "message").decode  # for tools watching hops.v1.>
