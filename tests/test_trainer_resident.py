"""The resident trainer process (docs/hare.md §7, step 4): a real
``python -m hops.trainer.resident`` behind its pipe, a tiny task script
(tests/trainer_task.py) and the small LM example. Each refusal code, with
nothing changed by it; several jobs resident; given parameters win over
the script's seeded ones; eviction to a file and reload, bitwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from hops.trainer import protocol as p
from hops.trainer.api import load_task, task_gradients
from hops.trainer.params import state_of
from hops.trainer.resident import Trainer
from hops.trainer.wire import decode_tensors, encode_tensors
from tests.trainer_task import same_gradients

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "trainer_task.py")
LM = str(ROOT / "examples" / "train_lm.py")
LM_CONFIG: dict[str, Any] = {"batch_size": 2, "seq_len": 8, "vocab": 32, "d_model": 16,
                             "layers": 1, "sync_scale": 3}


class Client:
    """One trainer process and its pipe."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "hops.trainer.resident"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.ready = self.read()

    def send(self, raw: bytes) -> p.Reply:
        """The reply to ``raw``: to a run, its gradients (``Ran``), after
        its ``Computed``, kept in ``computed``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw)
        self.proc.stdin.flush()
        reply = self.read()
        if isinstance(reply, p.Computed):
            self.computed = reply
            reply = self.read()
            assert isinstance(reply, p.Ran) and reply.job == self.computed.job, reply
        return reply

    def ask(self, command: p.Command) -> p.Reply:
        return self.send(p.frame(command))

    def read(self) -> p.Reply:
        assert self.proc.stdout is not None
        body = p.read_frame(self.proc.stdout)
        assert body is not None, "the trainer ended"
        return p.decode_reply(body)


@pytest.fixture(scope="module")
def trainer() -> Iterator[Client]:
    client = Client()
    yield client
    assert isinstance(client.ask(p.Quit()), p.Bye)
    assert client.proc.wait(10) == 0


def _params(script: str, config: Mapping[str, Any], shift: float = 0.0) -> dict[str, torch.Tensor]:
    model = load_task(script, config).model
    return {n: t.detach() + shift for n, t in model.named_parameters()}


def _local(script: str, config: Mapping[str, Any], params: Mapping[str, torch.Tensor],
           round_: int, lo: int, hi: int, scale: int) -> tuple[dict[str, torch.Tensor], ...]:
    job = load_task(script, config)
    with torch.no_grad():
        for name, param in job.model.named_parameters():
            param.copy_(params[name])
    return task_gradients(job, round_, lo, hi, scale)


def _grads(reply: p.Reply) -> list[dict[str, torch.Tensor]]:
    assert isinstance(reply, p.Ran), reply
    return [decode_tensors(g) for g in reply.gradients]


def _refused(reply: p.Reply, code: str) -> None:
    assert isinstance(reply, p.Refused), reply
    assert reply.code == code and reply.words, reply


def test_ready_and_several_jobs_resident_bitwise(trainer: Client) -> None:
    assert isinstance(trainer.ready, p.Ready) and trainer.ready.device == "cpu"
    tiny, lm = _params(TINY, {}, shift=0.01), _params(LM, LM_CONFIG)
    assert isinstance(trainer.ask(p.Load("tiny", TINY, {})), p.Loaded)
    assert isinstance(trainer.ask(p.Load("lm", LM, LM_CONFIG)), p.Loaded)
    a = _grads(trainer.ask(p.Run("tiny", 0, 0, 2, 3, encode_tensors(tiny))))
    b = _grads(trainer.ask(p.Run("lm", 0, 1, 3, 3, encode_tensors(lm))))
    c = _grads(trainer.ask(p.Run("tiny", 0, 2, 3, 3)))  # round 0's held: none sent again
    assert same_gradients(a + c, _local(TINY, {}, tiny, 0, 0, 3, 3))
    assert same_gradients(b, _local(LM, LM_CONFIG, lm, 0, 1, 3, 3))
    # The given round-0 parameters (shifted) count, not the seeded ones.
    assert not same_gradients(a, _local(TINY, {}, _params(TINY, {}), 0, 0, 2, 3))
    for job in ("tiny", "lm"):
        assert isinstance(trainer.ask(p.Forget(job)), p.Forgot)


def test_evict_and_reload_bitwise(trainer: Client, tmp_path: Path) -> None:
    params = _params(TINY, {"seed": 3}, shift=-0.02)
    trainer.ask(p.Load("e", TINY, {"seed": 3}))
    before = _grads(trainer.ask(p.Run("e", 4, 0, 1, 2, encode_tensors(params))))
    evicted = trainer.ask(p.Evict("e", str(tmp_path)))
    assert isinstance(evicted, p.Evicted) and evicted.nbytes > 0
    assert Path(evicted.path).parent == tmp_path and Path(evicted.path).exists()
    again = trainer.ask(p.Run("e", 4, 0, 1, 2))  # no parameters: reloaded from the file
    assert isinstance(again, p.Ran) and trainer.computed.reload_s > 0
    assert same_gradients(before, _grads(again)) and not Path(evicted.path).exists()
    assert same_gradients(before + _grads(trainer.ask(p.Run("e", 4, 1, 2, 2))),
                 _local(TINY, {"seed": 3}, params, 4, 0, 2, 2))
    shm = trainer.ask(p.Evict("e"))  # by default to shared memory
    assert isinstance(shm, p.Evicted) and shm.path.startswith("/dev/shm/")
    assert isinstance(trainer.ask(p.Forget("e")), p.Forgot) and not Path(shm.path).exists()


def test_evicted_model_holds_no_memory_and_comes_back_whole() -> None:
    trainer = Trainer(torch.device("cpu"), os.getpid())
    trainer.load(p.Load("m", LM, LM_CONFIG))
    model = trainer.jobs["m"].task.model
    held = {n: t.clone() for n, t in state_of(model).items()}
    trainer.run(p.Run("m", 0, 0, 1, 3, encode_tensors(dict(model.named_parameters()))))
    out = trainer.evict(p.Evict("m"))
    assert all(t.numel() == 0 for t in state_of(model).values())
    trainer.run(p.Run("m", 0, 1, 2, 3))
    assert all(torch.equal(held[n], t) for n, t in state_of(model).items())
    assert not Path(out.path).exists()
    # Evicted, the model's shapes still judge the parameters given.
    trainer.evict(p.Evict("m"))
    wrong = {n: torch.zeros(2) for n, _ in model.named_parameters()}
    (reply,) = trainer.replies(p.Run("m", 1, 0, 1, 3, encode_tensors(wrong)))
    assert isinstance(reply, p.Refused) and reply.code == p.BAD_PARAMS
    computed, ran = trainer.replies(p.Run("m", 1, 0, 1, 3, encode_tensors(held)))
    assert isinstance(computed, p.Computed) and isinstance(ran, p.Ran)
    assert computed.compute_start <= computed.compute_end and len(ran.gradients) == 1
    assert all(torch.equal(held[n], t) for n, t in state_of(model).items())
    trainer.close()


def test_refusals_change_nothing(trainer: Client, tmp_path: Path) -> None:
    params = _params(TINY, {}, shift=0.05)
    trainer.ask(p.Load("r", TINY, {}))
    # Seeded weights are no round's: a run without parameters is stale.
    _refused(trainer.ask(p.Run("r", 0, 0, 1, 2)), p.STALE_PARAMS)
    first = _grads(trainer.ask(p.Run("r", 0, 0, 1, 2, encode_tensors(params))))
    _refused(trainer.send(b"\x00\x00\x00\x01\xc1"), p.BAD_COMMAND)  # no msgpack
    body = msgspec.msgpack.encode({"type": "dance", "job": "r"})
    _refused(trainer.send(len(body).to_bytes(4, "big") + body), p.BAD_COMMAND)
    _refused(trainer.ask(p.Run("nope", 0, 0, 1, 2)), p.UNKNOWN_JOB)
    _refused(trainer.ask(p.Evict("nope")), p.UNKNOWN_JOB)
    _refused(trainer.ask(p.Forget("nope")), p.UNKNOWN_JOB)
    _refused(trainer.ask(p.Load("r", TINY, {})), p.JOB_EXISTS)
    for lo, hi, scale, round_ in ((1, 1, 2, 0), (0, 3, 2, 0), (-1, 1, 2, 0), (0, 1, 0, 0),
                                  (0, 1, 2, -1)):
        _refused(trainer.ask(p.Run("r", round_, lo, hi, scale)), p.BAD_SPAN)
    wrong = {**params, "0.weight": torch.zeros(3, 3)}
    missing = {n: t for n, t in params.items() if n != "2.bias"}
    extra = {**params, "ghost": torch.zeros(1)}
    lying = encode_tensors(params)
    data = lying[0]["data"]
    assert isinstance(data, bytes)
    lying[0]["data"] = data[:-4]  # a byte count that is not the shape's
    for bad in (encode_tensors(wrong), encode_tensors(missing), encode_tensors(extra), lying):
        _refused(trainer.ask(p.Run("r", 1, 0, 1, 2, bad)), p.BAD_PARAMS)
    # Round 0's parameters still held, untouched by the refusals.
    assert same_gradients(first, _grads(trainer.ask(p.Run("r", 0, 0, 1, 2))))
    _refused(trainer.ask(p.Run("r", 1, 0, 1, 2)), p.STALE_PARAMS)
    plain = tmp_path / "plain.py"
    plain.write_text("X = 1\n")
    _refused(trainer.ask(p.Load("n", str(plain), {})), p.NOT_TASK_READY)
    _refused(trainer.ask(p.Load("n", str(tmp_path / "absent.py"), {})), p.NOT_TASK_READY)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no')\n")
    _refused(trainer.ask(p.Load("n", str(broken), {})), p.TASK_FAILED)
    trainer.ask(p.Load("f", TINY, {"fail": True}))
    _refused(trainer.ask(p.Run("f", 0, 0, 1, 1, encode_tensors(params))), p.TASK_FAILED)
    for job in ("r", "f"):
        assert isinstance(trainer.ask(p.Forget(job)), p.Forgot)
    _refused(trainer.ask(p.Run("r", 0, 0, 1, 2)), p.UNKNOWN_JOB)
    every = {p.BAD_COMMAND, p.NOT_TASK_READY, p.UNKNOWN_JOB, p.JOB_EXISTS, p.BAD_SPAN,
             p.BAD_PARAMS, p.STALE_PARAMS, p.TASK_FAILED}
    assert every == p.REFUSAL_CODES


def test_a_script_printing_leaves_the_frames_alone(trainer: Client, tmp_path: Path) -> None:
    noisy = tmp_path / "noisy.py"
    noisy.write_text(f"print('hello from a script')\nexec(open({TINY!r}).read())\n")
    assert isinstance(trainer.ask(p.Load("noisy", str(noisy), {})), p.Loaded)
    assert isinstance(trainer.ask(p.Forget("noisy")), p.Forgot)
