"""The stack a live bench starts, and the bench's own identity on it.

:func:`start_stack` starts nats-server and the named components the way
``hops up`` does (:mod:`cli.up.stack`), and puts the ``admin`` identity in the
bench's environment; :func:`client_settings` and :func:`auth_headers` let
the bench's own NATS and HTTP clients use it. They stand apart from the
measurements (:mod:`bench.live_submit`, :mod:`bench.live_burst`), which
all need them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from cli.up.launcher import Launcher, free_port
from cli.up.stack import StackConfig, by_name
from cli.up.up import secure, stack_nats, wait_healthy
from services.runtime.bus import connect
from services.runtime.natsd import EmbeddedNats
from services.runtime.settings import RuntimeSettings, from_env
from shared import subjects
from shared.ids import JobId
from shared.job import JobSpec


def spec(job_id: str, total: int = 10**12) -> JobSpec:
    return JobSpec(JobId(job_id), "resnet18-cifar10", 128, 11_689_512, total, requirements=(1,))


async def wait_admission(nats_url: str, timeout: float = 60) -> None:
    nc = await connect(client_settings(nats_url), "bench-probe")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                await nc.request(subjects.JOBS_SUBMIT, b"{", timeout=1)  # a malformed probe
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("the scheduler never answered admission") from None
                await asyncio.sleep(0.2)
    finally:
        await nc.close()


def admin_token() -> str:
    """The bench's bearer token (:func:`start_stack` put it in ``HOPS_TOKEN``)."""
    return os.environ.get("HOPS_TOKEN", "")


def auth_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token()}"} if admin_token() else {}


def client_settings(nats_url: str) -> RuntimeSettings:
    """The bench's own NATS settings: the identity :func:`start_stack` put
    in its environment."""
    return replace(from_env(), nats_servers=(nats_url,))


def start_stack(config: StackConfig, names: tuple[str, ...]) -> tuple[EmbeddedNats, Launcher]:
    nats = stack_nats(config, 0)
    creds = secure(config)
    if creds is not None:
        os.environ["HOPS_NATS_NKEY"] = str(creds.seed("admin"))
        os.environ["HOPS_TOKEN"] = creds.token("admin").read_text().strip()
    else:
        os.environ.pop("HOPS_NATS_NKEY", None)
        os.environ.pop("HOPS_TOKEN", None)
    nats.start()
    config = replace(config, nats_url=nats.url)
    launcher = Launcher(config, lambda line: print(line, file=sys.stderr))
    table = by_name(config)
    for name in names:
        launcher.start(table[name])
    wait_healthy(launcher, launcher.children[-1], timeout=90)
    return nats, launcher


AUTH = True  # bench/live_submit.py --no-auth turns it off


def config_in(tmp: str, **kw: object) -> StackConfig:
    return StackConfig(data_dir=Path(tmp), gateway_port=free_port(), auth=AUTH,
                       metrics_port=free_port(), **kw)  # type: ignore[arg-type]
