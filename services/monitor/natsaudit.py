"""nats-server's own refusals of authentication, as error records.

nats-server publishes an advisory on ``$SYS.SERVER.<id>.CLIENT.AUTH.ERR``
in its system account for every connection it refuses for want of a valid
credential. With ``HOPS_NATS_AUDIT_NKEY`` (the ``audit`` identity, which may
only read those advisories) the monitor reads them on a second connection
and republishes each as an ``error_record`` of service ``nats`` and code
``unauthorized`` on ``hops.v1.errors``, where every refusal is counted
(``hops_refused_total``) and kept in the logs. Permission violations of
authenticated clients have no advisory in nats-server 2.15: they are in
its log only (docs/security.md, *Audit*).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from typing import Any

from nats.aio.msg import Msg

from services.runtime.bus import connect
from services.runtime.identity import AUTH_ERRORS
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import ErrorRecord, encode
from shared.wire import UNAUTHORIZED

SERVICE = "nats"


def auth_error_record(data: bytes, at: float) -> ErrorRecord | None:
    """The error record for one authentication-failure advisory; None if
    ``data`` is not one."""
    try:
        advisory: Any = json.loads(data)
    except ValueError:
        return None
    if not isinstance(advisory, dict) or not isinstance(advisory.get("client"), dict):
        return None
    client = advisory["client"]
    who = " ".join(str(x) for x in (client.get("host", "?"), client.get("name", "")) if x)
    key = client.get("nkey") or client.get("user") or "no credential"
    reason = str(advisory.get("reason") or "Authentication Failure")
    return ErrorRecord(service=SERVICE, subject="connect", code=UNAUTHORIZED, at=at,
                       error=f"nats-server refused a connection from {who} ({key}): {reason}",
                       excerpt=data[:200].decode("utf-8", errors="replace"))


async def watch_auth_errors(ctx: ServiceContext, seed: str) -> None:
    """Republish nats-server's authentication failures until the service stops."""
    settings = replace(ctx.settings, nats_nkey=seed, nats_creds=None)
    nc = await connect(settings, "monitor-audit")
    log = ctx.log.bind(component="nats-audit")

    async def on_advisory(msg: Msg) -> None:
        record = auth_error_record(msg.data, ctx.reporter.clock())
        if record is None:
            return
        log.warning("nats refused a connection", error=record.error)
        await ctx.nc.publish(subjects.ERRORS, encode(record))

    try:
        await nc.subscribe(AUTH_ERRORS, cb=on_advisory)
        await ctx.stopping.wait()
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
