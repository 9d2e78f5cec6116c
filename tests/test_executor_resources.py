"""CPU cores and memory on one node: the executor's ledger books each job's
whole demand on its server and refuses what would over-allocate it; the
executor advertises its capacity (declared, or found on the host); a job
learns its cores from its environment; the monitor's metrics and the
gateway's cluster view show capacity and what is allocated."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from executor.discovery import host_cores, host_memory_gb, with_host_capacity
from executor.launch import LaunchOptions, cores_of, job_paths, launches
from executor.ledger import NodeLedger
from gateway import views
from services.monitor.metrics import LatencyBook, cluster_metrics, render
from services.monitor.nodes import Refusal, admit
from shared import events as ev
from shared import jobenv
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord, Placement
from shared.resources import Resources
from shared.specs import cluster_from_doc

S, T = ServerId("s"), ServerId("t")
GT = GpuTypeSpec(GpuType("RTX3090"), 2.5e9, 1e9)
SERVER = Server(S, GpuType("RTX3090"), 4, memory_gb=2, cores=8)


def spec(job: str) -> JobSpec:
    return JobSpec(JobId(job), "resnet18-cifar10", 32, 1000, 10**9, requirements=(1, 2, 4),
                   command=("python", "train.py"))


def cfg(gpus: int, cores: int = 0, memory_mb: int = 0, other: int = 0) -> Configuration:
    parts = {S: gpus} | ({T: other} if other else {})
    return Configuration.of(parts).with_extras({S: Resources(cores=cores, memory_mb=memory_mb)})


def start(key: str, job: str, idx: tuple[int, ...], config: Configuration,
          mode: str = "run") -> ev.StartJob:
    return ev.StartJob(key=key, job_id=JobId(job), server_id=S, spec=spec(job),
                       configuration=config, gpu_indices=idx, mode=mode)  # type: ignore[arg-type]


# --- the node ledger ----------------------------------------------------------------------


def test_the_ledger_refuses_a_start_over_its_cores_until_the_holder_stops() -> None:
    ledger = NodeLedger(SERVER)
    first = start("k1", "j1", (0,), cfg(1, cores=6, other=2))
    assert ledger.refuse_start(first) is None
    ledger.book(first)
    assert ledger.allocated() == Resources(gpus=1, cores=6)  # this server's part only
    second = start("k2", "j2", (1,), cfg(1, cores=4))
    no = ledger.refuse_start(second)
    assert no is not None and (no.code, no.ok) == ("conflict", False)
    assert no.error == "s has 2 CPU cores free of 8, 4 needed (held by j1)"
    ledger.ending(JobId("j1"))  # its report is out: it holds its cores until it is gone
    assert ledger.refuse_start(second) is not None
    ledger.release(JobId("j1"))
    assert ledger.refuse_start(second) is None and ledger.allocated() == Resources()
    ledger.book(second)
    assert ledger.allocated() == Resources(gpus=1, cores=4)


def test_memory_over_allocated_is_a_conflict_and_beyond_the_server_invalid() -> None:
    ledger = NodeLedger(SERVER)  # 2 GiB
    ledger.book(start("k1", "j1", (0,), cfg(1, memory_mb=1500)))
    more = ledger.refuse_start(start("k2", "j2", (1,), cfg(1, memory_mb=1000)))
    assert more is not None and more.code == "conflict" and "548 MiB free of 2048" in more.error
    beyond = ledger.refuse_start(start("k3", "j3", (1,), cfg(1, cores=9)))
    assert beyond is not None and beyond.code == "invalid"
    assert beyond.error == "s has 8 CPU cores; job j3 needs 9"
    # GPU checks come as before: an index the server lacks, one in use
    bad = ledger.refuse_start(start("k4", "j4", (4,), cfg(1)))
    assert bad is not None and bad.code == "invalid" and "no GPU index 4" in bad.error
    busy = ledger.refuse_start(start("k5", "j5", (0,), cfg(1)))
    assert busy is not None and busy.code == "conflict" and "in use by j1" in busy.error


def test_a_gpu_only_server_takes_gpu_only_jobs_and_keys_answer_once() -> None:
    ledger = NodeLedger(Server(S, GpuType("RTX3090"), 4))
    cmd = start("k1", "j1", (0, 1), cfg(2))
    assert ledger.refuse_start(cmd) is None
    ledger.book(cmd)
    ack = ledger.remember(ev.CommandAck(key="k1", ok=True))
    assert ledger.answered("k1") == ack
    assert ledger.refuse_start(start("k2", "j2", (2,), cfg(1, cores=1))).code == "invalid"  # type: ignore[union-attr]
    assert ledger.refuse_start(start("k3", "j1", (2,), cfg(1))).code == "conflict"  # type: ignore[union-attr]


def test_an_adopted_job_beyond_what_is_left_holds_the_rest() -> None:
    ledger = NodeLedger(SERVER)
    ledger.book(start("k1", "j1", (0,), cfg(1, cores=6)))
    ledger.book(start("k2", "j2", (1,), cfg(1, cores=6)))  # recovered: booked without asking
    assert ledger.allocated() == Resources(gpus=2, cores=8)
    ledger.release(JobId("j1"))
    assert ledger.allocated() == Resources(gpus=1, cores=2)


# --- capacity and environment ---------------------------------------------------------------


def test_the_capacity_an_executor_advertises() -> None:
    bare = Server(S, GpuType("cpu"), 2)
    assert with_host_capacity(bare, 16, 64).capacity == Resources(2, 16, 64 * 1024)
    declared = Server(S, GpuType("cpu"), 2, memory_gb=8, cores=4)
    assert with_host_capacity(declared, 16, 64) == declared
    assert host_cores() >= 1 and host_memory_gb() >= 0
    doc = {"gpu_types": [{"name": "A", "link_bandwidth": 1e9, "net_bandwidth": 1e9}],
           "servers": [{"id_prefix": "a", "count": 2, "gpu_type": "A", "gpus": 4, "cores": 12},
                       {"id": "b", "gpu_type": "A", "gpus": 4}]}
    cluster = cluster_from_doc(doc)
    assert [s.cores for s in cluster.servers] == [12, 12, 0]


def test_meminfo_is_read_when_sysconf_says_nothing(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree: 1 kB\n")

    def no_sysconf(name: str) -> int:
        raise ValueError(name)

    assert host_memory_gb(meminfo, no_sysconf) == 15  # 16384000 kB
    assert host_memory_gb(tmp_path / "none", no_sysconf) == 0
    assert host_memory_gb(meminfo, lambda name: 4096 if name == "SC_PAGE_SIZE" else 2**20) == 4


def test_a_job_learns_its_cores_from_its_environment(tmp_path: Path) -> None:
    paths = job_paths(tmp_path, "j", S)
    opts = LaunchOptions(gpu_type="cpu", threads=1)
    held = start("k", "j", (0, 1), cfg(2, cores=6, other=1))
    ranks = launches(held, opts, paths, {})
    assert cores_of(held) == 6
    assert [(r.env[jobenv.CORES], r.env["OMP_NUM_THREADS"]) for r in ranks] == [("6", "3")] * 2
    assert ranks[0].env[jobenv.THREADS] == "1"  # the executor's setting, unchanged
    none = launches(start("k", "j", (0,), cfg(1)), opts, paths, {})
    assert none[0].env[jobenv.CORES] == "0" and none[0].env["OMP_NUM_THREADS"] == "1"
    profile = start("k", "j", (0,), Configuration.of({S: 1}), mode="profile")
    assert launches(profile, opts, paths, {})[0].env[jobenv.CORES] == "0"
    assert jobenv.CORES in jobenv.RESERVED


def test_a_node_may_declare_cores_it_registered_as_none() -> None:
    old = Server(S, GpuType("RTX3090"), 4)
    nodes = {S: admit({}, ev.RegisterNode(server=old, gpu_type=GT), 1.0)}
    learned = msgspec.structs.replace(old, cores=8, memory_gb=2)
    assert admit(nodes, ev.RegisterNode(server=learned, gpu_type=GT), 2.0).server == learned
    fewer = {S: admit({}, ev.RegisterNode(server=learned, gpu_type=GT), 1.0)}
    with pytest.raises(Refusal, match="cores \\(8, now 4\\)"):
        admit(fewer, ev.RegisterNode(server=msgspec.structs.replace(learned, cores=4),
                                     gpu_type=GT), 2.0)


# --- what the monitor and the gateway show ------------------------------------------------

def node(server: Server, alive: bool = True) -> NodeRecord:
    return NodeRecord(server=server, gpu_type=GT, alive=alive)


def placed(job: str, config: Configuration) -> Placement:
    return Placement(job_id=JobId(job), configuration=config,
                     gpu_indices={s: tuple(range(g)) for s, g in config.parts})


def test_metrics_and_the_cluster_view_show_capacity_and_allocation() -> None:
    t = Server(T, GpuType("RTX3090"), 2, cores=4)
    nodes = {S: node(SERVER), T: node(t), ServerId("x"): node(Server(ServerId("x"), GpuType(
        "RTX3090"), 8, cores=64), alive=False)}
    allocs = {JobId("j"): placed("j", cfg(2, cores=4, memory_mb=512, other=1))}
    text = render(cluster_metrics(nodes, allocs, {}, LatencyBook(), {}, 0.0, 1.0))
    m = {s.name + "".join(f"[{v}]" for v in s.labels.values()): s.value
         for f in text_string_to_metric_families(text) for s in f.samples}
    assert (m["hops_capacity[gpus]"], m["hops_capacity[cores]"],
            m["hops_capacity[memory_mb]"]) == (6, 12, 2048)
    assert (m["hops_allocated[gpus]"], m["hops_allocated[cores]"],
            m["hops_allocated[memory_mb]"]) == (3, 4, 512)
    view = views.cluster_view(list(nodes.values()), list(allocs.values()))
    by_id = {s["id"]: s for s in view["servers"]}
    assert by_id["s"]["capacity"] == {"gpus": 4, "cores": 8, "memory_mb": 2048}
    assert by_id["s"]["allocated"] == {"gpus": 2, "cores": 4, "memory_mb": 512}
    assert by_id["t"]["allocated"] == {"gpus": 1, "cores": 0, "memory_mb": 0}
