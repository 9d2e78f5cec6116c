"""A resubmission of the very spec is answered as its acceptance, on a real
nats-server (services/scheduler/admission.py, docs/live.md *A NATS cluster*).

The case the record cannot show: an earlier attempt's ``job_submitted`` is
on ``HOPS_JOBS`` but its record is not written yet (admission still
retrying it through an election, the gateway having answered 503). The
retry's publish is answered *duplicate*; admission reads the stored event
and answers the acceptance when the spec is the same, a conflict when not.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client as NATS

from scheduling.live import admission as adm
from services.runtime.bus import ErrorReporter, Rejected, connect, ensure_jetstream, publish_event
from services.runtime.logging import get_logger
from services.runtime.service import ServiceContext
from services.runtime.settings import RuntimeSettings
from services.scheduler.admission import Admission
from shared import events as ev
from shared import subjects
from shared.cluster import GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from tests.engines_nats import require_nats_server
from tests.natsfix import nats_server, nats_url  # noqa: F401

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
NODE = NodeRecord(server=Server(ServerId("a0"), A.name, 8), gpu_type=A)
SPEC = JobSpec(JobId("j1"), "resnet50", 32, 25_557_032, 1_000_000, requirements=(1, 2))


@pytest.fixture
def needs_nats() -> None:
    require_nats_server()


@pytest.fixture
async def nc(needs_nats: None, nats_url: str) -> AsyncIterator[NATS]:  # noqa: F811
    client = await connect(RuntimeSettings(nats_servers=(nats_url,)), "test")
    await ensure_jetstream(client.jetstream())
    yield client
    await client.close()


async def admission(nc: NATS) -> Admission:
    js = nc.jetstream()
    ctx = ServiceContext("scheduler", RuntimeSettings(), nc, js, get_logger(),
                         ErrorReporter(nc, "scheduler"))
    handler = Admission(ctx, await js.key_value(subjects.KV_JOBS), 8)
    handler._nodes = (time.monotonic(), [NODE])  # registered "just now"
    return handler


async def test_a_retry_whose_first_attempt_is_only_on_the_stream_is_its_acceptance(
        nc: NATS) -> None:
    js = nc.jetstream()
    # the first attempt: stored on HOPS_JOBS, its record not written (yet)
    stored = adm.accepted_spec(adm.keyed_spec(SPEC), 1000.0)
    await publish_event(js, subjects.job_events("j1"),
                        ev.JobSubmitted(job_id=JobId("j1"), spec=stored, at=1000.0),
                        msg_id="j1")
    handler = await admission(nc)
    reply = await handler.submit(ev.SubmitJob(spec=SPEC), subjects.JOBS_SUBMIT)
    assert reply == ev.Reply(ok=True, job_id="j1")
    assert (await js.stream_info(subjects.STREAM_JOBS.name)).state.messages == 1
    other = msgspec.structs.replace(SPEC, batch_size=64)
    with pytest.raises(Rejected) as refused:
        await handler.submit(ev.SubmitJob(spec=other), subjects.JOBS_SUBMIT)
    assert refused.value.code == adm.CONFLICT and "submitted already" in str(refused.value)
