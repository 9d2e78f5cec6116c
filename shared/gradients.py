"""The wire of a relaxed-sync job's aggregator service (docs/hare.md §7,
"Step 3b"): a task's gradients in chunks, the job's parameters by
request/reply, the rounds applied. MessagePack (msgspec), since each
carries raw bytes; what the bytes hold (tensors, never pickle) is
:mod:`hops.aggregator.codec`'s.

A task's gradients are one payload cut into chunks of at most
:data:`CHUNK_BYTES` (most models' gradients are larger than a NATS message),
each a :class:`GradientChunk` on ``hops.v1.grads.<server>.<job>.<round>``.
The server comes from the subject only: NATS lets executor-<S> alone
publish S's subjects, so the body cannot claim another. :class:`Chunks`
puts a report back together, pure: a chunk that disagrees with the
report's first one (its span, count, size or revision) is refused, a
repeat ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, TypeVar

import msgspec

from shared.ids import JobId, ServerId
from shared.sequence import span_problem
from shared.subjects import check_token
from shared.wire import INVALID, MALFORMED, WireError

S = TypeVar("S", bound=msgspec.Struct)
CHUNK_BYTES: Final = 512 * 1024
# The most chunks of one report: 4 GiB of gradients, far above any model here.
MAX_CHUNKS: Final = 8192
# A chunk's message: the chunk and its header (well under nats-server's 1 MiB).
CHUNK_MESSAGE_BYTES: Final = CHUNK_BYTES + 4096


def checkpoint_name(job_id: str) -> str:
    """The object (bucket ``hops_aggregator``) holding a job's parameters
    and optimizer state between rounds."""
    return f"{job_id}/checkpoint"


def final_name(job_id: str) -> str:
    """The object holding a job's final parameters once its last round is
    applied (``GET /jobs/{id}/params``, ``hops params``)."""
    return f"{job_id}/final"


class GradientChunk(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Chunk ``chunk`` of ``chunks`` of the gradients of micro-batches
    ``lo .. hi - 1`` of round ``round`` of ``job_id`` (one gradient dict per
    micro-batch, ``size`` bytes in all), computed by GPU ``gpu_index`` under
    revision ``revision`` of term ``term``."""

    job_id: JobId
    round: int
    lo: int
    hi: int
    gpu_index: int
    term: int
    revision: int
    chunk: int
    chunks: int
    size: int
    data: bytes
    v: int = 1

    def __post_init__(self) -> None:
        if (why := span_problem(self.job_id, self.round, self.lo, self.hi)) is not None:
            raise ValueError(why)
        if not 0 <= self.chunk < self.chunks <= MAX_CHUNKS:
            raise ValueError(f"chunk {self.chunk} of {self.chunks} (need 0 <= chunk < chunks "
                             f"<= {MAX_CHUNKS})")
        if len(self.data) > CHUNK_BYTES or not 0 <= self.size <= self.chunks * CHUNK_BYTES:
            raise ValueError(f"{len(self.data)} bytes in a chunk, {self.size} in all (at most "
                             f"{CHUNK_BYTES} a chunk)")
        if self.gpu_index < 0 or self.term < 1 or self.revision < 1:
            raise ValueError("gpu_index must be >= 0, term and revision >= 1")


class ParamsRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Chunk ``chunk`` of the parameters of ``job_id`` after ``round``
    rounds applied (-1: whatever the aggregator has now)."""

    job_id: JobId
    round: int = -1
    chunk: int = 0
    v: int = 1

    def __post_init__(self) -> None:
        check_token(self.job_id, "job id")
        if self.round < -1 or self.chunk < 0:
            raise ValueError(f"round must be >= -1 and chunk >= 0, got {self.round}, "
                             f"{self.chunk}")


class ParamsReply(msgspec.Struct, frozen=True, kw_only=True):
    """Chunk ``chunk`` of ``chunks`` of the parameters of ``job_id`` after
    ``round`` rounds applied; ``ok`` False: refused, ``code`` and
    ``error`` say why."""

    ok: bool
    job_id: str = ""
    round: int = 0
    chunk: int = 0
    chunks: int = 0
    data: bytes = b""
    code: str = ""
    error: str = ""
    v: int = 1


class RoundApplied(msgspec.Struct, frozen=True, kw_only=True):
    """The aggregator of ``job_id`` applied round ``round`` (so ``round`` +
    1 rounds in all) at ``at`` (wall-clock seconds)."""

    job_id: JobId
    round: int
    at: float
    v: int = 1


def encode(msg: GradientChunk | ParamsRequest | ParamsReply | RoundApplied) -> bytes:
    return msgspec.msgpack.encode(msg)


def _decode(tp: type[S], data: bytes, what: str, max_bytes: int) -> S:
    if len(data) > max_bytes:
        raise WireError(INVALID, f"{what}: {len(data)} bytes, more than {max_bytes}")
    try:
        return msgspec.msgpack.decode(data, type=tp)
    except msgspec.ValidationError as e:
        raise WireError(INVALID, f"invalid {what}: {e}") from None
    except msgspec.DecodeError as e:
        raise WireError(MALFORMED, f"malformed {what}: {e}") from None


def decode_chunk(data: bytes) -> GradientChunk:
    """A :class:`GradientChunk`, or :class:`WireError` (``malformed``, ``invalid``)."""
    return _decode(GradientChunk, data, "gradient_chunk", CHUNK_MESSAGE_BYTES)


def decode_params_request(data: bytes) -> ParamsRequest:
    return _decode(ParamsRequest, data, "params_request", 4096)


def decode_params_reply(data: bytes) -> ParamsReply:
    return _decode(ParamsReply, data, "params_reply", CHUNK_MESSAGE_BYTES)


def decode_applied(data: bytes) -> RoundApplied:
    return _decode(RoundApplied, data, "round_applied", 4096)


def split(payload: bytes, size: int = CHUNK_BYTES) -> list[bytes]:
    """``payload`` in pieces of at most ``size`` bytes (one, empty, for none)."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return [payload[i:i + size] for i in range(0, len(payload), size)] or [b""]


ReportKey = tuple[ServerId, JobId, int, int]  # (server, job, round, lo)


@dataclass
class _Report:
    first: GradientChunk
    parts: dict[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Assembled:
    """A report put back together: its first chunk's header and the payload."""

    server_id: ServerId
    header: GradientChunk
    payload: bytes


class Chunks:
    """Reports being put back together, keyed by (server, job, round, lo):
    :meth:`add` returns the report its last chunk completes, None before;
    ValueError for a chunk that disagrees with its report's first chunk."""

    def __init__(self) -> None:
        self._open: dict[ReportKey, _Report] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, server_id: ServerId, chunk: GradientChunk) -> Assembled | None:
        key = (server_id, chunk.job_id, chunk.round, chunk.lo)
        report = self._open.setdefault(key, _Report(chunk))
        first = report.first
        if (first.hi, first.chunks, first.size, first.term, first.revision) != (
                chunk.hi, chunk.chunks, chunk.size, chunk.term, chunk.revision):
            raise ValueError(f"chunk {chunk.chunk} of {key} disagrees with the report's first "
                             "chunk (micro-batches, chunk count, size or revision)")
        report.parts.setdefault(chunk.chunk, chunk.data)
        if len(report.parts) < first.chunks:
            return None
        del self._open[key]
        payload = b"".join(report.parts[i] for i in range(first.chunks))
        if len(payload) != first.size:
            raise ValueError(f"report {key}: {len(payload)} bytes in its chunks, its header "
                             f"says {first.size}")
        return Assembled(server_id, first, payload)

    def drop(self, job_id: JobId, below: int) -> None:
        """Forget the open reports of ``job_id``'s rounds below ``below``."""
        self._open = {k: r for k, r in self._open.items() if k[1] != job_id or k[2] >= below}
