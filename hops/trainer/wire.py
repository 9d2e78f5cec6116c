"""Tensors on the wire, without pickle (docs/hare.md §7).

A task's gradients travel from the trainer that computed them to the job's
aggregator, which may be another process or machine. ``torch.save`` would
pickle them, and unpickling runs whatever the sender wrote; so a tensor
travels as plain data: its name, a dtype from an allow-list, its shape and
its raw bytes (CPU, C-contiguous, the machine's byte order: every platform
torch runs on here is little-endian). :func:`decode_tensors` believes
nothing it is sent: an unknown dtype, a shape that is negative or too
large, a byte count other than the shape's, a name given twice or a field
of the wrong type is refused with :class:`BadTensor` and its reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np
import torch

BAD_TENSOR: Final = "bad_tensor"

DTYPES: Final[Mapping[str, torch.dtype]] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES: Final = {dtype: name for name, dtype in DTYPES.items()}
MAX_DIMS: Final = 16
# Elements of a tensor, counting each empty dimension as 1, so that no
# stride of a shape accepted overflows: far above any model's parameter.
MAX_ELEMENTS: Final = 2**40
FIELDS: Final = frozenset({"name", "dtype", "shape", "data"})


class BadTensor(ValueError):
    """A tensor refused on the wire; ``code`` is :data:`BAD_TENSOR`."""

    code: Final = BAD_TENSOR


def encode_tensors(tensors: Mapping[str, torch.Tensor]) -> list[dict[str, object]]:
    """``tensors`` as plain data: for each, ``name``, ``dtype`` (a key of
    :data:`DTYPES`), ``shape`` (a list of ints) and ``data`` (its bytes,
    CPU and contiguous). BadTensor for a dtype not allowed."""
    out: list[dict[str, object]] = []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise BadTensor(f"{name!r}: need a str name and a tensor")
        dtype = _NAMES.get(tensor.dtype)
        if dtype is None:
            raise BadTensor(f"{name}: dtype {tensor.dtype} is not one of {sorted(DTYPES)}")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes()
        out.append({"name": name, "dtype": dtype, "shape": list(tensor.shape), "data": data})
    return out


def decode_tensors(obj: object) -> dict[str, torch.Tensor]:
    """The tensors of :func:`encode_tensors`' list ``obj``, each in memory
    of its own (writable, never the message's buffer). BadTensor when
    anything in ``obj`` is not what that function writes."""
    if not isinstance(obj, list):
        raise BadTensor(f"need a list of tensors, got {type(obj).__name__}")
    out: dict[str, torch.Tensor] = {}
    for i, item in enumerate(obj):
        name, tensor = _decode_one(i, item)
        if name in out:
            raise BadTensor(f"tensor {i}: the name {name!r} is given twice")
        out[name] = tensor
    return out


def _decode_one(i: int, item: object) -> tuple[str, torch.Tensor]:
    if not isinstance(item, dict) or set(item) != FIELDS:
        raise BadTensor(f"tensor {i}: need a mapping of exactly {sorted(FIELDS)}")
    name, dtype_name, shape, data = (item[f] for f in ("name", "dtype", "shape", "data"))
    if not isinstance(name, str) or not name:
        raise BadTensor(f"tensor {i}: the name must be a non-empty str")
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise BadTensor(f"{name}: dtype {dtype_name!r} is not one of {sorted(DTYPES)}")
    dims = _shape(name, shape)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadTensor(f"{name}: data must be bytes, got {type(data).__name__}")
    size = torch.empty((), dtype=dtype).element_size()
    want = math.prod(dims) * size
    raw = memoryview(data).cast("B")
    if raw.nbytes != want:
        raise BadTensor(f"{name}: {raw.nbytes} bytes, the shape {list(dims)} of {dtype_name} "
                        f"needs {want}")
    buffer = torch.empty(want, dtype=torch.uint8)  # torch's own memory, writable
    buffer.numpy()[:] = np.frombuffer(raw, dtype=np.uint8)
    return name, buffer.view(dtype).reshape(dims)


def _shape(name: str, shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise BadTensor(f"{name}: the shape must be a list of at most {MAX_DIMS} ints")
    if any(type(d) is not int or d < 0 for d in shape):  # bool is no dimension
        raise BadTensor(f"{name}: the shape {shape!r} has a dimension that is not an int >= 0")
    dims = tuple(int(d) for d in shape)
    if math.prod(max(d, 1) for d in dims) > MAX_ELEMENTS:
        raise BadTensor(f"{name}: the shape {list(dims)} is larger than {MAX_ELEMENTS} elements")
    return dims
