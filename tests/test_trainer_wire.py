"""Tensors on the wire without pickle (hops/trainer/wire.py): any allowed
tensor round-trips exactly, into memory of its own; anything that lies
about itself is refused with ``bad_tensor`` and its reason."""

from __future__ import annotations

import math
from typing import Any, cast

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hops.trainer import BAD_TENSOR, DTYPES, BadTensor, decode_tensors, encode_tensors


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    names = draw(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=4))
    out: dict[str, torch.Tensor] = {}
    for name in names:
        dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        raw = draw(st.binary(min_size=math.prod(shape) * dtype.itemsize,
                             max_size=math.prod(shape) * dtype.itemsize))
        # Any bit pattern (NaNs included): the wire carries bytes, not values.
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(
            0, dtype=torch.uint8)
        tensor = flat.view(dtype).reshape(shape)
        if draw(st.booleans()) and tensor.dim() == 2:
            tensor = tensor.t()  # not contiguous: sent contiguous
        out[name] = tensor
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype, a.shape) == (b.dtype, b.shape) and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


@settings(max_examples=150, deadline=None)
@given(sent=tensors())
def test_round_trip_through_msgpack_is_exact(sent: dict[str, torch.Tensor]) -> None:
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(encode_tensors(sent)))
    got = decode_tensors(wire)
    assert list(got) == list(sent)
    for name, tensor in sent.items():
        assert same_bits(got[name], tensor), name


def test_decoded_tensors_own_writable_memory() -> None:
    wire = encode_tensors({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)})
    data = bytearray(cast(bytes, wire[0]["data"]))
    wire[0]["data"] = data
    got = decode_tensors(wire)["w"]
    got.add_(1.0)  # writable, and no warning of a read-only buffer
    data[:4] = b"\xff" * 4  # the message's buffer changing changes nothing
    assert torch.equal(got, torch.arange(1, 7, dtype=torch.float32).reshape(2, 3))


def test_gradients_of_a_gpu_free_model_travel_as_they_are() -> None:
    grad = torch.randn(3, 2, requires_grad=True) * 2
    got = decode_tensors(encode_tensors({"g": grad}))["g"]
    assert torch.equal(got, grad.detach()) and not got.requires_grad


def good() -> dict[str, Any]:
    return dict(encode_tensors({"w": torch.ones(2, 3)})[0])


LIES: dict[str, Any] = {
    "not a list": {"w": 1},
    "not a mapping": ["w"],
    "a field missing": [{k: v for k, v in good().items() if k != "shape"}],
    "a field more": [good() | {"extra": 1}],
    "an empty name": [good() | {"name": ""}],
    "a name not a str": [good() | {"name": 3}],
    "an unknown dtype": [good() | {"dtype": "complex64"}],
    "a dtype not a str": [good() | {"dtype": ["float32"]}],
    "a negative dimension": [good() | {"shape": [-2, -3]}],
    "a dimension not an int": [good() | {"shape": [2.0, 3]}],
    "a bool dimension": [good() | {"shape": [True, 6]}],
    "a shape not a list": [good() | {"shape": "2,3"}],
    "a huge shape": [good() | {"shape": [0, 2**30, 2**30]}],
    "too many dimensions": [good() | {"shape": [1] * 17}],
    "too few bytes": [good() | {"data": good()["data"][:-1]}],
    "too many bytes": [good() | {"data": good()["data"] + b"\x00" * 4}],
    "bytes of another dtype": [good() | {"dtype": "float64"}],
    "data not bytes": [good() | {"data": [0] * 24}],
    "a name twice": [good(), good()],
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_lie_is_refused_with_its_code(lie: str) -> None:
    with pytest.raises(BadTensor) as refused:
        decode_tensors(LIES[lie])
    assert refused.value.code == BAD_TENSOR == "bad_tensor"
    assert str(refused.value)


def test_the_honest_message_the_lies_start_from_decodes() -> None:
    assert torch.equal(decode_tensors([good()])["w"], torch.ones(2, 3))


def test_a_dtype_not_allowed_is_refused_when_sent() -> None:
    with pytest.raises(BadTensor, match="complex64"):
        encode_tensors({"z": torch.zeros(2, dtype=torch.complex64)})
