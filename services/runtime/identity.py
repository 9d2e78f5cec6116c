"""Who may publish and subscribe what on NATS: one identity per actor.

Every process of the live system connects to nats-server as an nkey user
(docs/security.md). The identity is the name of that user's seed file
(``<dir>/<identity>.nk``):

* the services ``monitor``, ``estimator``, ``profiler``, ``scheduler``
  (shared by its replicas: the leader lease tells them apart), ``placer``,
  ``gateway`` and ``aggregator``: system code, each allowed the subjects of
  its role;
* ``admin``: the operator and the test harness, allowed everything;
* ``executor-<server id>``: one server's executor, allowed only that
  server's subjects (node-scoped, the server id taken from the subject);
* ``tenant-<name>``: a client of one tenant, allowed only to submit and
  cancel that tenant's jobs and to read that tenant's event feed;
* ``audit``: a user of nats-server's system account that may only read
  the server's authentication-failure advisories (for the monitor).

Each identity has its own reply inbox, ``_INBOX.<identity>``, so that no
identity can subscribe to another one's replies.

Everything here is pure: :func:`permissions` is a table, and
:func:`render_authorization` turns public keys and identities into the
``authorization {}`` block of nats-server's configuration.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared import subjects
from shared.subjects import PREFIX, SubjectError, check_token

MONITOR = "monitor"
ESTIMATOR = "estimator"
PROFILER = "profiler"
SCHEDULER = "scheduler"
PLACER = "placer"
GATEWAY = "gateway"
AGGREGATOR = "aggregator"
ADMIN = "admin"
AUDIT = "audit"
SERVICES = (MONITOR, ESTIMATOR, PROFILER, SCHEDULER, PLACER, GATEWAY, AGGREGATOR)
EXECUTOR_PREFIX = "executor-"
TENANT_PREFIX = "tenant-"
# nats-server's system account, where its advisories are published.
SYSTEM_ACCOUNT = "SYS"
AUTH_ERRORS = "$SYS.SERVER.*.CLIENT.AUTH.ERR"

# What every service may use besides its own subjects: the JetStream API
# (streams, consumers, KV reads; nats-server cannot scope it more finely
# without listing every operation, see docs/security.md), acknowledgements
# and flow control of its consumers, and the error records.
_JS_CLIENT = ("$JS.API.>", "$JS.ACK.>", "$JS.FC.>")
# The leader's state (object store hops_state) is the scheduler's alone: for
# every other identity with the JetStream API, the API requests that read,
# change the limits of, purge or delete its stream (messages, direct gets,
# consumers, updates) are denied; its info and creation stay allowed, so
# that any service can ensure the layout (services.runtime.layout; only the
# scheduler updates this stream, JetStreamLayout.owns_state).
_STATE_STREAM = f"OBJ_{subjects.OBJ_STATE}"
_STATE_DENIED = tuple(
    f"$JS.API.{api}.{_STATE_STREAM}{rest}"
    for api in ("STREAM.MSG.GET", "STREAM.MSG.DELETE", "STREAM.PURGE", "STREAM.DELETE",
                "STREAM.UPDATE", "STREAM.SNAPSHOT", "STREAM.RESTORE", "DIRECT.GET",
                "CONSUMER.*", "CONSUMER.*.*")
    for rest in ("", ".>"))
# No service deletes a stream, and only the scheduler purges one (the state's
# stale chunks, services.runtime.objects): a purge or a delete of any other
# stream by a service is denied (KV deletes are publishes, not these).
_DELETE_ANY = "$JS.API.STREAM.DELETE.>"
_PURGE_ANY = "$JS.API.STREAM.PURGE.>"
_PURGE_BUT_STATE = tuple(
    f"$JS.API.STREAM.PURGE.{name}"
    for name in (*(s.name for s in subjects.STREAMS),
                 *(f"KV_{b}" for b in (*subjects.KV_BUCKETS, *subjects.LEGACY_KV_BUCKETS))))
_ALL = ">"


class IdentityError(ValueError):
    """A name cannot be an identity (it must also be a file name and a subject token)."""


@dataclass(frozen=True)
class Permissions:
    """One nats-server user's permissions: the subjects it may publish to and
    subscribe to (wildcards allowed), the subjects among those it may not
    publish to after all (``publish_deny``), and whether it may answer
    requests (publish once to the reply subject of a message it received)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    publish_deny: tuple[str, ...] = ()


def inbox_prefix(identity: str) -> str:
    """The inbox prefix of ``identity``'s connection (nats-py ``inbox_prefix``)."""
    return f"_INBOX.{check_identity(identity)}"


def executor_identity(server_id: str) -> str:
    return check_identity(EXECUTOR_PREFIX + check_token(server_id, "server id"))


def tenant_identity(tenant: str) -> str:
    return check_identity(TENANT_PREFIX + check_token(tenant, "tenant"))


def check_identity(name: str) -> str:
    """``name`` if it can be an identity: one subject token that is also a
    plain file name; else :class:`IdentityError`."""
    try:
        check_token(name, "identity")
    except SubjectError as e:
        raise IdentityError(str(e)) from None
    if "/" in name or "\\" in name or "\0" in name or name.startswith(("-", ".")):
        raise IdentityError(f"identity {name!r} cannot be a file name")
    return name


def _suffix(identity: str, prefix: str) -> str:
    rest = identity[len(prefix):]
    if not rest:
        raise IdentityError(f"identity {identity!r} names no {prefix.rstrip('-')}")
    return rest


def _service(identity: str, publish: Iterable[str], subscribe: Iterable[str] = (),
             kv: Iterable[str] = (), responds: bool = False, state: bool = False,
             ) -> Permissions:
    """A service's permissions: its own subjects, the KV buckets it writes,
    the leader's state if ``state``, and what every service uses
    (:data:`_JS_CLIENT`, errors, its inbox)."""
    writes = tuple(f"$KV.{bucket}.>" for bucket in kv)
    if state:
        writes += (f"$O.{subjects.OBJ_STATE}.>",)
    return Permissions(
        publish=(*_JS_CLIENT, subjects.ERRORS, *writes, *publish),
        subscribe=(f"{inbox_prefix(identity)}.>", *subscribe),
        allow_responses=responds,
        publish_deny=((_DELETE_ANY, *_PURGE_BUT_STATE) if state
                      else (*_STATE_DENIED, _DELETE_ANY, _PURGE_ANY)),
    )


_EVENTS = subjects.JOB_EVENTS_ALL
_TENANT_FEEDS = f"{PREFIX}.tenants.*.events.*"


def _monitor() -> Permissions:
    # It relays executors' reports to their canonical subjects, so it may
    # publish samples and profiles; it releases placements (hops_alloc); it
    # reads Hare's task sequences: where a task job runs (its job_failed).
    return _service(
        MONITOR,
        publish=(_EVENTS, subjects.SAMPLES_ALL, subjects.PROFILES_ALL, subjects.RELEASED,
                 subjects.EXEC_ALL, subjects.QUEUE),
        subscribe=(subjects.NODES_REGISTER_ALL, subjects.NODES_REMOVE, subjects.NODES_DRAIN,
                   subjects.NODE_HEARTBEATS_ALL, subjects.JOB_HEARTBEATS_ALL, subjects.ERRORS,
                   subjects.PLACER_SKIPPED, subjects.TASK_SEQ_ALL),
        kv=(subjects.KV_NODES, subjects.KV_ALLOC),
        responds=True,
    )


def _scheduler() -> Permissions:
    return _service(
        SCHEDULER,
        publish=(_EVENTS, subjects.PLANS, subjects.ESTIMATE, _TENANT_FEEDS,
                 subjects.TIMELINE_ALL, subjects.TASK_SEQ_ALL),
        subscribe=(subjects.JOBS_SUBMIT, subjects.JOBS_SUBMIT_TENANT_ALL, subjects.JOBS_CANCEL,
                   subjects.JOBS_CANCEL_TENANT_ALL, subjects.JOBS_HOLD,
                   subjects.JOBS_HOLD_TENANT_ALL, subjects.QUEUE, subjects.RELEASED,
                   subjects.JOB_HEARTBEATS_ALL, subjects.TENANTS_RELOAD),
        kv=(subjects.KV_JOBS, subjects.KV_LEADER, subjects.KV_TENANTS, subjects.KV_EXPLAIN),
        responds=True,
        state=True,
    )


def _aggregator() -> Permissions:
    # It reads the task sequences (its grants) and the gradients (HOPS_GRADS,
    # through the JetStream API), answers parameter requests, publishes the
    # rounds it applied and writes its own object store, whose stale chunks
    # it purges (every other stream's purge stays denied).
    base = _service(AGGREGATOR,
                    publish=(subjects.AGG_APPLIED_ALL, f"$O.{subjects.OBJ_AGGREGATOR}.>"),
                    subscribe=(subjects.TASK_SEQ_ALL, subjects.AGG_PARAMS_ALL),
                    responds=True)
    return Permissions(base.publish, base.subscribe, base.allow_responses,
                       (*_STATE_DENIED, _DELETE_ANY, *_PURGE_BUT_STATE))


def _gateway() -> Permissions:
    # A trusted caller: the bare subjects, with the tenant it authenticated.
    # It reads the buckets (hops_jobs, hops_explain, ...) and each job's
    # timeline (HOPS_TIMELINE, message by message) through the JetStream API
    # alone (_JS_CLIENT) and writes no bucket (tests/test_gateway_explain.py).
    return _service(GATEWAY, publish=(subjects.JOBS_SUBMIT, subjects.JOBS_CANCEL,
                                      subjects.JOBS_HOLD, subjects.NODES_REMOVE,
                                      subjects.NODES_DRAIN, subjects.QUEUE,
                                      subjects.TENANTS_RELOAD, subjects.SIGNATURES_LIST,
                                      subjects.SIGNATURES_STALE))


_SERVICE_TABLE = {
    MONITOR: _monitor,
    # It publishes profile_stale when a job's samples disagree (shared.reuse).
    ESTIMATOR: lambda: _service(ESTIMATOR, (subjects.SIGNATURES_STALE,),
                                subscribe=(subjects.ESTIMATE, subjects.SIGNATURES_LIST),
                                responds=True),
    PROFILER: lambda: _service(PROFILER, publish=(_EVENTS,)),
    SCHEDULER: _scheduler,
    # It reports the plan entries it skipped (subjects.PLACER_SKIPPED) to the monitor.
    PLACER: lambda: _service(PLACER, publish=(_EVENTS, subjects.EXEC_ALL,
                                              subjects.PLACER_SKIPPED),
                             kv=(subjects.KV_ALLOC,)),
    GATEWAY: _gateway,
    AGGREGATOR: _aggregator,
}


def executor_permissions(server_id: str) -> Permissions:
    """One server's executor (and the emulated jobs it starts): only its own
    node-scoped subjects; the server id comes from the subject."""
    sid = check_token(server_id, "server id")
    # No $JS.API: its reports are plain publishes captured by HOPS_REPORTS
    # (the stream's ack comes to its inbox), relayed by the monitor; its
    # jobs' output goes the same way to HOPS_LOGS, its tasks' gradients to
    # HOPS_GRADS (its own subjects only); it may ask any job's aggregator for
    # the parameters (read-only).
    return Permissions(
        publish=(subjects.nodes_register(sid), subjects.node_heartbeat(sid),
                 f"{PREFIX}.jobs.heartbeat.{sid}.*", f"{PREFIX}.reports.{sid}.*",
                 f"{PREFIX}.logs.{sid}.*", f"{PREFIX}.tasks.done.{sid}.*",
                 f"{PREFIX}.grads.{sid}.*.*", subjects.AGG_PARAMS_ALL, subjects.ERRORS),
        subscribe=(subjects.exec_commands(sid), subjects.task_sequence(sid),
                   f"{inbox_prefix(executor_identity(sid))}.>"),
        allow_responses=True,
    )


def tenant_permissions(tenant: str) -> Permissions:
    """A client of ``tenant``: submit, cancel and hold its jobs, read its feed."""
    return Permissions(
        publish=(subjects.tenant_submit(tenant), subjects.tenant_cancel(tenant),
                 subjects.tenant_hold(tenant)),
        subscribe=(f"{PREFIX}.tenants.{check_token(tenant, 'tenant')}.>",
                   f"{inbox_prefix(tenant_identity(tenant))}.>"),
    )


def permissions(identity: str) -> Permissions:
    """What ``identity`` may do on NATS; :class:`IdentityError` for a name
    that is no identity."""
    check_identity(identity)
    if identity in _SERVICE_TABLE:
        return _SERVICE_TABLE[identity]()
    if identity == ADMIN:
        return Permissions(publish=(_ALL,), subscribe=(_ALL,), allow_responses=True)
    if identity == AUDIT:
        return Permissions(publish=(), subscribe=(AUTH_ERRORS, f"{inbox_prefix(AUDIT)}.>"))
    if identity.startswith(EXECUTOR_PREFIX):
        return executor_permissions(_suffix(identity, EXECUTOR_PREFIX))
    if identity.startswith(TENANT_PREFIX):
        return tenant_permissions(_suffix(identity, TENANT_PREFIX))
    raise IdentityError(f"unknown identity {identity!r}: one of {', '.join(SERVICES)}, "
                        f"{ADMIN}, {AUDIT}, {EXECUTOR_PREFIX}<server id> or "
                        f"{TENANT_PREFIX}<tenant>")


def _list(values: Iterable[str]) -> str:
    return json.dumps(list(values))  # a JSON list is a valid nats-server config list


def _user(public_key: str, identity: str) -> str:
    p = permissions(identity)
    deny_all = '{deny: [">"]}'
    denied = f", deny: {_list(p.publish_deny)}" if p.publish_deny else ""
    publish = f"{{allow: {_list(p.publish)}{denied}}}" if p.publish else deny_all
    subscribe = f"{{allow: {_list(p.subscribe)}}}" if p.subscribe else deny_all
    responses = ", allow_responses: true" if p.allow_responses else ""
    return (f"    # {identity}\n    {{nkey: {json.dumps(public_key)}, permissions: "
            f"{{publish: {publish}, subscribe: {subscribe}{responses}}}}}")


def render_authorization(users: Mapping[str, str]) -> str:
    """nats-server configuration for ``users`` (public key -> identity): an
    ``authorization {}`` block with every identity but :data:`AUDIT`, and,
    if an audit user is among them, nats-server's system account with it.
    Deterministic: users in the order of their identity."""
    for key in users:
        if not (len(key) == 56 and key.startswith("U") and key.isalnum() and key.isupper()):
            raise IdentityError(f"{key!r} is not an nkey user's public key")
    ordered = sorted(users.items(), key=lambda kv: (kv[1], kv[0]))
    lines = ["# Generated by hops (docs/security.md): one nkey user per identity.",
             "authorization {", "  users = ["]
    lines += [_user(k, i) for k, i in ordered if i != AUDIT]
    lines += ["  ]", "}"]
    audit = [_user(k, i) for k, i in ordered if i == AUDIT]
    if audit:
        lines += [f"accounts {{ {SYSTEM_ACCOUNT} {{ users = [", *audit, "] } }",
                  f"system_account: {SYSTEM_ACCOUNT}"]
    return "\n".join(lines) + "\n"
