"""What an aggregator's bytes hold, without pickle (docs/hare.md §7, step 3b).

* A **report**: one gradient dict per micro-batch, each the tensors of
  :func:`hops.trainer.wire.encode_tensors`, in a MessagePack list.
* A **checkpoint**: the parameters, the optimiser's ``state_dict()`` and
  the rounds applied, plus what the service keeps with them (its
  ``extra``: plain data). An optimiser's state is a tree of dicts (some
  keyed by int), lists, tuples, numbers, strings, None and tensors; each
  node is written tagged (``{"t": tensor}``, ``{"d": [[key, value], ...]}``,
  ``{"u": [...]}`` a tuple, ``{"l": [...]}`` a list), so that it comes
  back as it was, tuples as tuples, int keys as ints, tensors bit for
  bit.

Decoding believes nothing: a lying tensor is :class:`BadTensor` (code
``bad_tensor``), any other shape of data :class:`BadCheckpoint`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
import torch

from hops.trainer.wire import BadTensor, decode_tensors, encode_tensors

MAX_DEPTH: Final = 32  # an optimiser's state is a few levels deep
_CHECKPOINT_VERSION: Final = 1


class BadCheckpoint(ValueError):
    """A checkpoint that is not what :func:`encode_checkpoint` writes."""

    code: Final = "bad_checkpoint"


def encode_report(gradients: Sequence[Mapping[str, torch.Tensor]]) -> bytes:
    """One payload for a task's gradients, one dict per micro-batch."""
    return msgspec.msgpack.encode([encode_tensors(g) for g in gradients])


def decode_report(payload: bytes, count: int) -> tuple[dict[str, torch.Tensor], ...]:
    """The ``count`` gradient dicts of ``payload``; BadTensor when it holds
    anything else."""
    try:
        obj = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as e:
        raise BadTensor(f"the gradients are not MessagePack: {e}") from None
    if not isinstance(obj, list) or len(obj) != count:
        raise BadTensor(f"need a list of {count} gradient dicts (one per micro-batch)")
    return tuple(decode_tensors(item) for item in obj)


def encode_params(parameters: Mapping[str, torch.Tensor]) -> bytes:
    """A model's parameters (the aggregator's answer, a job's final ones)."""
    return msgspec.msgpack.encode(encode_tensors({k: p.detach() for k, p in parameters.items()}))


def decode_params(data: bytes) -> dict[str, torch.Tensor]:
    """The parameters of :func:`encode_params`; BadTensor when they lie."""
    try:
        return decode_tensors(msgspec.msgpack.decode(data))
    except msgspec.DecodeError as e:
        raise BadTensor(f"the parameters are not MessagePack: {e}") from None


@dataclass(frozen=True)
class Checkpoint:
    """The parameters and the optimiser's state after ``applied`` rounds."""

    applied: int
    parameters: dict[str, torch.Tensor]
    optimizer: dict[str, object]
    extra: object = None


def _tree(value: object, depth: int = 0) -> object:
    if depth > MAX_DEPTH:
        raise BadCheckpoint(f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, torch.Tensor):
        return {"t": encode_tensors({"t": value})[0]}
    if isinstance(value, Mapping):
        return {"d": [[_tree(k, depth + 1), _tree(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"u": [_tree(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return {"l": [_tree(v, depth + 1) for v in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise BadCheckpoint(f"cannot keep a {type(value).__name__} in a checkpoint")


def _untree(obj: object, depth: int = 0) -> object:
    if depth > MAX_DEPTH:
        raise BadCheckpoint(f"nested deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if not isinstance(obj, dict) or len(obj) != 1:
        raise BadCheckpoint(f"a node must be a scalar or a one-key tag, got {obj!r:.80}")
    (tag, body), = obj.items()
    if tag == "t":
        return decode_tensors([body])["t"]
    if not isinstance(body, list):
        raise BadCheckpoint(f"tag {tag!r} needs a list")
    if tag == "u":
        return tuple(_untree(v, depth + 1) for v in body)
    if tag == "l":
        return [_untree(v, depth + 1) for v in body]
    if tag == "d":
        if not all(isinstance(p, list) and len(p) == 2 for p in body):
            raise BadCheckpoint("a dict needs [key, value] pairs")
        out: dict[object, object] = {}
        for k, v in body:
            key = _untree(k, depth + 1)
            if not isinstance(key, str | int) or key in out:
                raise BadCheckpoint(f"a dict key must be a str or an int, once: {key!r:.80}")
            out[key] = _untree(v, depth + 1)
        return out
    raise BadCheckpoint(f"unknown tag {tag!r}")


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    return msgspec.msgpack.encode({
        "version": _CHECKPOINT_VERSION, "applied": checkpoint.applied,
        "parameters": encode_tensors(checkpoint.parameters),
        "optimizer": _tree(checkpoint.optimizer), "extra": _tree(checkpoint.extra)})


def decode_checkpoint(data: bytes) -> Checkpoint:
    """The :class:`Checkpoint` of ``data``; BadCheckpoint or BadTensor when
    it is not one."""
    try:
        obj = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as e:
        raise BadCheckpoint(f"not MessagePack: {e}") from None
    fields = {"version", "applied", "parameters", "optimizer", "extra"}
    if not isinstance(obj, dict) or set(obj) != fields:
        raise BadCheckpoint(f"need a mapping of exactly {sorted(fields)}")
    if obj["version"] != _CHECKPOINT_VERSION:
        raise BadCheckpoint(f"version {obj['version']!r}, this reads {_CHECKPOINT_VERSION}")
    applied = obj["applied"]
    if type(applied) is not int or applied < 0:
        raise BadCheckpoint(f"applied must be an int >= 0, got {applied!r}")
    optimizer = _untree(obj["optimizer"])
    if not isinstance(optimizer, dict):
        raise BadCheckpoint("the optimiser's state must be a dict")
    return Checkpoint(applied, decode_tensors(obj["parameters"]), optimizer,
                      _untree(obj["extra"]))


def checkpoint_of(applied: int, parameters: Mapping[str, torch.nn.Parameter],
                  optimizer: torch.optim.Optimizer, extra: object = None) -> Checkpoint:
    """The checkpoint of a model's ``parameters`` and ``optimizer`` now."""
    return Checkpoint(applied, {k: p.detach() for k, p in parameters.items()},
                      optimizer.state_dict(), extra)


def restore(checkpoint: Checkpoint, parameters: Mapping[str, torch.nn.Parameter],
            optimizer: torch.optim.Optimizer) -> None:
    """Load ``checkpoint`` into ``parameters`` and ``optimizer``;
    BadCheckpoint when its parameters are not these (names, shapes, dtypes)."""
    saved = checkpoint.parameters
    if set(saved) != set(parameters):
        raise BadCheckpoint(f"parameters {sorted(saved)} are not the model's "
                            f"{sorted(parameters)}")
    for name, param in parameters.items():
        value = saved[name]
        if (value.shape, value.dtype) != (param.shape, param.dtype):
            raise BadCheckpoint(f"{name}: {tuple(value.shape)} {value.dtype}, the model's "
                                f"{tuple(param.shape)} {param.dtype}")
    with torch.no_grad():
        for name, param in parameters.items():
            param.copy_(saved[name])
    try:
        optimizer.load_state_dict(checkpoint.optimizer)
    except (ValueError, KeyError, TypeError) as e:
        raise BadCheckpoint(f"the optimiser's state does not fit: {e}") from None
