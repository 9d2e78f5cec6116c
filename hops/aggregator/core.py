"""One job's gradient aggregator, pure (docs/hare.md §7, step 3).

Hare's executors run a relaxed-sync job's round as tasks, micro-batches
``lo .. hi - 1`` of its S, on whichever GPUs the schedule gives them, and
send each task's gradients to the job's parameter server, which updates the
model once the round is complete (Hare §2.1, Eq. (3): g^t = (1/|K|) Σ_k
g_k^t, w^{t+1} = w^t − η g^t; §3.1). This is that server's rule, with no
I/O and no clock: the service around it (placement, restart, the NATS
subjects) is a later step.

**Exact, whatever the split and the order.** A task sends one gradient per
micro-batch it ran, each the gradient of that micro-batch's loss scaled by
1/S, which is what the plugin scales it by in a one-process relaxed job
(:func:`hops.plugin.micro.loss_factor`, k = 1). The aggregator adds the S
gradients of a round in micro-batch order, 0 first, exactly as autograd
accumulates them in one process that runs the S micro-batches in turn
(each later gradient added in place to ``.grad``), then gives the sum to the
job's optimiser. Floating-point addition is not associative, so a sum in
arrival order would depend on the schedule; in micro-batch order, given
the micro-batch gradients that process computes, the parameters are bitwise
its own, for any deterministic optimiser.
Micro-batches that arrive before their predecessors wait; those that
extend the summed prefix are folded in at once, so a round in order holds
one running sum.

**Counting.** Each (round, micro-batch) counts once: a report's
micro-batches counted already are ignored and named (``ignored``); a report
whose micro-batches all were is a ``duplicate``. The rounds are applied
strictly in order: the next round (``applied``) and the one after it are
accepted; a report is refused, changing nothing, with a reason and one of
the stable codes below, when it is another job's, names no micro-batch or a
round below 0 or not one gradient per micro-batch (``bad_span``), names a
micro-batch outside 0..S-1, a round applied already, a round more than one
ahead, or gradients that are not the parameters' (not a mapping, an
unknown name, another shape, dtype or device). A gradient may leave a parameter out (it had none
in that micro-batch, as autograd leaves ``.grad`` alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

import torch

OTHER_JOB: Final = "other_job"
BAD_SPAN: Final = "bad_span"
OUT_OF_RANGE: Final = "micro_batch_out_of_range"
ROUND_APPLIED: Final = "round_applied"
ROUND_AHEAD: Final = "round_ahead"
BAD_GRADIENTS: Final = "bad_gradients"
REFUSAL_CODES: Final = frozenset(
    {OTHER_JOB, BAD_SPAN, OUT_OF_RANGE, ROUND_APPLIED, ROUND_AHEAD, BAD_GRADIENTS})

Gradients = Mapping[str, torch.Tensor]  # parameter name -> its gradient of one micro-batch
Outcome = Literal["refused", "duplicate", "counted", "applied"]


@dataclass(frozen=True)
class GradientReport:
    """A task's gradients: ``gradients[i]`` is micro-batch ``lo + i``'s of
    round ``round`` of ``job_id``. The aggregator never writes to them but
    keeps those it counted until their round is applied: the sender must
    not change them meanwhile."""

    job_id: str
    round: int
    lo: int
    hi: int
    gradients: tuple[Gradients, ...]


@dataclass(frozen=True)
class Received:
    """What one report did. ``code`` and ``reason`` say why it was refused
    (``code`` one of :data:`REFUSAL_CODES`) or, for a duplicate, why it
    was ignored; ``counted`` and ``ignored`` are its micro-batches counted
    now and counted before; ``applied`` the rounds it completed, in order."""

    outcome: Outcome
    code: str = ""
    reason: str = ""
    counted: tuple[int, ...] = ()
    ignored: tuple[int, ...] = ()
    applied: tuple[int, ...] = ()


def _refused(code: str, reason: str) -> Received:
    return Received("refused", code, reason)


def _fold(total: dict[str, torch.Tensor], grads: Gradients) -> None:
    """Add one micro-batch's gradients to ``total``, as autograd adds a
    later backward pass's to ``.grad`` (the first one is taken as it is)."""
    for name, grad in grads.items():
        if name in total:
            total[name].add_(grad.detach())  # the sum keeps no autograd graph
        else:
            total[name] = grad.detach().clone()


def sum_in_order(micro: Sequence[Gradients]) -> dict[str, torch.Tensor]:
    """The gradients of ``micro`` added in their order (module doc)."""
    total: dict[str, torch.Tensor] = {}
    for grads in micro:
        _fold(total, grads)
    return total


class _Round:
    """One round's micro-batches: 0 .. ``folded`` - 1 summed in ``total``,
    the later ones that came early in ``waiting``."""

    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.folded = 0
        self.total: dict[str, torch.Tensor] = {}
        self.waiting: dict[int, Gradients] = {}

    def has(self, index: int) -> bool:
        return index < self.folded or index in self.waiting

    def add(self, index: int, grads: Gradients) -> None:
        self.waiting[index] = grads
        while self.folded in self.waiting:
            _fold(self.total, self.waiting.pop(self.folded))
            self.folded += 1

    @property
    def complete(self) -> bool:
        return self.folded == self.scale

    def counted(self) -> tuple[int, ...]:
        return tuple(sorted([*range(self.folded), *self.waiting]))


class Aggregator:
    """The aggregator of job ``job_id``, S = ``sync_scale`` micro-batches a
    round (module doc). ``parameters`` are the job's model (e.g.
    ``dict(model.named_parameters())``), which ``optimizer`` updates;
    ``applied`` the rounds applied before (a restart from a checkpoint of
    the parameters and the optimiser taken after that many)."""

    def __init__(self, job_id: str, sync_scale: int, parameters: Mapping[str, torch.nn.Parameter],
                 optimizer: torch.optim.Optimizer, applied: int = 0) -> None:
        if not job_id or sync_scale < 1 or applied < 0:
            raise ValueError(f"need a job id, S >= 1 and applied >= 0, got {job_id!r}, "
                             f"S = {sync_scale}, applied = {applied}")
        known = {id(p) for p in parameters.values()}
        if any(id(p) not in known for group in optimizer.param_groups for p in group["params"]):
            raise ValueError("the optimiser updates a tensor that is not one of the parameters")
        self.job_id = job_id
        self.sync_scale = sync_scale
        self.parameters: Mapping[str, torch.nn.Parameter] = MappingProxyType(dict(parameters))
        self._optimizer = optimizer
        self._applied = applied
        self._rounds: dict[int, _Round] = {}

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The job's optimiser (its state is part of a checkpoint)."""
        return self._optimizer

    @property
    def applied(self) -> int:
        """Rounds applied: the next round to apply."""
        return self._applied

    def counted(self, round_: int) -> tuple[int, ...]:
        """The micro-batches of ``round_`` (not applied yet) counted so far."""
        state = self._rounds.get(round_)
        return () if state is None else state.counted()

    def receive(self, report: GradientReport) -> Received:
        """Count ``report``; apply the rounds it completes, in order."""
        why = self._problem(report)
        if why is not None:
            return _refused(*why)
        state = self._rounds.setdefault(report.round, _Round(self.sync_scale))
        span = range(report.lo, report.hi)
        ignored = tuple(i for i in span if state.has(i))
        if len(ignored) == len(span):
            return Received("duplicate", reason=f"micro-batches {report.lo}..{report.hi - 1} of "
                            f"round {report.round} were counted already", ignored=ignored)
        counted = tuple(i for i in span if not state.has(i))
        for i in counted:
            state.add(i, report.gradients[i - report.lo])
        applied = self._apply_complete()
        return Received("applied" if applied else "counted", counted=counted, ignored=ignored,
                        applied=applied)

    def _problem(self, report: GradientReport) -> tuple[str, str] | None:
        """(code, reason) of a refusal; None when ``report`` may count."""
        r, lo, hi = report.round, report.lo, report.hi
        if report.job_id != self.job_id:
            return OTHER_JOB, (f"report of job {report.job_id!r} to the aggregator of "
                               f"{self.job_id!r}")
        if r < 0 or lo >= hi or len(report.gradients) != hi - lo:
            return BAD_SPAN, (f"round {r}, micro-batches {lo}..{hi - 1} with "
                              f"{len(report.gradients)} gradients (need round >= 0, lo < hi "
                              "and one gradient per micro-batch)")
        if lo < 0 or hi > self.sync_scale:
            return OUT_OF_RANGE, (f"micro-batches {lo}..{hi - 1} are not within "
                                  f"0..{self.sync_scale - 1}")
        if r < self._applied:
            return ROUND_APPLIED, f"round {r} is applied already ({self._applied} applied)"
        if r > self._applied + 1:
            return ROUND_AHEAD, (f"round {r} is more than one ahead of round {self._applied}, "
                                 "the next to apply")
        for i, grads in enumerate(report.gradients):
            why = self._gradients_problem(grads)
            if why is not None:
                return BAD_GRADIENTS, f"micro-batch {lo + i}: {why}"
        return None

    def _gradients_problem(self, grads: Gradients) -> str | None:
        if not isinstance(grads, Mapping):
            return "not a mapping of parameter names to gradients"
        for name, grad in grads.items():
            param = self.parameters.get(name)
            if param is None:
                return f"no parameter {name!r}"
            if not isinstance(grad, torch.Tensor):
                return f"{name}: not a tensor"
            if (grad.shape, grad.dtype, grad.device) != (param.shape, param.dtype, param.device):
                return (f"{name}: {tuple(grad.shape)} {grad.dtype} on {grad.device}, the "
                        f"parameter {tuple(param.shape)} {param.dtype} on {param.device}")
        return None

    def _apply_complete(self) -> tuple[int, ...]:
        """Apply the complete rounds from the next one on, in order."""
        done: list[int] = []
        while (state := self._rounds.get(self._applied)) is not None and state.complete:
            for name, param in self.parameters.items():
                param.grad = state.total.get(name)
            self._optimizer.step()
            for param in self.parameters.values():
                param.grad = None  # as the script's zero_grad(), before the next round
            del self._rounds[self._applied]
            done.append(self._applied)
            self._applied += 1
        return tuple(done)
