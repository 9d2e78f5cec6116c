"""A training script as Hare's tasks (hops/trainer/api.py, docs/hare.md §7):
the example scripts' ``hops_task``, run as tasks of any split over two
trainers and summed by the job's aggregator, reach the one-process loop's
parameters bitwise; a script without ``hops_task`` is refused."""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hops.aggregator import Aggregator, GradientReport
from hops.trainer import (
    TaskJob,
    decode_tensors,
    encode_tensors,
    load_task,
    reference_rounds,
    task_gradients,
)

ROOT = Path(__file__).resolve().parents[1]
S = 3  # micro-batches a round
ROUNDS = 3
JOB = "job-t"
# Small sizes: a few seconds for every run below on one core.
CONFIGS: dict[str, dict[str, object]] = {
    "train_cnn.py": {"batch_size": 2, "dataset_size": 64, "seed": 3, "sync_scale": S},
    "train_lm.py": {"batch_size": 2, "seq_len": 8, "vocab": 32, "d_model": 16, "layers": 1,
                    "seed": 5, "sync_scale": S},
}
Split = list[list[tuple[int, int, int]]]  # per round: (lo, hi, trainer), in arrival order


def load(script: str) -> TaskJob:
    return load_task(ROOT / "examples" / script, CONFIGS[script])


def params_of(job: TaskJob) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in job.model.named_parameters()}


@functools.cache
def reference(script: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The initial parameters, and those after ROUNDS rounds in one process."""
    job = load(script)
    start = params_of(job)
    reference_rounds(job, S, ROUNDS)
    return start, params_of(job)


def run_tasks(script: str, split: Split) -> dict[str, torch.Tensor]:
    """ROUNDS rounds as tasks on two trainers, each reporting its gradients
    through the wire to the job's aggregator, which updates a third copy;
    the trainers take its parameters after each round."""
    server = load(script)
    trainers = (load(script), load(script))
    agg = Aggregator(JOB, S, dict(server.model.named_parameters()), server.optimizer)
    for round_, tasks in enumerate(split):
        for lo, hi, which in tasks:
            grads = task_gradients(trainers[which], round_, lo, hi, S)
            sent = tuple(decode_tensors(encode_tensors(g)) for g in grads)
            got = agg.receive(GradientReport(JOB, round_, lo, hi, sent))
            assert got.outcome in ("counted", "applied"), got.reason
        assert agg.applied == round_ + 1
        for trainer in trainers:
            trainer.model.load_state_dict(server.model.state_dict())
    return params_of(server)


def assert_bitwise(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor, want[name]), name


@pytest.mark.parametrize("script", sorted(CONFIGS))
def test_trainers_start_equal_and_training_moves_the_parameters(script: str) -> None:
    start, end = reference(script)
    assert_bitwise(params_of(load(script)), start)
    assert any(not torch.equal(start[n], end[n]) for n in start)


@pytest.mark.parametrize("script", sorted(CONFIGS))
def test_tasks_over_two_trainers_reach_the_one_process_bitwise(script: str) -> None:
    split: Split = [
        [(0, 1, 0), (1, 3, 1)],
        [(2, 3, 1), (0, 2, 0)],  # the round's end first: it waits for the rest
        [(1, 2, 0), (0, 1, 1), (2, 3, 0)],
    ]
    assert_bitwise(run_tasks(script, split), reference(script)[1])


@st.composite
def splits(draw: st.DrawFn) -> Split:
    out: Split = []
    for _ in range(ROUNDS):
        cuts = draw(st.lists(st.integers(1, S - 1), unique=True, max_size=S - 1))
        bounds = [0, *sorted(cuts), S]
        tasks = [(lo, hi, draw(st.integers(0, 1))) for lo, hi in itertools.pairwise(bounds)]
        out.append(draw(st.permutations(tasks)))
    return out


@pytest.mark.parametrize("script", sorted(CONFIGS))
@settings(max_examples=4, deadline=None)
@given(split=splits())
def test_any_split_reaches_the_one_process_bitwise(script: str, split: Split) -> None:
    assert_bitwise(run_tasks(script, split), reference(script)[1])


def test_a_micro_batch_of_another_index_is_seen() -> None:
    """The comparison can fail: round 0's micro-batch 1 replaced by round
    1's gives other parameters."""
    script = "train_lm.py"
    server, trainer = load(script), load(script)
    agg = Aggregator(JOB, S, dict(server.model.named_parameters()), server.optimizer)
    wrong = task_gradients(trainer, 1, 1, 2, S)
    agg.receive(GradientReport(JOB, 0, 0, 1, task_gradients(trainer, 0, 0, 1, S)))
    agg.receive(GradientReport(JOB, 0, 1, 3, (*wrong, *task_gradients(trainer, 0, 2, 3, S))))
    right = load(script)
    reference_rounds(right, S, 1)
    assert agg.applied == 1
    assert any(not torch.equal(p, params_of(right)[n]) for n, p in params_of(server).items())


def test_task_gradients_are_detached_and_leave_the_model_clean() -> None:
    job = load("train_lm.py")
    grads = task_gradients(job, 2, 0, 2, S)
    assert len(grads) == 2
    names = dict(job.model.named_parameters()).keys()
    for g in grads:
        assert g.keys() == names
        assert all(t.grad_fn is None and not t.requires_grad for t in g.values())
    assert not torch.equal(grads[0]["out.weight"], grads[1]["out.weight"])
    assert all(p.grad is None for p in job.model.parameters())
    again = task_gradients(load("train_lm.py"), 2, 1, 2, S)[0]
    assert_bitwise(again, grads[1])  # micro-batch 1 alone: the same gradient


@pytest.mark.parametrize("span", [(-1, 0, 1), (0, 1, 1), (0, 2, 1), (0, -1, 1), (0, 0, S + 1)])
def test_task_gradients_refuse_a_span_outside_the_round(span: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="need S >= 1"):
        task_gradients(load("train_lm.py"), *span, S)


@pytest.mark.parametrize("script", sorted(CONFIGS))
def test_a_micro_batch_is_a_function_of_its_index(script: str) -> None:
    a, b = load(script), load(script)
    first, again, other = a.batch(7), b.batch(7), a.batch(8)
    flat = [torch.cat([t.reshape(-1).float() for t in (x if isinstance(x, tuple) else (x,))])
            for x in (first, again, other)]
    assert torch.equal(flat[0], flat[1]) and not torch.equal(flat[0], flat[2])


def test_a_script_without_hops_task_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("def main() -> None:\n    pass\n")
    with pytest.raises(ValueError, match="defines no hops_task"):
        load_task(script, {})


def test_a_hops_task_returning_something_else_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "odd.py"
    script.write_text("def hops_task(config):\n    return 42\n")
    with pytest.raises(ValueError, match="returned a int"):
        load_task(script, {})


def test_loading_never_runs_the_script_as_main(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "guarded.py"
    script.write_text(
        "from pathlib import Path\n"
        "import torch\n"
        "from hops.trainer import TaskJob\n"
        "def hops_task(config):\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    return TaskJob(model, torch.optim.SGD(model.parameters(), lr=float(config['lr'])),\n"
        "                   lambda k: torch.full((1, 2), float(k)), lambda m, b: m(b).sum())\n"
        f"if __name__ == '__main__':\n    Path({str(marker)!r}).write_text('x')\n")
    job = load_task(script, {"lr": 0.5})
    assert job.optimizer.param_groups[0]["lr"] == 0.5
    assert not marker.exists()


def test_a_trainer_joining_late_computes_what_the_first_one_would() -> None:
    """Determinism in k, not in call order: a shuffled order of tasks on one
    trainer gives each micro-batch the same gradient."""
    job, other = load("train_cnn.py"), load("train_cnn.py")
    order = list(range(S))
    random.Random(4).shuffle(order)
    one = {m: task_gradients(job, 0, m, m + 1, S)[0] for m in order}
    for m, g in enumerate(task_gradients(other, 0, 0, S, S)):
        assert_bitwise(one[m], g)
