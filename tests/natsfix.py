"""Pytest fixtures with a real nats-server (JetStream on, data in a tmp dir).

Import the fixtures into a test module: ``from tests.natsfix import nats_server,
nats_url``. ``nats_server`` is the running :class:`EmbeddedNats` (tests may
stop and restart it); ``nats_url`` is its URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.natsd import EmbeddedNats


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url
