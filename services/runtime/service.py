"""Running a service: logging, NATS, JetStream, health, signals, clean stop.

A service is a coroutine ``main(ctx)`` given a :class:`ServiceContext`. It
sets up its subscriptions (:func:`~services.runtime.bus.serve_requests`) and
background loops (``ctx.spawn(consume(...))``) and may return at once or
run until ``ctx.stopping`` is set; the service runs until SIGINT/SIGTERM
either way. On a signal, ``main`` gets ``grace`` seconds to return before it
is cancelled, background tasks are cancelled (consumer loops unsubscribe on
the way out), the connection is drained and the health endpoint closed.
If ``main`` or a spawned task raises, the service stops with exit code 1, so
that its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from structlog.typing import FilteringBoundLogger

from services.runtime.bus import (
    ErrorReporter,
    JetStreamLayout,
    LayoutError,
    connect,
    ensure_jetstream,
    nats_status,
)
from services.runtime.health import HealthServer
from services.runtime.logging import configure_logging, get_logger
from services.runtime.settings import RuntimeSettings, SettingsError, from_env, parse_args


@dataclass
class ServiceContext:
    """What a service's ``main`` works with."""

    name: str
    settings: RuntimeSettings
    nc: NATS
    js: JetStreamContext
    log: FilteringBoundLogger
    reporter: ErrorReporter
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    health_port: int | None = None
    failed: bool = False
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str = "") -> asyncio.Task[None]:
        """Run ``coro`` in the background until the service stops; if it
        raises, the service stops with exit code 1."""
        task = asyncio.create_task(coro, name=name or None)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        self.log.error("background task failed", task=task.get_name(), exc_info=task.exception())
        self.failed = True
        self.stopping.set()

    async def cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


ServiceMain = Callable[[ServiceContext], Awaitable[None]]
T = TypeVar("T")


async def serve(
    name: str,
    main: ServiceMain,
    settings: RuntimeSettings,
    *,
    stop: asyncio.Event | None = None,
    layout: JetStreamLayout | None = None,
    grace: float = 5.0,
    ensure_streams: bool = True,
) -> int:
    """Run service ``name`` until ``stop`` is set or SIGINT/SIGTERM arrives;
    return the exit code. Waits for NATS as long as it takes (a signal ends
    the wait). Logging must already be configured. With ``ensure_streams``
    it first creates or updates the streams and buckets (``layout``); an
    identity without the JetStream API (an executor) passes False and finds
    them made by the system services."""
    stopping = asyncio.Event()
    restore = _install_signals(stopping)
    relay = asyncio.create_task(_relay(stop, stopping)) if stop is not None else None
    try:
        nc = await _unless_stopped(connect(settings, name), stopping)
        if nc is None:
            return 0
        layout = (layout or JetStreamLayout.of(settings, name)
                  if ensure_streams else None)
        return await _serve_connected(name, main, settings, nc, stopping, layout, grace)
    finally:
        restore()
        if relay is not None:
            relay.cancel()


async def _serve_connected(
    name: str,
    main: ServiceMain,
    settings: RuntimeSettings,
    nc: NATS,
    stopping: asyncio.Event,
    layout: JetStreamLayout | None,
    grace: float,
) -> int:
    log = get_logger()
    js = nc.jetstream()
    ctx = ServiceContext(name, settings, nc, js, log, ErrorReporter(nc, name), stopping)
    health: HealthServer | None = None
    try:
        if layout is not None:  # None: the streams are not this identity's to make
            await ensure_jetstream(js, layout)
        health = await _start_health(ctx)
        log.info("service started", health_port=ctx.health_port, nats=nats_status(nc))
        await _run_main(ctx, main, grace)
    finally:
        await ctx.cancel_tasks()
        await _close(nc, settings.drain_timeout, log)
        if health is not None:
            await health.stop()
    log.info("service stopped", failed=ctx.failed)
    return 1 if ctx.failed else 0


def run_service(name: str, main: ServiceMain, settings: RuntimeSettings | None = None) -> int:
    """Configure logging and run service ``name`` until SIGINT/SIGTERM; return
    the exit code (``sys.exit(run_service(...))`` in a service's ``__main__``)."""
    settings = settings or from_env()
    log = configure_logging(name, settings.log_level)
    try:
        return asyncio.run(serve(name, main, settings))
    except KeyboardInterrupt:
        return 130
    except LayoutError as e:  # a deployment the layout cannot be made on: said in words
        log.error("service failed", code=e.code, reason=str(e))
        return 1
    except Exception:
        log.exception("service failed")
        return 1



def service_main(name: str, main: ServiceMain, argv: Sequence[str] | None = None) -> int:
    """``python -m`` entry of a service that takes only the runtime's settings
    (environment and flags): exit 2 with the reason on bad settings, else
    :func:`run_service`."""
    try:
        settings, _ = parse_args(argv, service=name)
    except SettingsError as e:
        print(f"hops-{name}: {e}", file=sys.stderr)
        return 2
    return run_service(name, main, settings)


async def _unless_stopped(coro: Awaitable[T], stopping: asyncio.Event) -> T | None:
    """The result of ``coro``, or ``None`` if ``stopping`` is set first."""
    work = asyncio.ensure_future(coro)
    stopped = asyncio.create_task(stopping.wait())
    await asyncio.wait((work, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return None


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _start_health(ctx: ServiceContext) -> HealthServer | None:
    if ctx.settings.health_port is None:
        return None
    health = HealthServer(
        ctx.name,
        lambda: nats_status(ctx.nc),
        host=ctx.settings.health_host,
        port=ctx.settings.health_port,
    )
    ctx.health_port = await health.start()
    return health


def _install_signals(stopping: asyncio.Event) -> Callable[[], None]:
    """SIGINT and SIGTERM set ``stopping``; returns the undo."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stopping.set)
            installed.append(sig)

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return restore


async def _run_main(ctx: ServiceContext, main: ServiceMain, grace: float) -> None:
    task = asyncio.create_task(_guarded(ctx, main), name=f"{ctx.name}-main")
    await ctx.stopping.wait()
    try:
        await asyncio.wait_for(asyncio.shield(task), grace)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _guarded(ctx: ServiceContext, main: ServiceMain) -> None:
    """``main``, with a crash logged and turned into a stop with exit code 1."""
    try:
        await main(ctx)
    except asyncio.CancelledError:
        raise
    except Exception:
        ctx.log.exception("service main failed")
        ctx.failed = True
        ctx.stopping.set()


async def _close(nc: NATS, timeout: float, log: FilteringBoundLogger) -> None:
    """Drain (finish in-flight messages), falling back to a plain close."""
    try:
        await asyncio.wait_for(nc.drain(), timeout)
    except Exception as e:
        log.warning("drain failed; closing", error=repr(e))
        with contextlib.suppress(Exception):
            await nc.close()
