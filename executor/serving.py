"""Commands answered concurrently.

The runtime's :func:`~services.runtime.bus.serve_requests` answers one
request at a time. An executor cannot: a ``start_job`` waits for its job
process's first heartbeat (a second or more on a busy host), and the
placer sends the starts of a plan all at once, so a stop or the tenth start
would wait behind the others until the placer gives up on them. Here each
command runs in its own task, with the same handling of bad input: a
failed ``command_ack``, a log line and an ``error_record``; the executor
orders the commands of one job itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.runtime.bus import ErrorReporter
from shared.events import INTERNAL, Command, CommandAck, WireError, decode_command, encode


def failed_ack(code: str, error: str, key: str = "") -> CommandAck:
    return CommandAck(key=key, ok=False, code=code, error=error)


async def serve_commands(nc: NATS, subject: str,
                         handle: Callable[[Command], Awaitable[CommandAck]],
                         reporter: ErrorReporter) -> Subscription:
    """Serve ``subject``, one task per command; returns once subscribed."""
    tasks: set[asyncio.Task[None]] = set()

    async def answer(msg: Msg) -> None:
        try:
            cmd = decode_command(msg.data)
        except WireError as e:
            await reporter.report(msg.subject, str(e), e.code, msg.data)
            ack = failed_ack(e.code, str(e))
        else:
            try:
                ack = await handle(cmd)
            except Exception as e:
                reporter.log.exception("command failed", subject=msg.subject, key=cmd.key)
                error = f"{type(e).__name__}: {e}"
                await reporter.report(msg.subject, error, INTERNAL, msg.data)
                ack = failed_ack(INTERNAL, error, cmd.key)
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(encode(ack))

    async def on_msg(msg: Msg) -> None:
        task = asyncio.create_task(answer(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    sub = await nc.subscribe(subject, cb=on_msg)
    await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
    await nc.flush()
    return sub
