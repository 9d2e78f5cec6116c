"""The per-job gradient aggregator's core (hops/aggregator/core.py,
docs/hare.md §7 step 3): the parameters it reaches from tasks' gradients,
split over GPUs and arriving in any order, are bitwise those of one process
that accumulates the S micro-batches of each round through the plugin; each
micro-batch counts once; a refused report changes nothing."""

from __future__ import annotations

import copy
import functools
import itertools
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from hops import plugin
from hops.aggregator import Aggregator, GradientReport, Gradients, core, sum_in_order
from hops.plugin.config import Settings
from hops.plugin.micro import MicroBatch, loss_factor
from tests.test_relaxed_sync import BATCH, make_model, micro_data  # the plugin's own test's

S = 6  # micro-batches a round
ROUNDS = 4
JOB = "job-a"
GPUS = 3  # the "GPUs" the tasks of a round are spread over

Optimiser = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
OPTIMISERS: dict[str, Optimiser] = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}
# What a task scales its micro-batch's loss by: the plugin's factor for one
# process running all S (k = 1).
FACTOR = loss_factor(Settings(batch_size=BATCH, sync_scale=S, micro_batches=(S,)))


def micro_loss(model: nn.Module, round_: int, micro: MicroBatch) -> torch.Tensor:
    x, y = micro_data(round_, micro.index)
    loss: torch.Tensor = micro.scale(nn.functional.mse_loss(model(x), y))
    return loss


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@functools.cache
def one_process(kind: str) -> tuple[tuple[dict[str, torch.Tensor], ...], dict[str, torch.Tensor]]:
    """The plugin's relaxed step in one process, ROUNDS rounds of S
    micro-batches: the parameters at the start of each round, and at the end."""
    env = {"HOPS_SYNC_SCALE": str(S), "HOPS_BATCH_SIZE": str(BATCH),
           "HOPS_TOTAL_SAMPLES": str(ROUNDS * S * BATCH)}
    run = plugin.init(env=env, handle_sigterm=False)
    model = run.wrap(make_model())
    opt = OPTIMISERS[kind](model.parameters())
    starts = []
    for step in run.steps():
        starts.append(params_of(model))
        for micro in step.micro_batches():
            with step.forward():
                loss = micro_loss(model, step.index, micro)
            with step.backward():
                loss.backward()  # type: ignore[no-untyped-call]
        with step.update():
            opt.step()
            opt.zero_grad()
    assert run.close() == 0 and len(starts) == ROUNDS
    return tuple(starts), params_of(model)


def task(params: Mapping[str, torch.Tensor], round_: int, lo: int, hi: int) -> GradientReport:
    """A task on a GPU: the model as of the round's start, micro-batches
    ``lo .. hi - 1``, one gradient each."""
    worker = make_model()
    worker.load_state_dict(params)
    grads: list[Gradients] = []
    for i in range(lo, hi):
        worker.zero_grad(set_to_none=True)
        micro_loss(worker, round_, MicroBatch(i, i - lo, hi - lo, FACTOR)).backward()  # type: ignore[no-untyped-call]
        grads.append({n: p.grad for n, p in worker.named_parameters() if p.grad is not None})
    return GradientReport(JOB, round_, lo, hi, tuple(grads))


@functools.cache
def tables(kind: str) -> tuple[tuple[Gradients, ...], ...]:
    """Each round's S micro-batch gradients, from the one process's parameters."""
    starts, _ = one_process(kind)
    return tuple(task(starts[r], r, 0, S).gradients for r in range(ROUNDS))


def report(kind: str, round_: int, lo: int, hi: int) -> GradientReport:
    return GradientReport(JOB, round_, lo, hi, tables(kind)[round_][lo:hi])


def fresh(kind: str) -> tuple[nn.Module, Aggregator]:
    model = make_model()
    return model, Aggregator(JOB, S, dict(model.named_parameters()),
                             OPTIMISERS[kind](model.parameters()))


def assert_bitwise(model: nn.Module, want: Mapping[str, torch.Tensor]) -> None:
    got = params_of(model)
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        assert torch.equal(tensor, want[name]), name


def random_split(rng: random.Random) -> list[tuple[int, int]]:
    cuts = sorted(rng.sample(range(1, S), rng.randint(0, S - 1)))
    bounds = [0, *cuts, S]
    return list(itertools.pairwise(bounds))


# --- (a) against one process ---------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kind", sorted(OPTIMISERS))
def test_tasks_on_any_gpus_give_the_one_process_parameters_bitwise(kind: str, seed: int) -> None:
    rng = random.Random(seed)
    model, agg = fresh(kind)
    for r in range(ROUNDS):
        # Each GPU starts the round from the aggregator's parameters and
        # runs the spans the split gives it; the reports come in any order.
        gpu_params = [params_of(model) for _ in range(GPUS)]
        reports = [task(gpu_params[rng.randrange(GPUS)], r, lo, hi)
                   for lo, hi in random_split(rng)]
        rng.shuffle(reports)
        outcomes = [agg.receive(rep) for rep in reports]
        assert [o.outcome for o in outcomes[:-1]] == ["counted"] * (len(reports) - 1)
        assert (outcomes[-1].outcome, outcomes[-1].applied) == ("applied", (r,))
    assert agg.applied == ROUNDS
    starts, final = one_process(kind)
    assert_bitwise(model, final)
    assert any(not torch.equal(final[n], starts[0][n]) for n in final)  # it trained


@pytest.mark.parametrize("kind", sorted(OPTIMISERS))
def test_another_summation_order_would_show(kind: str) -> None:
    """The data are such that the order of the sum changes bits, so the
    tests above would catch an aggregator that added in arrival order."""
    grads = tables(kind)[0]
    in_order, reversed_ = sum_in_order(grads), sum_in_order(grads[::-1])
    assert any(not torch.equal(in_order[n], reversed_[n]) for n in in_order)


# --- (b) any order, split and duplication -----------------------------------------------


@st.composite
def deliveries(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """(round, lo, hi) of every report, in arrival order: each round split
    into tasks, some sent again under another split."""
    sent: list[tuple[int, int, int]] = []
    for r in range(ROUNDS):
        bounds = [0, *sorted(draw(st.sets(st.integers(1, S - 1)))), S]
        sent += [(r, lo, hi) for lo, hi in itertools.pairwise(bounds)]
        for _ in range(draw(st.integers(0, 3))):
            lo = draw(st.integers(0, S - 1))
            sent.append((r, lo, draw(st.integers(lo + 1, S))))
    return draw(st.permutations(sent))


@pytest.mark.parametrize("kind", sorted(OPTIMISERS))
@settings(max_examples=60, deadline=None)
@given(order=deliveries())
def test_any_arrival_order_split_and_duplication_gives_the_same_parameters(
        kind: str, order: list[tuple[int, int, int]]) -> None:
    model, agg = fresh(kind)
    counted: Counter[tuple[int, int]] = Counter()
    queue = deque(order)
    for _ in range(100 * len(order)):
        if not queue:
            break
        r, lo, hi = queue.popleft()
        got = agg.receive(report(kind, r, lo, hi))
        if got.code == core.ROUND_AHEAD:
            queue.append((r, lo, hi))  # its sender tries again later
            continue
        if got.code == core.ROUND_APPLIED:
            continue  # a late copy: its round was complete without it
        assert got.outcome != "refused", got
        assert sorted(got.counted + got.ignored) == list(range(lo, hi))
        counted.update((r, i) for i in got.counted)
    assert not queue and agg.applied == ROUNDS
    assert counted == Counter((r, i) for r in range(ROUNDS) for i in range(S))
    assert_bitwise(model, one_process(kind)[1])


def test_a_duplicate_is_ignored_and_said_so() -> None:
    model, agg = fresh("adam")
    assert agg.receive(report("adam", 0, 0, 3)).counted == (0, 1, 2)
    junk = GradientReport(JOB, 0, 1, 3, tuple(junk_gradients(model) for _ in range(2)))
    again = agg.receive(junk)
    assert (again.outcome, again.ignored, again.counted) == ("duplicate", (1, 2), ())
    assert "counted already" in again.reason
    partly = agg.receive(report("adam", 0, 2, 5))
    assert (partly.outcome, partly.counted, partly.ignored) == ("counted", (3, 4), (2,))
    assert agg.counted(0) == (0, 1, 2, 3, 4)
    for r in range(ROUNDS):
        agg.receive(report("adam", r, 0, S))
    assert_bitwise(model, one_process("adam")[1])  # the first copy counted, not the junk


# --- (c) refusals ------------------------------------------------------------------------


def junk_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradients of the right shapes that would show if they were counted."""
    return {n: torch.full_like(p, 1000.0) for n, p in model.named_parameters()}


def refusals(model: nn.Module) -> dict[str, tuple[str, GradientReport]]:
    """Reports refused while round 0 is applied and round 1 holds 0..1, by
    what is wrong with them: (code, report)."""
    junk = junk_gradients(model)
    weight = "0.weight"

    def one(**change: Any) -> tuple[Gradients, ...]:
        return ({**junk, **change},)

    return {
        "another job's": (core.OTHER_JOB, GradientReport("job-b", 1, 2, 3, (junk,))),
        "no micro-batch": (core.BAD_SPAN, GradientReport(JOB, 1, 3, 3, ())),
        "a gradient short": (core.BAD_SPAN, GradientReport(JOB, 1, 2, 4, (junk,))),
        "round below 0": (core.BAD_SPAN, GradientReport(JOB, -1, 0, 1, (junk,))),
        "beyond S - 1": (core.OUT_OF_RANGE, GradientReport(JOB, 1, S - 1, S + 1, (junk, junk))),
        "below 0": (core.OUT_OF_RANGE, GradientReport(JOB, 1, -1, 1, (junk, junk))),
        "round applied": (core.ROUND_APPLIED, GradientReport(JOB, 0, 0, 1, (junk,))),
        "two rounds ahead": (core.ROUND_AHEAD, GradientReport(JOB, 3, 0, 1, (junk,))),
        "unknown parameter": (core.BAD_GRADIENTS, GradientReport(
            JOB, 1, 2, 3, one(nope=torch.zeros(1)))),
        "another shape": (core.BAD_GRADIENTS, GradientReport(
            JOB, 1, 2, 3, one(**{weight: torch.zeros(1)}))),
        "another dtype": (core.BAD_GRADIENTS, GradientReport(
            JOB, 1, 2, 3, one(**{weight: junk[weight].double()}))),
        "not a tensor": (core.BAD_GRADIENTS, GradientReport(
            JOB, 1, 2, 3, one(**{weight: [[0.0]]}))),
        "not a mapping": (core.BAD_GRADIENTS, GradientReport(JOB, 1, 2, 3, ([junk],))),  # type: ignore[arg-type]
        # Atomic: the good first micro-batch is not counted either.
        "second gradient bad": (core.BAD_GRADIENTS, GradientReport(
            JOB, 1, 2, 4, (junk, {"nope": torch.zeros(1)}))),
    }


REFUSALS = sorted(refusals(make_model()))


def snapshot(model: nn.Module, agg: Aggregator) -> tuple[Any, ...]:
    opt = copy.deepcopy(agg.optimizer.state_dict())
    return params_of(model), opt, agg.applied, [agg.counted(r) for r in range(ROUNDS)]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_report_changes_nothing(case: str) -> None:
    model, agg = fresh("adam")
    assert agg.receive(report("adam", 0, 0, S)).applied == (0,)
    agg.receive(report("adam", 1, 0, 2))
    code, bad = refusals(model)[case]
    before = snapshot(model, agg)
    got = agg.receive(bad)
    assert (got.outcome, got.code, got.counted, got.applied) == ("refused", code, (), ())
    assert code in core.REFUSAL_CODES and got.reason
    assert same(snapshot(model, agg), before)
    agg.receive(report("adam", 1, 2, S))
    for r in range(2, ROUNDS):
        agg.receive(report("adam", r, 0, S))
    assert agg.applied == ROUNDS
    assert_bitwise(model, one_process("adam")[1])


def test_the_refusal_cases_cover_every_code() -> None:
    assert {code for code, _ in refusals(make_model()).values()} == core.REFUSAL_CODES


def test_a_restarted_aggregator_goes_on_from_its_applied_round() -> None:
    """A checkpoint of the parameters and the optimiser after round 1 and
    ``applied=2``: the rounds after it come out as in one process."""
    kind = "sgd-momentum"
    model, agg = fresh(kind)
    for r in range(2):
        agg.receive(report(kind, r, 0, S))
    saved = copy.deepcopy((model.state_dict(), agg.optimizer.state_dict()))
    model = make_model()
    model.load_state_dict(saved[0])
    opt = OPTIMISERS[kind](model.parameters())
    opt.load_state_dict(saved[1])
    agg = Aggregator(JOB, S, dict(model.named_parameters()), opt, applied=2)
    assert agg.receive(report(kind, 1, 0, 1)).code == core.ROUND_APPLIED
    ahead = GradientReport(JOB, 4, 0, 1, tables(kind)[0][:1])
    assert agg.receive(ahead).code == core.ROUND_AHEAD
    assert agg.receive(report(kind, 3, 0, S)).outcome == "counted"  # one ahead: it waits
    assert agg.receive(report(kind, 2, 0, S)).applied == (2, 3)
    assert agg.applied == ROUNDS
    assert_bitwise(model, one_process(kind)[1])


@pytest.mark.parametrize(("job", "scale", "applied", "foreign"), [
    ("", S, 0, False), (JOB, 0, 0, False), (JOB, S, -1, False), (JOB, S, 0, True),
])
def test_a_bad_aggregator_is_refused(job: str, scale: int, applied: int, foreign: bool) -> None:
    model = make_model()
    tensors = [nn.Parameter(torch.zeros(1))] if foreign else list(model.parameters())
    with pytest.raises(ValueError):
        Aggregator(job, scale, dict(model.named_parameters()),
                   torch.optim.SGD(tensors, lr=0.1), applied)
