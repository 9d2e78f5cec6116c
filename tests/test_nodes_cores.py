"""Cores and memory in the cluster view (``GET /cluster``, ``hops nodes``):
used and free per server and in total, as GPUs are; a CPU job, which holds
no GPU, is listed on its server. Pure: the gateway's view and the CLI's
rendering."""

from __future__ import annotations

from cli.client import render_jobs, render_nodes
from gateway.access import redact_cluster
from gateway.views import cluster_view
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.records import NodeRecord, Placement
from shared.resources import Resources

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
S0, S1, S2 = ServerId("s0"), ServerId("s1"), ServerId("s2")


def node(sid: ServerId, cores: int, memory_gb: int = 0, alive: bool = True,
         order: int = 0) -> NodeRecord:
    server = Server(sid, A.name, 4, cores=cores, memory_gb=memory_gb)
    return NodeRecord(server=server, gpu_type=A, order=order, alive=alive)


NODES = [node(S0, 16, memory_gb=64), node(S1, 8, order=1), node(S2, 32, alive=False, order=2)]
# A GPU job with 2 GPUs, 6 cores and 2 GiB on s0; a CPU job with 8 cores on s1.
GPU_JOB = Placement(job_id=JobId("g1"), gpu_indices={S0: (0, 1)},
                    configuration=Configuration.of({"s0": 2}).with_extras(
                        {S0: Resources(cores=6, memory_mb=2048)}))
CPU_JOB = Placement(job_id=JobId("c1"), gpu_indices={S1: ()},
                    configuration=Configuration.cpu(S1, 8))


def test_each_server_shows_cores_and_memory_used_and_free() -> None:
    view = cluster_view(NODES, [GPU_JOB, CPU_JOB])
    servers = {s["id"]: s for s in view["servers"]}
    got = {k: (s["used"], s["free"], s["cores"], s["cores_used"], s["cores_free"])
           for k, s in servers.items()}
    assert got == {"s0": (2, 2, 16, 6, 10), "s1": (0, 4, 8, 8, 0), "s2": (0, 0, 32, 0, 0)}
    assert (servers["s0"]["memory_mb"], servers["s0"]["memory_mb_used"],
            servers["s0"]["memory_mb_free"]) == (65536, 2048, 63488)
    assert servers["s1"]["memory_mb"] == 0 and servers["s1"]["memory_mb_free"] == 0
    assert servers["s1"]["jobs"] == ["c1"] and servers["s0"]["jobs"] == ["g1"]
    # totals over the alive servers, as GPUs
    t = view["totals"]
    assert (t["cores"], t["cores_used"], t["cores_free"]) == (24, 14, 10)
    assert (t["memory_mb"], t["memory_mb_used"], t["memory_mb_free"]) == (65536, 2048, 63488)
    assert (t["gpus"], t["used"], t["free"]) == (8, 2, 6)


def test_a_tenant_sees_the_cores_others_hold_but_not_their_ids() -> None:
    view = redact_cluster(cluster_view(NODES, [GPU_JOB, CPU_JOB]), own={"g1"})
    servers = {s["id"]: s for s in view["servers"]}
    assert servers["s1"]["cores_used"] == 8 and servers["s1"]["jobs"] == ["(another tenant)"]


def test_hops_nodes_prints_cores_and_memory_used_and_free() -> None:
    lines = render_nodes(cluster_view(NODES, [GPU_JOB, CPU_JOB])).splitlines()
    assert lines[0].split() == ["server", "gpu", "type", "gpus", "used", "free", "cores",
                                "used/free", "MiB", "used/free", "alive", "jobs"]
    assert lines[1].split() == ["s0", "A", "4", "2", "2", "6/10", "2048/63488", "yes", "g1"]
    assert lines[2].split() == ["s1", "A", "4", "0", "4", "8/0", "-", "yes", "c1"]
    assert lines[3].split() == ["s2", "A", "4", "0", "0", "0/0", "-", "NO"]
    assert lines[4].endswith("; CPU cores 14 used, 10 free of 24")


def test_without_declared_cores_or_memory_nothing_more_is_printed() -> None:
    bare = [NodeRecord(server=Server(S0, A.name, 4), gpu_type=A)]
    lines = render_nodes(cluster_view(bare, [])).splitlines()
    assert lines[0].split() == ["server", "gpu", "type", "gpus", "used", "free", "cores",
                                "used/free", "alive", "jobs"]
    assert lines[1].split() == ["s0", "A", "4", "0", "4", "-", "yes"]
    assert "CPU cores" not in lines[2]


def test_hops_jobs_shows_the_cores_of_a_configuration() -> None:
    jobs = [{"job_id": j, "phase": "running", "spec": {"model": "m", "total_samples": 10},
             "samples_done": 5.0, "configuration": c, "restarts": 1}
            for j, c in (("c1", {"parts": [["s1", 0]], "extras": [{"cores": 8}]}),
                         ("g1", {"parts": [["s0", 2], ["s1", 1]],
                                 "extras": [{"cores": 6}, {}]}))]
    lines = render_jobs({"jobs": jobs}).splitlines()
    assert lines[1].split()[5] == "s1:0+8c"  # after job and tenant, phase, model, done
    assert lines[2].split()[5:7] == ["s0:2+6c", "s1:1"]
