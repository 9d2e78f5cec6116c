"""Durable JetStream pull consumers with explicit acks.

:func:`consume` fetches from a durable consumer and, per message:

- decodes it; a payload that is not a valid message is reported (log and
  ErrorRecord) and *terminated*, so it is never redelivered;
- calls the handler and acks after it returns;
- when the handler raises, naks with a delay so JetStream redelivers it,
  up to ``max_deliver`` deliveries; the last failure is reported and the
  message terminated, so a poison message cannot loop forever;
- a handler that refused a message on purpose (and audited it) raises
  :class:`Terminate`: the message is terminated, nothing more reported; one
  that cannot judge it yet raises :class:`Later`: redelivered after
  ``nak_delay`` without a warning (the handler gives its verdict on the last
  delivery, ``Delivery.num_delivered >= ConsumerSpec.max_deliver``).

Delivery is at least once: a message comes again if the service dies
between the handler's effect and the ack, or when ``ack_wait`` passes.
Handlers must therefore be idempotent, keyed by the event's identity (the
job id and event type, a command's ``key``) or by ``Delivery.stream_seq``:
check the key before acting, write state with a KV compare-and-set
(``kv.update(key, value, last=revision)``), and publish follow-up events with
a ``msg_id`` (:func:`services.runtime.bus.publish_event`) so JetStream drops
repeats.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from services.runtime.bus import ErrorReporter
from shared.events import INTERNAL, WireError

T = TypeVar("T")


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable consumer ``durable`` on ``stream``, filtered to ``subject``.
    The configuration applies when the consumer is first created."""

    stream: str
    durable: str
    subject: str
    batch: int = 32
    fetch_timeout: float = 1.0
    nak_delay: float = 1.0
    max_deliver: int = 10
    ack_wait: float = 30.0

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            filter_subject=self.subject,
        )


@dataclass(frozen=True)
class Delivery:
    """Where a message came from: its subject, its sequence in the stream
    (unique, a natural idempotency key), how often it has been delivered
    and the ``Nats-Msg-Id`` its publisher gave it ("" when none)."""

    subject: str
    stream_seq: int
    num_delivered: int
    msg_id: str = ""


class Terminate(Exception):
    """Raised by a handler that refused the message for good (and said why)."""


class Later(Exception):
    """Raised by a handler that cannot judge the message yet."""


Handler = Callable[[T, Delivery], Awaitable[None]]


async def consume(
    js: JetStreamContext,
    spec: ConsumerSpec,
    decode: Callable[[bytes], T],
    handle: Handler[T],
    reporter: ErrorReporter,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the consumer until ``stop`` is set or the task is cancelled; see the
    module docstring. The pull subscription is always unsubscribed on the way
    out (a draining connection would otherwise wait on it)."""
    stop = stop or asyncio.Event()
    sub = await js.pull_subscribe(
        spec.subject, durable=spec.durable, stream=spec.stream, config=spec.config()
    )
    try:
        while not stop.is_set():
            try:
                msgs = await sub.fetch(spec.batch, timeout=spec.fetch_timeout)
            except TimeoutError:
                # nats-py raises its own TimeoutError (a subclass) or, from
                # inside fetch, sometimes the built-in one: both mean "no
                # message yet".
                continue
            except nats.errors.ConnectionClosedError:
                return
            except nats.errors.Error as e:
                reporter.log.warning("fetch failed", durable=spec.durable, error=repr(e))
                await asyncio.sleep(spec.fetch_timeout)
                continue
            for msg in msgs:
                await _process(msg, spec, decode, handle, reporter)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _process(
    msg: Msg,
    spec: ConsumerSpec,
    decode: Callable[[bytes], T],
    handle: Handler[T],
    reporter: ErrorReporter,
) -> None:
    meta = msg.metadata
    msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
    delivery = Delivery(msg.subject, meta.sequence.stream, meta.num_delivered, msg_id)
    try:
        event = decode(msg.data)
    except WireError as e:
        await reporter.report(msg.subject, str(e), e.code, msg.data)
        await msg.term()
        return
    try:
        await handle(event, delivery)
    except Terminate:
        await msg.term()
        return
    except Later:
        await msg.nak(delay=spec.nak_delay)
        return
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        if 0 < spec.max_deliver <= delivery.num_delivered:
            give_up = f"{error} (gave up after {delivery.num_delivered} deliveries)"
            await reporter.report(msg.subject, give_up, INTERNAL, msg.data)
            await msg.term()
        else:
            reporter.log.warning(
                "handler failed; will retry",
                durable=spec.durable,
                stream_seq=delivery.stream_seq,
                delivered=delivery.num_delivered,
                error=error,
                exc_info=True,
            )
            await msg.nak(delay=spec.nak_delay)
        return
    await msg.ack()
