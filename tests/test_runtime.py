"""The service runtime against a real nats-server: JetStream layout, request
handlers and consumers that survive bad input, restarts, health, settings,
logging and the service runner."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import msgspec
import nats.errors
import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import StorageType
from nats.js.errors import NotFoundError

from services.runtime.bus import (
    ErrorReporter,
    JetStreamLayout,
    Rejected,
    connect,
    ensure_jetstream,
    publish_event,
    request,
    serve_requests,
)
from services.runtime.consumer import ConsumerSpec, Delivery, Later, Terminate, consume
from services.runtime.health import HealthServer
from services.runtime.logging import configure_logging
from services.runtime.natsd import EmbeddedNats, NatsServerError
from services.runtime.service import ServiceContext, serve, service_main
from services.runtime.settings import (
    RuntimeSettings,
    SettingsError,
    build_parser,
    env_bool,
    env_float,
    env_int,
    from_env,
    parse_args,
)
from shared import events as ev
from shared import subjects
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ThroughputSample
from tests.natsfix import nats_server, nats_url

__all__ = ["nats_server", "nats_url"]  # fixtures

ROOT = Path(__file__).resolve().parent.parent


def spec(job_id: str) -> JobSpec:
    return JobSpec(JobId(job_id), "resnet50", 32, 25_557_032, 1_000_000, requirements=(1, 2))


def fast_consumer(durable: str, subject: str, **kw: int) -> ConsumerSpec:
    stream = "HOPS_JOBS" if subject.startswith("hops.v1.jobs") else "HOPS_SAMPLES"
    return ConsumerSpec(stream, durable, subject, fetch_timeout=0.2, nak_delay=0.1, **kw)


def settings_for(url: str, **kw: object) -> RuntimeSettings:
    return RuntimeSettings(nats_servers=(url,), reconnect_wait=0.1, **kw)  # type: ignore[arg-type]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NATS]:
    client = await connect(settings_for(nats_url), "test")
    yield client
    await client.close()


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def error_records(nc: NATS) -> asyncio.Queue[ev.ErrorRecord]:
    queue: asyncio.Queue[ev.ErrorRecord] = asyncio.Queue()

    async def on_msg(msg: object) -> None:
        await queue.put(ev.decode_error_record(msg.data))  # type: ignore[attr-defined]

    await nc.subscribe(subjects.ERRORS, cb=on_msg)
    await asyncio.sleep(0)
    await nc.flush()
    return queue


# --- JetStream layout --------------------------------------------------------------


async def test_streams_and_buckets_are_created_idempotently(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js)
    await ensure_jetstream(js)
    for stream in subjects.STREAMS:
        info = await js.stream_info(stream.name)
        assert info.config.subjects == list(stream.subjects)
        assert info.config.storage == StorageType.FILE
    for bucket in subjects.KV_BUCKETS:
        await (await js.key_value(bucket)).put("k", b"v")
    with pytest.raises(NotFoundError):  # an earlier version's bucket: not made any more
        await js.stream_info(f"KV_{subjects.KV_LAYERS}")
    leader = await js.stream_info(f"KV_{subjects.KV_LEADER}")
    assert leader.config.max_age == JetStreamLayout().leader_ttl == 5.0
    await ensure_jetstream(js, JetStreamLayout(leader_ttl=3.0, samples_max_age=30 * 86400.0))
    assert (await js.stream_info(f"KV_{subjects.KV_LEADER}")).config.max_age == 3.0
    assert (await js.stream_info("HOPS_SAMPLES")).config.max_age == 30 * 86400.0


async def test_publish_with_msg_id_is_deduplicated(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js)
    event = ev.JobFinished(job_id=JobId("j1"), at=1.0)
    first = await publish_event(js, subjects.job_events("j1"), event, msg_id="j1:finished")
    again = await publish_event(js, subjects.job_events("j1"), event, msg_id="j1:finished")
    assert first.stream == "HOPS_JOBS" and not first.duplicate and again.duplicate
    assert (await js.stream_info("HOPS_JOBS")).state.messages == 1


# --- request handlers --------------------------------------------------------------


async def test_request_handler_survives_bad_input(nc: NATS) -> None:
    errors = await error_records(nc)
    seen: list[str] = []

    async def handle(req: ev.SubmitJob) -> ev.Message:
        if req.spec.id == "crash":
            raise RuntimeError("boom")
        if req.spec.id == "dup":
            raise Rejected("duplicate", "job dup exists")
        seen.append(req.spec.id)
        return ev.Reply(ok=True, job_id=req.spec.id)

    reporter = ErrorReporter(nc, "gateway", clock=lambda: 42.0)
    await serve_requests(nc, subjects.JOBS_SUBMIT, ev.decode_submit, handle, reporter)

    async def ask(data: bytes) -> ev.Reply:
        return ev.decode_reply((await nc.request(subjects.JOBS_SUBMIT, data, timeout=2)).data)

    ok = await request(nc, subjects.JOBS_SUBMIT, ev.SubmitJob(spec=spec("a")), ev.decode_reply)
    assert ok == ev.Reply(ok=True, job_id="a")
    bad = await ask(b'{"type": "submit_job", "spec": ')
    assert not bad.ok and bad.code == ev.MALFORMED and "malformed JSON" in bad.error
    record = await asyncio.wait_for(errors.get(), 2)
    assert (record.service, record.subject, record.code, record.at) == (
        "gateway",
        subjects.JOBS_SUBMIT,
        ev.MALFORMED,
        42.0,
    )
    assert record.excerpt.startswith('{"type": "submit_job"')
    crash = await ask(ev.encode(ev.SubmitJob(spec=spec("crash"))))
    assert (crash.ok, crash.code, crash.error) == (False, ev.INTERNAL, "RuntimeError: boom")
    assert (await asyncio.wait_for(errors.get(), 2)).code == ev.INTERNAL
    dup = await ask(msgspec.json.encode(spec("dup")))  # a bare JobSpec
    assert (dup.ok, dup.code) == (False, "duplicate")
    assert await ask(msgspec.json.encode(spec("b"))) == ev.Reply(ok=True, job_id="b")
    assert seen == ["a", "b"] and errors.empty()  # a rejection is no error record


async def test_failed_reply_of_another_shape(nc: NATS) -> None:
    async def handle(req: ev.EstimateRequest) -> ev.Message:
        return ev.EstimateReply()

    reporter = ErrorReporter(nc, "estimator")
    await serve_requests(
        nc,
        subjects.ESTIMATE,
        ev.decode_estimate_request,
        handle,
        reporter,
        queue=subjects.ESTIMATOR_QUEUE,
        on_error=lambda code, error: ev.EstimateReply(ok=False, code=code, error=error),
    )
    reply = await nc.request(subjects.ESTIMATE, b'{"type": "cancel_job", "job_id": "x"}')
    decoded = ev.decode_estimate_reply(reply.data)
    assert (
        not decoded.ok and decoded.code == ev.UNKNOWN_TYPE and "estimate_request" in decoded.error
    )


# --- durable consumers -------------------------------------------------------------


async def test_consumer_redelivers_after_nak_and_handles_each_event_once(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js)
    errors = await error_records(nc)
    events = [ev.JobSubmitted(job_id=JobId(j), spec=spec(j), at=1.0) for j in ("a", "b", "c")]
    for e in [*events, events[1]]:  # "b" twice: a producer retried without a msg_id
        await publish_event(js, subjects.job_events(e.job_id), e)
    await js.publish(subjects.job_events("x"), b'{"type": "job_exploded"}')
    handled: list[str] = []
    deliveries: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def handle(event: ev.JobEvent, delivery: Delivery) -> None:
        deliveries.append((event.job_id, delivery.num_delivered))
        key = f"{event.job_id}:{event.__struct_config__.tag}"
        if key in handled:  # idempotent: keyed by the event's identity
            return
        if event.job_id == "b" and delivery.num_delivered == 1:
            raise RuntimeError("transient")
        handled.append(key)
        if len(handled) == 3:
            done.set()

    consumer = fast_consumer("test", subjects.JOB_EVENTS_ALL)
    task = asyncio.create_task(
        consume(js, consumer, ev.decode_job_event, handle, ErrorReporter(nc, "t"))
    )
    await asyncio.wait_for(done.wait(), 5)
    record = await asyncio.wait_for(errors.get(), 2)
    assert record.code == ev.UNKNOWN_TYPE and record.subject == "hops.v1.jobs.events.x"
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert handled == ["a:job_submitted", "c:job_submitted", "b:job_submitted"]
    assert ("b", 2) in deliveries
    info = await js.consumer_info("HOPS_JOBS", "test")
    assert info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_poison_message_is_given_up_after_max_deliver(nc: NATS) -> None:
    js = nc.jetstream()
    await ensure_jetstream(js)
    errors = await error_records(nc)
    sample = ev.SampleReported(sample=_sample("p"), at=1.0)
    await publish_event(js, subjects.samples("p"), sample)
    calls: list[int] = []

    async def handle(event: ev.SampleEvent, delivery: Delivery) -> None:
        calls.append(delivery.num_delivered)
        raise ValueError("never works")

    consumer = fast_consumer("poison", subjects.SAMPLES_ALL, max_deliver=3)
    task = asyncio.create_task(
        consume(js, consumer, ev.decode_sample_event, handle, ErrorReporter(nc, "t"))
    )
    record = await asyncio.wait_for(errors.get(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls == [1, 2, 3]
    assert record.code == ev.INTERNAL and "gave up after 3 deliveries" in record.error
    assert (await js.consumer_info("HOPS_SAMPLES", "poison")).num_ack_pending == 0


async def test_a_handler_may_judge_later_or_terminate_quietly(nc: NATS) -> None:
    """``Later``: redelivered after the nak delay; ``Terminate``: never again,
    and no error record (the handler audited its refusal itself)."""
    js = nc.jetstream()
    await ensure_jetstream(js)
    errors = await error_records(nc)
    for job in ("later", "never"):
        await publish_event(js, subjects.samples(job), ev.SampleReported(sample=_sample(job)),
                            msg_id=f"id-{job}")
    seen: list[tuple[str, int, str]] = []

    async def handle(event: ev.SampleEvent, delivery: Delivery) -> None:
        assert isinstance(event, ev.SampleReported)
        seen.append((event.sample.job_id, delivery.num_delivered, delivery.msg_id))
        if event.sample.job_id == "never":
            raise Terminate("refused")
        if delivery.num_delivered < 3:
            raise Later("not yet")

    consumer = fast_consumer("judge", subjects.SAMPLES_ALL, max_deliver=5)
    task = asyncio.create_task(
        consume(js, consumer, ev.decode_sample_event, handle, ErrorReporter(nc, "t"))
    )
    await eventually(lambda: ("later", 3, "id-later") in seen)
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert sorted(seen) == [("later", 1, "id-later"), ("later", 2, "id-later"),
                            ("later", 3, "id-later"), ("never", 1, "id-never")]
    assert errors.empty()
    info = await js.consumer_info("HOPS_SAMPLES", "judge")
    assert info.num_pending == 0 and info.num_ack_pending == 0


def _sample(job_id: str) -> ThroughputSample:
    return ThroughputSample(JobId(job_id), ServerId("s0"), GpuType("rtx"), per_gpu_throughput=1.0)


# --- restarts --------------------------------------------------------------------------


async def test_jetstream_state_survives_a_server_restart(nats_server: EmbeddedNats) -> None:
    nc = await connect(settings_for(nats_server.url), "test")
    js = nc.jetstream()
    await ensure_jetstream(js)
    await publish_event(js, subjects.job_events("a"), ev.JobFinished(job_id=JobId("a"), at=1.0))
    await (await js.key_value(subjects.KV_JOBS)).put("a", b"finished")
    seen: list[str] = []
    arrived = asyncio.Event()

    async def handle(event: ev.JobEvent, delivery: Delivery) -> None:
        seen.append(event.job_id)
        arrived.set()

    consumer = fast_consumer("survivor", subjects.JOB_EVENTS_ALL)
    task = asyncio.create_task(
        consume(js, consumer, ev.decode_job_event, handle, ErrorReporter(nc, "t"))
    )
    await asyncio.wait_for(arrived.wait(), 5)
    port = nats_server.port
    await asyncio.to_thread(nats_server.restart)
    assert nats_server.port == port
    arrived.clear()
    await eventually(lambda: nc.stats["reconnects"] >= 1 and nc.is_connected)  # by itself
    assert (await js.stream_info("HOPS_JOBS")).state.messages == 1
    assert (await (await js.key_value(subjects.KV_JOBS)).get("a")).value == b"finished"
    await publish_event(js, subjects.job_events("b"), ev.JobFinished(job_id=JobId("b"), at=2.0))
    await asyncio.wait_for(arrived.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await nc.close()
    assert seen == ["a", "b"]  # the durable consumer resumed where it was


def test_embedded_nats_reports_a_failed_start(tmp_path: Path, nats_server: EmbeddedNats) -> None:
    clash = EmbeddedNats(tmp_path / "other", port=nats_server.port, start_timeout=5.0)
    with pytest.raises(NatsServerError, match="exited"):
        clash.start()
    assert not clash.running
    with pytest.raises(NatsServerError, match="not started"):
        _ = EmbeddedNats(tmp_path / "third").url


# --- health --------------------------------------------------------------------------


async def http(port: int, line: str) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{line}\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def test_health_endpoint_follows_the_connection() -> None:
    state = ["connected"]
    health = HealthServer("placer", lambda: state[0], host="127.0.0.1", details=lambda: {"x": 1})
    port = await health.start()
    try:
        code, body = await http(port, "GET /healthz HTTP/1.1")
        assert (code, body) == (200, {"service": "placer", "ok": True, "nats": "connected", "x": 1})
        state[0] = "reconnecting"
        code, body = await http(port, "GET /healthz?verbose=1 HTTP/1.1")
        assert (code, body["ok"], body["nats"]) == (503, False, "reconnecting")
        assert (await http(port, "GET /metrics HTTP/1.1"))[0] == 404
        assert (await http(port, "POST /healthz HTTP/1.1"))[0] == 405
        assert (await http(port, "garbage"))[0] == 400
    finally:
        await health.stop()


# --- the service runner -------------------------------------------------------------


async def test_serve_runs_a_service_and_stops_cleanly(nats_server: EmbeddedNats) -> None:
    stop = asyncio.Event()
    contexts: list[ServiceContext] = []

    async def main(ctx: ServiceContext) -> None:
        async def handle(req: ev.CancelJob) -> ev.Message:
            return ev.Reply(ok=True, job_id=req.job_id)

        async def ignore(event: ev.JobEvent, delivery: Delivery) -> None:
            return None

        await serve_requests(ctx.nc, subjects.JOBS_CANCEL, ev.decode_cancel, handle, ctx.reporter)
        consumer = fast_consumer("svc", subjects.JOB_EVENTS_ALL)
        ctx.spawn(consume(ctx.js, consumer, ev.decode_job_event, ignore, ctx.reporter))
        contexts.append(ctx)

    settings = settings_for(nats_server.url, health_port=0, health_host="127.0.0.1")
    service = asyncio.create_task(serve("monitor", main, settings, stop=stop, grace=0.5))
    client = await connect(settings_for(nats_server.url), "client")
    await eventually(lambda: bool(contexts))
    port = contexts[0].health_port
    assert port and (await http(port, "GET /healthz HTTP/1.1"))[0] == 200
    cancel = ev.CancelJob(job_id=JobId("j9"))
    assert (await request(client, subjects.JOBS_CANCEL, cancel, ev.decode_reply)).ok
    await asyncio.to_thread(nats_server.stop)
    await eventually(lambda: not contexts[0].nc.is_connected)
    assert (await http(port, "GET /healthz HTTP/1.1")) == (
        503,
        {"service": "monitor", "ok": False, "nats": "reconnecting"},
    )
    await asyncio.to_thread(nats_server.start)
    await eventually(lambda: contexts[0].nc.is_connected and client.is_connected)
    assert (await http(port, "GET /healthz HTTP/1.1"))[0] == 200
    # The reconnected service resends its subscriptions on its own time: a
    # request before the server has them finds no responder, so ask again.
    await contexts[0].nc.flush()
    for _ in range(100):
        try:
            reply = await request(client, subjects.JOBS_CANCEL, cancel, ev.decode_reply)
            break
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.05)
    else:
        pytest.fail("the service never answered after the server restarted")
    assert reply.ok
    stop.set()
    assert await asyncio.wait_for(service, 5) == 0
    assert contexts[0].nc.is_closed
    await client.close()


async def test_a_crash_stops_the_service_with_exit_code_1(nats_url: str) -> None:
    async def main(ctx: ServiceContext) -> None:
        raise RuntimeError("bad start")

    async def crash_later() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("loop died")

    async def main_with_task(ctx: ServiceContext) -> None:
        ctx.spawn(crash_later(), "loop")
        await ctx.stopping.wait()

    assert await asyncio.wait_for(serve("placer", main, settings_for(nats_url)), 5) == 1
    assert await asyncio.wait_for(serve("placer", main_with_task, settings_for(nats_url)), 5) == 1


async def test_a_service_without_the_jetstream_api_creates_no_streams(nats_url: str) -> None:
    """An executor's identity may not use ``$JS.API``: it runs on the streams
    the system services made, and serve() must not try to make them."""
    seen: list[list[str]] = []

    async def main(ctx: ServiceContext) -> None:
        seen.append(sorted(s.config.name for s in await ctx.js.streams_info()))
        ctx.stopping.set()

    settings = settings_for(nats_url)
    assert await asyncio.wait_for(serve("x", main, settings, ensure_streams=False), 5) == 0
    assert await asyncio.wait_for(serve("y", main, settings), 5) == 0
    assert seen[0] == []
    assert {s.name for s in subjects.STREAMS} <= set(seen[1])


async def test_run_service_stops_on_sigterm_and_logs_json(nats_url: str, tmp_path: Path) -> None:
    script = tmp_path / "demo.py"
    script.write_text(
        "import sys\n"
        "from services.runtime.bus import serve_requests\n"
        "from services.runtime.service import run_service\n"
        "from shared import events, subjects\n\n"
        "async def main(ctx):\n"
        "    async def handle(req):\n"
        "        return events.Reply(ok=True, job_id=req.spec.id)\n"
        "    await serve_requests(ctx.nc, subjects.JOBS_SUBMIT, events.decode_submit,\n"
        "                         handle, ctx.reporter)\n"
        "    ctx.log.info('ready')\n\n"
        "sys.exit(run_service('demo', main))\n"
    )
    env = os.environ | {"HOPS_NATS_URL": nats_url, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    lines: list[dict[str, object]] = []
    while not lines or lines[-1]["event"] != "ready":
        lines.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 10)))
    client = await connect(settings_for(nats_url), "client")
    reply = await request(
        client, subjects.JOBS_SUBMIT, ev.SubmitJob(spec=spec("z")), ev.decode_reply
    )
    assert reply == ev.Reply(ok=True, job_id="z")
    await client.close()
    proc.send_signal(signal.SIGTERM)
    rest = await asyncio.wait_for(proc.stdout.read(), 10)
    assert await proc.wait() == 0
    lines += [json.loads(line) for line in rest.splitlines()]
    assert [line["event"] for line in lines][-2:] == ["nats connection closed", "service stopped"]
    assert not [line for line in lines if line["level"] not in ("info", "debug")]
    for line in lines:
        assert line["service"] == "demo" and {"timestamp", "level", "event"} <= line.keys()


# --- settings and logging ------------------------------------------------------------


def test_settings_from_environment_and_flags(tmp_path: Path) -> None:
    creds = tmp_path / "user.creds"
    creds.write_text("creds")
    env = {
        "HOPS_NATS_URL": "nats://a:4222, nats://b:4222",
        "HOPS_NATS_CREDS": str(creds),
        "HOPS_HEALTH_PORT": "8080",
        "HOPS_LOG_LEVEL": "DEBUG",
    }
    settings = from_env(env)
    assert settings.nats_servers == ("nats://a:4222", "nats://b:4222")
    assert settings.nats_url == "nats://a:4222,nats://b:4222"
    assert (settings.nats_creds, settings.health_port, settings.log_level) == (
        str(creds),
        8080,
        "debug",
    )
    assert from_env({}) == RuntimeSettings()
    flags = ["--nats-url", "tls://c:1", "--health-port", "0", "--leader-ttl", "4"]
    settings, _ = parse_args(flags, env=env)
    assert (settings.nats_servers, settings.health_port, settings.leader_ttl) == (
        ("tls://c:1",),
        0,
        4.0,
    )
    assert settings.log_level == "debug"  # from the environment
    assert RuntimeSettings().nats_replicas == JetStreamLayout().replicas == 1
    replicated = from_env({"HOPS_NATS_REPLICAS": "3"})
    layout = JetStreamLayout.of(replicated, "scheduler")
    assert (replicated.nats_replicas, layout.replicas, layout.leader_ttl) == (3, 3, 12.5)
    assert layout.owns_state and not JetStreamLayout.of(replicated, "gateway").owns_state
    assert {s.num_replicas for s in layout.streams()} == {3}
    assert {b.replicas for b in layout.buckets()} == {3}
    assert {o.replicas for o in layout.object_stores()} == {3}


def test_services_add_their_own_flags() -> None:
    parser = build_parser("scheduler")
    parser.add_argument("--round-s", type=float, default=env_float("HOPS_ROUND_S", 60.0, env={}))
    settings, args = parse_args(["--round-s", "30"], parser=parser, env={})
    assert args.round_s == 30.0 and settings == RuntimeSettings()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOPS_HEALTH_PORT": "http"}, "HOPS_HEALTH_PORT must be an integer, got 'http'"),
        ({"HOPS_HEALTH_PORT": "70000"}, "HOPS_HEALTH_PORT must be a port number"),
        ({"HOPS_NATS_URL": "localhost:4222"}, "'localhost:4222' is not a NATS URL"),
        ({"HOPS_NATS_URL": " , "}, "HOPS_NATS_URL must name at least one server"),
        ({"HOPS_LOG_LEVEL": "loud"}, "HOPS_LOG_LEVEL must be one of debug"),
        ({"HOPS_NATS_CREDS": "/no/such.creds"}, "does not exist"),
        ({"HOPS_LEADER_TTL": "0"}, "HOPS_LEADER_TTL must be >= 1.0"),
        ({"HOPS_NATS_REPLICAS": "0"}, "HOPS_NATS_REPLICAS must be >= 1"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        from_env(env)


def test_bad_flags_name_the_flag() -> None:
    with pytest.raises(SettingsError, match="--health-port must be an integer"):
        parse_args(["--health-port", "x"], env={})


def test_env_numbers() -> None:
    env = {"HOPS_ROUND_S": "2.5", "HOPS_N": "3", "HOPS_BAD": "x", "HOPS_NEG": "-1"}
    assert env_float("HOPS_ROUND_S", 1.0, env=env) == 2.5
    assert env_float("HOPS_UNSET", 1.0, env=env) == 1.0
    assert env_int("HOPS_N", 1, env=env) == 3
    with pytest.raises(SettingsError, match="HOPS_BAD must be a number"):
        env_float("HOPS_BAD", 1.0, env=env)
    with pytest.raises(SettingsError, match="HOPS_N must be a number"):
        env_float("HOPS_N", 1.0, env={"HOPS_N": "nan?"})
    with pytest.raises(SettingsError, match="HOPS_NEG must be >= 0"):
        env_int("HOPS_NEG", 1, env=env)


@pytest.mark.parametrize("raw", ["1", "true", "yes", "on", " TRUE ", "Yes", "ON"])
def test_env_bool_on(raw: str) -> None:
    assert env_bool("HOPS_SWITCH", False, env={"HOPS_SWITCH": raw}) is True


@pytest.mark.parametrize("raw", ["0", "false", "no", "off", " FALSE ", "No", "Off"])
def test_env_bool_off(raw: str) -> None:
    assert env_bool("HOPS_SWITCH", True, env={"HOPS_SWITCH": raw}) is False


def test_env_bool_default_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ({}, {"HOPS_SWITCH": ""}, {"HOPS_SWITCH": "  "}):
        assert env_bool("HOPS_SWITCH", True, env=env) is True
        assert env_bool("HOPS_SWITCH", False, env=env) is False
    monkeypatch.setenv("HOPS_SWITCH", "yes")  # os.environ unless env is given
    assert env_bool("HOPS_SWITCH", False) is True


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "enabled", "1 0"])
def test_env_bool_refuses_anything_else(raw: str) -> None:
    # a typo must not read as off: the message names the variable, the value
    # and what it may be
    with pytest.raises(SettingsError, match=rf"HOPS_SWITCH must be on \(1, true, yes, on\) "
                                            rf"or off \(0, false, no, off\), got '{raw}'"):
        env_bool("HOPS_SWITCH", False, env={"HOPS_SWITCH": raw})


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers, root.level = handlers, level


@pytest.mark.usefixtures("restore_logging")
def test_logs_are_json_lines_with_the_service_name() -> None:
    out = io.StringIO()
    log = configure_logging("estimator", "info", stream=out)
    log.info("estimated", jobs=3)
    log.debug("hidden")
    logging.getLogger("nats.aio.client").warning("from the %s", "library")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "estimated" and first["jobs"] == 3
    assert (first["service"], first["level"]) == ("estimator", "info")
    assert first["timestamp"].endswith("Z")
    assert second["event"] == "from the library" and second["service"] == "estimator"
    assert second["logger"] == "nats.aio.client"


def test_service_main_refuses_bad_settings_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    async def never(ctx: object) -> None:  # pragma: no cover - must not run
        raise AssertionError("ran with bad settings")

    assert service_main("probe", never, ["--health-port", "not-a-port"]) == 2
    assert capsys.readouterr().err.startswith("hops-probe: ")
