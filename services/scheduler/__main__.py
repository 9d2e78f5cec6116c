"""``python -m services.scheduler``: one scheduler replica (Hops §3.1).

Every replica admits jobs (:mod:`.admission`) and runs for the leader lease
(:mod:`.election`); the one holding it plans the rounds (:mod:`.leader`),
with the policy's stored layer state and the tenants' views in
:mod:`.layer_store`. SIGHUP, or a request on ``hops.v1.reload.tenants``, reloads the tenants
file (:mod:`.reload`). Settings: :mod:`.settings` and
:mod:`services.runtime.settings`; every variable has a flag (``--help``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from scheduling.layers.base import Layer
from services.runtime.bus import serve_requests, serve_scoped_requests
from services.runtime.service import ServiceContext, run_service
from services.runtime.settings import SettingsError, build_parser, parse_args
from services.scheduler.admission import Admission, Checks
from services.scheduler.election import Elector
from services.scheduler.reload import TenantsReload
from services.scheduler.settings import FIELDS, SchedulerSettings, scheduler_settings
from shared import events as ev
from shared import subjects


async def run(
    ctx: ServiceContext, settings: SchedulerSettings, layers: Sequence[Layer] = ()
) -> None:
    """The service's main: admission, then the lease loop until stopped.
    ``layers`` wrap the configured policy (see :func:`main`)."""
    kv = await ctx.js.key_value(subjects.KV_JOBS)
    admission = Admission(ctx, kv, settings.policy.r_num, settings.tenants,
                          Checks.of(settings))
    queue = subjects.ADMISSION_QUEUE
    # the bare subjects (trusted callers) and the tenant-scoped ones, alike
    for submit in (subjects.JOBS_SUBMIT, subjects.JOBS_SUBMIT_TENANT_ALL):
        await serve_scoped_requests(
            ctx.nc, submit, ev.decode_submit, admission.submit, ctx.reporter, queue=queue
        )
    for cancel in (subjects.JOBS_CANCEL, subjects.JOBS_CANCEL_TENANT_ALL):
        await serve_scoped_requests(
            ctx.nc, cancel, ev.decode_cancel, admission.cancel, ctx.reporter, queue=queue
        )
    for hold in (subjects.JOBS_HOLD, subjects.JOBS_HOLD_TENANT_ALL):
        await serve_scoped_requests(
            ctx.nc, hold, ev.decode_hold, admission.hold, ctx.reporter, queue=queue
        )
    elector = Elector(ctx, settings, layers)
    await _serve_reload(ctx, TenantsReload(ctx, settings, _tenants_path(settings), admission,
                                           elector))
    ctx.log.info("admission ready", replica=elector.lease.holder,
                 tenants=sorted(settings.tenants.tenants))
    await elector.run()


def _tenants_path(settings: SchedulerSettings) -> str:
    """The tenants file to read again on a reload ("" when started without one)."""
    return "" if settings.tenants_source == SchedulerSettings().tenants_source \
        else settings.tenants_source


async def _serve_reload(ctx: ServiceContext, reload: TenantsReload) -> None:
    """``hops.v1.reload.tenants`` (every replica answers) and SIGHUP."""
    await serve_requests(ctx.nc, subjects.TENANTS_RELOAD, ev.decode_reload_tenants,
                         reload.handle, ctx.reporter)
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload.reload)


def main(argv: Sequence[str] | None = None, layers: Sequence[Layer] = ()) -> int:
    """The scheduler replica. ``layers`` (scheduling/layers) wrap
    the policy that ``HOPS_POLICY``/``--policy`` names, the first innermost:
    a launcher that calls ``main(layers=...)`` runs the real scheduler with
    a layer of its own, as tests/forbid_layer.py does."""
    parser = build_parser("scheduler")
    for name, var, flag in FIELDS:
        parser.add_argument(flag, dest=name, type=float, metavar="S", help=f"overrides ${var}")
    parser.add_argument("--replica-id", metavar="ID", help="overrides $HOPS_REPLICA_ID")
    parser.add_argument("--tenants", metavar="FILE", help="overrides $HOPS_TENANTS")
    parser.add_argument("--policy", metavar="SPEC", help="overrides $HOPS_POLICY (hops, sia, "
                        "gavel; with settings: sia:lam=1.2; a task policy: hare, hare-eft)")
    try:
        runtime, args = parse_args(argv, parser=parser)
        settings = scheduler_settings(os.environ, vars(args))
    except (SettingsError, ValueError) as e:
        print(f"hops-scheduler: {e}", file=sys.stderr)
        return 2
    return run_service("scheduler", lambda ctx: run(ctx, settings, layers), runtime)


if __name__ == "__main__":
    sys.exit(main())
