"""Admission of CPU jobs (CODA) and of GPU jobs that state cores, without NATS.

The pure decisions (:mod:`scheduling.live.admission`): a CPU job under a
policy that does not schedule cores, or asking more cores than the largest
registered server has, is ``unschedulable``; a GPU job's ``cores`` is never
refused. Malformed values are refused at decoding (the gateway's POST and
the NATS subjects share it) and by ``hops submit``'s file check, each with a
sentence naming the field. Then the scheduler's admission handler over fake
NATS objects: a refusal publishes nothing and writes no record; an accepted
CPU job's record is ``queued`` at once (nothing to profile).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError

from cli.jobfile import check_jobs
from scheduling.live import admission as adm
from services.runtime.bus import Rejected
from services.scheduler.__main__ import Admission, Checks
from shared import events as ev
from shared.cluster import GpuTypeSpec, Server
from shared.ids import GpuType, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.wire import INVALID, UNSCHEDULABLE

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)


def node(sid: str, cores: int, gpus: int = 4) -> NodeRecord:
    return NodeRecord(server=Server(ServerId(sid), A.name, gpus, cores=cores), gpu_type=A)


NODES = [node("a0", 16), node("a1", 32), node("a2", 32)]


def cpu(job_id: str = "c1", cores: int = 4, **kw: Any) -> JobSpec:
    return JobSpec(id=job_id, model="etl", batch_size=1, params=1, total_samples=100,
                   kind="cpu", cores=cores, **kw)


def gpu(job_id: str = "g1", cores: int = 0, **kw: Any) -> JobSpec:
    return JobSpec(id=job_id, model="m", batch_size=8, params=10, total_samples=100,
                   requirements=(1, 2), cores=cores, **kw)


# --- the pure decisions ---------------------------------------------------------------


def test_a_cpu_job_under_a_gpu_only_policy_is_refused_naming_the_core_policies() -> None:
    refusal = adm.policy_refusal(cpu(), schedules_cores=False, policy="hops")
    assert refusal is not None and refusal.code == UNSCHEDULABLE
    assert "policy hops does not schedule CPU cores; run coda, fifo, drf or fixed-cores" \
        in refusal.message
    assert "c1" in refusal.message
    assert adm.policy_refusal(cpu(), schedules_cores=True, policy="coda") is None
    # A GPU job stating cores runs under any policy: the cores are a request.
    assert adm.policy_refusal(gpu(cores=12), schedules_cores=False, policy="hops") is None


def test_more_cores_than_the_largest_server_is_refused_naming_it() -> None:
    refusal = adm.fit_refusal(cpu(cores=33), NODES, r_num=8)
    assert refusal is not None and refusal.code == UNSCHEDULABLE
    # a1 and a2 tie at 32: the first by id is named
    assert refusal.message == ("job c1 can never run here: the job asks for 33 CPU cores, "
                               "but the largest server, a1, has 32")
    assert adm.largest_cores(NODES) == (ServerId("a1"), 32)
    assert adm.largest_cores([]) is None


def test_cpu_jobs_that_fit_and_gpu_jobs_asking_any_cores_are_admitted() -> None:
    assert adm.fit_refusal(cpu(cores=32), NODES, r_num=8) is None
    assert adm.fit_refusal(cpu(cores=1), NODES, r_num=8) is None
    assert adm.fit_refusal(gpu(cores=500), NODES, r_num=8) is None
    assert adm.fit_refusal(cpu(cores=500), [], r_num=8) is None  # nothing known yet
    assert adm.check_spec(cpu()) is None and adm.spec_problem(cpu()) is None
    # emulated nodes name their GPU models; a CPU job is not one of them
    emulated = [msgspec.structs.replace(n, models=("resnet18",)) for n in NODES]
    assert adm.fit_refusal(cpu(), emulated, r_num=8) is None


def test_a_cluster_whose_servers_declare_no_cores_refuses_cpu_jobs() -> None:
    refusal = adm.fit_refusal(cpu(cores=1), [node("a0", 0)], r_num=8)
    assert refusal is not None and "no server declares any CPU cores" in refusal.message
    assert adm.fit_refusal(gpu(cores=4), [node("a0", 0)], r_num=8) is None


def test_the_leader_holds_cpu_jobs_it_cannot_plan() -> None:
    alive = NODES
    assert adm.hold_problem(cpu(), alive, 8, schedules_cores=True) is None
    held = adm.hold_problem(cpu(), alive, 8, schedules_cores=False)
    assert held is not None and "does not schedule CPU cores" in held
    assert "32" in (adm.hold_problem(cpu(cores=40), alive, 8, True) or "")
    assert adm.hold_problem(gpu(cores=40), alive, 8, schedules_cores=False) is None


# --- malformed values: refused at decoding, a sentence each -----------------------------


def body(**fields: Any) -> bytes:
    spec = {"id": "c1", "model": "etl", "batch_size": 1, "params": 1, "total_samples": 100,
            "kind": "cpu", "cores": 4, **fields}
    return json.dumps({k: v for k, v in spec.items() if v is not None}).encode()


@pytest.mark.parametrize(("fields", "says"), [
    ({"cores": -2}, "cores must be >= 0, got -2"),
    ({"cores": 0}, "a cpu job needs cores > 0"),
    ({"cores": None}, "a cpu job needs cores > 0"),
    ({"requirements": [1, 2]}, "a cpu job asks for cores, not GPUs: give no requirements"),
    ({"min_gpus": 1, "max_gpus": 2}, "give no requirements"),
    ({"kind": "tpu"}, "Invalid enum value 'tpu'"),
    ({"category": "video"}, "Invalid enum value 'video'"),
    ({"hints": {"fast": True}}, "unknown field `fast`"),
    ({"cores": 2.5}, "Expected `int`"),
])
def test_malformed_cpu_jobs_are_invalid_at_decoding(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ev.WireError) as refused:
        ev.decode_submit(body(**fields))
    assert refused.value.code == INVALID and says in str(refused.value), refused.value


def test_gpu_jobs_take_category_hints_and_cores_on_every_entry_point() -> None:
    data = json.dumps({"id": "g1", "model": "m", "batch_size": 8, "params": 10,
                       "total_samples": 100, "requirements": [1], "cores": 6,
                       "category": "nlp", "hints": {"pipeline": True}}).encode()
    spec = ev.decode_submit(data).spec
    assert (spec.kind, spec.cores, spec.category, spec.hints.pipeline) == ("gpu", 6, "nlp", True)
    wrapped = ev.decode_submit(ev.encode(ev.SubmitJob(spec=cpu(cores=3)))).spec
    assert (wrapped.kind, wrapped.cores) == ("cpu", 3)


def test_too_many_cores_is_a_problem_of_the_field() -> None:
    assert adm.spec_problem(cpu(cores=adm.MAX_CORES + 1)) == (
        "cores", f"the job asks for {adm.MAX_CORES + 1} CPU cores; at most {adm.MAX_CORES} "
        "are allowed")


def test_hops_submit_names_the_field_of_each_bad_cpu_job(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n"
        "  - {id: ok, model: etl, batch_size: 1, params: 1, total_samples: 9, kind: cpu, "
        "cores: 4}\n"
        "  - {id: zero, model: etl, batch_size: 1, params: 1, total_samples: 9, kind: cpu}\n"
        "  - {id: gpus, model: etl, batch_size: 1, params: 1, total_samples: 9, kind: cpu, "
        "cores: 2, requirements: [1]}\n"
        "  - {id: neg, model: etl, batch_size: 1, params: 1, total_samples: 9, kind: cpu, "
        "cores: -1}\n"
        "  - {id: g, model: m, batch_size: 1, params: 1, total_samples: 9, requirements: [1], "
        "cores: 8, category: cv, hints: {many_weights: true}}\n")
    checked = check_jobs(jobs)
    assert [s.id for s in checked.valid] == ["ok", "g"]
    assert [(b.job_id, b.field) for b in checked.invalid] == [
        ("zero", "cores"), ("gpus", "requirements"), ("neg", "cores")]


# --- the admission handler: a refusal changes nothing --------------------------------


class FakeKV:
    def __init__(self) -> None:
        self.created: dict[str, bytes] = {}

    async def get(self, key: str) -> Any:
        raise KeyNotFoundError

    async def create(self, key: str, value: bytes) -> int:
        self.created[key] = value
        return 1


class FakeJS:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes, **_: Any) -> Any:
        self.published.append((subject, data))
        return msgspec.structs.replace(FakeAck(), seq=len(self.published))


class FakeAck(msgspec.Struct):
    seq: int = 0
    duplicate: bool = False


class FakeReporter:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, str]] = []

    async def report(self, subject: str, error: str, code: str, *_: Any) -> None:
        self.reports.append((subject, error, code))


class FakeLog:
    def info(self, *_: Any, **__: Any) -> None:
        pass


class FakeContext:
    def __init__(self) -> None:
        self.js = FakeJS()
        self.reporter = FakeReporter()
        self.log = FakeLog()


def admission(cores: bool, policy: str) -> tuple[Admission, FakeContext, FakeKV]:
    ctx, kv = FakeContext(), FakeKV()
    handler = Admission(ctx, kv, 8, checks=Checks(cores=cores, policy=policy))  # type: ignore[arg-type]
    handler._nodes = (time.monotonic(), list(NODES))  # read "just now": no KV read
    return handler, ctx, kv


@pytest.mark.parametrize(("spec", "cores", "says"), [
    (cpu(), False, "policy hops does not schedule CPU cores; run coda, fifo, drf or fixed-cores"),
    (cpu(cores=64), True, "but the largest server, a1, has 32"),
])
async def test_a_refused_cpu_job_publishes_and_stores_nothing(
    spec: JobSpec, cores: bool, says: str
) -> None:
    handler, ctx, kv = admission(cores, "hops" if not cores else "coda")
    with pytest.raises(Rejected) as refused:
        await handler.submit(ev.SubmitJob(spec=spec), "hops.v1.jobs.submit")
    assert refused.value.code == UNSCHEDULABLE and says in str(refused.value)
    assert ctx.js.published == [] and kv.created == {}
    assert [code for _, _, code in ctx.reporter.reports] == [UNSCHEDULABLE]


async def test_an_accepted_cpu_job_is_queued_from_its_submission() -> None:
    handler, ctx, _ = admission(True, "coda")
    reply = await handler.submit(ev.SubmitJob(spec=cpu(cores=8)), "hops.v1.jobs.submit")
    assert isinstance(reply, ev.Reply) and reply.ok and reply.job_id == "c1"
    # the event, then the job's record (written on the bucket's subject, kv_write)
    assert [s for s, _ in ctx.js.published] == ["hops.v1.jobs.events.c1", "$KV.hops_jobs.c1"]
    record = json.loads(ctx.js.published[1][1])
    assert record["phase"] == "queued" and record["spec"]["cores"] == 8
    # A GPU job stating cores is admitted under a GPU-only policy, to be profiled.
    handler, ctx, _ = admission(False, "hops")
    reply = await handler.submit(ev.SubmitJob(spec=gpu(cores=6)), "hops.v1.jobs.submit")
    assert isinstance(reply, ev.Reply) and reply.ok
    assert json.loads(dict(ctx.js.published)["$KV.hops_jobs.g1"])["phase"] == "submitted"
