"""The executor's side of a job's aggregator (docs/hare.md §7, "Step 3b"):
:func:`send_gradients` publishes a task's gradients, chunked, on its
server's subject (captured by ``HOPS_GRADS``; the executor's identity has
no JetStream API, so each chunk is a publish the stream acknowledges),
and :func:`fetch_params` asks the aggregator for the job's parameters
after the last round applied. The real executor's task work
(:mod:`executor.realwork`) uses both."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from hops.aggregator.codec import decode_params, encode_report
from services.aggregator.rules import PARAMS_MOVED
from services.runtime.retry import publish_retried
from shared import subjects
from shared.gradients import (
    GradientChunk,
    ParamsReply,
    ParamsRequest,
    decode_params_reply,
    encode,
    split,
)
from shared.ids import JobId, ServerId

FETCH_TRIES = 5  # a round applied while the chunks are read starts the read again


class ParamsRefused(RuntimeError):
    """The aggregator refused a parameters request: ``code`` and its words."""

    def __init__(self, code: str, error: str) -> None:
        super().__init__(f"{code}: {error}")
        self.code = code


async def send_gradients(js: JetStreamContext, server_id: ServerId, job_id: JobId, *,
                         round_: int, lo: int, gradients: Sequence[Mapping[str, torch.Tensor]],
                         gpu_index: int, term: int, revision: int) -> int:
    """Publish the gradients of micro-batches ``lo .. lo + len(gradients) -
    1`` of round ``round_`` (one dict per micro-batch, each the micro-batch's
    loss scaled by 1/S); each chunk's message id names the server, the job,
    the round, ``lo`` and the chunk, so a repeat is stored once. The
    number of chunks sent."""
    payload = encode_report(gradients)
    parts = split(payload)
    subject = subjects.grads(server_id, job_id, round_)
    for i, part in enumerate(parts):
        chunk = GradientChunk(job_id=job_id, round=round_, lo=lo, hi=lo + len(gradients),
                              gpu_index=gpu_index, term=term, revision=revision, chunk=i,
                              chunks=len(parts), size=len(payload), data=part)
        await publish_retried(js, subject, encode(chunk),
                              msg_id=subjects.grads_id(server_id, job_id, round_, lo, i))
    return len(parts)


async def fetch_params(nc: NATS, job_id: JobId,
                       timeout: float = 5.0) -> tuple[int, dict[str, torch.Tensor]]:
    """(rounds applied, the parameters after them) from ``job_id``'s
    aggregator; ParamsRefused when it refuses."""
    for _ in range(FETCH_TRIES):
        first = await _ask(nc, ParamsRequest(job_id=job_id), timeout)
        parts, moved = [first.data], False
        for i in range(1, first.chunks):
            try:
                reply = await _ask(nc, ParamsRequest(job_id=job_id, round=first.round, chunk=i),
                                   timeout)
            except ParamsRefused as e:
                if e.code != PARAMS_MOVED:
                    raise
                moved = True
                break
            parts.append(reply.data)
        if not moved:
            return first.round, decode_params(b"".join(parts))
    raise ParamsRefused(PARAMS_MOVED, f"job {job_id}: the parameters moved {FETCH_TRIES} times "
                        "while they were read")


async def _ask(nc: NATS, req: ParamsRequest, timeout: float) -> ParamsReply:
    msg = await nc.request(subjects.agg_params(req.job_id), encode(req), timeout=timeout)
    reply = decode_params_reply(msg.data)
    if not reply.ok:
        raise ParamsRefused(reply.code, reply.error)
    return reply
