"""Hare's relaxed-sync workload run as ordinary synchronous jobs through the
main simulator (:mod:`simulator.engine`), so ``hops experiment hare`` can
set Hops (and Gavel's job-level policy) beside the task policies on the very
same jobs.

The conversion
--------------
A task job of :mod:`experiments.hare.workload` (model, sync scale S, rounds R,
arrival a) becomes one synchronous data-parallel :class:`~shared.job.JobSpec`:

* ``model``, ``batch_size`` and ``params``: the job's Gavel catalog entry;
* ``requirements = (S,)``: rigid, the parallelism the relaxed job keeps in
  every round (S tasks of one batch each), so neither side may widen a job;
* ``total_samples = R x S x batch``: the same work, sample for sample;
* ``submit_time = a``: the same arrival; ``sync_scale`` 0 (plain data
  parallel, one batch per GPU per step);
* the weight of the task job is kept aside for the metrics (Hops and Gavel
  do not read weights; the default workload's are all 1).

The cluster has the task cluster's GPU counts per type, on servers of
``server_gpus`` GPUs (the last of a type holds the remainder), with the
bandwidths, network and server size of the built-in ``gavel`` cluster
(world/data/clusters/gavel.yaml: 4-GPU servers, 10 GbE).

What the synchronous jobs pay, as the main simulator has it: profiling on
every GPU type before the first start (the profiling-first layer), plans in
300 s rounds (:data:`scheduling.rounds.ROUND_S`, with fills within a round),
a checkpoint-restart on every (re)start (:func:`world.restarts.
restart_cost`: 250 s for ResNet-50, 120 s for the Transformers, 30 s
otherwise), and the speed of :class:`world.truth.GroundTruth`: one GPU
runs at Gavel's measured single-GPU throughput, as T^c of
:mod:`world.hare` does, but S GPUs run at Gavel's measured consolidated
(one server) or unconsolidated (several servers) per-GPU throughput, not
at Hare's batch / (T^c + T^s) (:func:`speed_rows` compares the two).
``speed="task"`` runs the same engine with Hare's round times instead
(:class:`TaskSpeedTruth`), a control in which only the schedulers differ.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import msgspec

from scheduling.policies.hare.model import TaskJob
from scheduling.registry import make_policy, parse_policy, spec_name
from shared.cluster import Cluster, Server
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from simulator.engine import Simulation
from simulator.metrics import JobOutcome as SimOutcome
from simulator.settings import SimSettings
from simulator.state import JobRecord
from simulator.tasks_result import JobOutcome, TaskSimResult, summarise
from simulator.workloads import SimJob, learning_rate, packed
from world.catalog import ModelTruth, gavel_catalog
from world.clusters import builtin_cluster
from world.hare import TaskModel, task_models
from world.restarts import restart_cost
from world.truth import GroundTruth

# The round-based policies that run the workload as synchronous jobs.
SYNC_POLICIES: tuple[str, ...] = ("hops", "gavel")
SERVER_GPUS = 4  # gavel.yaml's servers (the cloud instances Gavel measured on)
REFERENCE = "gavel"  # the built-in cluster whose types and network are reused
Speed = Literal["measured", "task"]


class SyncJob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One job's life as a synchronous job: its first start (after
    profiling and queueing), finish, its starts (each a checkpoint-restart
    that the engine charges, the first one included) and the GPU type it
    spent most GPU time on."""

    id: JobId
    arrival_s: float
    first_start_s: float
    finish_s: float
    starts: int
    gpu_type: GpuType


class SyncRun(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A run's metrics, computed as the task simulator's (``result``), and
    each job's life (``jobs``, in workload order)."""

    result: TaskSimResult
    jobs: tuple[SyncJob, ...]


def is_sync_policy(name: str) -> bool:
    """Whether ``name`` (a registry spec: ``hops``, ``gavel:lam=inf``) names a
    policy of :data:`SYNC_POLICIES`."""
    return spec_name(name) in SYNC_POLICIES


def sync_cluster(shape: Mapping[GpuType, int], server_gpus: int = SERVER_GPUS,
                 name: str = "hare-sync") -> Cluster:
    """``shape``'s GPUs on servers of ``server_gpus``, typed and networked as
    the built-in ``gavel`` cluster, its types in that cluster's order."""
    if server_gpus < 1:
        raise ValueError("server_gpus must be >= 1")
    ref = builtin_cluster(REFERENCE)
    unknown = sorted(set(shape) - {t.name for t in ref.gpu_types})
    if unknown:
        raise ValueError(f"GPU type {unknown[0]!r} is not in the {REFERENCE} cluster")
    network = ref.servers[0].network
    servers: list[Server] = []
    for spec in ref.gpu_types:
        left = shape.get(spec.name, 0)
        for i in range(math.ceil(left / server_gpus)):
            gpus = min(server_gpus, left - i * server_gpus)
            sid = ServerId(f"{spec.name.lower()}-{i}")
            servers.append(Server(id=sid, gpu_type=spec.name, gpus=gpus, network=network))
    types = tuple(t for t in ref.gpu_types if shape.get(t.name, 0) > 0)
    return Cluster(gpu_types=types, servers=tuple(servers), name=name)


def sync_job(job: TaskJob, catalog: Mapping[str, ModelTruth]) -> SimJob:
    """``job`` as a synchronous job (the rule of the module docstring)."""
    m = catalog.get(job.model)
    if m is None:
        raise ValueError(f"task job {job.id}: model {job.model!r} is not in the catalog")
    lr, rule = learning_rate(m)
    spec = JobSpec(
        id=job.id, model=m.name, batch_size=m.batch_size, params=m.params,
        total_samples=job.rounds * job.tasks_per_round * m.batch_size,
        requirements=(job.tasks_per_round,), base_lr=lr, lr_rule=rule,
        submit_time=job.arrival_s,
    )
    return SimJob(spec=spec, model=m.name)


def task_result(policy: str, jobs: Sequence[TaskJob], outcomes: Sequence[SimOutcome],
                plan_s: Sequence[float]) -> TaskSimResult:
    """The main simulator's outcomes as a task run's result: the very
    :func:`simulator.tasks_result.summarise` of the task simulator, so both
    worlds' metrics are one computation."""
    by_id = {o.id: o for o in outcomes}
    out: list[JobOutcome] = []
    for job in jobs:
        o = by_id.get(job.id)
        if o is None or o.finish is None:
            raise RuntimeError(f"{policy}: job {job.id} did not finish")
        out.append(JobOutcome(id=job.id, arrival_s=o.submit, finish_s=o.finish,
                              weight=job.weight, tasks=job.rounds * job.tasks_per_round))
    return summarise(policy, tuple(out), tuple(plan_s))


def run_jobs(jobs: Sequence[TaskJob], shape: Mapping[GpuType, int], policy: str, *,
             server_gpus: int = SERVER_GPUS, seed: int = 0, speed: Speed = "measured",
             restart_s: float | None = None,
             timer: Callable[[], float] | None = time.perf_counter) -> SyncRun:
    """``jobs`` as synchronous jobs on ``shape`` under the registry's
    ``policy`` (a spec, e.g. ``hops``), driven as :func:`experiments.common.simrun.simulate`
    drives the engine: 300 s rounds, restart costs per model (``restart_s``:
    one for all, as ``--restart-s``). ``speed``: ``measured``, the main
    ground truth; ``task``, Hare's round times (:class:`TaskSpeedTruth`), to
    set the schedulers apart from the speed models."""
    spec = parse_policy(policy)
    cluster = sync_cluster(shape, server_gpus)
    catalog = gavel_catalog()
    truth = (GroundTruth(cluster, catalog) if speed == "measured"
             else TaskSpeedTruth(cluster, catalog, task_models()))
    sim_jobs = [sync_job(j, catalog) for j in jobs]
    # The engine checks plans against the requirement sets the policy plans
    # with, so it takes the policy's own R_num (as simrun does).
    settings = SimSettings(seed=seed, r_num=spec.r_num, restart_s=restart_s)
    sim = Simulation(cluster, sim_jobs, make_policy(spec), truth, settings, timer=timer)
    res = sim.run()
    result = task_result(policy, jobs, res.jobs, res.plan_seconds)
    return SyncRun(result=result, jobs=tuple(_life(sim.jobs[d.id], d) for d in result.jobs))


def _life(rec: JobRecord, done: JobOutcome) -> SyncJob:
    by_type = rec.attained_by_type
    return SyncJob(
        id=done.id, arrival_s=done.arrival_s,
        first_start_s=done.finish_s if rec.first_start is None else rec.first_start,
        finish_s=done.finish_s, starts=rec.restarts,
        gpu_type=max(by_type, key=lambda t: by_type[t]) if by_type else GpuType(""))


class TaskSpeedTruth(GroundTruth):
    """The main ground truth with the task model's speeds for the Hare
    models: a synchronous step on any GPUs takes the slowest GPU's T^c plus
    T^s (:meth:`world.hare.TaskModel.round_s`), wherever they sit; one
    round of the relaxed job with its S tasks side by side. Not a world
    model of its own: a control that leaves only the schedulers different."""

    def __init__(self, cluster: Cluster, catalog: Mapping[str, ModelTruth],
                 models: Mapping[str, TaskModel]) -> None:
        super().__init__(cluster, catalog)
        self._task_models = dict(models)

    def _server_time(self, m: ModelTruth, server: Server, local: int, config: Configuration,
                     t_c: float) -> tuple[float, float, float]:
        tm = self._task_models.get(m.name)
        if tm is None:
            return super()._server_time(m, server, local, config, t_c)
        t = tm.round_s(server.gpu_type)
        return 1.0, t, t


class SpeedRow(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-GPU samples/s of a model at scale S on one type: the main
    simulator's synchronous job (S GPUs packed on the fewest servers) and
    Hare's task model (batch / (T^c + T^s)); ``one_gpu_*``: the single-GPU
    figures both take from Gavel's measurements."""

    model: str
    gpu_type: GpuType
    scale: int
    servers: int
    sync_per_gpu: float
    task_per_gpu: float
    one_gpu_sync: float
    one_gpu_task: float

    @property
    def ratio(self) -> float:
        """Synchronous over task-level speed: < 1, the sync job is slower."""
        return self.sync_per_gpu / self.task_per_gpu


def speed_rows(models: Mapping[str, TaskModel], shape: Mapping[GpuType, int],
               scales: Sequence[int] = (1, 2, 4, 8),
               server_gpus: int = SERVER_GPUS) -> list[SpeedRow]:
    """Every model, type and scale that fits the cluster's GPUs of a type."""
    cluster = sync_cluster(shape, server_gpus)
    truth = GroundTruth(cluster, gavel_catalog())
    rows: list[SpeedRow] = []
    for m in models.values():
        for t in m.compute_s:
            for s in (s for s in scales if s <= cluster.type_gpus(t)):
                config = packed(cluster, t, s)
                rows.append(SpeedRow(
                    model=m.name, gpu_type=t, scale=s, servers=config.num_nodes,
                    sync_per_gpu=truth.throughput(m.name, config) / s,
                    task_per_gpu=m.batch_size / m.round_s(t),
                    one_gpu_sync=truth.single_gpu_throughput(m.name, t),
                    one_gpu_task=m.batch_size / m.compute_s[t]))
    return rows


def restart_costs(models: Sequence[str]) -> dict[str, float]:
    """What one checkpoint-restart costs each model in the main simulator."""
    return {m: restart_cost(m) for m in models}
