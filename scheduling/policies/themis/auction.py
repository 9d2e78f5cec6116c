"""Themis' partial-allocation auction (NSDI'20 §3.3, after Cole, Gkatzelis
and Goel's Partial Allocation mechanism, EC'13).

The jobs offered the GPUs bid: each bid is a bundle (``gpus`` GPUs of one
type, placed as the bidder would run on them) and its value v > 1, how
much it improves the bidder's rho (:func:`.fairness.value`).

1. The proportionally fair allocation PF maximises the product of the
   winners' values, prod_i v_i, over allocations that fit the offer (one
   bundle per job at most). Here it is found greedily: bids by log v per
   GPU, descending, each taken if its job has none yet and its type still
   has the GPUs (:func:`proportional_fair`).
2. Each winner i keeps the fraction

       c_i = prod_{j != i} v_j(PF) / prod_{j != i} v_j(PF_{-i})

   of its bundle, PF_{-i} the allocation found without i: what i's
   presence costs the others is the hidden payment that makes bidding
   truthfully the best strategy (:func:`partial_shares`). The greedy PF
   may let the others fare better with i present; c_i is then 1.
3. GPUs cannot be split and a job is gang-scheduled on its request: a
   winner keeps its bundle when c_i times its GPUs rounds to all of them,
   and otherwise gives it back (:func:`kept`); what is given back is the
   leftover the policy hands to the jobs outside the auction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.ids import GpuType, JobId


@dataclass(frozen=True, slots=True)
class Bid:
    """A bundle one job bids for, and its value to the job."""

    job_id: JobId
    gpu_type: GpuType
    gpus: int
    value: float  # rho without the bundle over rho with it (> 1 to count)
    keep: bool = False  # the job's own configuration, kept in place


def _order(bids: Sequence[Bid]) -> list[Bid]:
    """The greedy's order: log v per GPU, then v, then job and type."""
    worth = [b for b in bids if b.value > 1.0 and b.gpus > 0]
    return sorted(worth, key=lambda b: (-math.log(b.value) / b.gpus, -b.value, b.job_id,
                                        b.gpu_type, not b.keep))


def _greedy(order: Sequence[Bid], free: Mapping[GpuType, int],
            without: JobId | None = None) -> dict[JobId, Bid]:
    left = dict(free)
    won: dict[JobId, Bid] = {}
    for b in order:
        if b.job_id == without or b.job_id in won or left.get(b.gpu_type, 0) < b.gpus:
            continue
        left[b.gpu_type] -= b.gpus
        won[b.job_id] = b
    return won


def proportional_fair(bids: Sequence[Bid], free: Mapping[GpuType, int]) -> dict[JobId, Bid]:
    """The winning bid of each winner (step 1 of the module docstring)."""
    return _greedy(_order(bids), free)


def _log_worth(won: Mapping[JobId, Bid], but: JobId) -> float:
    return sum(math.log(b.value) for j, b in won.items() if j != but)


def partial_shares(bids: Sequence[Bid], free: Mapping[GpuType, int]
                   ) -> dict[JobId, tuple[Bid, float]]:
    """Each winner's bid and its fraction c_i (step 2), in the order PF took
    them."""
    order = _order(bids)
    pf = _greedy(order, free)
    shares: dict[JobId, tuple[Bid, float]] = {}
    for jid, bid in pf.items():
        alone = _greedy(order, free, without=jid)
        c = math.exp(min(0.0, _log_worth(pf, jid) - _log_worth(alone, jid)))
        shares[jid] = (bid, c)
    return shares


def kept(bid: Bid, share: float) -> bool:
    """Whether a winner keeps its bundle: ``share`` of its GPUs rounds to
    all of them (step 3)."""
    return math.floor(share * bid.gpus + 0.5) >= bid.gpus
