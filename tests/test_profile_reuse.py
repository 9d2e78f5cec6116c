"""Profiles reused across the jobs of one profile signature (shared.reuse,
estimation.shared_profiles): the signature, the skip rule, the stale margin,
the database's shared layer and its state, and the simulator's use of them."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.policies import make_policy
from estimation.database import DatabaseState, RecordState, ThroughputDatabase
from estimation.estimator import estimate_job
from scheduling.live.reuse import reuse_events, reused_types
from scheduling.live.state import new_record
from scheduling.registry import profile_reuse
from shared.cluster import Cluster, GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.measurements import ProfileReport, ThroughputSample, TimeModules
from shared.reuse import STALE_MARGIN, Signature, disagrees, must_profile, profile_signature
from simulator.engine import Simulation
from simulator.settings import SimSettings
from simulator.workloads import SimJob
from world.catalog import builtin_catalog
from world.truth import GroundTruth

MODEL = "resnet18-cifar10"
RTX, V100 = GpuType("RTX3090"), GpuType("TitanXP")


def spec(jid: str = "a", **kw: object) -> JobSpec:
    base: dict[str, object] = dict(id=jid, model=MODEL, batch_size=256, params=11_181_642,
                                   total_samples=1_000_000, requirements=(1, 2, 4))
    base.update(kw)
    return msgspec.convert(base, JobSpec)


# ------------------------------------------------------------------ signature


def test_signature_is_what_determines_the_time_modules() -> None:
    a = profile_signature(spec("a"))
    assert a is not None and a == profile_signature(spec("b", total_samples=5, tenant="t2",
                                                         requirements=(8,)))
    for change in ({"model": "vgg"}, {"batch_size": 128}, {"params": 5},
                   {"command": ("python", "train.py")}):
        assert profile_signature(spec("a", **change)) != a, change
    real = spec("a", command=("python", "train.py"), workdir="/w1")
    # Relative paths in the command resolve against the workdir.
    assert profile_signature(real) != profile_signature(
        spec("a", command=("python", "train.py"), workdir="/w2"))
    # The environment is the job's own (output paths, run names): left out.
    assert profile_signature(real) == profile_signature(
        spec("b", command=("python", "train.py"), workdir="/w1", env={"RUN": "b"}))


def test_signature_is_stable_across_runs() -> None:
    # A hash of a canonical encoding, not Python's per-process hash().
    assert profile_signature(spec()) == "542bd2f605207220"


def test_cpu_jobs_have_no_signature() -> None:
    cpu = msgspec.convert(dict(id="c", model="etl", batch_size=1, params=1, total_samples=10,
                               kind="cpu", cores=2), JobSpec)
    assert profile_signature(cpu) is None


# ------------------------------------------------------------ skip and stale


def test_must_profile_skips_only_shared_types() -> None:
    assert must_profile([RTX, V100], frozenset({RTX})) == {V100}
    assert must_profile([RTX], frozenset({RTX, V100})) == frozenset()
    assert must_profile([RTX, V100], frozenset()) == {RTX, V100}


@given(st.sets(st.sampled_from("ABCDE")), st.sets(st.sampled_from("ABCDE")))
def test_reuse_never_skips_a_type_the_signature_was_not_profiled_on(
        supported: set[str], shared: set[str]) -> None:
    types = [GpuType(t) for t in supported]
    need = must_profile(types, frozenset(GpuType(t) for t in shared))
    assert need <= set(types)
    assert set(types) - need <= shared  # every skipped type was profiled


def test_stale_margin() -> None:
    assert STALE_MARGIN == 0.25
    assert not disagrees(100.0, 124.0) and not disagrees(100.0, 76.0)
    assert disagrees(100.0, 126.0) and disagrees(100.0, 74.0)
    assert not disagrees(0.0, 50.0) and not disagrees(50.0, 0.0)


# ------------------------------------------------------------------ database


def cluster2() -> Cluster:
    return Cluster(
        gpu_types=(GpuTypeSpec(RTX, link_bandwidth=2.5e9, net_bandwidth=1e9),
                   GpuTypeSpec(V100, link_bandwidth=2.5e9, net_bandwidth=1e9)),
        servers=(Server(ServerId("r0"), RTX, 4, model="TIGERWAY YK8100-8G"),
                 Server(ServerId("v0"), V100, 4, model="TIGERWAY YK8100-8G")),
    )


def report(job: JobSpec, gpu_type: GpuType, server: str, t_f: float = 0.05) -> ProfileReport:
    modules = TimeModules(t_f=t_f, t_b=2 * t_f, t_u=0.01, t_d=(0.01, 0.012))
    return ProfileReport(job.id, gpu_type, ServerId(server), modules,
                         signature=profile_signature(job) or "")


def test_a_job_is_estimated_from_its_signatures_shared_profile() -> None:
    db, c = ThroughputDatabase(reuse=True), cluster2()
    a, b = spec("a"), spec("b")
    db.record_profile(report(a, RTX, "r0"))
    db.forget(a.id)  # the shared profile outlives the job that made it
    sig = profile_signature(b)
    assert db.shared_types(sig) == {RTX}
    est = estimate_job(db, b, c)
    assert set(est.by_type) == {RTX}
    rec = db.record(b.id, RTX)
    assert rec is not None and rec.reused
    # Its own samples correct its own estimate, not the shared profile.
    db.record_sample(ThroughputSample(b.id, ServerId("r0"), RTX, local_gpus=1, nodes=1,
                                      total_gpus=1, per_gpu_throughput=10.0))
    assert estimate_job(db, b, c).by_type[RTX].agg[0] == pytest.approx(10.0, rel=0.01)
    assert estimate_job(db, spec("c"), c).by_type[RTX].agg[0] == est.by_type[RTX].agg[0]


def test_without_reuse_nothing_is_shared() -> None:
    db = ThroughputDatabase()
    a, b = spec("a"), spec("b")
    db.record_profile(report(a, RTX, "r0"))
    assert db.shared_types(profile_signature(b)) == frozenset()
    assert estimate_job(db, b, cluster2()).by_type == {}


def test_a_stale_profile_is_offered_again_once_profiled_again() -> None:
    db = ThroughputDatabase(reuse=True)
    a = spec("a")
    sig = profile_signature(a)
    assert sig is not None
    db.record_profile(report(a, RTX, "r0"))
    db.record_profile(report(a, V100, "v0"))
    assert db.mark_stale(sig, frozenset({RTX})) == (RTX,)
    assert db.shared_types(sig) == {V100}
    assert db.mark_stale(sig, frozenset({RTX})) == ()  # already stale
    db.record_profile(report(spec("b"), RTX, "r0"))
    assert db.shared_types(sig) == {RTX, V100}
    assert db.mark_stale(Signature("unknown")) == ()


def test_state_round_trip_keeps_the_shared_layer_and_old_states_decode() -> None:
    db = ThroughputDatabase(reuse=True)
    a, b = spec("a"), spec("b")
    db.record_profile(report(a, RTX, "r0"))
    db.record_profile(report(a, V100, "v0"))
    estimate_job(db, b, cluster2())
    sig = profile_signature(a)
    assert sig is not None
    db.mark_stale(sig, frozenset({V100}))
    blob = msgspec.json.encode(db.to_state())
    again = ThroughputDatabase.from_state(msgspec.json.decode(blob, type=DatabaseState))
    assert again.to_state() == db.to_state()
    assert again.shared_types(sig) == {RTX}
    rec = again.record(b.id, RTX)
    assert rec is not None and rec.reused
    # A state written before profiles were shared: no shared layer, no reuse.
    old = {"records": [msgspec.to_builtins(RecordState(job_id=a.id, gpu_type=RTX))]}
    legacy = ThroughputDatabase.from_state(msgspec.convert(old, DatabaseState))
    assert not legacy.reuse and legacy.shared.to_state() == ()
    legacy_report = {"job_id": "a", "gpu_type": "RTX3090", "server_id": "r0"}
    assert msgspec.convert(legacy_report, ProfileReport).signature == ""


# ------------------------------------------------------------------ policies


def test_reuse_is_hops_and_not_the_baselines_unless_asked() -> None:
    assert profile_reuse("hops")
    assert not profile_reuse("hops-paper")
    assert not profile_reuse("sia") and not profile_reuse("gavel")
    assert profile_reuse("sia:profile_reuse=true")
    assert profile_reuse("hived:inner=hops") and not profile_reuse("coda:inner=gavel")


# ----------------------------------------------------------------- simulator


class Spy(Simulation):
    """Records every profiling run the engine starts."""

    runs: list[tuple[JobId, GpuType]]

    def _profile(self, job_id: JobId, gpu_type: GpuType, server: ServerId) -> None:
        self.runs.append((job_id, gpu_type))
        super()._profile(job_id, gpu_type, server)


def simulate(reuse: bool, model_b: str = MODEL) -> Spy:
    c = cluster2()
    jobs = [SimJob(spec("a", total_samples=50_000_000, requirements=(1,)), MODEL),
            SimJob(spec("b", model=model_b, submit_time=900.0), model_b)]
    sim = Spy(c, jobs, make_policy("hops", "lr"), GroundTruth(c, builtin_catalog()),
              SimSettings(profile_reuse=reuse))
    sim.runs = []
    sim.run()
    return sim


def test_simulator_second_job_of_a_signature_is_not_profiled() -> None:
    sim = simulate(reuse=True)
    assert sorted(sim.runs) == [("a", RTX), ("a", V100)]
    assert sim.jobs[JobId("b")].profile_end == 900.0
    assert all(r.finish is not None for r in sim.jobs.values())
    # Without reuse (the baselines' setting) both jobs are profiled everywhere.
    assert sorted(simulate(reuse=False).runs) == [("a", RTX), ("a", V100),
                                                  ("b", RTX), ("b", V100)]


def test_simulator_profiles_a_job_of_another_signature() -> None:
    other = "resnet50-cifar10"
    sim = simulate(reuse=True, model_b=other)
    assert sorted(sim.runs) == [("a", RTX), ("a", V100), ("b", RTX), ("b", V100)]


# --------------------------------------------------------------- live leader


def test_live_leader_takes_only_current_shared_types_for_jobs_being_profiled() -> None:
    c = cluster2()
    new = new_record(spec("n"), 0.0)
    part = msgspec.structs.replace(new_record(spec("p"), 0.0), phase="profiling",
                                   profiled=(V100,))
    queued = msgspec.structs.replace(new_record(spec("q"), 0.0), phase="queued")
    records = {r.job_id: r for r in (new, part, queued)}
    both = frozenset({RTX, V100})
    assert reused_types(new, both, c) == both
    assert reused_types(part, both, c) == {RTX}
    assert reused_types(queued, both, c) == frozenset()
    assert reused_types(new, frozenset({GpuType("K80")}), c) == frozenset()  # not alive
    shared = {JobId("n"): frozenset({RTX}), JobId("p"): both, JobId("q"): both}
    assert reuse_events(records, shared, c) == {"n": (RTX,), "p": (RTX, V100)}
