"""The gateway's reading of stream ``HOPS_LOGS`` (docs/logs.md): one job's
log chunks, from every server, through an ordered consumer filtered on
``hops.v1.logs.*.<job key>`` (the JetStream API and the gateway's own inbox
alone, which its NATS identity may use). A thin shell: the lines' shape and
the filters are :mod:`shared.logs`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from types import TracebackType

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext as _JS
from structlog.typing import FilteringBoundLogger

from shared import subjects
from shared.logs import LogChunk, decode_chunk


class LogReader:
    """One job's chunks, oldest first: :meth:`backlog` what is stored (from
    ``since``), then :meth:`next` each new one as it comes."""

    def __init__(self, js: JetStreamContext, job_key: str, since: float,
                 log: FilteringBoundLogger) -> None:
        self.js = js
        self.job_key = job_key
        self.since = since
        self.log = log
        self.queue: asyncio.Queue[Msg] = asyncio.Queue()
        self.sub: _JS.PushSubscription | None = None

    async def __aenter__(self) -> LogReader:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        if self.since > 0:
            start = datetime.datetime.fromtimestamp(self.since, datetime.UTC)
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                                    opt_start_time=start)

        async def on_msg(msg: Msg) -> None:
            await self.queue.put(msg)

        self.sub = await self.js.subscribe(subjects.job_logs_all(self.job_key),
                                           stream=subjects.STREAM_LOGS.name, cb=on_msg,
                                           ordered_consumer=True, config=config)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()

    async def backlog(self, wait: float = 5.0) -> list[LogChunk]:
        """Every chunk stored from ``since`` when the consumer was made (those
        delivered already and those pending), waiting at most ``wait``
        seconds for each one."""
        assert self.sub is not None
        info = await self.sub.consumer_info()
        expected = (info.num_pending or 0) + (info.delivered.consumer_seq or 0
                                              if info.delivered else 0)
        out: list[LogChunk] = []
        for _ in range(expected):
            try:
                msg = await asyncio.wait_for(self.queue.get(), wait)
            except TimeoutError:
                break
            chunk = self._decode(msg)
            if chunk is not None:
                out.append(chunk)
            if msg.metadata.num_pending == 0:
                break
        return out

    async def next(self, wait: float) -> LogChunk | None:
        """The next chunk, or None when none came within ``wait`` seconds."""
        while True:
            try:
                msg = await asyncio.wait_for(self.queue.get(), wait)
            except TimeoutError:
                return None
            chunk = self._decode(msg)
            if chunk is not None:
                return chunk

    def _decode(self, msg: Msg) -> LogChunk | None:
        try:
            return decode_chunk(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self.log.warning("undecodable log chunk", subject=msg.subject, error=str(e),
                             job_id=self.job_key)
            return None
