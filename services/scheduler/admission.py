"""Admission, on every scheduler replica (Hops §3.1): each answers
``hops.v1.jobs.submit`` and ``hops.v1.jobs.cancel`` and their tenant-scoped
forms in queue group ``admission``, so jobs are accepted during a failover
too. A submission is validated (:mod:`scheduling.live.admission`; the
policy's traits say whether CPU jobs may run and whether the tenants' cells
must hold it, :func:`scheduling.live.cells.cells_refusal`), published as
``job_submitted`` on ``HOPS_JOBS`` and acknowledged once the stream stored
it; its record is then created in ``hops_jobs``. A cancel publishes
``job_cancelled``; a hold (``hops.v1.jobs.hold``) ``job_held`` or
``job_released``, under the same tenant rules as a cancel.
"""

from __future__ import annotations

import time
from typing import NamedTuple, NoReturn

import nats.errors
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from structlog.contextvars import bound_contextvars

from scheduling.cells import Cells
from scheduling.layers.traits import TenantAdmission
from scheduling.live import admission as adm
from scheduling.live import state as st
from scheduling.live import tenancy as tn
from scheduling.live.cells import cells_refusal
from scheduling.registry import DEFAULT_POLICY, policy_traits
from services.runtime.bus import Rejected, publish_event
from services.runtime.retry import kv_write
from services.runtime.service import ServiceContext
from services.scheduler.kv import decode_all, get_record
from services.scheduler.settings import SchedulerSettings
from shared import events as ev
from shared import jobkeys as keys
from shared import subjects
from shared.ids import JobId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.tenants import DEFAULT_TENANTS, TenantsFile

# How old admission's copy of the registered nodes may be.
NODES_MAX_AGE_S = 1.0


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
            try:
                nodes = await decode_all(self.ctx.js, subjects.KV_NODES, NodeRecord,
                                         self.ctx.log)
            except (nats.errors.Error, TimeoutError) as e:
                if read_at < 0:  # never read: nothing to judge a submission by
                    raise
                # JetStream electing a leader (a NATS cluster): the last copy,
                # rather than refusing submissions for the election's length
                self.ctx.log.warning("nodes not read; using the last copy", error=repr(e))
                return nodes
            self._nodes = (now, nodes)
        return nodes

    async def submit(self, req: ev.SubmitJob, subject: str) -> ev.Message:
        scope = tn.scope_of(subject, subjects.JOBS_SUBMIT_TENANT_ALL)
        asked = time.perf_counter()  # the admission latency runs from here
        # on every line, the runtime's too: the audit names who asked
        with bound_contextvars(job_id=req.spec.id, identity=_identity(scope)):
            return await self._submit(subject, req, scope, asked)

    async def _submit(self, subject: str, req: ev.SubmitJob, scope: str | None,
                      asked: float) -> ev.Message:
        problem = adm.check_spec(req.spec)
        if problem is not None:
            error = f"invalid submit_job: {problem}"
            await self.ctx.reporter.report(subject, error, ev.INVALID, ev.encode(req))
            raise Rejected(ev.INVALID, error)
        spec, denied = tn.submit_refusal(self.tenants, req.spec, scope)
        if denied is not None:
            await self._refuse(denied, subject, scope, ev.encode(req))
        shown = JobId(spec.id if scope is not None else keys.job_key(spec.tenant, spec.id))
        existing = await self._existing(spec)
        if existing is not None and adm.resubmission(spec, existing.spec):
            return self._accepted_again(shown)
        refusal = (
            adm.policy_refusal(spec, self.checks.cores, self.checks.policy)
            or adm.fit_refusal(spec, await self.nodes(), self.r_num)
            or self._cells_refusal(spec)
            or adm.duplicate(spec.id, spec.tenant, existing)
        )
        if refusal is not None:
            if refusal.code != adm.CONFLICT:
                await self.ctx.reporter.report(subject, refusal.message, refusal.code)
            raise Rejected(refusal.code, refusal.message)
        now = time.time()
        asked_for, spec = spec, adm.accepted_spec(adm.keyed_spec(spec), now)
        event = ev.JobSubmitted(job_id=spec.id, spec=spec, at=now,
                                admission_s=time.perf_counter() - asked)
        ack = await publish_event(self.ctx.js, subjects.job_events(spec.id), event, msg_id=spec.id)
        if ack.duplicate:  # an attempt before this one is on the stream: the same job?
            if adm.resubmission(asked_for, await self._submitted(ack.seq)):
                return self._accepted_again(shown)
            raise Rejected(adm.CONFLICT, f"job {keys.local_id(spec.id)} was submitted already")
        try:  # retried through an election; the leader was quicker: a conflict
            await kv_write(self.ctx.js, subjects.KV_JOBS, spec.id,
                           st.encode_record(st.new_record(spec, now, ack.seq)), last=0,
                           msg_id=f"{spec.id}:record")
        except KeyWrongLastSequenceError:
            pass
        except (nats.errors.Error, TimeoutError) as e:  # accepted all the same: on the stream
            self.ctx.log.warning("job record not written; the leader writes it", key=spec.id,
                                 error=repr(e))
        self.ctx.log.info("job accepted", stream_seq=ack.seq, tenant=spec.tenant, key=spec.id,
                          kind=spec.kind, cores=spec.cores)
        # a tenant's client names its jobs by their ids, a trusted caller by their keys
        return ev.Reply(ok=True, job_id=shown)

    def _accepted_again(self, shown: JobId) -> ev.Message:
        """The answer to a resubmission of an accepted job
        (:func:`scheduling.live.admission.resubmission`): its acceptance."""
        self.ctx.log.info("job submitted again; answered as accepted")
        return ev.Reply(ok=True, job_id=shown)

    async def _existing(self, spec: JobSpec) -> st.LiveJobRecord | None:
        """The record of ``spec``'s tenant's job of its id, under its key or
        (written before keys were qualified) its bare id; None: none."""
        for key in keys.candidates(spec.tenant, spec.id):
            record = (await get_record(self.kv, key))[0]
            if record is not None and (key == spec.id or record.spec.tenant == spec.tenant):
                return record
        return None

    async def _submitted(self, seq: int) -> JobSpec | None:
        """The spec of the ``job_submitted`` at ``seq`` on ``HOPS_JOBS`` (None:
        unreadable now, so the answer stays a conflict)."""
        try:
            msg = await self.ctx.js.get_msg(subjects.STREAM_JOBS.name, seq)
            event = ev.decode_job_event(msg.data or b"")
        except (nats.errors.Error, TimeoutError, ev.WireError) as e:
            self.ctx.log.warning("stored submission not read", stream_seq=seq, error=repr(e))
            return None
        return event.spec if isinstance(event, ev.JobSubmitted) else None

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
        key, record = await self._own_record(req.job_id, req, subject, scope)
        refusal = adm.cancel_refusal(keys.local_id(key), record)
        if refusal is not None:
            raise Rejected(refusal.code, refusal.message)
        event = ev.JobCancelled(job_id=key, at=time.time())
        msg_id = f"{key}:job_cancelled"
        await publish_event(self.ctx.js, subjects.job_events(key), event, msg_id=msg_id)
        self.ctx.log.info("job cancelled", reason=req.reason, key=key)
        return ev.Reply(ok=True, job_id=req.job_id)

    async def hold(self, req: ev.HoldJob, subject: str) -> ev.Message:
        scope = tn.scope_of(subject, subjects.JOBS_HOLD_TENANT_ALL)
        with bound_contextvars(job_id=req.job_id, identity=_identity(scope)):
            return await self._hold(req, subject, scope)

    async def _hold(self, req: ev.HoldJob, subject: str, scope: str | None) -> ev.Message:
        key, record = await self._own_record(req.job_id, req, subject, scope)
        refusal = adm.hold_refusal(keys.local_id(key), record, req.hold)
        if refusal is not None:
            raise Rejected(refusal.code, refusal.message)
        assert record is not None  # hold_refusal refuses an unknown job
        if record.held == req.hold:  # held already, or not held: nothing to do
            return ev.Reply(ok=True, job_id=req.job_id)
        now = time.time()
        event: ev.JobEvent = (ev.JobHeld(job_id=key, at=now, reason=req.reason)
                              if req.hold else ev.JobReleased(job_id=key, at=now))
        # one per state seen: a retried request is stored once
        msg_id = f"{key}:{'job_held' if req.hold else 'job_released'}:{record.last_seq}"
        await publish_event(self.ctx.js, subjects.job_events(key), event, msg_id=msg_id)
        self.ctx.log.info("job held" if req.hold else "job released", reason=req.reason)
        return ev.Reply(ok=True, job_id=req.job_id)

    async def _own_record(self, job_id: JobId, req: ev.Message, subject: str,
                          scope: str | None) -> tuple[JobId, st.LiveJobRecord | None]:
        """The key and record of the job a cancel or hold names (None: no
        such job), after the tenant rules for tenant ``scope`` (refused,
        audited): a tenant names its job by its id, a trusted caller by its
        key (:mod:`shared.jobkeys`)."""
        key, record = await self._lookup(job_id, scope)
        denied = tn.cancel_scope_refusal(self.tenants, job_id, record, scope)
        if denied is not None:
            await self._refuse(denied, subject, scope, ev.encode(req))
        return key, record

    async def _lookup(self, job_id: JobId, scope: str | None
                      ) -> tuple[JobId, st.LiveJobRecord | None]:
        if scope is None:
            found = adm.valid_key(job_id)
            return job_id, (await get_record(self.kv, job_id))[0] if found else None
        if not adm.valid_id(job_id):
            return job_id, None
        tried = keys.candidates(scope, job_id)
        for key in tried:
            record = (await get_record(self.kv, key))[0]
            # under the bare id, only a record of the tenant's own counts
            if record is not None and (key == tried[0] or record.spec.tenant == scope):
                return key, record
        return tried[0], None

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
