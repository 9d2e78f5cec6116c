"""The resident trainer's messages (docs/hare.md §7, step 4).

A resident trainer (:mod:`hops.trainer.resident`) serves Hare's tasks
(hare.md §4: "fast task switching") over a pipe, its stdin and stdout:
each message is a 4-byte big-endian length, then that many bytes of
msgpack, a tagged union (``type`` names the message). Tensors travel as
:func:`hops.trainer.wire.encode_tensors` writes them, never pickled.

Commands: :class:`Load` (a job's script and config, with its parameters
or none: the script's seeded ones), :class:`Run` (micro-batches ``lo ..
hi - 1`` of a round; the round's parameters given once per round to each
trainer that runs it; it may come while another trainer of the GPU
computes, and then waits for its turn), :class:`Evict` (the model's state
to shared memory or a folder, its memory freed), :class:`Forget`, :class:`Quit`. The
trainer answers each with one reply, but a run with two: :class:`Computed`
as soon as its compute ends, then :class:`Ran` with the gradients, so that
the GPU's next task can start while they travel (Hare's sync overlapping
the next task); :class:`Ready` comes first, unasked. A refusal carries one
of the stable codes below and words.
"""

from __future__ import annotations

import struct
from typing import IO, Any, Final

import msgspec

BAD_COMMAND: Final = "bad_command"  # not a command of this protocol
NOT_TASK_READY: Final = "not_task_ready"  # the script offers no tasks (no hops_task)
UNKNOWN_JOB: Final = "unknown_job"  # no model of that job here
JOB_EXISTS: Final = "job_exists"  # a load of a job already here
BAD_SPAN: Final = "bad_span"  # S < 1, round < 0 or not 0 <= lo < hi <= S
BAD_PARAMS: Final = "bad_params"  # tensors that lie, or are not the model's
STALE_PARAMS: Final = "stale_params"  # no parameters given, and those held are another round's
TASK_FAILED: Final = "task_failed"  # the script raised while loading or computing
REFUSAL_CODES: Final = frozenset({BAD_COMMAND, NOT_TASK_READY, UNKNOWN_JOB, JOB_EXISTS,
                                  BAD_SPAN, BAD_PARAMS, STALE_PARAMS, TASK_FAILED})

Tensors = list[dict[str, Any]]  # hops.trainer.wire.encode_tensors' form
_LENGTH: Final = struct.Struct(">I")
MAX_FRAME: Final = 2**31  # bytes: a frame above this is a broken stream, not a model


class Load(msgspec.Struct, tag="load", frozen=True):
    """Make ``job``'s model from ``script``'s ``hops_task(config)``;
    ``params`` (parameters and buffers) replace the seeded ones, and are
    then those of round ``round``."""

    job: str
    script: str
    config: dict[str, Any]
    params: Tensors | None = None
    round: int = 0


class Run(msgspec.Struct, tag="run", frozen=True):
    """Micro-batches ``lo .. hi - 1`` of round ``round`` of S = ``sync_scale``.
    ``params``: the round's; None when this trainer was given them already.
    ``turn``: the task's place in its GPU's order (:mod:`hops.trainer.turns`):
    the trainer readies the task, then waits for that turn to compute; None:
    at once (a trainer started without turns ignores it)."""

    job: str
    round: int
    lo: int
    hi: int
    sync_scale: int
    params: Tensors | None = None
    turn: int | None = None


class Evict(msgspec.Struct, tag="evict", frozen=True):
    """Move ``job``'s model state out of memory: to ``folder``, or to
    ``/dev/shm`` when it is empty; the model's memory is freed."""

    job: str
    folder: str = ""


class Forget(msgspec.Struct, tag="forget", frozen=True):
    job: str


class Quit(msgspec.Struct, tag="quit", frozen=True):
    pass


Command = Load | Run | Evict | Forget | Quit


class Ready(msgspec.Struct, tag="ready", frozen=True):
    """The trainer is up: its process, device and, on a GPU, the CUDA
    context made (``context_s`` it took)."""

    pid: int
    device: str
    context_s: float


class Loaded(msgspec.Struct, tag="loaded", frozen=True):
    job: str
    load_s: float


class Computed(msgspec.Struct, tag="computed", frozen=True):
    """A run's compute ended. ``received``, ``compute_start`` and
    ``compute_end`` are the trainer's ``time.monotonic()`` (system-wide on
    Linux, comparable across processes); ``reload_s`` the evicted state's
    reload, 0 when resident; ``ready``: when its model and parameters were
    in place, before it waited for its turn (0: not said)."""

    job: str
    round: int
    lo: int
    hi: int
    received: float
    compute_start: float
    compute_end: float
    reload_s: float = 0.0
    ready: float = 0.0


class Ran(msgspec.Struct, tag="ran", frozen=True):
    """A run's gradients, after its :class:`Computed`: one per micro-batch
    (``gradients[i]`` is ``lo + i``'s)."""

    job: str
    round: int
    lo: int
    hi: int
    gradients: list[Tensors]


class Evicted(msgspec.Struct, tag="evicted", frozen=True):
    job: str
    path: str
    nbytes: int


class Forgot(msgspec.Struct, tag="forgot", frozen=True):
    job: str


class Bye(msgspec.Struct, tag="bye", frozen=True):
    pass


class Refused(msgspec.Struct, tag="refused", frozen=True):
    """A command refused, changing nothing: ``code`` one of
    :data:`REFUSAL_CODES`, ``words`` why."""

    code: str
    words: str
    job: str = ""


Reply = Ready | Loaded | Computed | Ran | Evicted | Forgot | Bye | Refused

_encoder = msgspec.msgpack.Encoder()
_commands = msgspec.msgpack.Decoder(Command)
_replies = msgspec.msgpack.Decoder(Reply)


def frame(message: Command | Reply) -> bytes:
    """``message`` as one frame: its length, then its msgpack."""
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def decode_command(body: bytes) -> Command:
    """A command (msgspec.ValidationError or DecodeError when it is none)."""
    command: Command = _commands.decode(body)
    return command


def decode_reply(body: bytes) -> Reply:
    reply: Reply = _replies.decode(body)
    return reply


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's body; None at the end of the stream (also mid-frame:
    the peer died). ValueError for a length above :data:`MAX_FRAME`."""
    head = _read_exactly(stream, _LENGTH.size)
    if head is None:
        return None
    (size,) = _LENGTH.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"a frame of {size} bytes: the stream is broken")
    return _read_exactly(stream, size)


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    parts: list[bytes] = []
    left = size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
