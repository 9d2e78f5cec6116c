"""Test isolation the whole suite shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import HealthCheck, settings

# Time is measured by the benchmarks under bench/, never by a test: on a
# loaded two-core CI machine (Slurm's daemons of the previous test still
# going down) one pure example can outlast Hypothesis's default deadline of
# 200 ms, and the property would fail for a reason that is not its own.
settings.register_profile("suite", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


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
