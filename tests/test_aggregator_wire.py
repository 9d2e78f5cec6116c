"""The aggregator service's wire, pure (docs/hare.md §7, step 3b): chunks
put back together whatever their order and repeats, refused when they
disagree; the messages' own checks; a report's and a checkpoint's codec
(no pickle) round-tripping bit for bit and refusing what lies; the
service's grant rules."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hops.aggregator.codec import (
    BadCheckpoint,
    checkpoint_of,
    decode_checkpoint,
    decode_report,
    encode_checkpoint,
    encode_report,
    restore,
)
from hops.trainer.wire import BadTensor, encode_tensors
from services.aggregator.rules import (
    NOT_SEQUENCED,
    OTHER_JOB,
    grant_problem,
    grants_of,
    header_problem,
    kept,
    shard_of,
)
from services.aggregator.settings import AggregatorSettings, aggregator_settings
from services.runtime.settings import SettingsError
from shared import subjects
from shared.events import TaskSequence
from shared.gradients import (
    CHUNK_BYTES,
    Chunks,
    GradientChunk,
    ParamsRequest,
    decode_chunk,
    decode_params_request,
    encode,
    split,
)
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.sequence import GpuTasks, TaskEntry
from shared.wire import INVALID, MALFORMED, WireError

A, B, J = ServerId("a"), ServerId("b"), JobId("j1")


def chunks_of(payload: bytes, size: int, *, round_: int = 0, lo: int = 0, hi: int = 2,
              revision: int = 1) -> list[GradientChunk]:
    parts = split(payload, size)
    return [GradientChunk(job_id=J, round=round_, lo=lo, hi=hi, gpu_index=0, term=1,
                          revision=revision, chunk=i, chunks=len(parts), size=len(payload),
                          data=p) for i, p in enumerate(parts)]


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=200), size=st.integers(1, 64), data=st.data())
def test_chunks_come_back_whatever_the_order_and_the_repeats(
        payload: bytes, size: int, data: st.DataObject) -> None:
    sent = chunks_of(payload, size)
    order = data.draw(st.permutations(sent))
    # repeats of the chunks before the last one, anywhere before it
    repeats = data.draw(st.lists(st.sampled_from(order[:-1]), max_size=3)) if order[:-1] else []
    early = data.draw(st.permutations([*order[:-1], *repeats]))
    assembly, done = Chunks(), []
    for chunk in [*early, order[-1]]:
        out = assembly.add(A, chunk)
        if out is not None:
            done.append(out)
    assert len(done) == 1 and done[0].payload == payload and done[0].server_id == A
    assert len(assembly) == 0
    assert all(len(c.data) <= size for c in sent)


def test_two_servers_reports_of_one_span_stay_apart_and_a_disagreeing_chunk_is_refused() -> None:
    assembly = Chunks()
    a0, a1 = chunks_of(b"aaaa", 2)
    b0, b1 = chunks_of(b"bbbb", 2)
    assert assembly.add(A, a0) is None and assembly.add(B, b0) is None
    got_b = assembly.add(B, b1)
    assert got_b is not None and got_b.payload == b"bbbb" and got_b.server_id == B
    liar = chunks_of(b"aaaa", 2, hi=3)[1]  # other micro-batches than its first chunk's
    with pytest.raises(ValueError, match="disagrees"):
        assembly.add(A, liar)
    got_a = assembly.add(A, a1)
    assert got_a is not None and got_a.payload == b"aaaa"
    assembly.add(A, chunks_of(b"cccc", 2, round_=1)[0])
    assembly.drop(J, 2)
    assert len(assembly) == 0


@pytest.mark.parametrize("fields", [
    {"round": -1}, {"lo": 2, "hi": 2}, {"chunk": 1, "chunks": 1}, {"chunks": 0},
    {"data": b"x" * (CHUNK_BYTES + 1)}, {"size": 10**12}, {"term": 0}, {"job_id": "a.b"},
    {"gpu_index": -1}])
def test_a_malformed_chunk_is_refused_as_decoded(fields: dict[str, object]) -> None:
    good = {"job_id": "j1", "round": 0, "lo": 0, "hi": 2, "gpu_index": 0, "term": 1,
            "revision": 1, "chunk": 0, "chunks": 1, "size": 3, "data": b"abc", "v": 1}
    raw = msgspec.msgpack.encode({**good, **fields})
    with pytest.raises(WireError) as e:
        decode_chunk(raw)
    assert e.value.code == INVALID and str(e.value)
    assert decode_chunk(msgspec.msgpack.encode(good)).data == b"abc"
    with pytest.raises(WireError) as m:
        decode_chunk(b"\xc1not msgpack")
    assert m.value.code == MALFORMED
    with pytest.raises(WireError):
        decode_params_request(msgspec.msgpack.encode({"job_id": "j1", "round": -2}))
    assert decode_params_request(encode(ParamsRequest(job_id=J, chunk=3))).chunk == 3


def grads(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g,
                                                                 dtype=torch.float64)}


def test_a_report_round_trips_bitwise_and_lying_tensors_are_refused() -> None:
    sent = (grads(1), grads(2))
    back = decode_report(encode_report(sent), 2)
    assert all(torch.equal(x[k], y[k]) and x[k].dtype == y[k].dtype
               for x, y in zip(sent, back, strict=True) for k in x)
    with pytest.raises(BadTensor):
        decode_report(encode_report(sent), 3)  # not one dict per micro-batch
    lying = encode_tensors(grads(1))
    lying[0]["shape"] = [4, 4]  # more elements than its bytes
    with pytest.raises(BadTensor):
        decode_report(msgspec.msgpack.encode([lying]), 1)
    with pytest.raises(BadTensor):
        decode_report(b"\xc1", 1)


def adam_after_two_steps() -> tuple[torch.nn.Linear, torch.optim.Adam]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    for _ in range(2):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_a_checkpoint_restores_parameters_and_optimiser_so_training_goes_on_bitwise() -> None:
    model, opt = adam_after_two_steps()
    params = dict(model.named_parameters())
    data = encode_checkpoint(checkpoint_of(2, params, opt, {"grants": [["a", 2, 0, 1]]}))
    assert b"pickle" not in data and b"torch._utils" not in data
    ckpt = decode_checkpoint(data)
    assert ckpt.applied == 2 and ckpt.extra == {"grants": [["a", 2, 0, 1]]}
    twin = torch.nn.Linear(4, 3)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=0.5)
    restore(ckpt, dict(twin.named_parameters()), twin_opt)
    assert twin_opt.param_groups[0]["betas"] == (0.8, 0.9)  # a tuple again
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (twin, twin_opt)):
        m(x).pow(2).sum().backward()
        o.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(),
                                                  strict=True))


@pytest.mark.parametrize("bad", [
    b"\xc1", msgspec.msgpack.encode({"version": 1}),
    msgspec.msgpack.encode({"version": 2, "applied": 0, "parameters": [], "optimizer": None,
                            "extra": None}),
    msgspec.msgpack.encode({"version": 1, "applied": -1, "parameters": [], "optimizer": None,
                            "extra": None}),
    msgspec.msgpack.encode({"version": 1, "applied": 0, "parameters": [],
                            "optimizer": {"x": 1, "y": 2}, "extra": None}),
    msgspec.msgpack.encode({"version": 1, "applied": 0, "parameters": [],
                            "optimizer": {"d": [[[1], 2]]}, "extra": None})])
def test_a_checkpoint_that_is_not_one_is_refused(bad: bytes) -> None:
    with pytest.raises(BadCheckpoint):
        decode_checkpoint(bad)


def test_a_checkpoint_of_another_model_is_refused_and_changes_nothing() -> None:
    model, opt = adam_after_two_steps()
    ckpt = decode_checkpoint(encode_checkpoint(checkpoint_of(2, dict(model.named_parameters()),
                                                             opt)))
    other = torch.nn.Linear(4, 2)
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(BadCheckpoint):
        restore(ckpt, dict(other.named_parameters()), torch.optim.SGD(other.parameters(), 0.1))
    assert all(torch.equal(p, q) for p, q in zip(before, other.parameters(), strict=True))


def test_grants_are_the_sequences_entries_and_the_subject_must_match_the_body() -> None:
    spec = JobSpec(id=J, model="resnet18", batch_size=8, params=10, total_samples=64,
                   requirements=(1, 2), sync_scale=2)
    seq = TaskSequence(term=1, revision=1, server_id=A, at=0.0, specs=(spec,), gpus=(
        GpuTasks(0, (TaskEntry(J, 0, 0, 1, 0.0, 1.0), TaskEntry(J, 1, 0, 2, 2.0, 3.0))),
        GpuTasks(1, (TaskEntry(J, 0, 1, 2, 0.0, 1.0),))))
    grants = grants_of(seq)[J]
    assert grants == {(A, 0, 0, 1), (A, 1, 0, 2), (A, 0, 1, 2)}
    assert kept(grants, 1) == {(A, 1, 0, 2)}
    ok = chunks_of(b"", 1, round_=1, lo=0, hi=2)[0]
    assert grant_problem(grants, A, ok) is None
    code, reason = grant_problem(grants, B, ok) or ("", "")
    assert code == NOT_SEQUENCED and "server b" in reason
    assert grant_problem(grants, A, chunks_of(b"", 1, round_=1, lo=0, hi=1)[0]) is not None
    assert header_problem((A, J, 1), ok) is None
    assert (header_problem((A, JobId("j2"), 1), ok) or ("",))[0] == OTHER_JOB
    assert header_problem((A, J, 0), ok) is not None
    assert subjects.grads_tokens(subjects.grads(A, J, 7)) == (A, J, 7)
    for bad in ("hops.v1.grads.a.j1", "hops.v1.grads.a.j1.x", "hops.v1.tasks.done.a.j1"):
        with pytest.raises(subjects.SubjectError):
            subjects.grads_tokens(bad)


def test_the_settings_have_one_default_each_and_name_a_bad_variable(tmp_path: Path) -> None:
    assert aggregator_settings({}) == AggregatorSettings(Path("."), 10.0)
    got = aggregator_settings({"HOPS_AGGREGATOR_ROOT": str(tmp_path),
                               "HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S": "2.5"})
    assert got == AggregatorSettings(tmp_path, 2.5)
    with pytest.raises(SettingsError, match="HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S"):
        aggregator_settings({"HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S": "-1"})
    (tmp_path / "f").write_text("")
    with pytest.raises(SettingsError, match="HOPS_AGGREGATOR_ROOT"):
        aggregator_settings({"HOPS_AGGREGATOR_ROOT": str(tmp_path / "f")})
    got = aggregator_settings({"HOPS_AGGREGATOR_SHARD": "1/3"})
    assert (got.shard, got.shards) == (1, 3)
    for bad in ("3/3", "1", "a/2", "-1/2", "1/0", "0/"):
        with pytest.raises(SettingsError, match="HOPS_AGGREGATOR_SHARD"):
            aggregator_settings({"HOPS_AGGREGATOR_SHARD": bad})


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=40),
       st.integers(min_value=1, max_value=16))
def test_every_job_has_one_shard_the_same_in_every_process(job: str, shards: int) -> None:
    k = shard_of(JobId(job), shards)
    assert 0 <= k < shards
    assert shard_of(JobId(job), 1) == 0


def test_shards_are_a_stable_hash_not_pythons_salted_one() -> None:
    # Fixed values: a replica of another process, or another release, must
    # give each job the same shard (CRC-32 of the id).
    assert [shard_of(JobId(j), 4) for j in ("cnn", "lm", "job-1", "job-2")] == [1, 1, 3, 1]
    spread = {shard_of(JobId(f"job-{i}"), 4) for i in range(40)}
    assert spread == {0, 1, 2, 3}
