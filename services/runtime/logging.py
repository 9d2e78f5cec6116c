"""JSON-lines logging to stdout with structlog.

Every line is one JSON object with ``timestamp`` (ISO 8601, UTC), ``level``,
``service`` and ``event``, plus the key/values of the call. Records of the
standard library's ``logging`` (nats-py, asyncio) go through the same
renderer, so a service's stdout is uniformly machine-readable.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

from services.runtime.settings import LOG_LEVELS


def _service_adder(service: str) -> Processor:
    def add(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
        event.setdefault("service", service)
        return event

    return add


class _Stdout(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to ``sys.stdout`` as it is at each record:
    whoever swaps stdout (a test runner, a CLI runner) after logging was
    configured gets the lines, instead of the handler writing to a closed file."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


def configure_logging(
    service: str, level: str = "info", stream: TextIO | None = None
) -> FilteringBoundLogger:
    """Configure structlog and the standard library's root logger to write JSON
    lines for ``service`` at ``level`` and above to ``stream`` (stdout by
    default); return a logger."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    common: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _service_adder(service),
    ]
    structlog.configure(
        processors=[
            *common,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # one write per line (print writes the newline apart): processes that
        # share a log file unbuffered (hops up) never merge two lines into one
        logger_factory=structlog.WriteLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream) if stream is not None else _Stdout()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*common, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    # Python's warnings (a library's DeprecationWarning, say) are otherwise
    # printed on stderr as plain text, between the JSON lines.
    logging.captureWarnings(True)
    return get_logger()


def get_logger(**bound: object) -> FilteringBoundLogger:
    """A logger with ``bound`` key/values on every line."""
    return cast(FilteringBoundLogger, structlog.get_logger(**bound))
