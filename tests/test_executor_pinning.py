"""Exact core pinning on one node (CODA): which core ids a job gets, the
ledger keeping them apart and refusing what is not free, ``set_cores``
re-booking in place, CPU jobs launched as one process without GPUs, the
plugin following its core count, and resctrl read from a fake tree.

No GPU here: the NUMA preference is tested with a fake NVML topology."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.cores import (
    CoreShortage,
    NvmlTopology,
    choose_cores,
    mask_cores,
    with_cores,
)
from executor.launch import LaunchOptions, job_paths, launches, world_of
from executor.ledger import CONFLICT, NOT_FOUND, NodeLedger
from executor.membw import BandwidthMeter, NodeMemory, detect, has_mba, total_bytes
from executor.pinning import write_count
from executor.reports import JobReports
from hops.plugin.config import settings_from_env
from hops.plugin.cores import CoresWatch, read_count
from hops.plugin.measure import IterationTimes, SamplePeriod
from shared import events as ev
from shared import jobenv
from shared.cluster import Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.jobreport import Sampled
from shared.resources import Resources
from shared.wire import INVALID

S = ServerId("s")
SERVER = Server(S, GpuType("RTX3090"), 4, memory_gb=8, cores=8)
POOL = frozenset(range(8))


def spec(job: str, cpu_cores: int = 0) -> JobSpec:
    if cpu_cores:
        return JobSpec(JobId(job), "resnet18-cifar10", 32, 1000, 10**9, kind="cpu",
                       cores=cpu_cores, command=("python", "work.py"))
    return JobSpec(JobId(job), "resnet18-cifar10", 32, 1000, 10**9, requirements=(1, 2, 4),
                   command=("python", "train.py"))


def run(job: str, idx: tuple[int, ...], cores: int, key: str = "") -> ev.StartJob:
    config = Configuration.of({S: len(idx)}).with_extras({S: Resources(cores=cores)})
    return ev.StartJob(key=key or f"start-{job}", job_id=JobId(job), server_id=S,
                       spec=spec(job), configuration=config, gpu_indices=idx)


def cpu_job(job: str, cores: int) -> ev.StartJob:
    return ev.StartJob(key=f"start-{job}", job_id=JobId(job), server_id=S,
                       spec=spec(job, cores), configuration=Configuration.cpu(S, cores),
                       gpu_indices=())


def set_cores(job: str, cores: int, key: str = "") -> ev.SetCores:
    return ev.SetCores(key=key or f"cores-{job}-{cores}", job_id=JobId(job), server_id=S,
                       cores=cores, at=1.0)


# --- the choice ---------------------------------------------------------------------------


def test_the_lowest_free_cores_are_chosen() -> None:
    assert choose_cores(3, POOL, taken={0, 2}) == (1, 3, 4)
    assert choose_cores(0, POOL, taken=()) == ()
    with pytest.raises(CoreShortage, match=r"2 of this executor's cores \[0-7\] are free, 3"):
        choose_cores(3, POOL, taken=set(range(6)))


def test_cores_near_the_gpus_come_first_then_any() -> None:
    near = {4, 5, 6, 7}
    assert choose_cores(2, POOL, taken={4}, near=near) == (5, 6)
    assert choose_cores(3, POOL, taken={4, 5}, near=near) == (0, 6, 7)  # the near ones run out


def test_a_change_of_count_keeps_the_cores_held_first() -> None:
    assert choose_cores(2, POOL, taken={0}, keep=(5, 6, 7)) == (5, 6)  # a shrink keeps two
    assert choose_cores(4, POOL, taken={0}, keep=(5, 6)) == (1, 2, 5, 6)  # a growth adds


class FakeNvmlTopology:
    """A fake ``pynvml``: GPUs 0-1 on the socket of cores 0-3, GPUs 2-3 on
    that of cores 4-7 and 64 (a second word of the CPU set); GPU 9 unknown."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.masks = {0: [0x0F, 0], 1: [0x0F, 0], 2: [0xF0, 1], 3: [0xF0, 1]}
        self.asked: list[int] = []

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index not in self.masks:
            raise self.NVMLError("no such GPU")
        return index

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        self.asked.append(handle)
        return self.masks[handle][:words]


def test_the_nvml_topology_prefers_the_gpus_numa_node() -> None:
    fake = FakeNvmlTopology()
    topo = NvmlTopology(fake, cpu_count=72)
    assert topo.words == 2
    assert topo.near((2,)) == {4, 5, 6, 7, 64}
    assert topo.near((0, 1)) == {0, 1, 2, 3}
    assert topo.near((1, 2)) == {0, 1, 2, 3, 4, 5, 6, 7, 64}  # two sockets: either
    assert topo.near((9,)) == frozenset() and topo.near(()) == frozenset()
    topo.near((2,))
    assert fake.asked.count(2) == 1  # read once per GPU
    ledger = NodeLedger(SERVER, pool=POOL, topology=topo)
    assert ledger.book(run("a", (2,), 2)).cores == (4, 5)
    assert ledger.book(run("b", (0,), 2)).cores == (0, 1)
    assert mask_cores([1 << 63, 1]) == {63, 64}


# --- the ledger ---------------------------------------------------------------------------


def test_each_job_gets_its_own_cores_and_a_start_beyond_the_pool_is_refused() -> None:
    ledger = NodeLedger(SERVER, pool={0, 1, 2})  # the host lets it use 3 of the 8 declared
    assert ledger.book(run("a", (0,), 2)).cores == (0, 1)
    assert ledger.book(cpu_job("c", 1)).cores == (2,)
    refusal = ledger.refuse_start(run("b", (1,), 1))
    assert refusal is not None and refusal.code == CONFLICT
    assert "0 of this executor's cores [0-2] are free, 1 needed" in refusal.error
    assert "a [0, 1]" in refusal.error and "c [2]" in refusal.error
    ledger.release(JobId("a"))
    assert ledger.refuse_start(run("b", (1,), 1)) is None
    assert ledger.book(run("b", (1,), 1)).cores == (0,)


def test_without_a_pool_cores_are_counted_not_chosen() -> None:
    ledger = NodeLedger(SERVER)
    assert ledger.book(run("a", (0,), 6)).cores == ()
    assert ledger.allocated() == Resources(gpus=1, cores=6)


def test_an_adopted_job_keeps_the_cores_it_was_pinned_to() -> None:
    ledger = NodeLedger(SERVER, pool=POOL)
    assert ledger.book(run("a", (0,), 2), cores=(6, 7)).cores == (6, 7)
    assert ledger.book(run("b", (1,), 2)).cores == (0, 1)


def test_set_cores_re_books_in_place_keeping_the_cores_it_can() -> None:
    ledger = NodeLedger(SERVER, pool=POOL)
    ledger.book(run("a", (0,), 4))
    ledger.book(run("b", (1,), 2))  # (4, 5)
    assert ledger.refuse_retune(set_cores("a", 2)) is None
    booking = ledger.retune(set_cores("a", 2))
    assert booking.cores == (0, 1) and ledger.allocated().cores == 4
    assert ledger.retune(set_cores("a", 5)).cores == (0, 1, 2, 3, 6)
    assert ledger.allocated() == Resources(gpus=2, cores=7)


def test_set_cores_is_refused_with_nothing_changed() -> None:
    ledger = NodeLedger(SERVER, pool=POOL)
    ledger.book(run("a", (0,), 4))
    ledger.book(run("b", (1,), 3))
    before = (ledger.booking(JobId("a")), ledger.allocated())
    over = ledger.refuse_retune(set_cores("a", 6))
    assert over is not None and over.code == CONFLICT and "CPU cores" in over.error
    assert (ledger.booking(JobId("a")), ledger.allocated()) == before
    small = NodeLedger(SERVER, pool={0, 1, 2, 3, 4})  # the server declares more than the pool
    small.book(run("a", (0,), 4))
    short = small.refuse_retune(set_cores("a", 6))
    assert short is not None and short.code == CONFLICT and "are free, 6 needed" in short.error
    missing = ledger.refuse_retune(set_cores("zz", 1))
    assert missing is not None and missing.code == NOT_FOUND
    beyond = ledger.refuse_retune(set_cores("a", 9))
    assert beyond is not None and beyond.code == INVALID
    ledger.book(cpu_job("c", 1))
    empty = ledger.refuse_retune(set_cores("c", 0))
    assert empty is not None and empty.code == INVALID and "CPU job" in empty.error
    other = ledger.refuse_retune(ev.SetCores(key="k", job_id=JobId("a"),
                                             server_id=ServerId("t"), cores=1))
    assert other is not None and other.code == INVALID


def test_a_profiling_run_has_no_cores_to_change() -> None:
    ledger = NodeLedger(SERVER, pool=POOL)
    prof = msgspec.structs.replace(run("p", (0,), 0), mode="profile",
                                   configuration=Configuration.of({S: 1}))
    ledger.book(prof)
    refusal = ledger.refuse_retune(set_cores("p", 2))
    assert refusal is not None and refusal.code == INVALID


Op = tuple[str, int, int]  # verb, job number, cores


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["start", "stop", "retune"]), st.integers(0, 5),
                          st.integers(0, 5)), max_size=40),
       st.frozensets(st.integers(0, 11), min_size=1, max_size=10))
def test_no_core_is_ever_given_to_two_jobs(ops: list[Op], pool: frozenset[int]) -> None:
    ledger = NodeLedger(Server(S, GpuType("RTX3090"), 8, cores=12), pool=pool)
    for verb, j, n in ops:
        job = f"j{j}"
        if verb == "start":
            cmd = cpu_job(job, n) if n else run(job, (j,), 0)
            if ledger.refuse_start(cmd) is None:
                ledger.book(cmd)
        elif verb == "stop":
            ledger.release(JobId(job))
        elif ledger.refuse_retune(set_cores(job, n)) is None:
            ledger.retune(set_cores(job, n))
        held = [c for b in map(ledger.booking, ledger.running()) if b for c in b.cores]
        assert len(held) == len(set(held)) and set(held) <= pool
        for jid in ledger.running():
            booking = ledger.booking(jid)
            assert booking is not None
            assert len(booking.cores) == ledger._held.held_by(jid).get(S, Resources()).cores


# --- launching ------------------------------------------------------------------------------


def test_a_cpu_job_is_one_process_without_gpus_pinned_to_its_cores(tmp_path: Path) -> None:
    cmd = cpu_job("c", 2)
    assert world_of(cmd) == (1, 1, 1, 0)
    paths = job_paths(tmp_path, "c", S)
    [rank] = launches(cmd, LaunchOptions(gpu_type="RTX3090"), paths, {}, cores=(3, 4))
    assert rank.cpus == (3, 4)
    assert rank.env["CUDA_VISIBLE_DEVICES"] == "" and rank.env["WORLD_SIZE"] == "1"
    assert rank.env[jobenv.CORES] == "2" and rank.env["OMP_NUM_THREADS"] == "2"
    assert rank.env[jobenv.CORES_FILE] == str(tmp_path / "c" / "cores-s")


def test_an_operators_cpu_affinity_keeps_precedence(tmp_path: Path) -> None:
    cmd = run("a", (0, 1), 4)
    opts = LaunchOptions(gpu_type="cpu", affinity=((0,), (1,)))
    ranks = launches(cmd, opts, job_paths(tmp_path, "a", S), {}, cores=(4, 5, 6, 7))
    assert [r.cpus for r in ranks] == [(0,), (1,)]
    plain = launches(cmd, LaunchOptions(gpu_type="cpu"), job_paths(tmp_path, "a", S), {},
                     cores=(4, 5, 6, 7))
    assert [r.cpus for r in plain] == [(4, 5, 6, 7)] * 2


def test_with_cores_changes_this_servers_cores_only() -> None:
    t = ServerId("t")
    config = Configuration.of({S: 1, t: 1}).with_extras(
        {S: Resources(cores=2, memory_mb=100), t: Resources(cores=3)})
    cmd = ev.StartJob(key="k", job_id=JobId("a"), server_id=S, spec=spec("a"),
                      configuration=config, gpu_indices=(0,))
    new = with_cores(cmd, 5).configuration
    assert new.demand_on(S) == Resources(gpus=1, cores=5, memory_mb=100)
    assert new.demand_on(t) == Resources(gpus=1, cores=3)
    assert with_cores(cpu_job("c", 2), 1).configuration == Configuration.cpu(S, 1)


def test_the_count_file_is_replaced_whole_never_written_through_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    path = tmp_path / "cores-s"
    path.symlink_to(target)
    write_count(path, 3)
    assert not path.is_symlink() and path.read_text() == "3\n"
    assert target.read_text() == "keep\n"
    assert read_count(path) == 3 and read_count(tmp_path / "none") is None


# --- the job's side -------------------------------------------------------------------------


def test_the_plugin_follows_its_core_count_and_resizes_torch_threads(tmp_path: Path) -> None:
    path = tmp_path / "cores-s"
    write_count(path, 2)
    now = [0.0]
    before = torch.get_num_threads()
    try:
        watch = CoresWatch(path, count=2, processes=1, clock=lambda: now[0])
        assert not watch.poll()  # not yet time
        now[0] = 1.5
        assert not watch.poll()  # same count
        write_count(path, 1)
        now[0] = 3.0
        assert watch.poll() and watch.count == 1 and torch.get_num_threads() == 1
        fixed = CoresWatch(path, count=1, fixed_threads=3, clock=lambda: now[0])
        write_count(path, 2)
        now[0] = 5.0
        assert fixed.poll() and fixed.count == 2 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    env = {jobenv.JOB_ID: "a", jobenv.BATCH_SIZE: "8", jobenv.CORES: "2",
           jobenv.CORES_FILE: str(path), "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}
    s = settings_from_env(env)
    assert (s.cores, s.cores_file, s.local_processes) == (2, path, 2)


def test_samples_carry_the_cores_the_job_ran_on() -> None:
    period = SamplePeriod(started=0.0, batch_size=8)
    period.add(IterationTimes(data_wait=0.1, production=None, forward=0.1, backward=0.1,
                              update=0.1, sync_wait=0.0, comm=None, comm_exposed=None,
                              total=0.4))
    line = period.line(1.0, 8.0, 100.0, cores=3)
    assert line is not None and line.cores == 3
    sample = JobReports(run("a", (0,), 3), GpuType("RTX3090")).sample(line)
    assert sample.cores == 3
    assert Sampled(samples_done=1.0, per_gpu_throughput=1.0).cores == 0  # older writers


# --- resctrl --------------------------------------------------------------------------------


def fake_resctrl(root: Path, schemata: str, counters: dict[str, str]) -> Path:
    """A fake /sys/fs/resctrl tree: its schemata and MBM counters per domain."""
    root.mkdir(parents=True)
    (root / "schemata").write_text(schemata)
    for domain, value in counters.items():
        (root / "mon_data" / domain).mkdir(parents=True)
        (root / "mon_data" / domain / "mbm_total_bytes").write_text(value + "\n")
    return root


def test_resctrl_with_mbm_and_mba_from_a_fake_tree(tmp_path: Path) -> None:
    root = fake_resctrl(tmp_path / "fake-resctrl", "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n",
                        {"mon_L3_00": "1000", "mon_L3_01": "Unavailable"})
    found = detect(root)
    assert found.mounted and found.mbm and found.mba
    assert total_bytes(root) == 1000
    now = [10.0]
    meter = BandwidthMeter(root, clock=lambda: now[0])
    assert meter.read() == 0.0  # the first reading only sets the start
    (root / "mon_data" / "mon_L3_00" / "mbm_total_bytes").write_text("4000000001000\n")
    now[0] = 12.0
    assert meter.read() == pytest.approx(2000.0)  # 4e12 bytes in 2 s
    assert "allocation (MBA) on" in found.describe()


def test_no_resctrl_or_no_mba_says_the_fallback(tmp_path: Path) -> None:
    none = detect(tmp_path / "absent")
    assert not none.mounted and not none.mba
    assert "halve a CPU job's cores" in none.describe()
    root = fake_resctrl(tmp_path / "fake-resctrl", "L3:0=7ff\n", {})
    found = detect(root)
    assert found.mounted and not found.mbm and not found.mba
    assert "halve a CPU job's cores" in found.describe()
    assert not has_mba("L3:0=ff\nMBX:0=1\n") and has_mba("MB:0=100\n")
    assert total_bytes(root) is None
    assert NodeMemory(real=False, root=root).gbps() == 0.0
    assert ev.NodeHeartbeat(server_id=S, at=1.0).memory_bandwidth_gbps == 0.0
