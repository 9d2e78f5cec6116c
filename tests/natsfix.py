"""Pytest fixtures with a real nats-server (JetStream on, data in a tmp dir).

Import the fixtures into a test module: ``from tests.natsfix import nats_server,
nats_url``. ``nats_server`` is the running :class:`EmbeddedNats` (tests may
stop and restart it); ``nats_url`` is its URL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cli.up.credentials import Credentials, ensure_credentials, write_auth
from services.runtime.natsd import EmbeddedNats
from services.runtime.settings import RuntimeSettings


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


@contextmanager
def secured_nats(root: Path, identities: list[str]) -> Iterator[Callable[[str], RuntimeSettings]]:
    """A real nats-server that admits only the nkeys of ``identities`` (as
    ``hops up`` configures it), yielding the runtime settings of each."""
    creds = Credentials(root / "credentials")
    ensure_credentials(creds.dir, identities)
    write_auth(creds.dir)
    with EmbeddedNats(root / "nats", auth_conf=creds.auth_conf) as server:
        def runtime(identity: str) -> RuntimeSettings:
            return RuntimeSettings(nats_servers=(server.url,), reconnect_wait=0.1,
                                   nats_nkey=str(creds.seed(identity)))

        yield runtime
