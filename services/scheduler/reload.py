"""Reloading the tenants file without a restart (``hops tenants reload``,
``POST /tenants/reload``, or SIGHUP to a replica; docs/tenancy.md).

Every replica answers ``hops.v1.reload.tenants`` (no queue group: each one
reloads, and each answers ``tenants_reloaded``). It reads the file at
``HOPS_TENANTS`` again and checks it exactly as at start
(:func:`shared.tenants.read_tenants`, the cells as far as they can be
checked without the nodes, :func:`scheduling.live.cells.tenant_cells`),
then asks :func:`scheduling.live.tenancy.reload_refusal` whether it may
swap it in (a cells change under a policy that plans with cells needs a
restart). On success admission and the leader use the new file at once
(the leader holds or releases jobs of tenants it drops or names again,
reason ``unknown_tenant``); a file that does not pass is refused with the
error, logged, and the replica keeps the old file. Nothing is stored: a
replica that restarts reads the file as it is then.
"""

from __future__ import annotations

import dataclasses

from scheduling.live import tenancy as tn
from scheduling.live.cells import tenant_cells
from scheduling.registry import policy_traits
from services.runtime.service import ServiceContext
from services.scheduler.admission import Admission
from services.scheduler.election import Elector
from services.scheduler.settings import SchedulerSettings
from shared import events as ev
from shared.tenants import TenantsError, read_tenants
from shared.wire import INVALID


class TenantsReload:
    """Reads, checks and swaps in the tenants file; see the module docstring."""

    def __init__(self, ctx: ServiceContext, settings: SchedulerSettings, path: str,
                 admission: Admission, elector: Elector) -> None:
        self.ctx, self.settings, self.path = ctx, settings, path
        self.admission, self.elector = admission, elector

    async def handle(self, _req: ev.ReloadTenants) -> ev.Message:
        return self.reload()

    def reload(self) -> ev.TenantsReloaded:
        """Reload now; the answer says what this replica uses from now on."""
        replica = self.elector.lease.holder
        try:
            settings = self._checked()
        except TenantsError as e:
            self.ctx.log.error("tenants file refused; the old one stays", source=self.path,
                               error=str(e))
            return ev.TenantsReloaded(
                ok=False, service="scheduler", replica=replica, source=self.path,
                tenants=tuple(sorted(self.settings.tenants.tenants)), error=str(e), code=INVALID)
        self.settings = settings
        self.admission.tenants = settings.tenants
        self.elector.use(settings)
        tenants = tuple(sorted(settings.tenants.tenants))
        self.ctx.log.info("tenants file reloaded", source=self.path, tenants=list(tenants))
        return ev.TenantsReloaded(ok=True, service="scheduler", replica=replica,
                                  source=self.path, tenants=tenants)

    def _checked(self) -> SchedulerSettings:
        """The settings with the file as it is now, or TenantsError saying why not."""
        if not self.path:
            raise TenantsError(
                "this scheduler was started without a tenants file (HOPS_TENANTS, --tenants): "
                "there is nothing to reload; restart it with one")
        file = read_tenants(self.path)
        cells = tenant_cells(file, (), self.path)
        traits = policy_traits(self.settings.policy)
        problem = tn.reload_refusal(self.settings.tenants, file, traits.needs_cells)
        if problem is not None:
            raise TenantsError(f"{self.path}: {problem}")
        # a policy that plans with cells keeps the very model it was built with
        kept = self.settings.cells if traits.needs_cells else cells
        return dataclasses.replace(self.settings, tenants=file, cells=kept)
