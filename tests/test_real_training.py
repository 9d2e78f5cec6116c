"""Real training under the live system, on the CPU: the example scripts
(examples/train_cnn.py, examples/train_lm.py, PyTorch with the in-job
plugin hops/plugin/), not stand-ins.

- The REAL executor (``python -m executor --backend real``) against a real
  nats-server, the monitor and the estimator service (each its own
  process): train_cnn is profiled, runs, is preempted (SIGTERM: the plugin
  checkpoints and exits 0), resumes from its checkpoint on two GPUs (a
  resize: DistributedDataParallel over gloo) and finishes; its profile and
  running-mode samples reach the estimator, whose answer is built from them.
- Failing commands (a bad argument to train_cnn, a script that raises) are
  reported as ``job_failed`` with their exit codes and the errors in the
  log tails; a stop that reaches a job exiting after it reported
  ``finished`` (a plan stopping a job in the instant it ends) still ends
  it as ``job_finished``, not as a stop to requeue.
- The whole live system (:class:`tests.livestack.LiveStack` with real
  executors on examples/cluster-local-cpu.yaml, as ``hops up --executor
  real`` runs it): malformed commands are refused at submission (NATS and
  HTTP) and recorded nowhere; a job whose working folder is missing fails
  with a reason naming it; a CNN and a language-model job are profiled by
  the real plugin, placed, started and finished.

The machine has no NVML: the executors run the devices the cluster file
declares (one process per device, one thread each).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats.errors
import pytest

from estimation.database import DEFAULT_RECENT_WEIGHT, RunningStat, ThroughputDatabase
from estimation.estimator import round_sig
from executor.adopt import load_state, state_path
from executor.reports import End, JobReports, verdict
from services.estimator.service import apply_sample_event, estimates_for
from shared import events as ev
from shared import subjects
from shared.cluster import Cluster
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.jobreport import AnyReport, Checkpointed, Finished, Started, decode_line
from tests.livestack import LiveStack, until
from tests.test_live_executor import (
    Client,
    Procs,
    announce,
    client,
    eventually,
    nats_server,
    nats_url,
    procs,
    start_cmd,
)
from world.clusters import cluster_arg

__all__ = ["client", "nats_server", "nats_url", "procs"]  # fixtures

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_FILE = ROOT / "examples" / "cluster-local-cpu.yaml"
CNN = ROOT / "examples" / "train_cnn.py"
LM = ROOT / "examples" / "train_lm.py"
A = ServerId("local-a")
CPU = GpuType("cpu")
CNN_PARAMS = 113_738  # SmallCNN
LM_PARAMS = 338_944  # TinyLM at the script's defaults


def cnn_spec(job: str, total: int, *args: str) -> JobSpec:
    return JobSpec(JobId(job), "small-cnn", 8, CNN_PARAMS, total, requirements=(1, 2),
                   base_lr=0.05, command=(sys.executable, str(CNN), *args), workdir=str(ROOT))


def report_lines(path: Path) -> list[AnyReport]:
    lines = [decode_line(raw) for raw in path.read_bytes().splitlines()]
    return [line for line in lines if line is not None]


async def poll(probe: Callable[[], Any], what: str, timeout: float) -> Any:
    """The first truthy result of the coroutine function ``probe``, polled
    until ``timeout``; an assertion naming ``what`` after it."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        await asyncio.sleep(0.2)


async def estimate(client: Client, spec: JobSpec, cluster: Cluster) -> ev.EstimateReply | None:
    """The estimator service's answer, None while no replica serves yet."""
    req = ev.EstimateRequest(jobs=(spec,), cluster=cluster)
    try:
        msg = await client.nc.request(subjects.ESTIMATE, ev.encode(req), timeout=3)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):  # still catching up
        return None
    return ev.decode_estimate_reply(msg.data)


async def stream_events(client: Client) -> list[ev.SampleEvent]:
    """Every message of HOPS_SAMPLES, in stream order."""
    name = subjects.STREAM_SAMPLES.name
    info = await client.js.stream_info(name)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await client.js.get_msg(name, seq)
        out.append(ev.decode_sample_event(raw.data or b""))
    return out


# --- the executor, one job's life ---------------------------------------------------


async def test_train_cnn_is_profiled_preempted_resumed_and_finishes(
        procs: Procs, client: Client, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cluster = cluster_arg(str(CLUSTER_FILE))
    procs.monitor()
    procs.start("estimator", "services.estimator")
    procs.start("executor", "executor", "--cluster", str(CLUSTER_FILE), "--server-id", A,
                "--backend", "real", "--run-dir", str(runs), "--stop-grace-s", "20",
                "--allow-root-jobs", HOPS_PROFILE_ITERS="5", HOPS_SAMPLE_S="0.3")
    await client.wait_node(A)
    await announce(client, "cnn", {A: 2})  # the monitor relays its reports
    events = await client.collect(subjects.job_events("cnn"), ev.decode_job_event)
    beats = await client.collect(subjects.job_heartbeat(A, "cnn"), ev.decode_job_heartbeat)
    samples = await client.collect(subjects.samples("cnn"), ev.decode_sample_event)
    profiles = await client.collect(subjects.profiles("cnn"), ev.decode_sample_event)
    job = cnn_spec("cnn", 3000)
    report = runs / "cnn" / "reports" / f"{A}.jsonl"

    def why() -> str:
        return procs.log("executor")[-3000:]

    # profiling: one process, 5 measured iterations, the profile reaches the estimator
    prof = start_cmd("k-prof", job, A, {A: 1}, (1,), mode="profile")
    assert (await client.command(A, prof)).ok
    await eventually(lambda: bool(profiles), 60, "profile_reported")
    (profiled,) = profiles
    assert isinstance(profiled, ev.ProfileReported), profiled
    modules = profiled.report.modules
    assert (profiled.report.server_id, profiled.report.gpu_type) == (A, CPU)
    assert profiled.report.batch_size == 8 and len(modules.t_d) == 5
    assert modules.t_f > 0 and modules.t_b > 0 and modules.t_u > 0
    async def profiled_estimate() -> ev.EstimateReply | None:
        # The estimator applies the stream asynchronously: an answer may come
        # before the profile is in it.
        reply = await estimate(client, job, cluster)
        return reply if reply is not None and JobId("cnn") in reply.estimates else None

    answer = await poll(profiled_estimate, "an estimate after the profile", 30)
    assert answer.ok and set(answer.estimates[JobId("cnn")].by_type) == {CPU}, answer

    # the profiling process exits 0 after its report, and says nothing more
    await eventually(lambda: load_state(state_path(runs, A), A).jobs == (), 30,
                     "the profiling process ended")
    assert not events, events

    # running on one GPU, then preempted: SIGTERM, checkpoint, exit 0
    first = await client.command(A, start_cmd("k-run-1", job, A, {A: 1}, (0,)))
    assert first.ok, first
    await eventually(lambda: any(b.samples_done > 0 for b in beats), 60, "progress")
    stopped = await client.command(A, ev.StopJob(key="s-1", job_id=JobId("cnn")), timeout=30)
    assert stopped.ok and stopped.exit_code == 0, stopped
    assert 0 < stopped.samples_done < job.total_samples, stopped
    lines = report_lines(report)
    assert isinstance(lines[-1], Checkpointed), lines[-3:]
    checkpoint = runs / "cnn" / "checkpoint" / "latest.pt"
    assert (lines[-1].samples_done, lines[-1].path) == (stopped.samples_done, str(checkpoint))
    assert checkpoint.is_file()
    assert not events, events  # a stop is neither a finish nor a failure
    ran_before = len(lines)

    # the first run's samples reach the estimator: once it has applied the
    # whole stream its answer equals the library's, and the type layer's
    # measured one-GPU cell overrides the formula (Hops §3.5)
    async def settled() -> ev.EstimateReply | None:
        db = ThroughputDatabase(reuse=True)  # as the estimator service keeps it
        for message in await stream_events(client):
            apply_sample_event(db, message)
        wanted, _ = estimates_for(db, ev.EstimateRequest(jobs=(job,), cluster=cluster))
        got = await estimate(client, job, cluster)
        return got if got == wanted else None

    reply = await poll(settled, "the estimator's answer from the whole stream", 20)
    stat = RunningStat()
    for message in await stream_events(client):
        if isinstance(message, ev.SampleReported):
            stat.add(message.sample.per_gpu_throughput, DEFAULT_RECENT_WEIGHT)
    assert stat.count > 0 and reply is not None
    curve = reply.estimates[JobId("cnn")].by_type[CPU]
    assert curve.agg[0] == round_sig(stat.recent, 4), (curve, stat)

    # resumed on two GPUs (a resize), from the checkpoint, until the end
    resumed_at = len(beats)
    second = start_cmd("k-run-2", job, A, {A: 2}, (0, 1), samples=stopped.samples_done)
    assert (await client.command(A, second)).ok
    await eventually(lambda: bool(events), 90, f"the end of the job\n{why()}")
    (end,) = events
    assert isinstance(end, ev.JobFinished) and end.exit_code == 0, (end, why())
    lines = report_lines(report)[ran_before:]
    started = lines[0]
    assert isinstance(started, Started), lines[:2]
    assert (started.samples_done, started.checkpoint, started.world_size) == \
        (stopped.samples_done, str(checkpoint), 2)
    assert isinstance(lines[-1], Finished) and lines[-1].samples_done == job.total_samples
    after = [b.samples_done for b in beats[resumed_at:]]
    assert after and after[0] == stopped.samples_done, after  # not 0: resumed
    assert after == sorted(after), after
    log1 = (runs / "cnn" / "logs" / f"{A}-rank1.log").read_text()
    assert "start k-run-2" in log1  # the second rank ran (and exited 0)

    # running-mode samples: on the stream, and in the estimator's answer
    sampled = [s.sample for s in samples if isinstance(s, ev.SampleReported)]
    by_gpus = {k: [s for s in sampled if s.local_gpus == k] for k in (1, 2)}
    assert by_gpus[1] and by_gpus[2], sampled
    assert all((s.server_id, s.gpu_type, s.nodes) == (A, CPU, 1) for s in sampled)
    assert all(s.per_gpu_throughput > 0 and s.data_times for s in sampled)
    stored = [m.sample for m in await stream_events(client) if isinstance(m, ev.SampleReported)]
    assert stored == sampled

    # the job has ended: the estimator drops its own record (its measured
    # samples); a job of its signature is still estimated, from the shared
    # profile alone (issue 33's reuse), so the answer is no longer the one
    # the samples made
    async def forgotten() -> bool:
        now = await estimate(client, job, cluster)
        cnn = JobId("cnn")
        return (now is not None and now.shared.get(cnn) == (CPU,)
                and now.estimates.get(cnn) != reply.estimates[cnn])

    await poll(forgotten, "the estimator forgets the ended job", 20)


# --- failures, and a stop that comes too late ----------------------------------------

# train_cnn, then a slow exit: its work is done (``finished`` is reported)
# when a stop reaches it, as when a plan stops a job in the instant it ends.
LINGER = (f"import sys, time; sys.path.insert(0, {str(CNN.parent)!r}); import train_cnn; "
          "code = train_cnn.main([]); print('training returned', code, flush=True); "
          "time.sleep(120); sys.exit(code)")


async def test_failing_commands_fail_and_a_finish_outlives_a_late_stop(
        procs: Procs, client: Client, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    procs.monitor()
    procs.start("executor", "executor", "--cluster", str(CLUSTER_FILE), "--server-id", A,
                "--backend", "real", "--run-dir", str(runs), "--stop-grace-s", "10",
                "--allow-root-jobs")
    await client.wait_node(A)
    for job in ("badarg", "raises", "linger"):  # the monitor relays their reports
        await announce(client, job, {A: 1})
    events = await client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
    nodes = await client.collect(subjects.node_heartbeat(A), ev.decode_node_heartbeat)
    badarg = cnn_spec("badarg", 1000, "--lr-rule", "cubic")
    raises = JobSpec(JobId("raises"), "m", 8, 1000, 1000, requirements=(1,),
                     command=(sys.executable, "-c", "import sys; print('epoch 0', flush=True); "
                              "raise RuntimeError('loss is nan at step 3')"),
                     workdir=str(ROOT))
    assert (await client.command(A, start_cmd("k-bad", badarg, A, {A: 1}, (0,)))).ok
    assert (await client.command(A, start_cmd("k-raise", raises, A, {A: 1}, (1,)))).ok
    await eventually(lambda: len(events) == 2, 60, "both jobs ended")
    ended = {e.job_id: e for e in events}
    bad, boom = ended[JobId("badarg")], ended[JobId("raises")]
    assert isinstance(bad, ev.JobFailed) and bad.exit_code == 2, bad  # argparse's exit
    assert "invalid choice: 'cubic'" in bad.log_tail, bad.log_tail
    assert f"exited with code 2 on {A}" in bad.reason
    assert isinstance(boom, ev.JobFailed) and boom.exit_code == 1, boom
    assert "RuntimeError: loss is nan at step 3" in boom.log_tail, boom.log_tail
    assert "epoch 0" in boom.log_tail and f"exited with code 1 on {A}" in boom.reason

    # the work is done, the process still exiting: a stop now must not lose the finish
    # (acknowledged as a stop, the job would be requeued and redone from its checkpoint)
    linger = JobSpec(JobId("linger"), "small-cnn", 8, CNN_PARAMS, 64, requirements=(1,),
                     command=(sys.executable, "-c", LINGER), workdir=str(ROOT))
    assert (await client.command(A, start_cmd("k-linger", linger, A, {A: 1}, (0,)))).ok
    log = runs / "linger" / "logs" / f"{A}-rank0.log"
    await eventually(lambda: log.exists() and "training returned 0" in log.read_text(), 60,
                     "training done")
    seen = len(nodes)  # a node beat after the finished line no longer lists the job
    await eventually(lambda: any(n.running == () for n in nodes[seen:]), 10, "job ending")
    assert [e for e in events if e.job_id == "linger"] == []
    ack = await client.command(A, ev.StopJob(key="s-linger", job_id=JobId("linger")))
    assert ack.ok and ack.samples_done == 64 and ack.exit_code == -15, ack  # SIGTERM
    await eventually(lambda: any(e.job_id == "linger" for e in events), 5, "job_finished")
    (done,) = [e for e in events if e.job_id == "linger"]
    assert isinstance(done, ev.JobFinished), done
    assert done.exit_code == -15 and "training returned 0" in done.log_tail, done


def test_a_stop_after_the_finished_line_is_a_finish() -> None:
    """:func:`executor.reports.verdict` after a stop: only a run whose node
    of rank 0 reported ``finished`` calls for an event."""
    cmd = start_cmd("k", cnn_spec("j", 64), A, {A: 2}, (0, 1))
    killed = End({0: -15, 1: 0}, log_tail="tail")
    reports = JobReports(cmd, CPU)
    reports.apply(Started(samples_done=0.0))
    assert verdict(reports, killed, 0, 1.0, stopped=True) is None  # stopped mid-run
    assert isinstance(verdict(reports, killed, 0, 1.0), ev.JobFailed)  # no stop: a failure
    reports.apply(Finished(samples_done=64.0))
    assert verdict(reports, killed, 0, 1.0, stopped=True) == ev.JobFinished(
        job_id=JobId("j"), at=1.0, exit_code=-15, log_tail="tail")
    assert verdict(reports, killed, 1, 1.0, stopped=True) is None  # rank 0's node speaks
    profiling = JobReports(start_cmd("k", cnn_spec("j", 64), A, {A: 1}, (0,), mode="profile"),
                           CPU, finished=True)
    assert verdict(profiling, killed, 0, 1.0, stopped=True) is None


# --- the whole live system ------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    affinity = "local-a=0|1;local-b=1" if len(os.sched_getaffinity(0)) >= 2 else ""
    # torch processes take a second or two to exit on 2 busy cores: a longer grace
    env = {"HOPS_PROFILE_ITERS": "5", "HOPS_SAMPLE_S": "0.5", "HOPS_STOP_GRACE_S": "15",
           # the scripts and the interpreter may lie in root's private folders
           "HOPS_ALLOW_ROOT_JOBS": "1"}
    with LiveStack(tmp_path_factory.mktemp("real"), CLUSTER_FILE.read_text(), env=env,
                   executor="real", cpu_affinity=affinity) as s:
        yield s


def submission(job: str, script: Path, batch: int, params: int, total: int,
               **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"id": job, "model": script.stem, "batch_size": batch,
                            "params": params, "total_samples": total,
                            "requirements": [1, 2], "base_lr": 0.05,
                            "command": [sys.executable, str(script)], "workdir": str(ROOT)}
    spec.update(extra)
    return spec


def test_malformed_commands_are_refused_at_submission(stack: LiveStack) -> None:
    bus = stack.bus_()
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "empty-program": ({"command": [""]}, "the program (first entry) must not be empty"),
        "sets-rank": ({"env": {"RANK": "3"}},
                      "env: RANK is set by the executor and cannot be overridden"),
        "bad-env-name": ({"env": {"MY-VAR": "1"}}, "'MY-VAR' is not a valid variable name"),
        "env-no-cmd": ({"command": [], "env": {"X": "1"}}, "workdir and env need a command"),
    }
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as gateway:
        for job, (change, why) in cases.items():
            spec = submission(job, CNN, 8, CNN_PARAMS, 1000, **change)
            reply = stack.submit(spec)
            assert (reply["ok"], reply["code"]) == (False, "invalid"), reply
            assert why in reply["error"], reply
            answer = gateway.post("/jobs", json=spec)
            assert answer.status_code == 422, answer.text
            assert why in answer.json()["error"], answer.text
    assert not set(cases) & set(bus.bucket("hops_jobs"))
    assert not [m for m in bus.messages("hops.v1.jobs.events.")
                if m.subject.rsplit(".", 1)[1] in cases]

    # a working folder that is not there: accepted (it is the executors' to
    # check), then failed by the executor that was to run it, naming the folder
    missing = stack.root / "no-such-folder"
    reply = stack.submit(submission("nowhere", CNN, 8, CNN_PARAMS, 1000,
                                    workdir=str(missing)))
    assert reply["ok"] is True, reply
    assert stack.wait_final(["nowhere"], 30) == {"nowhere": "failed"}
    (failed,) = [m.body for m in stack.bus_().job_events("nowhere", "job_failed")]
    assert f"working folder {missing} does not exist on local-" in failed["reason"], failed
    until(lambda: "nowhere" not in stack.allocs(), "nowhere's GPUs released", 10, stack.logs)


def executor_said(stack: LiveStack) -> set[tuple[str, str]]:
    """(job, event) of every log line of the real executors."""
    out = set()
    for line in (stack.config.logs_dir / "cluster.log").read_text().splitlines():
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and "job_id" in said:
            out.add((str(said["job_id"]), str(said.get("event"))))
    return out


def test_a_cnn_and_a_language_model_train_end_to_end(stack: LiveStack) -> None:
    bus = stack.bus_()
    jobs = {
        "cnn-e2e": submission("cnn-e2e", CNN, 8, CNN_PARAMS, 1200),
        "lm-e2e": submission("lm-e2e", LM, 8, LM_PARAMS, 600, base_lr=0.001,
                             lr_rule="sqrt"),
    }
    for job, spec in jobs.items():
        reply = stack.submit(spec)
        assert reply["ok"] is True and reply["job_id"] == job, reply
    phases = stack.wait_final(list(jobs), 90)
    assert phases == dict.fromkeys(jobs, "finished"), stack.logs()
    runs = stack.config.runs_dir
    for job, spec in jobs.items():
        why = f"{job}\n{stack.logs()}"
        profiles = bus.stored("HOPS_SAMPLES", f"hops.v1.profiles.{job}")
        assert profiles, why
        for p in profiles:  # from the plugin's measurements, not a model of them
            report = p["report"]
            assert report["gpu_type"] == "cpu" and report["batch_size"] == spec["batch_size"]
            assert len(report["modules"]["t_d"]) == 5 and report["modules"]["t_f"] > 0
        kinds = [e["type"] for e in bus.stored("HOPS_JOBS", f"hops.v1.jobs.events.{job}")]
        assert kinds[0] == "job_submitted", (kinds, why)
        assert {"job_profiled", "job_started", "job_finished"} <= set(kinds), (kinds, why)
        assert "job_failed" not in kinds, (kinds, why)
        (finished,) = [m.body for m in bus.job_events(job, "job_finished")]
        if finished["exit_code"] != 0:  # a plan's stop reached it exiting after its finish
            assert finished["exit_code"] == -signal.SIGTERM, finished
            assert (job, "job finished before the stop") in executor_said(stack), why
        record = stack.record(job)
        assert record is not None and record["phase"] == "finished", why
        assert record["samples_done"] == spec["total_samples"], record
        # the last run's report: started, ..., finished with every sample.
        # Every server of that run writes its own (the policy may have
        # grown the job over two when GPUs were idle); runs before it were
        # stopped and wrote none.
        reports = list((runs / job / "reports").glob("*.jsonl"))
        ends = [line for r in reports for line in report_lines(r) if isinstance(line, Finished)]
        assert ends and {e.samples_done for e in ends} == {spec["total_samples"]}, (ends, why)
        assert len(ends) <= len(reports), (ends, why)
    until(lambda: not set(jobs) & set(stack.allocs()), "the jobs' GPUs released", 10,
          stack.logs)
    sampled = bus.messages("hops.v1.samples.", "sample_reported")
    assert {m.body["sample"]["job_id"] for m in sampled} == set(jobs)
