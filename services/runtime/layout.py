"""The JetStream layout of the live system: its streams, KV buckets and
object store, their limits and replicas, and :func:`ensure_jetstream`, which every service runs
at start (re-exported by :mod:`services.runtime.bus`)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError

from scheduling.live.lease import lease_ttl
from services.runtime.durability import DURABLE, never_weaker
from services.runtime.identity import AGGREGATOR, SCHEDULER
from services.runtime.logging import get_logger
from services.runtime.retry import transient_retried
from services.runtime.settings import DEFAULT_REPLICAS, RuntimeSettings
from shared import subjects
from shared.events import MAX_PAYLOAD

_STREAM_IN_USE = 10058  # JetStream: stream name already in use with a different configuration
_NO_PEERS = 10005  # JetStream: no suitable peers for placement (servers not all met yet)
_INSUFFICIENT = 10023  # JetStream: insufficient resources
_NOT_CLUSTERED = 10074  # JetStream: replicas > 1 not supported in non-clustered mode
# How long a replicated stream may find too few servers to keep its copies
# before the service gives up: a cluster's members meet within seconds of
# a start; past this, HOPS_NATS_REPLICAS is above the cluster's size.
PLACEMENT_WAIT_S = 15.0
REPLICAS_EXCEED_CLUSTER = "nats_replicas_exceed_cluster"
_GIB = 1024**3
_DAY = 86400.0
# How long a service's start waits for JetStream to answer (a cluster whose
# members are starting too, or electing a meta leader).
ENSURE_RETRY_S = 60.0
_PLACEMENT_PAUSE_S = 0.5


@dataclass(frozen=True)
class JetStreamLayout:
    """Limits of the streams and buckets. Job events are the record of each
    job and are kept until ``jobs_max_bytes``; samples and plans age out."""

    replicas: int = DEFAULT_REPLICAS
    jobs_max_bytes: int = 4 * _GIB
    samples_max_age: float = 14 * _DAY
    samples_max_bytes: int = 4 * _GIB
    plans_max_age: float = 14 * _DAY
    plans_max_bytes: int = _GIB
    # Executors' reports wait here only until the monitor relayed them.
    reports_max_age: float = _DAY
    reports_max_bytes: int = _GIB
    # Each job's timeline: at most this many entries per job (the oldest
    # go first), and this much in all; kept after the job ends.
    timeline_per_job: int = 256
    timeline_max_bytes: int = _GIB
    # Jobs' output (docs/logs.md): per job and server at most this many
    # chunks (each at most 16 KiB of text, shared.logs), in all this much,
    # and none older than this; kept after the job ends, within these.
    logs_per_job: int = 10_000
    logs_max_bytes: int = 4 * _GIB
    logs_max_age: float = 7 * _DAY
    # Hare's task reports: a leader replays those its state does not hold
    # yet, so they outlive any failover; the rounds they complete are
    # recorded in the leader's state long before this.
    task_done_max_age: float = 7 * _DAY
    task_done_max_bytes: int = _GIB
    # Hare's gradients: kept until a restarted aggregator has replayed the
    # rounds it had not applied (a day is far beyond any restart); a chunk
    # is 512 KiB (shared.gradients), under nats-server's 1 MiB message.
    grads_max_age: float = _DAY
    grads_max_bytes: int = 4 * _GIB
    grads_max_msg_size: int = 1024 * 1024
    # The aggregators' checkpoints and final parameters (hops_aggregator).
    checkpoints_max_bytes: int = 2 * _GIB
    duplicate_window: float = 120.0
    max_msg_size: int = MAX_PAYLOAD
    leader_ttl: float = 5.0
    kv_history: int = 5
    # The leader's large state (hops_state): a few versions of a few objects.
    state_max_bytes: int = _GIB
    # Whether this ensure may update hops_state's stream: only its owner's
    # (the scheduler's; nats-server denies it to every other service,
    # services.runtime.identity), the others create it if it is missing.
    owns_state: bool = True
    # Whether this ensure may update hops_aggregator's stream: the aggregator's.
    owns_checkpoints: bool = True

    @classmethod
    def of(cls, settings: RuntimeSettings, service: str) -> JetStreamLayout:
        """The layout service ``service`` (its identity's name) with ``settings`` ensures."""
        replicated = settings.nats_replicas > 1
        return cls(leader_ttl=lease_ttl(settings.leader_ttl, replicated),
                   replicas=settings.nats_replicas, owns_state=service == SCHEDULER,
                   owns_checkpoints=service == AGGREGATOR)

    def streams(self) -> tuple[StreamConfig, ...]:
        limits = {
            subjects.STREAM_JOBS: (None, self.jobs_max_bytes),
            subjects.STREAM_SAMPLES: (self.samples_max_age, self.samples_max_bytes),
            subjects.STREAM_PLANS: (self.plans_max_age, self.plans_max_bytes),
            subjects.STREAM_REPORTS: (self.reports_max_age, self.reports_max_bytes),
            subjects.STREAM_TIMELINE: (None, self.timeline_max_bytes),
            subjects.STREAM_LOGS: (self.logs_max_age, self.logs_max_bytes),
            subjects.STREAM_TASK_DONE: (self.task_done_max_age, self.task_done_max_bytes),
            subjects.STREAM_GRADS: (self.grads_max_age, self.grads_max_bytes),
            subjects.STREAM_AGG_APPLIED: (self.task_done_max_age, self.task_done_max_bytes),
        }
        per_subject = {subjects.STREAM_TIMELINE: self.timeline_per_job,
                       subjects.STREAM_LOGS: self.logs_per_job}
        return tuple(
            StreamConfig(
                name=s.name,
                subjects=list(s.subjects),
                storage=StorageType.FILE,
                max_age=max_age,
                max_bytes=max_bytes,
                max_msg_size=(self.grads_max_msg_size if s == subjects.STREAM_GRADS
                              else self.max_msg_size),
                max_msgs_per_subject=per_subject.get(s, -1),
                num_replicas=self.replicas,
                duplicate_window=self.duplicate_window,
            )
            for s, (max_age, max_bytes) in limits.items()
        )

    def buckets(self) -> tuple[KeyValueConfig, ...]:
        def bucket(name: str, history: int, ttl: float | None = None) -> KeyValueConfig:
            return KeyValueConfig(
                bucket=name,
                history=history,
                ttl=ttl,
                storage=StorageType.FILE,
                replicas=self.replicas,
                max_value_size=self.max_msg_size,
                # Reads by direct get: served by the stream itself rather than
                # queued behind every other JetStream API request.
                direct=True,
            )

        return (
            bucket(subjects.KV_JOBS, self.kv_history),
            bucket(subjects.KV_ALLOC, self.kv_history),
            bucket(subjects.KV_NODES, 1),
            bucket(subjects.KV_LEADER, 1, self.leader_ttl),
            bucket(subjects.KV_TENANTS, 1),
            bucket(subjects.KV_EXPLAIN, 1),
        )

    def object_stores(self) -> tuple[ObjectStoreConfig, ...]:
        return (ObjectStoreConfig(bucket=subjects.OBJ_STATE, storage=StorageType.FILE,
                                  replicas=self.replicas, max_bytes=self.state_max_bytes,
                                  description="the scheduler leader's large state"),
                ObjectStoreConfig(bucket=subjects.OBJ_AGGREGATOR, storage=StorageType.FILE,
                                  replicas=self.replicas, max_bytes=self.checkpoints_max_bytes,
                                  description="the aggregators' checkpoints and final "
                                              "parameters"))

    def owns(self, bucket: str) -> bool:
        """Whether this ensure may update object store ``bucket``'s limits."""
        return self.owns_checkpoints if bucket == subjects.OBJ_AGGREGATOR else self.owns_state


async def ensure_jetstream(js: JetStreamContext, layout: JetStreamLayout | None = None) -> None:
    """Create the streams, KV buckets and object stores, or update them to ``layout``;
    calling it again (from any number of services) changes nothing. On a
    cluster that is still electing its meta leader, each is retried. An
    update never lowers what exists (replicas, limits:
    :func:`services.runtime.durability.never_weaker`); what it kept higher
    than ``layout`` asks is logged, once."""
    layout = layout or JetStreamLayout()
    calls = [*(partial(_ensure_stream, js, c) for c in layout.streams()),
             *(partial(_ensure_bucket, js, kv) for kv in layout.buckets()),
             *(partial(_ensure_objects, js, obj, layout.owns(obj.bucket or ""))
               for obj in layout.object_stores())]
    kept: list[str] = []
    for call in calls:
        kept += await _placed_within(js, call, layout.replicas)
    if kept:
        get_logger().warning("the configured JetStream layout is weaker than the existing one; "
                             "kept the existing", replicas=layout.replicas, kept=kept)


class LayoutError(RuntimeError):
    """The layout cannot be made on this NATS deployment: a stable ``code``
    and the reason, in words, for the operator."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PeersPending(Exception):
    """A replicated stream asked for while too few servers are there to keep
    its copies (JetStream's 10005, "no suitable peers for placement", or
    10023, "insufficient resources"): the cluster's servers have not all
    met yet, which passes within seconds of a start, or there are fewer of
    them than ``HOPS_NATS_REPLICAS``, which does not."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.description)
        self.error = error


def _placed(e: APIError) -> None:
    """:class:`PeersPending` for JetStream's answers that say too few servers
    are there for the replicas (10074 comes as a server error, 500)."""
    if e.err_code in (_NO_PEERS, _INSUFFICIENT, _NOT_CLUSTERED):
        raise PeersPending(e) from e


async def _placed_within(js: JetStreamContext, call: Callable[[], Awaitable[list[str]]],
                         replicas: int) -> list[str]:
    """``call()``, retried while JetStream elects its meta leader and, for
    up to :data:`PLACEMENT_WAIT_S`, while it finds too few servers for
    ``replicas`` copies; then :class:`LayoutError` with
    :data:`REPLICAS_EXCEED_CLUSTER` (at once from a server not clustered)."""
    deadline = time.monotonic() + PLACEMENT_WAIT_S
    while True:
        try:
            return await transient_retried(call, ENSURE_RETRY_S)
        except PeersPending as e:
            if replicas <= 1 and e.error.err_code != _NO_PEERS:
                raise e.error from None  # short of storage, not of servers
            if e.error.err_code == _NOT_CLUSTERED or time.monotonic() >= deadline:
                raise replicas_exceed_cluster(replicas, _cluster_size(js), e.error) from e
            await asyncio.sleep(_PLACEMENT_PAUSE_S)


def replicas_exceed_cluster(replicas: int, servers: int | None,
                            error: APIError) -> LayoutError:
    """The refusal of ``HOPS_NATS_REPLICAS=replicas`` on a deployment of
    ``servers`` JetStream servers (None: not known), JetStream's ``error``."""
    have = ("fewer JetStream servers than that" if servers is None
            else f"{servers} JetStream server{'s' if servers != 1 else ''}")
    return LayoutError(REPLICAS_EXCEED_CLUSTER, (
        f"HOPS_NATS_REPLICAS={replicas} but the NATS cluster has {have}: each stream "
        f"would keep a copy on {replicas} servers. Set HOPS_NATS_REPLICAS to at most the "
        f"number of servers (compose runs three with --env-file deploy/nats-cluster.env). "
        f"JetStream said: {error.description} [{error.err_code}]"))


def _cluster_size(js: JetStreamContext) -> int | None:
    """How many servers the connected server says its cluster has (the
    client URLs it gossips, itself included); 1 for a server with no
    cluster, None when its INFO says nothing of either."""
    info: dict[str, object] = getattr(getattr(js, "_nc", None), "_server_info", None) or {}
    urls = info.get("connect_urls")
    if isinstance(urls, list) and urls:
        return len(urls)
    return None if info.get("cluster") else (1 if info else None)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> list[str]:
    try:
        await js.add_stream(config)
    except APIError as e:
        _placed(e)
        if not isinstance(e, BadRequestError) or e.err_code != _STREAM_IN_USE:
            raise
        return await _update(js, config)
    return []


async def _ensure_bucket(js: JetStreamContext, kv: KeyValueConfig) -> list[str]:
    try:
        await js.create_key_value(kv)
    except APIError as e:
        _placed(e)
        if not isinstance(e, BadRequestError) or e.err_code != _STREAM_IN_USE:
            raise
        return await _update_bucket(js, kv)
    return []


async def _ensure_objects(js: JetStreamContext, config: ObjectStoreConfig,
                          owner: bool) -> list[str]:
    try:
        # nats-py sets config.bucket to its first argument: name it again
        await js.create_object_store(config.bucket or "", config=config)
    except APIError as e:
        _placed(e)
        if not isinstance(e, BadRequestError) or e.err_code != _STREAM_IN_USE:
            raise
        if not owner:  # it exists: its limits are its owner's to change
            return []
        info = await js.stream_info(f"OBJ_{config.bucket}")
        wanted = dataclasses.replace(info.config, num_replicas=config.replicas,
                                     max_bytes=config.max_bytes)
        return await _update(js, wanted, info.config)
    return []


async def _update_bucket(js: JetStreamContext, kv: KeyValueConfig) -> list[str]:
    """Apply a changed TTL, history or size limit to an existing bucket."""
    info = await js.stream_info(f"KV_{kv.bucket}")
    wanted = dataclasses.replace(
        info.config, max_age=kv.ttl, max_msgs_per_subject=kv.history,
        max_msg_size=kv.max_value_size, allow_direct=kv.direct, num_replicas=kv.replicas)
    if not kv.ttl:
        return await _update(js, wanted, info.config)
    # a TTL is a lease's (hops_leader): it follows the setting, up or down
    wanted.duplicate_window = min(kv.ttl, 120.0)
    lease = tuple(f for f in DURABLE if f != "max_age")
    return await _update(js, wanted, info.config, lease)


async def _update(js: JetStreamContext, wanted: StreamConfig,
                  existing: StreamConfig | None = None,
                  limits: tuple[str, ...] = DURABLE) -> list[str]:
    """Update the stream to ``wanted``, but none of ``limits`` below
    ``existing``'s (read when not given); the notes of the limits kept."""
    if existing is None:
        existing = (await js.stream_info(wanted.name or "")).config
    config, notes = never_weaker(existing, wanted, limits)
    if config.max_age and config.duplicate_window > config.max_age:
        config.duplicate_window = config.max_age  # JetStream: at most the age limit
    if config != existing:
        await js.update_stream(config)
    return [f"{config.name}: {note}" for note in notes]
