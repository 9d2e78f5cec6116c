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
Subjects and streams are in :mod:`shared.subjects`; ``docs/events.md``
documents the whole contract.
"""

from __future__ import annotations

import math
import typing
from typing import Any, Generic, Literal, TypeAlias, TypeVar

import msgspec

from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample
from shared.node import Device, Rendezvous
from shared.snapshot import Plan
from shared.subjects import check_token

MAX_PAYLOAD = 256 * 1024

# Error codes carried by WireError and by failed replies.
MALFORMED = "malformed"
UNKNOWN_TYPE = "unknown_type"
INVALID = "invalid"
TOO_LARGE = "too_large"
INTERNAL = "internal"


class WireError(ValueError):
    """A payload that is not a valid message; ``code`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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


class Reply(Message, frozen=True, tag="reply"):
    """Reply to submit, cancel and register; ``code`` is set when ``ok`` is false."""

    ok: bool
    job_id: str = ""
    server_id: str = ""
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

    def __post_init__(self) -> None:
        check_token(self.server.id, "server id")
        if self.gpu_type.name != self.server.gpu_type:
            raise ValueError(
                f"server {self.server.id} has gpu_type {self.server.gpu_type!r} "
                f"but gpu_type describes {self.gpu_type.name!r}"
            )


class EstimateRequest(Message, frozen=True, tag="estimate_request"):
    """Request on ``hops.v1.estimate`` (queue group ``estimator``)."""

    jobs: tuple[JobSpec, ...]
    cluster: Cluster


class EstimateReply(Message, frozen=True, tag="estimate_reply"):
    """Estimates keyed by job id; jobs not profiled on any type may be missing."""

    ok: bool = True
    estimates: dict[JobId, JobEstimate] = {}
    error: str = ""
    code: str = ""


# --- executor commands --------------------------------------------------------


class StartJob(Message, frozen=True, tag="start_job"):
    """Command on ``hops.v1.exec.<server_id>``: run (or profile) this server's
    part of ``configuration`` on ``gpu_indices``, resuming at ``samples_done``.
    ``key`` is an idempotency key: a repeated key is acknowledged, not rerun."""

    key: str
    job_id: JobId
    server_id: ServerId
    spec: JobSpec
    configuration: Configuration
    gpu_indices: tuple[int, ...]
    samples_done: float = 0.0
    mode: Literal["run", "profile"] = "run"
    rendezvous: Rendezvous | None = None

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("key must not be empty")
        if self.spec.id != self.job_id:
            raise ValueError(f"spec.id {self.spec.id!r} differs from job_id {self.job_id!r}")
        local = self.configuration.as_dict().get(self.server_id)
        if local is None:
            raise ValueError(f"server {self.server_id} is not in {self.configuration}")
        idx = self.gpu_indices
        if len(idx) != local or len(set(idx)) != len(idx) or min(idx) < 0:
            raise ValueError(f"gpu_indices {idx} must be {local} distinct indices >= 0")


class StopJob(Message, frozen=True, tag="stop_job"):
    """Command on ``hops.v1.exec.<server_id>``: checkpoint and stop the job."""

    key: str
    job_id: JobId
    reason: str = ""


class CommandAck(Message, frozen=True, tag="command_ack"):
    """Reply to a command; ``samples_done`` is the job's progress when it
    stopped, ``exit_code`` and ``log_tail`` its process's end (real jobs)."""

    key: str
    ok: bool
    samples_done: float = 0.0
    error: str = ""
    code: str = ""
    exit_code: int | None = None
    log_tail: str = ""


# --- job lifecycle (stream HOPS_JOBS) -------------------------------------------


class JobSubmitted(Message, frozen=True, tag="job_submitted"):
    job_id: JobId
    spec: JobSpec
    at: float

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


JobEvent: TypeAlias = (
    JobSubmitted
    | JobProfiled
    | JobStarted
    | JobResized
    | JobStopped
    | JobFinished
    | JobFailed
    | JobCancelled
)
SampleEvent: TypeAlias = SampleReported | ProfileReported
Command: TypeAlias = StartJob | StopJob
PlanEvent: TypeAlias = PlanIssued | ResourcesReleased
AnyMessage: TypeAlias = (
    SubmitJob
    | CancelJob
    | Reply
    | RegisterNode
    | EstimateRequest
    | EstimateReply
    | Command
    | CommandAck
    | JobEvent
    | SampleEvent
    | NodeHeartbeat
    | JobHeartbeat
    | PlanEvent
    | ErrorRecord
)


def error_reply(code: str, error: str) -> Reply:
    """The failed :class:`Reply` for ``code`` and ``error``."""
    return Reply(ok=False, code=code, error=error)


# --- encoding and decoding ----------------------------------------------------------

_ENCODER = msgspec.json.Encoder()
T = TypeVar("T")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def encode(msg: Message, max_payload: int = MAX_PAYLOAD) -> bytes:
    """``msg`` as JSON; :class:`WireError` ``too_large`` above ``max_payload`` bytes."""
    data = _ENCODER.encode(msg)
    if b"null" in data:  # maybe a non-finite float: msgspec writes those as null
        data = _ENCODER.encode(_finite(msgspec.to_builtins(msg)))
    _check_size(data, max_payload, str(msg.__struct_config__.tag))
    return data


def _check_size(data: bytes, max_payload: int, what: str) -> None:
    if len(data) > max_payload:
        raise WireError(TOO_LARGE, f"{what}: {len(data)} bytes exceed the limit of {max_payload}")


class _Probe(msgspec.Struct):
    type: str | None = None


_PROBE = msgspec.json.Decoder(_Probe)


def _probe(data: bytes, what: str) -> str | None:
    try:
        return _PROBE.decode(data).type
    except msgspec.DecodeError as e:
        if isinstance(e, msgspec.ValidationError):
            raise WireError(INVALID, f"invalid {what}: {e}") from None
        raise WireError(MALFORMED, f"malformed JSON in {what}: {e}") from None


class _Codec(Generic[T]):
    """A strict-enough JSON decoder for one message type or tagged union."""

    def __init__(self, tp: Any, what: str) -> None:
        self._decoder = msgspec.json.Decoder(tp, strict=False)
        self.what = what
        members = typing.get_args(tp) or (tp,)
        self.tags = tuple(str(m.__struct_config__.tag) for m in members if m.__struct_config__.tag)

    def decode(self, data: bytes, max_payload: int = MAX_PAYLOAD) -> T:
        _check_size(data, max_payload, self.what)
        try:
            return self._decoder.decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError as e:
            self._raise_invalid(data, e)
        except msgspec.DecodeError as e:
            raise WireError(MALFORMED, f"malformed JSON in {self.what}: {e}") from None

    def _raise_invalid(self, data: bytes, err: msgspec.ValidationError) -> typing.NoReturn:
        text = str(err)
        if text.endswith("at `$.type`") or text == "Object missing required field `type`":
            tag = _probe(data, self.what)
            found = 'no "type" field' if tag is None else f"unknown type {tag!r}"
            expected = ", ".join(self.tags)
            raise WireError(
                UNKNOWN_TYPE, f"{self.what}: {found}; expected one of: {expected}"
            ) from None
        raise WireError(INVALID, f"invalid {self.what}: {text}") from None


_SUBMIT = _Codec[SubmitJob](SubmitJob, "submit_job")
_JOB_SPEC = _Codec[JobSpec](JobSpec, "job spec")


def decode_submit(data: bytes, max_payload: int = MAX_PAYLOAD) -> SubmitJob:
    """A :class:`SubmitJob`, or a bare JobSpec object (no ``type``) wrapped in one."""
    _check_size(data, max_payload, "submit_job")
    if _probe(data, "submit_job") is not None:
        return _SUBMIT.decode(data, max_payload)
    spec = _JOB_SPEC.decode(data, max_payload)
    try:
        return SubmitJob(spec=spec)
    except ValueError as e:
        raise WireError(INVALID, f"invalid submit_job: {e}") from None


# Each decoder: (data: bytes, max_payload: int = MAX_PAYLOAD) -> the message.
decode_cancel = _Codec[CancelJob](CancelJob, "cancel_job").decode
decode_reply = _Codec[Reply](Reply, "reply").decode
decode_register = _Codec[RegisterNode](RegisterNode, "register_node").decode
decode_estimate_request = _Codec[EstimateRequest](EstimateRequest, "estimate_request").decode
decode_estimate_reply = _Codec[EstimateReply](EstimateReply, "estimate_reply").decode
decode_command = _Codec[Command](Command, "command").decode
decode_ack = _Codec[CommandAck](CommandAck, "command_ack").decode
decode_job_event = _Codec[JobEvent](JobEvent, "job event").decode
decode_sample_event = _Codec[SampleEvent](SampleEvent, "sample event").decode
decode_node_heartbeat = _Codec[NodeHeartbeat](NodeHeartbeat, "node_heartbeat").decode
decode_job_heartbeat = _Codec[JobHeartbeat](JobHeartbeat, "job_heartbeat").decode
decode_plan_event = _Codec[PlanEvent](PlanEvent, "plan event").decode
decode_error_record = _Codec[ErrorRecord](ErrorRecord, "error_record").decode
decode_any = _Codec[AnyMessage](AnyMessage, "message").decode  # for tools watching hops.v1.>
