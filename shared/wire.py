"""The wire format under :mod:`shared.events`: the message base, JSON
encoding with non-finite floats as strings, size limits, and the decoder
that turns every failure into one :class:`WireError` with a code.
"""

from __future__ import annotations

import math
import typing
from typing import Any, Generic, TypeVar

import msgspec

MAX_PAYLOAD = 256 * 1024

# Error codes carried by WireError and by failed replies.
MALFORMED = "malformed"
UNKNOWN_TYPE = "unknown_type"
INVALID = "invalid"
TOO_LARGE = "too_large"
INTERNAL = "internal"
# A failed reply's code for a job no GPU type of the cluster can ever hold.
UNSCHEDULABLE = "unschedulable"
# Refusals of identity (docs/security.md): no or a bad credential (HTTP 401),
# and an authenticated actor doing what its role does not allow (HTTP 403).
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
# An error record of the scheduler leader: a plan that over-allocated what its
# snapshot left free, refused and never published (docs/live.md).
PLAN_REFUSED = "plan_refused"
# A hold of a job that is not pending (it runs): as Slurm, only a waiting job
# can be held (HTTP 409). ``held`` is the reason a held job waits under.
NOT_PENDING = "not_pending"
HELD = "held"
# The reason a job waits under while the tenants file does not name its
# tenant (a file changed since it was accepted): never planned, released when
# a reload names the tenant again (docs/tenancy.md, scheduling.live.tenancy).
UNKNOWN_TENANT = "unknown_tenant"
# The reason of a job the leader ended at its time limit (Slurm's TimeLimit):
# its phase is ``cancelled`` (scheduling.live.timelimit).
TIME_LIMIT = "TimeLimit"
# Under a task policy (hare.md, "Live mechanism"): the reasons a job waits
# unsequenced, and the error record of a task report the leader refused.
NOT_RELAXED = "not_relaxed"
NO_ESTIMATE = "no_estimate"
TASK_REFUSED = "task_refused"


class WireError(ValueError):
    """A payload that is not a valid message; ``code`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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


def encode(msg: msgspec.Struct, max_payload: int = MAX_PAYLOAD) -> bytes:
    """``msg`` as JSON; :class:`WireError` ``too_large`` above ``max_payload`` bytes."""
    data = _ENCODER.encode(msg)
    if b"null" in data:  # maybe a non-finite float: msgspec writes those as null
        data = _ENCODER.encode(_finite(msgspec.to_builtins(msg)))
    check_size(data, max_payload, str(msg.__struct_config__.tag))
    return data


def check_size(data: bytes, max_payload: int, what: str) -> None:
    if len(data) > max_payload:
        size = f"{what} of {len(data)} bytes"
        raise WireError(TOO_LARGE, f"{size} is larger than the limit of {max_payload} bytes")


class _Probe(msgspec.Struct):
    type: str | None = None


_PROBE = msgspec.json.Decoder(_Probe)


def probe_type(data: bytes, what: str) -> str | None:
    try:
        return _PROBE.decode(data).type
    except msgspec.DecodeError as e:
        if isinstance(e, msgspec.ValidationError):
            raise WireError(INVALID, f"invalid {what}: {e}") from None
        raise WireError(MALFORMED, f"malformed JSON in {what}: {e}") from None


class Codec(Generic[T]):
    """A strict-enough JSON decoder for one message type or tagged union."""

    def __init__(self, tp: Any, what: str) -> None:
        self._decoder = msgspec.json.Decoder(tp, strict=False)
        self.what = what
        members = typing.get_args(tp) or (tp,)
        self.tags = tuple(str(m.__struct_config__.tag) for m in members if m.__struct_config__.tag)

    def decode(self, data: bytes, max_payload: int = MAX_PAYLOAD) -> T:
        check_size(data, max_payload, self.what)
        try:
            return self._decoder.decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError as e:
            self._raise_invalid(data, e)
        except msgspec.DecodeError as e:
            raise WireError(MALFORMED, f"malformed JSON in {self.what}: {e}") from None

    def _raise_invalid(self, data: bytes, err: msgspec.ValidationError) -> typing.NoReturn:
        text = str(err)
        if text.endswith("at `$.type`") or text == "Object missing required field `type`":
            tag = probe_type(data, self.what)
            found = 'no "type" field' if tag is None else f"unknown type {tag!r}"
            expected = ", ".join(self.tags)
            raise WireError(
                UNKNOWN_TYPE, f"{self.what}: {found}; expected one of: {expected}"
            ) from None
        raise WireError(INVALID, f"invalid {self.what}: {text}") from None
