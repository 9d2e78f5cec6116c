"""What an ensure of the JetStream layout (services/runtime/layout.py) does
with what exists and with a deployment too small for it.

* It never weakens what exists (services/runtime/durability.py): a
  configured limit below the existing one keeps the existing; a higher one
  is applied; unlimited (unset, 0, -1) is the strongest. On a real server,
  an ensure with smaller limits keeps the streams' and the object store's
  and logs once which it kept; the leader bucket's TTL (a lease) still
  follows the setting.
* ``HOPS_NATS_REPLICAS`` above the number of servers fails at once, with
  the code ``nats_replicas_exceed_cluster`` and the numbers in words (the
  cluster case: tests/test_nats_cluster.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError

from services.runtime.bus import JetStreamLayout, LayoutError, connect, ensure_jetstream
from services.runtime.durability import never_weaker
from services.runtime.layout import REPLICAS_EXCEED_CLUSTER, replicas_exceed_cluster
from services.runtime.settings import RuntimeSettings
from shared import subjects
from tests.engines_nats import require_nats_server
from tests.natsfix import nats_server, nats_url  # noqa: F401

GIB = 1024**3


def test_a_lower_replica_count_or_limit_keeps_the_existing() -> None:
    existing = StreamConfig(name="S", num_replicas=3, max_bytes=4 * GIB, max_age=86400.0)
    wanted = StreamConfig(name="S", num_replicas=1, max_bytes=GIB, max_age=3600.0,
                          description="new")
    config, notes = never_weaker(existing, wanted)
    assert (config.num_replicas, config.max_bytes, config.max_age) == (3, 4 * GIB, 86400.0)
    assert config.description == "new"  # what is not a limit is applied
    assert notes == ["num_replicas 3 kept (configured 1)",
                     f"max_bytes {4 * GIB} kept (configured {GIB})",
                     "max_age 86400 kept (configured 3600)"]


def test_a_higher_or_unlimited_one_is_applied() -> None:
    existing = StreamConfig(name="S", num_replicas=1, max_bytes=GIB, max_age=3600.0,
                            max_msgs_per_subject=5)
    wanted = StreamConfig(name="S", num_replicas=3, max_bytes=-1, max_age=None,
                          max_msgs_per_subject=-1)
    config, notes = never_weaker(existing, wanted)
    assert config == wanted and notes == []
    # and the way back: unlimited is not lowered to a limit
    config, notes = never_weaker(wanted, existing)
    assert (config.max_bytes, config.max_age, config.max_msgs_per_subject) == (-1, None, -1)
    assert config.num_replicas == 3 and len(notes) == 4


def test_limits_left_out_follow_the_setting() -> None:
    existing = StreamConfig(name="KV_hops_leader", max_age=9.5, num_replicas=3)
    wanted = StreamConfig(name="KV_hops_leader", max_age=5.0, num_replicas=1)
    config, notes = never_weaker(existing, wanted, ("num_replicas",))
    assert (config.max_age, config.num_replicas) == (5.0, 3) and len(notes) == 1


def test_the_refusal_of_too_many_replicas_names_both_numbers() -> None:
    error = BadRequestError(code=500, err_code=10005,
                            description="no suitable peers for placement")
    refused = replicas_exceed_cluster(5, 3, error)
    assert refused.code == REPLICAS_EXCEED_CLUSTER == "nats_replicas_exceed_cluster"
    assert str(refused).startswith("HOPS_NATS_REPLICAS=5 but the NATS cluster has 3 JetStream "
                                   "servers: each stream would keep a copy on 5 servers.")
    assert str(refused).endswith("JetStream said: no suitable peers for placement [10005]")
    assert "has fewer JetStream servers than that:" in str(replicas_exceed_cluster(5, None, error))


@pytest.fixture
def needs_nats() -> None:
    require_nats_server()  # before the server fixture starts one


@pytest.fixture
async def nc(needs_nats: None, nats_url: str) -> AsyncIterator[NATS]:  # noqa: F811
    client = await connect(RuntimeSettings(nats_servers=(nats_url,)), "test")
    yield client
    await client.close()


async def test_an_ensure_with_smaller_limits_keeps_the_existing_and_says_so(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js, JetStreamLayout(jobs_max_bytes=4 * GIB, state_max_bytes=2 * GIB))
    with structlog.testing.capture_logs() as logs:
        await ensure_jetstream(js, JetStreamLayout(jobs_max_bytes=GIB, state_max_bytes=GIB,
                                                   leader_ttl=3.0))
    assert (await js.stream_info(subjects.STREAM_JOBS.name)).config.max_bytes == 4 * GIB
    assert (await js.stream_info(f"OBJ_{subjects.OBJ_STATE}")).config.max_bytes == 2 * GIB
    # the lease's TTL is the setting's, lower or not
    assert (await js.stream_info(f"KV_{subjects.KV_LEADER}")).config.max_age == 3.0
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert len(warned) == 1, logs  # once for the whole layout
    assert f"HOPS_JOBS: max_bytes {4 * GIB} kept (configured {GIB})" in warned[0]["kept"]
    assert any(k.startswith("OBJ_hops_state: max_bytes") for k in warned[0]["kept"])
    with structlog.testing.capture_logs() as logs:  # a larger one is applied, silently
        await ensure_jetstream(js, JetStreamLayout(jobs_max_bytes=8 * GIB,
                                                   state_max_bytes=2 * GIB))
    assert (await js.stream_info(subjects.STREAM_JOBS.name)).config.max_bytes == 8 * GIB
    assert not [e for e in logs if e["log_level"] == "warning"]


async def test_replicas_above_a_single_server_fail_at_once_saying_why(nc: NATS) -> None:
    began = time.monotonic()
    with pytest.raises(LayoutError) as refused:
        await ensure_jetstream(nc.jetstream(), JetStreamLayout(replicas=3))
    assert time.monotonic() - began < 5.0  # not the 60 s of a JetStream that does not answer
    assert refused.value.code == REPLICAS_EXCEED_CLUSTER
    assert str(refused.value).startswith(
        "HOPS_NATS_REPLICAS=3 but the NATS cluster has 1 JetStream server:"), refused.value
    await ensure_jetstream(nc.jetstream(), JetStreamLayout(replicas=1))  # R1 still goes
