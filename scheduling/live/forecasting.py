"""The forecast as a task for another process (:mod:`scheduling.forecast`).

The leader runs :func:`scheduling.forecast.forecast` in a single-worker
process pool, off its planning path: the planning thread then shares no
interpreter lock with it. What goes to the worker and back are msgpack
bytes (:func:`task_bytes`, :func:`run`, :func:`decode_result`), so the
pool pickles nothing but bytes.
"""

from __future__ import annotations

import msgspec

from scheduling.forecast import forecast
from shared.explain import QueueForecast
from shared.snapshot import Plan, Snapshot


class ForecastTask(msgspec.Struct, frozen=True, kw_only=True):
    """One forecast: the snapshot, the plan made from it, the round's length
    and the seed (the round number: the same round forecasts the same)."""

    snapshot: Snapshot
    plan: Plan
    round_s: float
    seed: int


_TASK = msgspec.msgpack.Decoder(ForecastTask)
_RESULT = msgspec.msgpack.Decoder(QueueForecast)


def task_bytes(snapshot: Snapshot, plan: Plan, round_s: float, seed: int) -> bytes:
    return msgspec.msgpack.encode(ForecastTask(snapshot=snapshot, plan=plan,
                                               round_s=round_s, seed=seed))


def run(data: bytes) -> bytes:
    """The worker's side: the forecast of the task ``data`` encodes."""
    task = _TASK.decode(data)
    result = forecast(task.snapshot, task.plan, round_s=task.round_s, seed=task.seed)
    return msgspec.msgpack.encode(result)


def decode_result(data: bytes) -> QueueForecast:
    return _RESULT.decode(data)
