"""``python -m services.scheduler``: one scheduler replica (Hops §3.1).

Every replica answers ``hops.v1.jobs.submit`` and ``hops.v1.jobs.cancel``,
and their tenant-scoped forms ``...submit.<tenant>``/``...cancel.<tenant>``
(:mod:`scheduling.live.tenancy`), in queue group ``admission``, so jobs are accepted
during a failover too. A
submission is validated (:mod:`scheduling.live.admission`; a CPU job
under a policy that does not schedule cores is ``unschedulable``; with a
policy that plans with the tenants' cells, also :func:`scheduling.live.cells.
cells_refusal`: a job no cell of its tenant can hold, when it cannot run
opportunistically, is ``unschedulable``), published as
``job_submitted`` on ``HOPS_JOBS`` (``Nats-Msg-Id`` = job id) and
acknowledged only once the stream has stored it; its record is then created
in ``hops_jobs``. A cancel publishes ``job_cancelled``.

Each replica also runs the leader lease (:mod:`scheduling.live.lease`): while it holds
the lease it is the leader (:class:`.service.Leader`); when the lease is
lost it goes back to admission only, and on SIGTERM it deletes the lease so
that a standby takes over without waiting for the TTL. Settings:
:mod:`.live_settings` and :mod:`services.runtime.settings`; every variable
has a flag (``--help``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

import nats.errors
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from structlog.contextvars import bound_contextvars

from scheduling.cells import Cells
from scheduling.layers.base import Layer
from scheduling.layers.traits import TenantAdmission
from scheduling.live import admission as adm
from scheduling.live import state as st
from scheduling.live import tenancy as tn
from scheduling.live.cells import cells_refusal
from scheduling.live.lease import (
    LEASE_KEY,
    Change,
    Create,
    Lease,
    Observed,
    Wait,
    encode_value,
)
from scheduling.registry import DEFAULT_POLICY, policy_traits
from services.runtime.bus import Rejected, publish_event, serve_scoped_requests
from services.runtime.service import ServiceContext, run_service
from services.runtime.settings import SettingsError, build_parser, parse_args
from services.scheduler.live_kv import decode_all, get_record
from services.scheduler.live_settings import FIELDS, SchedulerSettings, scheduler_settings
from services.scheduler.service import Leader
from shared import events as ev
from shared import subjects
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.tenants import DEFAULT_TENANTS, TenantsFile

# How old admission's copy of the registered nodes may be.
NODES_MAX_AGE_S = 1.0


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
    elector = Elector(ctx, settings, layers)
    ctx.log.info("admission ready", replica=elector.lease.holder,
                 tenants=sorted(settings.tenants.tenants))
    await elector.run()


class Checks(NamedTuple):
    """What admission checks beyond the spec and the tenant, as the policy's
    traits say: the tenants' cells when it plans with them
    (:func:`scheduling.live.cells.cells_refusal`), and whether it schedules
    CPU cores, which a CPU job needs (:func:`scheduling.live.admission.
    policy_refusal`; ``policy``, the name its message shows)."""

    cells: Cells | None = None
    rule: TenantAdmission = TenantAdmission()
    cores: bool = False
    policy: str = DEFAULT_POLICY

    @classmethod
    def of(cls, settings: SchedulerSettings) -> Checks:
        traits = policy_traits(settings.policy)
        cores, name = traits.schedules_cores, traits.policy
        if settings.cells is None or not traits.needs_cells:
            return cls(cores=cores, policy=name)
        return cls(Cells(settings.cells), traits.admission, cores, name)


class Admission:
    """Submit and cancel handlers, on every replica; see the module docstring."""

    def __init__(self, ctx: ServiceContext, kv: KeyValue, r_num: int,
                 tenants: TenantsFile = DEFAULT_TENANTS, checks: Checks | None = None) -> None:
        self.ctx = ctx
        self.kv = kv
        self.r_num = r_num
        self.tenants = tenants
        self.checks = checks or Checks()
        self._nodes: tuple[float, list[NodeRecord]] = (-NODES_MAX_AGE_S, [])

    async def nodes(self) -> list[NodeRecord]:
        """The registered nodes, read again once the copy is older than
        :data:`NODES_MAX_AGE_S` (a burst of submissions reads them once)."""
        read_at, nodes = self._nodes
        now = time.monotonic()
        if now - read_at >= NODES_MAX_AGE_S:
            nodes = await decode_all(self.ctx.js, subjects.KV_NODES, NodeRecord, self.ctx.log)
            self._nodes = (now, nodes)
        return nodes

    async def submit(self, req: ev.SubmitJob, subject: str) -> ev.Message:
        scope = tn.scope_of(subject, subjects.JOBS_SUBMIT_TENANT_ALL)
        # on every line, the runtime's too: the audit names who asked
        with bound_contextvars(job_id=req.spec.id, identity=_identity(scope)):
            return await self._submit(subject, req, scope)

    async def _submit(self, subject: str, req: ev.SubmitJob, scope: str | None) -> ev.Message:
        problem = adm.check_spec(req.spec)
        if problem is not None:
            error = f"invalid submit_job: {problem}"
            await self.ctx.reporter.report(subject, error, ev.INVALID, ev.encode(req))
            raise Rejected(ev.INVALID, error)
        spec, denied = tn.submit_refusal(self.tenants, req.spec, scope)
        if denied is not None:
            await self._refuse(denied, subject, scope, ev.encode(req))
        refusal = (
            adm.policy_refusal(spec, self.checks.cores, self.checks.policy)
            or adm.fit_refusal(spec, await self.nodes(), self.r_num)
            or self._cells_refusal(spec)
            or adm.duplicate(spec.id, (await get_record(self.kv, spec.id))[0])
        )
        if refusal is not None:
            if refusal.code != adm.CONFLICT:
                await self.ctx.reporter.report(subject, refusal.message, refusal.code)
            raise Rejected(refusal.code, refusal.message)
        now = time.time()
        spec = adm.accepted_spec(spec, now)
        event = ev.JobSubmitted(job_id=spec.id, spec=spec, at=now)
        ack = await publish_event(self.ctx.js, subjects.job_events(spec.id), event, msg_id=spec.id)
        if ack.duplicate:
            raise Rejected(adm.CONFLICT, f"job {spec.id} was submitted already")
        with contextlib.suppress(KeyWrongLastSequenceError):  # the leader was quicker
            await self.kv.create(spec.id, st.encode_record(st.new_record(spec, now, ack.seq)))
        self.ctx.log.info("job accepted", stream_seq=ack.seq, tenant=spec.tenant,
                          kind=spec.kind, cores=spec.cores)
        return ev.Reply(ok=True, job_id=spec.id)

    def _cells_refusal(self, spec: JobSpec) -> adm.Refusal | None:
        cells = self.checks.cells
        if cells is None:
            return None
        return cells_refusal(cells, spec, self.r_num, self.checks.rule)

    async def cancel(self, req: ev.CancelJob, subject: str) -> ev.Message:
        scope = tn.scope_of(subject, subjects.JOBS_CANCEL_TENANT_ALL)
        with bound_contextvars(job_id=req.job_id, identity=_identity(scope)):
            return await self._cancel(req, subject, scope)

    async def _cancel(self, req: ev.CancelJob, subject: str, scope: str | None) -> ev.Message:
        record = (await get_record(self.kv, req.job_id))[0] if adm.valid_id(req.job_id) else None
        denied = tn.cancel_scope_refusal(self.tenants, req.job_id, record, scope)
        if denied is not None:
            await self._refuse(denied, subject, scope, ev.encode(req))
        refusal = adm.cancel_refusal(req.job_id, record)
        if refusal is not None:
            raise Rejected(refusal.code, refusal.message)
        event = ev.JobCancelled(job_id=req.job_id, at=time.time())
        msg_id = f"{req.job_id}:job_cancelled"
        await publish_event(self.ctx.js, subjects.job_events(req.job_id), event, msg_id=msg_id)
        self.ctx.log.info("job cancelled", reason=req.reason)
        return ev.Reply(ok=True, job_id=req.job_id)

    async def _refuse(self, denied: tn.TenantRefusal, subject: str, scope: str | None,
                      data: bytes) -> NoReturn:
        """Audit a refusal of the tenants' rules (who, what, why), then refuse."""
        audit = denied.audit or denied.code
        await self.ctx.reporter.refused(_identity(scope), subject, denied.message, audit, data)
        raise Rejected(denied.code, denied.message, audited=True)


def _identity(scope: str | None) -> str:
    """Who asked, for the log: a tenant's client, or a trusted caller (the
    gateway or an admin; nats-server let it publish the bare subject)."""
    return f"tenant-{scope}" if scope is not None else "trusted"


class Elector:
    """Runs the lease (:class:`scheduling.live.lease.Lease`) and the leader's work
    while it lasts."""

    def __init__(
        self, ctx: ServiceContext, settings: SchedulerSettings, layers: Sequence[Layer] = ()
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self.layers = tuple(layers)
        self.lease = Lease(
            settings.replica(socket.gethostname(), os.getpid()), ctx.settings.leader_ttl
        )
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        self.kv = await self.ctx.js.key_value(subjects.KV_LEADER)
        try:
            while not self.ctx.stopping.is_set():
                await self._tick(self.kv)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ctx.stopping.wait(), self.lease.interval)
        finally:
            await self._follow()
            await self._release()

    async def _release(self) -> None:
        """Step down and delete the lease, so a standby takes over at once."""
        term, revision = self.lease.term, self.lease.release()
        if revision is not None:
            with contextlib.suppress(Exception):
                await self.kv.delete(LEASE_KEY, last=revision)
            self.ctx.log.info("leadership released", term=term)

    async def _tick(self, kv: KeyValue) -> None:
        await self._change(self.lease.check(time.time()))
        observed: Observed | None = None
        if self.lease.role == "follower":
            try:
                entry = await kv.get(LEASE_KEY)
                observed = Observed.of(entry.value or b"", entry.revision or 0)
            except KeyNotFoundError:
                observed = None
            except (nats.errors.Error, TimeoutError) as e:
                self.ctx.log.warning("cannot read the lease", error=repr(e))
                return
        action = self.lease.action(time.time(), observed)
        if isinstance(action, Wait):
            return
        try:
            data = encode_value(action.value)
            if isinstance(action, Create):
                revision = await kv.create(LEASE_KEY, data)
            else:
                revision = await kv.update(LEASE_KEY, data, last=action.revision)
        except (nats.errors.Error, TimeoutError) as e:
            if not isinstance(e, KeyWrongLastSequenceError) or self.lease.role == "leader":
                self.ctx.log.warning("lease write failed", error=repr(e))
            await self._change(self.lease.failed())
            return
        await self._change(self.lease.written(action, revision, time.time()))

    async def _change(self, change: Change) -> None:
        if change == "elected":
            self.ctx.log.info("elected leader", term=self.lease.term)
            leader = Leader(self.ctx, self.settings, self.lease, self.layers)
            self.task = asyncio.create_task(self._lead(leader), name="leader")
        elif change == "deposed":
            self.ctx.log.warning("no longer leader", term=self.lease.term)
            await self._follow()

    async def _lead(self, leader: Leader) -> None:
        try:
            await leader.run()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # step down; a fresh term rebuilds the state
            self.ctx.log.exception("leader failed; stepping down")
            await self.ctx.reporter.report("scheduler.leader", repr(e), ev.INTERNAL)
            self.task = None
            await self._release()

    async def _follow(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


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
                        "gavel; with settings: sia:lam=1.2)")
    try:
        runtime, args = parse_args(argv, parser=parser)
        settings = scheduler_settings(os.environ, vars(args))
    except (SettingsError, ValueError) as e:
        print(f"hops-scheduler: {e}", file=sys.stderr)
        return 2
    return run_service("scheduler", lambda ctx: run(ctx, settings, layers), runtime)


if __name__ == "__main__":
    sys.exit(main())
