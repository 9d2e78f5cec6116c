"""The NATS side of every service: connection, JetStream layout, typed publish
and request, and request handlers that never crash on input.

A request handler (:func:`serve_requests`) decodes each request with a
:mod:`shared.events` decoder and replies with what the handler returns
(one request at a time; in a queue group, several at once, see there). When
the payload is not a valid message (:class:`~shared.events.WireError`) or the
handler raises, it replies with a failed reply (``ok=False``, ``error``,
``code``), logs, publishes an :class:`~shared.events.ErrorRecord` on
``hops.v1.errors`` and goes on serving. A handler that refuses a valid
request on purpose raises :class:`Rejected`: a failed reply with its code,
logged, but not an error record, unless the code is ``not_found`` (the
request names a job or server that does not exist: bad input). Durable
JetStream consumers are in :mod:`services.runtime.consumer`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import PubAck
from structlog.typing import FilteringBoundLogger

from services.runtime.layout import JetStreamLayout as JetStreamLayout
from services.runtime.layout import LayoutError as LayoutError
from services.runtime.layout import ensure_jetstream as ensure_jetstream
from services.runtime.logging import get_logger
from services.runtime.retry import PUBLISH_RETRY_S, publish_retried
from services.runtime.settings import RuntimeSettings
from shared import subjects
from shared.events import (
    INTERNAL,
    ErrorRecord,
    Message,
    WireError,
    encode,
    error_reply,
)

Req = TypeVar("Req")
Rep = TypeVar("Rep")
Clock = Callable[[], float]
# Subscriptions per queue-group request handler (see serve_requests).
QUEUE_WORKERS = 128


async def connect(settings: RuntimeSettings, name: str) -> NATS:
    """A connection that retries the first connect and every reconnect forever."""
    log = get_logger(component="nats")

    async def on_error(e: Exception) -> None:
        log.warning("nats error", error=str(e) or type(e).__name__)

    async def on_disconnected() -> None:
        if not nc.is_closed:  # a close of our own is no news
            log.warning("nats disconnected")

    async def on_closed() -> None:
        log.info("nats connection closed")

    async def on_reconnected() -> None:
        log.info("nats reconnected", url=str(nc.connected_url.geturl() if nc.connected_url else ""))

    options: dict[str, Any] = {
        "servers": list(settings.nats_servers),
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": settings.reconnect_wait,
        "connect_timeout": settings.connect_timeout,
        "drain_timeout": settings.drain_timeout,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed,
    }
    options.update(auth_options(settings))
    nc = await nats.connect(**options)
    return nc


def auth_options(settings: RuntimeSettings) -> dict[str, Any]:
    """nats-py's options for the credential and CA of ``settings``: an nkey
    seed file names the identity, whose replies come to its own inbox
    (docs/security.md), so that no identity may read another's replies."""
    options: dict[str, Any] = {}
    if settings.nats_creds:
        options["user_credentials"] = settings.nats_creds
    if settings.nats_nkey:
        options["nkeys_seed"] = settings.nats_nkey
        options["inbox_prefix"] = f"_INBOX.{Path(settings.nats_nkey).name.removesuffix('.nk')}"
    if settings.nats_ca:
        options["tls"] = ssl.create_default_context(cafile=settings.nats_ca)
    return options


def nats_status(nc: NATS) -> str:
    """``connected``, ``reconnecting``, ``draining``, ``closed`` or ``disconnected``."""
    if nc.is_connected:
        return "connected"
    if nc.is_reconnecting:
        return "reconnecting"
    if nc.is_draining:
        return "draining"
    return "closed" if nc.is_closed else "disconnected"


async def publish_event(
    js: JetStreamContext,
    subject: str,
    msg: Message,
    *,
    msg_id: str | None = None,
    timeout: float | None = None,
    within: float = PUBLISH_RETRY_S,
) -> PubAck:
    """Publish ``msg`` to a stream and wait for the stream's ack. With
    ``msg_id`` (e.g. ``f"{job_id}:job_finished"``) JetStream drops repeats
    within the duplicate window, which makes retried publishes idempotent.
    See :func:`services.runtime.retry.publish_retried` for the retries."""
    return await publish_retried(js, subject, encode(msg), msg_id=msg_id, timeout=timeout,
                                 within=within)


async def request(
    nc: NATS,
    subject: str,
    msg: Message,
    decode: Callable[[bytes], Rep],
    timeout: float = 2.0,
) -> Rep:
    """Send ``msg`` as a request and decode the reply (raises WireError on a
    bad reply, ``nats.errors.TimeoutError``/``NoRespondersError`` on none)."""
    reply = await nc.request(subject, encode(msg), timeout=timeout)
    return decode(reply.data)


# Refusals that are bad input all the same: also published as error records.
REPORTED_REFUSALS = frozenset({"not_found"})


class Rejected(Exception):
    """Raised by a request handler to refuse a valid request (e.g. ``conflict``).
    A refusal with a code of :data:`REPORTED_REFUSALS` is also an error record,
    unless ``audited``: the handler audited it already
    (:meth:`ErrorReporter.refused`; e.g. another tenant's job, answered
    ``not_found`` and audited ``forbidden``)."""

    def __init__(self, code: str, message: str, audited: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.audited = audited


class ErrorReporter:
    """Logs a failure on input and publishes it as an ErrorRecord."""

    def __init__(self, nc: NATS, service: str, clock: Clock = time.time) -> None:
        self.nc = nc
        self.service = service
        self.clock = clock
        self.log: FilteringBoundLogger = get_logger()

    async def report(self, subject: str, error: str, code: str, data: bytes = b"") -> None:
        excerpt = data[:200].decode("utf-8", errors="replace")
        self.log.warning("bad input", subject=subject, code=code, error=error, excerpt=excerpt)
        await self.publish(subject, error, code, excerpt)

    async def refused(self, identity: str, subject: str, reason: str, code: str,
                      data: bytes = b"") -> None:
        """Audit a refusal on purpose (``forbidden``, ``unauthorized``): who
        tried what, and why it was refused; an error record with ``code``."""
        excerpt = data[:200].decode("utf-8", errors="replace")
        self.log.warning("refused", identity=identity, subject=subject, reason=reason, code=code)
        await self.publish(subject, reason, code, excerpt)

    async def publish(self, subject: str, error: str, code: str, excerpt: str = "") -> None:
        """Publish the error record (never raises)."""
        record = ErrorRecord(
            service=self.service,
            subject=subject,
            error=error[:2000],
            code=code,
            excerpt=excerpt,
            at=self.clock(),
        )
        try:
            await self.nc.publish(subjects.ERRORS, encode(record))
        except Exception as e:  # reporting must never take the service down
            self.log.warning("cannot publish error record", error=str(e))


async def serve_requests(
    nc: NATS,
    subject: str,
    decode: Callable[[bytes], Req],
    handle: Callable[[Req], Awaitable[Message]],
    reporter: ErrorReporter,
    *,
    queue: str = "",
    on_error: Callable[[str, str], Message] = error_reply,
    workers: int | None = None,
) -> list[Subscription]:
    """Serve requests on ``subject``; see :func:`serve_scoped_requests`."""

    async def unscoped(req: Req, _subject: str) -> Message:
        return await handle(req)

    return await serve_scoped_requests(nc, subject, decode, unscoped, reporter, queue=queue,
                                       on_error=on_error, workers=workers)


async def serve_scoped_requests(
    nc: NATS,
    subject: str,
    decode: Callable[[bytes], Req],
    handle: Callable[[Req, str], Awaitable[Message]],
    reporter: ErrorReporter,
    *,
    queue: str = "",
    on_error: Callable[[str, str], Message] = error_reply,
    workers: int | None = None,
) -> list[Subscription]:
    """Serve requests on ``subject``; see the module docstring. ``handle``
    gets each request with the subject it came on: on a wildcard subject
    whose tokens NATS permissions tie to an identity (a server id), the
    subject says who asks.
    ``on_error(code, error)`` builds the failed reply (``Reply`` by default;
    a subject whose reply is another message passes its own). Returns once
    the server knows the subscriptions.

    Without a queue group, requests are handled one at a time. In queue
    group ``queue`` the handler must bear concurrent requests anyway (other
    replicas serve the same group), so ``workers`` subscriptions
    (:data:`QUEUE_WORKERS` by default) join it and each handles its own
    requests one at a time: a handler waiting on NATS (admission waits on
    the stream's ack) no longer holds up the requests behind it, and a
    drain still waits for every request in hand."""
    count = workers if workers is not None else (QUEUE_WORKERS if queue else 1)
    if count < 1 or (count > 1 and not queue):
        raise ValueError("several workers need a queue group (each would get every request)")

    async def on_msg(msg: Msg) -> None:
        reply = await _answer(msg, decode, handle, reporter, on_error)
        if not msg.reply:
            return
        try:
            data = encode(reply)
        except WireError as e:  # e.g. a reply over the size limit
            await reporter.report(msg.subject, f"reply: {e}", e.code)
            data = encode(on_error(e.code, f"reply: {e}"))
        try:
            await msg.respond(data)
        except Exception as e:
            reporter.log.warning("cannot reply", subject=msg.subject, error=str(e))

    subs = [await nc.subscribe(subject, queue=queue, cb=on_msg) for _ in range(count)]
    await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
    await nc.flush()
    return subs


async def _answer(
    msg: Msg,
    decode: Callable[[bytes], Req],
    handle: Callable[[Req, str], Awaitable[Message]],
    reporter: ErrorReporter,
    on_error: Callable[[str, str], Message],
) -> Message:
    try:
        req = decode(msg.data)
    except WireError as e:
        await reporter.report(msg.subject, str(e), e.code, msg.data)
        return on_error(e.code, str(e))
    try:
        return await handle(req, msg.subject)
    except Rejected as e:
        if e.code in REPORTED_REFUSALS and not e.audited:
            await reporter.report(msg.subject, str(e), e.code, msg.data)
        else:
            reporter.log.info("request rejected", subject=msg.subject, code=e.code, error=str(e))
        return on_error(e.code, str(e))
    except Exception as e:
        reporter.log.exception("request handler failed", subject=msg.subject)
        error = f"{type(e).__name__}: {e}"
        await reporter.report(msg.subject, error, INTERNAL, msg.data)
        return on_error(INTERNAL, error)
