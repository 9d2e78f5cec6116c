"""A relaxed-sync job's gradient aggregator (Hare's per-job parameter
server, docs/hare.md §7): :mod:`hops.aggregator.core` is its pure rule.
Apart from the training script's plugin (:mod:`hops.plugin`), so that the
service that will run it does not import the script's run loop."""

from hops.aggregator.core import (
    BAD_GRADIENTS,
    BAD_SPAN,
    OTHER_JOB,
    OUT_OF_RANGE,
    REFUSAL_CODES,
    ROUND_AHEAD,
    ROUND_APPLIED,
    Aggregator,
    GradientReport,
    Gradients,
    Received,
    sum_in_order,
)

__all__ = [
    "BAD_GRADIENTS",
    "BAD_SPAN",
    "OTHER_JOB",
    "OUT_OF_RANGE",
    "REFUSAL_CODES",
    "ROUND_AHEAD",
    "ROUND_APPLIED",
    "Aggregator",
    "GradientReport",
    "Gradients",
    "Received",
    "sum_in_order",
]
