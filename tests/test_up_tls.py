"""``hops up --tls-cert/--tls-key``: nats-server serves TLS only, every
process verifies it against the certificate (a self-signed one here) and
connects as its own identity, and the gateway serves HTTPS."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from cli.up.stack import modules
from cli.up.up import missing_modules
from tests.test_identity import self_signed
from tests.upstack import hops_up

__all__ = ["self_signed"]  # fixtures
MISSING = missing_modules(modules())


@pytest.mark.skipif(bool(MISSING), reason=f"cannot run {', '.join(MISSING)}")
async def test_hops_up_with_tls(tmp_path: Path, self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    with hops_up(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key)) as up:
        url = up.state()["nats"]["url"]
        assert url.startswith("tls://"), url
        https = up.gateway.replace("http://", "https://")
        assert https in up.said()
        tls = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(verify=tls, headers=up.headers, timeout=10) as client:
            assert client.get(f"{https}/jobs").status_code == 200
        with pytest.raises(httpx.HTTPError):  # not trusted without the certificate
            httpx.get(f"{https}/healthz", timeout=5)
        nc = await nats.connect(url, tls=tls, nkeys_seed=str(up.admin_seed),
                                inbox_prefix="_INBOX.admin")
        assert nc.is_connected
        await nc.close()
        with pytest.raises(Exception):  # noqa: B017  # plain text to a TLS-only server
            await nats.connect(url.replace("tls://", "nats://"), nkeys_seed=str(up.admin_seed),
                               allow_reconnect=False, max_reconnect_attempts=0,
                               connect_timeout=2)
