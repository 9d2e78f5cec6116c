"""Test isolation the whole suite shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _isolated_logging() -> Iterator[None]:
    """A test that runs a service's main in this process configures logging
    for the whole process (the root logger at INFO, to the stdout of that
    moment); restore it, so that a later test's output does not carry a
    library's log lines, or a handler writing to a stream closed since."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers, root.level = handlers, level
    logging.captureWarnings(False)
    structlog.reset_defaults()
