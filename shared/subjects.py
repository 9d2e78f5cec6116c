"""NATS subject names, JetStream streams and KV buckets of the live system.

Every subject starts with ``hops.v1``; an incompatible change of the wire
contract gets a new prefix rather than a silent break. Ids that become a
subject token (job ids, server ids) must be one token: non-empty, without
``.``, ``*``, ``>`` or whitespace. :func:`check_token` enforces that, and
every builder below calls it. ``docs/events.md`` documents each subject.
"""

from __future__ import annotations

import msgspec

from shared.ids import JobId, ServerId

PREFIX = "hops.v1"

# Request/reply, JSON (external clients speak these).
JOBS_SUBMIT = f"{PREFIX}.jobs.submit"
JOBS_CANCEL = f"{PREFIX}.jobs.cancel"
# Hold and release (``hold_job``), served like cancel, tenant-scoped form too.
JOBS_HOLD = f"{PREFIX}.jobs.hold"
# Reload the tenants file (``reload_tenants``): every scheduler replica
# answers (no queue group), trusted callers only (docs/tenancy.md).
TENANTS_RELOAD = f"{PREFIX}.reload.tenants"
# Node-scoped: the last token is the executor's server id, which its NATS
# identity may use and no other (the monitor serves the wildcard).
NODES_REGISTER_ALL = f"{PREFIX}.nodes.register.*"
NODES_REMOVE = f"{PREFIX}.nodes.remove"
# Drain and undrain (``drain_node``), answered by the monitor.
NODES_DRAIN = f"{PREFIX}.nodes.drain"
ESTIMATE = f"{PREFIX}.estimate"
ESTIMATOR_QUEUE = "estimator"
# Profile signatures' shared profiles (``list_signatures``), answered by an
# estimator replica in queue group ``estimator``; trusted callers only.
SIGNATURES_LIST = f"{PREFIX}.signatures.list"
# The scheduler's queue view (priority, latency ratio, window), answered by the leader.
QUEUE = f"{PREFIX}.queue"
# Submissions and cancels are answered by every scheduler replica in this group.
ADMISSION_QUEUE = "admission"
# Submit and cancel scoped to one tenant (its clients' subjects; the tenant is the
# last token): the scheduler serves both patterns in queue group ``admission``.
JOBS_SUBMIT_TENANT_ALL = f"{JOBS_SUBMIT}.*"
JOBS_CANCEL_TENANT_ALL = f"{JOBS_CANCEL}.*"
JOBS_HOLD_TENANT_ALL = f"{JOBS_HOLD}.*"

# Persisted on JetStream.
JOB_EVENTS_ALL = f"{PREFIX}.jobs.events.*"
SAMPLES_ALL = f"{PREFIX}.samples.*"
PROFILES_ALL = f"{PREFIX}.profiles.*"
PLANS = f"{PREFIX}.plans"
# ``profile_stale`` (stream HOPS_SAMPLES): from the gateway for an operator,
# or from an estimator whose job measured a disagreement (shared.reuse).
SIGNATURES_STALE = f"{PREFIX}.signatures.stale"
RELEASED = f"{PREFIX}.cluster.released"
# Each job's history (shared.explain.TimelineEntry), ``hops.v1.timeline.<job key>``:
# written by the leader, bounded per job and in total, kept after the job ends.
TIMELINE_ALL = f"{PREFIX}.timeline.*"
# What executors report of their jobs, ``hops.v1.reports.<server_id>.<job_id>``:
# the monitor checks each one and relays it to its canonical subject above.
REPORTS_ALL = f"{PREFIX}.reports.*.*"
# Each rank's output (shared.logs.LogChunk), ``hops.v1.logs.<server_id>.<job key>``:
# published by the executor of that server, read by the gateway (docs/logs.md).
LOGS_ALL = f"{PREFIX}.logs.*.*"
# Hare's task reports (shared.events.TaskDone), ``hops.v1.tasks.done.<server_id>.<job_id>``:
# published by the executor of that server only, read by the scheduler leader;
# kept so that a new leader replays the reports its predecessor had not stored
# (message id ``<server>:<job>:<round>:<lo>``, :func:`task_done_id`: a report
# sent twice is stored once, and no server's report can make JetStream drop
# another server's as a repeat).
TASK_DONE_ALL = f"{PREFIX}.tasks.done.*.*"
# A task's gradients (shared.gradients.GradientChunk), chunked,
# ``hops.v1.grads.<server_id>.<job_id>.<round>``: published by the executor of
# that server only, read by the aggregator service; kept so that a restarted
# aggregator replays the rounds it had not applied (message id
# ``<server>:<job>:<round>:<lo>:<chunk>``: the server in it, so that no
# server's chunk can make JetStream drop another's as a repeat).
GRADS_ALL = f"{PREFIX}.grads.*.*.*"
# The rounds an aggregator applied (shared.gradients.RoundApplied),
# ``hops.v1.agg.applied.<job_id>``: published by the aggregator service only.
AGG_APPLIED_ALL = f"{PREFIX}.agg.applied.*"

# A job's parameters after the last round applied, request/reply
# (shared.gradients.ParamsRequest), ``hops.v1.agg.params.<job_id>``: answered
# by the aggregator service.
AGG_PARAMS_ALL = f"{PREFIX}.agg.params.*"

# Core NATS (not persisted): heartbeats, executor commands, error records.
NODE_HEARTBEATS_ALL = f"{PREFIX}.nodes.heartbeat.*"
JOB_HEARTBEATS_ALL = f"{PREFIX}.jobs.heartbeat.*.*"  # <server_id>.<job_id>
EXEC_ALL = f"{PREFIX}.exec.*"
# Hare's task sequences (shared.events.TaskSequence), ``hops.v1.tasks.seq.<server_id>``:
# published by the scheduler leader only, under its lease term, and sent again
# until superseded (the leader's state holds them: docs/hare.md, "Live mechanism").
TASK_SEQ_ALL = f"{PREFIX}.tasks.seq.*"
ERRORS = f"{PREFIX}.errors"
# Plan entries the placer skipped as overtaken by events (benign races).
PLACER_SKIPPED = f"{PREFIX}.placer.skipped"

# KV buckets.
KV_JOBS = "hops_jobs"
KV_ALLOC = "hops_alloc"
KV_NODES = "hops_nodes"
KV_LEADER = "hops_leader"
# Where earlier versions kept each stateful layer's state (key: the layer's
# name; HiveD's cell bindings): read by a new leader if it exists, no longer
# made nor written (OBJ_STATE replaced it).
KV_LAYERS = "hops_layers"
# Each tenant's virtual cluster as the leader's cells state shows it (key:
# the tenant), for GET /tenants and ``hops tenants``.
KV_TENANTS = "hops_tenants"
# Each job's latest reason, receipt and forecast (shared.explain.JobExplain;
# key: the job key), written by the leader, read by the gateway and a standby.
KV_EXPLAIN = "hops_explain"
# Object store: the leader's large state (each stateful layer's, object
# "layer.<name>"; the forecast's calibration), read by the next leader.
# Before it, the layers' state was kept in KV_LAYERS (read once, if the
# object is absent: services/scheduler/layer_store.py).
OBJ_STATE = "hops_state"
# Object store: each relaxed job's aggregator checkpoint (object
# ``<job>/checkpoint``: parameters, optimiser state, rounds applied, the
# grants it saw) and its final parameters (``<job>/final``).
OBJ_AGGREGATOR = "hops_aggregator"

_FORBIDDEN = frozenset(".*>")


class SubjectError(ValueError):
    """An id cannot be used as a subject token."""


class StreamDef(msgspec.Struct, frozen=True):
    """A JetStream stream: its name and the subjects it captures."""

    name: str
    subjects: tuple[str, ...]


STREAM_JOBS = StreamDef("HOPS_JOBS", (JOB_EVENTS_ALL,))
STREAM_SAMPLES = StreamDef("HOPS_SAMPLES", (SAMPLES_ALL, PROFILES_ALL, SIGNATURES_STALE))
STREAM_PLANS = StreamDef("HOPS_PLANS", (PLANS, RELEASED))
STREAM_REPORTS = StreamDef("HOPS_REPORTS", (REPORTS_ALL,))
STREAM_TIMELINE = StreamDef("HOPS_TIMELINE", (TIMELINE_ALL,))
STREAM_LOGS = StreamDef("HOPS_LOGS", (LOGS_ALL,))
STREAM_TASK_DONE = StreamDef("HOPS_TASK_DONE", (TASK_DONE_ALL,))
STREAM_GRADS = StreamDef("HOPS_GRADS", (GRADS_ALL,))
STREAM_AGG_APPLIED = StreamDef("HOPS_AGG_APPLIED", (AGG_APPLIED_ALL,))
STREAMS = (STREAM_JOBS, STREAM_SAMPLES, STREAM_PLANS, STREAM_REPORTS, STREAM_TIMELINE,
           STREAM_LOGS, STREAM_TASK_DONE, STREAM_GRADS, STREAM_AGG_APPLIED)
KV_BUCKETS = (KV_JOBS, KV_ALLOC, KV_NODES, KV_LEADER, KV_TENANTS, KV_EXPLAIN)
# Buckets of earlier versions: read where they exist, no longer made.
LEGACY_KV_BUCKETS = (KV_LAYERS,)


def check_token(value: str, what: str = "id") -> str:
    """``value`` if it is a valid single subject token, else :class:`SubjectError`."""
    if not value:
        raise SubjectError(f"{what} must not be empty")
    bad = sorted({c for c in value if c in _FORBIDDEN or c.isspace()})
    if bad:
        raise SubjectError(
            f"{what} {value!r} cannot be used in a subject: it contains {''.join(bad)!r} "
            "(ids must not contain '.', '*', '>' or whitespace)"
        )
    return value


def job_events(job_id: str) -> str:
    return f"{PREFIX}.jobs.events.{check_token(job_id, 'job id')}"


def timeline(job_id: str) -> str:
    return f"{PREFIX}.timeline.{check_token(job_id, 'job id')}"


def samples(job_id: str) -> str:
    return f"{PREFIX}.samples.{check_token(job_id, 'job id')}"


def profiles(job_id: str) -> str:
    return f"{PREFIX}.profiles.{check_token(job_id, 'job id')}"


def nodes_register(server_id: str) -> str:
    return f"{PREFIX}.nodes.register.{check_token(server_id, 'server id')}"


def job_heartbeat(server_id: str, job_id: str) -> str:
    sid, job = check_token(server_id, "server id"), check_token(job_id, "job id")
    return f"{PREFIX}.jobs.heartbeat.{sid}.{job}"


def reports(server_id: str, job_id: str) -> str:
    sid, job = check_token(server_id, "server id"), check_token(job_id, "job id")
    return f"{PREFIX}.reports.{sid}.{job}"


def logs(server_id: str, job_id: str) -> str:
    sid, job = check_token(server_id, "server id"), check_token(job_id, "job id")
    return f"{PREFIX}.logs.{sid}.{job}"


def job_logs_all(job_id: str) -> str:
    """Every server's log subject of ``job_id`` (a consumer's filter)."""
    return f"{PREFIX}.logs.*.{check_token(job_id, 'job id')}"


def node_heartbeat(server_id: str) -> str:
    return f"{PREFIX}.nodes.heartbeat.{check_token(server_id, 'server id')}"


def exec_commands(server_id: str) -> str:
    return f"{PREFIX}.exec.{check_token(server_id, 'server id')}"


def task_sequence(server_id: str) -> str:
    return f"{PREFIX}.tasks.seq.{check_token(server_id, 'server id')}"


def task_done(server_id: str, job_id: str) -> str:
    sid, job = check_token(server_id, "server id"), check_token(job_id, "job id")
    return f"{PREFIX}.tasks.done.{sid}.{job}"


def task_done_id(server_id: str, job_id: str, round_: int, lo: int) -> str:
    """The message id of a ``task_done`` (``TASK_DONE_ALL``'s comment)."""
    return f"{server_id}:{job_id}:{round_}:{lo}"


def grads_id(server_id: str, job_id: str, round_: int, lo: int, chunk: int) -> str:
    """The message id of a gradients chunk (``GRADS_ALL``'s comment)."""
    return f"{server_id}:{job_id}:{round_}:{lo}:{chunk}"


def grads(server_id: str, job_id: str, round_: int) -> str:
    sid, job = check_token(server_id, "server id"), check_token(job_id, "job id")
    if round_ < 0:
        raise SubjectError(f"round must be >= 0, got {round_}")
    return f"{PREFIX}.grads.{sid}.{job}.{round_}"


def job_grads_all(job_id: str) -> str:
    """Every server's gradients of ``job_id`` (a consumer's filter)."""
    return f"{PREFIX}.grads.*.{check_token(job_id, 'job id')}.*"


def grads_tokens(subject: str) -> tuple[ServerId, JobId, int]:
    """(server id, job id, round) of a gradients subject; SubjectError for
    another subject."""
    head = f"{PREFIX}.grads."
    parts = subject[len(head):].split(".") if subject.startswith(head) else []
    if len(parts) != 3 or not all(parts) or not parts[2].isdigit():
        raise SubjectError(f"subject {subject!r} does not match {GRADS_ALL!r}")
    return ServerId(parts[0]), JobId(parts[1]), int(parts[2])


def agg_params(job_id: str) -> str:
    return f"{PREFIX}.agg.params.{check_token(job_id, 'job id')}"


def agg_applied(job_id: str) -> str:
    return f"{PREFIX}.agg.applied.{check_token(job_id, 'job id')}"


def tenant_submit(tenant: str) -> str:
    return f"{JOBS_SUBMIT}.{check_token(tenant, 'tenant')}"


def tenant_cancel(tenant: str) -> str:
    return f"{JOBS_CANCEL}.{check_token(tenant, 'tenant')}"


def tenant_hold(tenant: str) -> str:
    return f"{JOBS_HOLD}.{check_token(tenant, 'tenant')}"


def tenant_events(tenant: str, job_id: str) -> str:
    """The live feed of a tenant's job (core NATS; the scheduler republishes
    each job event of the tenant's jobs here)."""
    tenant = check_token(tenant, "tenant")
    return f"{PREFIX}.tenants.{tenant}.events.{check_token(job_id, 'job id')}"


def tenant_events_all(tenant: str) -> str:
    return f"{PREFIX}.tenants.{check_token(tenant, 'tenant')}.events.*"


def last_token(subject: str, pattern: str) -> str:
    """The id in ``subject`` matched by the trailing ``*`` of ``pattern``,
    e.g. ``last_token("hops.v1.jobs.events.j1", JOB_EVENTS_ALL) == "j1"``."""
    if not pattern.endswith(".*"):
        raise ValueError(f"pattern {pattern!r} must end with '.*'")
    head = pattern[:-1]
    rest = subject[len(head) :] if subject.startswith(head) else ""
    if not rest or "." in rest:
        raise SubjectError(f"subject {subject!r} does not match {pattern!r}")
    return rest


def last_two_tokens(subject: str, pattern: str) -> tuple[str, str]:
    """The two ids in ``subject`` matched by the trailing ``*.*`` of
    ``pattern``, e.g. ``("a0", "j1")`` for ``hops.v1.reports.a0.j1`` and
    :data:`REPORTS_ALL`."""
    if not pattern.endswith(".*.*"):
        raise ValueError(f"pattern {pattern!r} must end with '.*.*'")
    head = pattern[:-3]
    rest = subject[len(head) :] if subject.startswith(head) else ""
    first, _, second = rest.partition(".")
    if not first or not second or "." in second:
        raise SubjectError(f"subject {subject!r} does not match {pattern!r}")
    return first, second
