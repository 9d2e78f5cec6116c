"""The JetStream layout of the live system: its streams, KV buckets and
object store, their limits and replicas, and :func:`ensure_jetstream`, which every service runs
at start (re-exported by :mod:`services.runtime.bus`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from scheduling.live.lease import lease_ttl
from services.runtime.durability import DURABLE, never_weaker
from services.runtime.logging import get_logger
from services.runtime.retry import transient_retried
from services.runtime.settings import DEFAULT_REPLICAS, RuntimeSettings
from shared import subjects
from shared.events import MAX_PAYLOAD

_STREAM_IN_USE = 10058  # JetStream: stream name already in use with a different configuration
_NO_PEERS = 10005  # JetStream: no suitable peers for placement (servers not all met yet)
_GIB = 1024**3
_DAY = 86400.0
# How long a service's start waits for JetStream to answer (a cluster whose
# members are starting too, or electing a meta leader).
ENSURE_RETRY_S = 60.0


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
    duplicate_window: float = 120.0
    max_msg_size: int = MAX_PAYLOAD
    leader_ttl: float = 5.0
    kv_history: int = 5
    # The leader's large state (hops_state): a few versions of a few objects.
    state_max_bytes: int = _GIB

    @classmethod
    def of(cls, settings: RuntimeSettings) -> JetStreamLayout:
        """The layout a service with ``settings`` ensures."""
        replicated = settings.nats_replicas > 1
        return cls(leader_ttl=lease_ttl(settings.leader_ttl, replicated),
                   replicas=settings.nats_replicas)

    def streams(self) -> tuple[StreamConfig, ...]:
        limits = {
            subjects.STREAM_JOBS: (None, self.jobs_max_bytes),
            subjects.STREAM_SAMPLES: (self.samples_max_age, self.samples_max_bytes),
            subjects.STREAM_PLANS: (self.plans_max_age, self.plans_max_bytes),
            subjects.STREAM_REPORTS: (self.reports_max_age, self.reports_max_bytes),
            subjects.STREAM_TIMELINE: (None, self.timeline_max_bytes),
            subjects.STREAM_LOGS: (self.logs_max_age, self.logs_max_bytes),
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
                max_msg_size=self.max_msg_size,
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
            bucket(subjects.KV_LAYERS, 1),
            bucket(subjects.KV_TENANTS, 1),
            bucket(subjects.KV_EXPLAIN, 1),
        )

    def object_stores(self) -> tuple[ObjectStoreConfig, ...]:
        return (ObjectStoreConfig(bucket=subjects.OBJ_STATE, storage=StorageType.FILE,
                                  replicas=self.replicas, max_bytes=self.state_max_bytes,
                                  description="the scheduler leader's large state"),)


async def ensure_jetstream(js: JetStreamContext, layout: JetStreamLayout | None = None) -> None:
    """Create the streams, KV buckets and object stores, or update them to ``layout``;
    calling it again (from any number of services) changes nothing. On a
    cluster that is still electing its meta leader, each is retried. An
    update never lowers what exists (replicas, limits:
    :func:`services.runtime.durability.never_weaker`); what it kept higher
    than ``layout`` asks is logged, once."""
    layout = layout or JetStreamLayout()
    kept: list[str] = []
    for config in layout.streams():
        kept += await transient_retried(partial(_ensure_stream, js, config), ENSURE_RETRY_S)
    for kv in layout.buckets():
        kept += await transient_retried(partial(_ensure_bucket, js, kv), ENSURE_RETRY_S)
    for obj in layout.object_stores():
        kept += await transient_retried(partial(_ensure_objects, js, obj), ENSURE_RETRY_S)
    if kept:
        get_logger().warning("the configured JetStream layout is weaker than the existing one; "
                             "kept the existing", replicas=layout.replicas, kept=kept)


class PeersPending(nats.errors.TimeoutError):
    """A replicated stream asked for before the cluster's servers have all
    met (JetStream's 10005, "no suitable peers for placement"): it passes
    within seconds of a start, so it is retried as a timeout is."""


def _placed(e: BadRequestError) -> None:
    if e.err_code == _NO_PEERS:
        raise PeersPending() from e


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> list[str]:
    try:
        await js.add_stream(config)
    except BadRequestError as e:
        _placed(e)
        if e.err_code != _STREAM_IN_USE:
            raise
        return await _update(js, config)
    return []


async def _ensure_bucket(js: JetStreamContext, kv: KeyValueConfig) -> list[str]:
    try:
        await js.create_key_value(kv)
    except BadRequestError as e:
        _placed(e)
        if e.err_code != _STREAM_IN_USE:
            raise
        return await _update_bucket(js, kv)
    return []


async def _ensure_objects(js: JetStreamContext, config: ObjectStoreConfig) -> list[str]:
    try:
        # nats-py sets config.bucket to its first argument: name it again
        await js.create_object_store(config.bucket or "", config=config)
    except BadRequestError as e:
        _placed(e)
        if e.err_code != _STREAM_IN_USE:
            raise
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
    await js.update_stream(config)
    return [f"{config.name}: {note}" for note in notes]
