"""The leader's task loop, its pure part (scheduling/live/taskrun.py): the
snapshot it builds from records, nodes and estimates; how it counts
``task_done`` reports into applied rounds; when it replans; which job
events follow; and the settings that select it."""

from __future__ import annotations

import msgspec
import pytest

from cli.up.stack import StackConfig
from scheduling.live import state as st
from scheduling.live import taskrun as tr
from scheduling.live.state import LiveJobRecord
from scheduling.live.tasks import LiveTaskSettings, TaskSnapshot, replan, split_gpu_id
from scheduling.policies.hare.model import GpuId, TaskJob
from scheduling.policies.hare.sequences import Sequences
from scheduling.registry import PolicyError, make_task_policy, policy_name
from services.runtime.settings import SettingsError
from services.scheduler.settings import scheduler_settings
from shared import events as ev
from shared.cluster import GpuTypeSpec, Server
from shared.configuration import Configuration
from shared.estimate import JobEstimate, ThroughputCurve
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from shared.wire import NO_ESTIMATE, NOT_RELAXED

A, B = GpuType("A"), GpuType("B")


def spec(job: str, s: int = 2, total: int = 1000, batch: int = 32) -> JobSpec:
    return JobSpec(JobId(job), "resnet18", batch, 11_000_000, total, sync_scale=s,
                   requirements=(1,))


def record(job: str, s: int = 2, total: int = 1000, at: float = 1.0,
           phase: str = "queued") -> LiveJobRecord:
    return msgspec.structs.replace(LiveJobRecord(spec=spec(job, s, total), submitted_at=at),
                                   phase=phase)


def node(sid: str, gpu_type: GpuType, gpus: int, alive: bool = True) -> NodeRecord:
    return NodeRecord(server=Server(ServerId(sid), gpu_type, gpus),
                      gpu_type=GpuTypeSpec(gpu_type, 1e9, 1e9), alive=alive)


def estimate(job: str, agg: float = 100.0, dist: float = 80.0) -> JobEstimate:
    return JobEstimate(JobId(job), {A: ThroughputCurve((agg,), (dist,))})


def report(e: tuple[str, int, int, int], server: str = "s", gpu: int = 0) -> ev.TaskDone:
    job, rnd, lo, hi = e
    return ev.TaskDone(term=1, revision=1, job_id=JobId(job), round=rnd, lo=lo, hi=hi,
                       server_id=ServerId(server), gpu_index=gpu, started_at=0.0, ended_at=1.0,
                       at=1.0)


# --- the snapshot --------------------------------------------------------------------


def test_a_relaxed_job_becomes_a_task_job_from_its_estimates() -> None:
    rec = record("j", s=4, total=1000)
    job = tr.task_job(rec, estimate("j", agg=100.0, dist=80.0), {A, B}, applied=3)
    assert isinstance(job, TaskJob)
    # 1000 samples in steps of S * batch = 4 * 32 = 128: 8 rounds (the last one short)
    assert (job.rounds, job.tasks_per_round, job.done_rounds) == (8, 4, 3)
    # T^c = batch / one GPU's throughput; T^s = batch / two nodes' - T^c
    assert job.compute_s == {A: pytest.approx(0.32)}  # B: no estimate, cannot run it
    assert job.sync_s == {A: pytest.approx(0.4 - 0.32)}
    assert job.arrival_s == 1.0
    no_dist = tr.task_job(rec, JobEstimate(JobId("j"), {A: ThroughputCurve((64.0,))}), {A}, 0)
    assert isinstance(no_dist, TaskJob) and no_dist.sync_s == {A: 0.0}
    # two GPUs of one server, where the estimator has them, before two nodes
    local = tr.task_job(rec, JobEstimate(JobId("j"), {A: ThroughputCurve((100.0, 64.0),
                                                                          (80.0,))}), {A}, 0)
    assert isinstance(local, TaskJob) and local.sync_s == {A: pytest.approx(0.5 - 0.32)}


def test_a_job_the_task_policy_cannot_sequence_waits_with_a_coded_reason() -> None:
    plain = tr.task_job(record("p", s=0), estimate("p"), {A}, 0)
    assert isinstance(plain, str) and plain.startswith(f"{NOT_RELAXED}: ")
    for est in (None, JobEstimate(JobId("j"), {B: ThroughputCurve((10.0,))})):
        why = tr.task_job(record("j"), est, {A}, 0)  # none, or only on a type not alive
        assert isinstance(why, str) and why.startswith(f"{NO_ESTIMATE}: ")


def test_the_snapshot_holds_alive_gpus_and_unfinished_jobs() -> None:
    records = {JobId(j): record(j) for j in ("j1", "j2", "p", "e")}
    records[JobId("p")] = record("p", s=0)
    records[JobId("e")] = msgspec.structs.replace(records[JobId("e")], phase="finished")
    progress = tr.Progress(tr.TaskState(applied={JobId("j2"): 16}))  # j2: every round applied
    snap, waits = tr.task_snapshot(
        5.0, records, {JobId("j1"): estimate("j1"), JobId("j2"): estimate("j2")},
        [node("s", A, 2), node("t", A, 1, alive=False)], progress)
    assert [g.id for g in snap.gpus] == ["s:0", "s:1"]
    assert [j.id for j in snap.jobs] == ["j1"] and snap.now == 5.0
    assert set(waits) == {"p"} and waits[JobId("p")].startswith(NOT_RELAXED)


# --- counting reports ----------------------------------------------------------------


def planned(jobs: tuple[str, ...] = ("j1",), gpus: int = 2, horizon: int = 2,
            s: int = 2) -> tuple[tr.Progress, Sequences]:
    records = {JobId(j): record(j, s=s) for j in jobs}
    progress = tr.Progress(tr.TaskState())
    snap, _ = tr.task_snapshot(0.0, records, {JobId(j): estimate(j) for j in jobs},
                               [node("s", A, gpus)], progress)
    seqs = replan(snap, make_task_policy("hare"), None, LiveTaskSettings(horizon_rounds=horizon))
    progress.seqs = seqs
    return progress, seqs


def keys_of(seqs: Sequences, job: str, rnd: int) -> list[tuple[GpuId, tuple[str, int, int, int]]]:
    return [(g, (e.job, e.round, e.lo, e.hi)) for g, e in seqs.entries()
            if (e.job, e.round) == (job, rnd)]


def send(progress: tr.Progress, gpu: GpuId, e: tuple[str, int, int, int],
         seq: int = 0, subject: tuple[str, str] | None = None) -> tr.Counted:
    server, index = gpu.rsplit(":", 1)
    return progress.count(report(e, server, int(index)), subject or (server, e[0]), seq)


def test_a_round_is_applied_once_all_s_micro_batches_are_reported() -> None:
    progress, seqs = planned()
    first, *rest = keys_of(seqs, "j1", 0)
    assert sum(e[3] - e[2] for _, e in [first, *rest]) == 2  # S micro-batches, whole
    outcomes = [send(progress, g, e).outcome for g, e in [first, *rest]]
    assert outcomes[-1] == "applied" and set(outcomes[:-1]) <= {"counted"}
    assert progress.applied == {"j1": 1}
    # the reports of the applied round are no longer kept, but count as done
    assert not progress.done and {(e[0], e[1], e[2]) for _, e in [first, *rest]} <= \
        progress.done_keys()


def test_a_report_counted_twice_is_counted_once() -> None:
    progress, seqs = planned()
    entries = keys_of(seqs, "j1", 0)
    g, e = entries[0]
    assert send(progress, g, e, seq=1).outcome in ("counted", "applied")
    again = send(progress, g, e, seq=1)  # the same stream message, replayed
    assert again.outcome == "duplicate" and "sequence 1" in again.reason
    assert send(progress, g, e, seq=2).outcome == "duplicate"  # a resend, stored twice
    for g2, e2 in entries[1:]:
        send(progress, g2, e2, seq=3)
    assert progress.applied == {"j1": 1}
    assert send(progress, g, e, seq=4).outcome == "duplicate"  # its round is applied
    assert progress.applied == {"j1": 1} and progress.stream_seq == 4
    # the next revision drops the applied round; a resend of it still counts once
    records = {JobId("j1"): record("j1")}
    snap, _ = tr.task_snapshot(1.0, records, {JobId("j1"): estimate("j1")},
                               [node("s", A, 2)], progress)
    progress.seqs = replan(snap, make_task_policy("hare"), progress.seqs)
    assert all(x.round >= 1 for _, x in progress.seqs.entries())
    assert send(progress, g, e, seq=5).outcome == "duplicate"
    forged = send(progress, GpuId("t:0"), ("j1", 1, 0, 1), seq=6)
    assert forged.outcome == "refused"


def test_reports_out_of_order_apply_rounds_in_order() -> None:
    progress, seqs = planned(horizon=2)
    later, earlier = keys_of(seqs, "j1", 1), keys_of(seqs, "j1", 0)
    assert later and earlier
    assert {send(progress, g, e).outcome for g, e in later} == {"counted"}
    assert progress.applied == {}
    last = [send(progress, g, e) for g, e in earlier][-1]
    assert (last.outcome, last.applied, progress.applied) == ("applied", 2, {"j1": 2})


def test_a_report_of_an_entry_not_in_the_sequence_is_refused_and_changes_nothing() -> None:
    progress, seqs = planned(gpus=2)
    (g, e), *_ = keys_of(seqs, "j1", 0)
    other = GpuId("s:1") if g == "s:0" else GpuId("s:0")
    before = progress.state(1)
    for counted in (
        send(progress, GpuId("t:0"), e),  # another server's GPU
        send(progress, other, e) if (other, e) not in keys_of(seqs, "j1", 0) else None,
        send(progress, g, ("j1", 0, e[2], e[3] + 5)),  # other micro-batches
        send(progress, g, ("j9", 0, 0, 1)),  # an invented job
        send(progress, g, e, subject=("t", "j1")),  # its subject names another server
    ):
        if counted is not None:
            assert counted.outcome == "refused" and counted.reason
    assert progress.state(1) == before
    assert tr.Progress(tr.TaskState()).count(report(e), ("s", "j1")).reason == \
        "no sequence was sent yet"


def test_the_state_travels_and_a_replay_counts_nothing_twice() -> None:
    progress, seqs = planned(jobs=("j1", "j2"))
    (g, e), *_ = keys_of(seqs, "j1", 0)
    send(progress, g, e, seq=7)
    progress.started.add(JobId("j1"))
    state = tr.decode_state(tr.encode_state(progress.state(3)))
    assert state == progress.state(3) and state.term == 3 and state.stream_seq == 7
    resumed = tr.Progress(state)
    assert send(resumed, g, e, seq=7).outcome == "duplicate"  # replayed from the stream
    assert send(resumed, g, e, seq=8).outcome == "duplicate"  # the same entry again
    assert resumed.done_keys() == progress.done_keys() and resumed.started == {"j1"}


def test_a_real_jobs_rounds_are_applied_by_its_aggregator_only() -> None:
    """A job with a command: ``task_done`` marks its entries done, and its
    rounds are applied when its aggregator says so (any order, twice), so
    it finishes only after the aggregator's last round."""
    real = JobSpec(JobId("r"), "cnn", 32, 1000, 64, sync_scale=2, requirements=(1,),
                   command=("python", "examples/train_cnn.py"))
    assert tr.aggregated(real) and not tr.aggregated(spec("e"))
    progress, seqs = planned(jobs=("r",))
    records = {JobId("r"): msgspec.structs.replace(record("r", total=64), spec=real)}
    entries = keys_of(seqs, "r", 0)
    for g, e in entries:  # all S reported done: not applied
        server, index = g.rsplit(":", 1)
        got = progress.count(report(e, server, int(index)), (server, "r"), aggregated=True)
        assert got.outcome == "counted", got
    assert progress.applied == {} and tr.to_finish(records, progress) == []
    assert {e[:3] for _, e in entries} <= progress.done_keys()
    assert progress.round_applied(JobId("r"), 0, seq=5) == tr.Counted("applied", applied=1)
    assert progress.applied == {"r": 1} and not progress.done  # its reports dropped
    assert tr.to_finish(records, progress) == ["r"]
    assert progress.round_applied(JobId("r"), 0, seq=5).outcome == "duplicate"  # replayed
    assert progress.round_applied(JobId("r"), 0, seq=6).outcome == "duplicate"  # sent twice
    assert progress.round_applied(JobId("r"), 2, seq=7) == tr.Counted("applied", applied=2)
    assert progress.round_applied(JobId("r"), 1, seq=8).outcome == "duplicate"  # late
    assert progress.round_applied(JobId("r"), -1).outcome == "refused"
    assert progress.applied == {"r": 3} and progress.agg_seq == 8
    resumed = tr.Progress(tr.decode_state(tr.encode_state(progress.state(2))))
    assert resumed.agg_seq == 8 and resumed.applied == {"r": 3}
    assert resumed.round_applied(JobId("r"), 2, seq=8).outcome == "duplicate"


# --- triggers and job events ---------------------------------------------------------


def test_replans_on_arrivals_ends_gpus_rounds_and_a_new_term_only() -> None:
    progress, seqs = planned(jobs=("j1",))
    records = {JobId("j1"): record("j1")}
    ests = {JobId("j1"): estimate("j1"), JobId("j2"): estimate("j2")}
    nodes = [node("s", A, 2)]
    snap, _ = tr.task_snapshot(1.0, records, ests, nodes, progress)
    assert tr.replan_reasons(seqs, snap, False, False) == []  # a report alone: no replan
    assert tr.replan_reasons(seqs, snap, True, False) == ["round applied"]
    assert tr.replan_reasons(seqs, snap, False, True) == ["new term"]
    arrived, _ = tr.task_snapshot(1.0, records | {JobId("j2"): record("j2")}, ests, nodes,
                                  progress)
    assert tr.replan_reasons(seqs, arrived, False, False) == ["jobs changed"]
    ended, _ = tr.task_snapshot(1.0, {}, ests, nodes, progress)
    assert tr.replan_reasons(seqs, ended, False, False) == ["jobs changed"]
    grown, _ = tr.task_snapshot(1.0, records, ests, [*nodes, node("t", A, 1)], progress)
    assert tr.replan_reasons(seqs, grown, False, False) == ["GPUs changed"]
    assert tr.replan_reasons(None, snap, False, True) == ["first revision"]
    empty = TaskSnapshot(1.0, (), snap.gpus)
    assert tr.replan_reasons(None, empty, False, True) == []


def test_a_job_starts_on_the_gpus_of_its_entries_and_finishes_at_its_last_round() -> None:
    progress, seqs = planned(jobs=("j1",), gpus=2)
    records = {JobId("j1"): record("j1", total=64)}  # one round of 2 x 32
    servers = {split_gpu_id(g)[1] for g, e in seqs.entries() if e.job == "j1"}
    assert tr.to_start(seqs, records, ()) == {"j1": Configuration.of({"s": len(servers)})}
    assert tr.to_start(seqs, records, {JobId("j1")}) == {}
    running = {JobId("j1"): msgspec.structs.replace(records[JobId("j1")], phase="running")}
    assert tr.to_start(seqs, running, ()) == {}  # it had its job_started
    profiling = {JobId("j1"): msgspec.structs.replace(records[JobId("j1")], phase="submitted")}
    assert tr.to_start(seqs, profiling, ()) == {}  # queued first, by the next pass
    assert tr.to_finish(records, progress) == []
    for g, e in keys_of(seqs, "j1", 0):
        send(progress, g, e)
    assert tr.to_finish(records, progress) == ["j1"]
    progress.finished.add(JobId("j1"))
    assert tr.to_finish(records, progress) == []
    assert tr.samples_applied(records[JobId("j1")], 1) == 64.0
    progress.forget_jobs(())
    assert not progress.applied and not progress.finished


def test_records_queue_and_carry_the_task_loops_reasons() -> None:
    rec = record("j", phase="submitted")
    queued = st.queue_now(rec, 2.0)
    assert queued is not None and queued.phase == "queued"
    assert st.queue_now(queued, 3.0) is None
    waiting = tr.wait_reason(queued, f"{NO_ESTIMATE}: none")
    assert waiting is not None and waiting.reason == f"{NO_ESTIMATE}: none"
    cleared = tr.wait_reason(waiting, None)
    assert cleared is not None and cleared.reason == ""
    assert tr.wait_reason(queued, None) is None
    held = msgspec.structs.replace(queued, held=True, reason="held")
    assert tr.wait_reason(held, f"{NO_ESTIMATE}: none") is None


def test_hops_up_takes_a_task_policy() -> None:
    assert StackConfig(policy="hare-eft").policy == "hare-eft"
    with pytest.raises(PolicyError):
        StackConfig(policy="hare:nope=1")


def test_hops_policy_names_a_task_policy() -> None:
    cfg = scheduler_settings({"HOPS_POLICY": "hare-eft", "HOPS_TASK_RESEND_S": "1.5",
                              "HOPS_TASK_HORIZON": "2"})
    assert cfg.task_policy is not None and policy_name(cfg.task_policy) == "hare-eft"
    assert (policy_name(cfg.policy), cfg.task_resend_s, cfg.task_horizon) == ("hops", 1.5, 2)
    assert scheduler_settings({}, {"policy": "srtf"}).task_policy is not None
    assert scheduler_settings({"HOPS_POLICY": "sia"}).task_policy is None
    with pytest.raises(SettingsError, match="HOPS_POLICY"):
        scheduler_settings({"HOPS_POLICY": "hare:nope=1"})
    with pytest.raises(SettingsError, match="HOPS_TASK_HORIZON"):
        scheduler_settings({"HOPS_TASK_HORIZON": "0"})
