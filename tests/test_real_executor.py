"""The REAL node executor against a real nats-server and real processes.

Each job runs a stand-in training script (written below into the test's
folder): a real Python process that reads the job environment, appends
:mod:`shared.jobreport` lines to ``$HOPS_REPORT_FILE`` (started, progress,
sampled, profiled, finished), and on SIGTERM writes a checkpoint, reports
it and exits 0, as the training plugin does. Knobs travel in the job's
``env`` (``STANDIN_*``). The machine has no NVML, so the executor runs the
devices its cluster file declares.

Covered: registration with address and devices, start -> heartbeats ->
samples -> ``job_finished`` (exit code 0, log tail), the launch environment
and log files, profiling, stop with SIGTERM (ack with progress, exit code,
log tail), a failing command, refusals that fail the job (no command,
missing working folder, missing program), SIGKILL of a whole process group
that ignores SIGTERM, and a SIGKILLed executor that restarts, adopts the job
still running (and reports its end) and reports the job whose processes
died meanwhile as lost, which the monitor then releases.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nats.aio.msg import Msg

from executor.adopt import ExecutorState, group_members, load_state, state_path
from services.monitor.release import VANISHED
from shared import events as ev
from shared import subjects
from shared.configuration import Configuration
from shared.ids import JobId, ServerId
from shared.job import JobSpec
from shared.jobreport import Checkpointed, decode_line
from shared.records import Placement
from tests.test_live_executor import (
    Client,
    Procs,
    client,
    eventually,
    nats_server,
    nats_url,
    procs,
    start_cmd,
)

__all__ = ["client", "nats_server", "nats_url", "procs"]  # fixtures

A = ServerId("node-a")
CLUSTER = """\
name: local-test
gpu_types:
  - {name: cpu, link_bandwidth: 2.0e8, net_bandwidth: 2.0e8}
servers:
  - {id: node-a, gpu_type: cpu, gpus: 2}
  - {id: node-b, gpu_type: cpu, gpus: 1}
"""

STANDIN = r'''
"""A stand-in training script: real progress reports, no training."""
import json, os, signal, subprocess, sys, time

env = os.environ
rank = int(env["LOCAL_RANK"])
done = float(env["HOPS_SAMPLES_DONE"])
total = float(env["HOPS_TOTAL_SAMPLES"])
step = float(env.get("STANDIN_STEP", "50"))
tick = float(env.get("STANDIN_TICK_S", "0.05"))
finish_file = env.get("STANDIN_FINISH_FILE", "")


def report(kind, **fields):
    if rank == 0:  # only local rank 0 of a node reports
        with open(env["HOPS_REPORT_FILE"], "a") as f:
            f.write(json.dumps({"kind": kind, "at": time.time(), **fields}) + "\n")


shown = {k: v for k, v in env.items()
         if k.startswith(("HOPS_", "MASTER_", "WORLD_", "LOCAL_", "CUDA_", "OMP_"))
         or k == "RANK"}
print("ENV " + json.dumps(shown, sort_keys=True), flush=True)
print("CWD " + os.getcwd(), flush=True)
stopping = []
if env.get("STANDIN_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
else:
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
report("started", samples_done=done, world_size=int(env["WORLD_SIZE"]))
if env["HOPS_MODE"] == "profile":
    modules = {"t_f": 0.01, "t_b": 0.02, "t_u": 0.005, "t_d": [0.001] * 5}
    report("profiled", modules=modules, batch_size=int(env["HOPS_BATCH_SIZE"]), iterations=5)
    sys.exit(0)
last_sample = time.time()
while done < total:
    if stopping:
        path = os.path.join(env["HOPS_CHECKPOINT_DIR"], "checkpoint.txt")
        with open(path, "w") as f:
            f.write(str(done))
        report("checkpointed", samples_done=done, path=path)
        print(f"checkpointed at {done}", flush=True)
        sys.exit(0)
    time.sleep(tick)
    if finish_file and done + step >= total and not os.path.exists(finish_file):
        continue  # the last step waits for the test's word
    done = min(total, done + step)
    report("progress", samples_done=done, iterations=1)
    if time.time() - last_sample >= float(env["HOPS_SAMPLE_S"]):
        report("sampled", samples_done=done, per_gpu_throughput=step / tick,
               data_times=[0.001], wait_times=[0.0])
        last_sample = time.time()
report("finished", samples_done=done)
print(f"finished at {done}", flush=True)
'''


class Setup:
    """The files of one test: cluster, stand-in script, working and run folders."""

    def __init__(self, tmp: Path) -> None:
        self.cluster = tmp / "cluster.yaml"
        self.cluster.write_text(CLUSTER)
        self.script = tmp / "standin.py"
        self.script.write_text(STANDIN)
        self.work = tmp / "work"
        self.work.mkdir()
        self.runs = tmp / "runs"

    def spec(self, job: str, total: float = 1e9, command: tuple[str, ...] | None = None,
             workdir: str | None = None, **env: str) -> JobSpec:
        argv = (sys.executable, str(self.script)) if command is None else command
        return JobSpec(JobId(job), "standin", 32, 1000, int(total), requirements=(1, 2),
                       base_lr=0.1, command=argv,
                       workdir=str(self.work) if workdir is None else workdir,
                       env=env if argv else {})

    def executor(self, procs: Procs, name: str = "executor", **env: str) -> subprocess.Popen[bytes]:
        # Jobs run as the executor's user, root included: the stand-in lives in
        # the test's private folder (tests/test_real_jobuser.py runs one as nobody).
        return procs.start(name, "executor", "--cluster", str(self.cluster), "--server-id", A,
                           "--backend", "real", "--run-dir", str(self.runs),
                           "--stop-grace-s", "1", "--allow-root-jobs", **env)

    def state(self) -> ExecutorState:
        return load_state(state_path(self.runs, A), A)

    def log(self, job: str, rank: int = 0) -> str:
        return (self.runs / job / "logs" / f"{A}-rank{rank}.log").read_text()


async def registrar(client: Client) -> list[ev.RegisterNode]:
    """Answer registrations as the monitor does (tests without a monitor)."""
    seen: list[ev.RegisterNode] = []

    async def on_msg(msg: Msg) -> None:
        req = ev.decode_register(msg.data)
        seen.append(req)
        await msg.respond(ev.encode(ev.Reply(ok=True, server_id=req.server.id)))

    await client.nc.subscribe(subjects.NODES_REGISTER_ALL, cb=on_msg)
    await client.nc.flush()
    return seen


def env_of(log: str) -> dict[str, str]:
    line = next(x for x in log.splitlines() if x.startswith("ENV "))
    shown: dict[str, str] = json.loads(line[4:])
    return shown


async def test_a_real_job_runs_reports_and_finishes(procs: Procs, client: Client,
                                                    tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    registered = await registrar(client)
    setup.executor(procs)
    await eventually(lambda: bool(registered), 20, "registration")
    devices = registered[0].devices
    assert registered[0].address == "127.0.0.1"
    assert [(d.index, d.name, d.source) for d in devices] == [(0, "cpu", "declared"),
                                                              (1, "cpu", "declared")]
    assert "NVML unavailable" in procs.log("executor")
    assert "running with 2 declared GPUs of type cpu" in procs.log("executor")

    # No monitor relays them here: what the executor publishes, on its own subjects.
    reports = await client.collect(subjects.reports(A, "train"), ev.decode_report)
    beats = await client.collect(subjects.job_heartbeat(A, "train"), ev.decode_job_heartbeat)
    nodes = await client.collect(subjects.node_heartbeat(A), ev.decode_node_heartbeat)
    job = setup.spec("train", total=1200)  # 24 steps of 50 samples, 0.05 s each
    began = time.monotonic()
    ack = await client.command(A, start_cmd("k-train", job, A, {A: 2}, (0, 1)))
    assert ack.ok, ack
    assert time.monotonic() - began < 3.0  # spawned, not waiting for the script
    await eventually(lambda: any(isinstance(r, ev.JobFinished) for r in reports), 20,
                     "job_finished")
    (finished,) = [r for r in reports if isinstance(r, ev.JobFinished | ev.JobFailed)]
    assert isinstance(finished, ev.JobFinished) and finished.exit_code == 0
    assert "finished at 1200" in finished.log_tail
    assert beats and {b.server_id for b in beats} == {A}
    assert [b.samples_done for b in beats] == sorted(b.samples_done for b in beats)
    assert any(0 < b.samples_done < 1200 for b in beats)
    reported = [s.sample for s in reports if isinstance(s, ev.SampleReported)]
    assert reported and all((s.server_id, s.gpu_type, s.local_gpus, s.total_gpus)
                            == (A, "cpu", 2, 2) for s in reported)
    assert any(n.running == ("train",) for n in nodes)
    await eventually(lambda: nodes[-1].running == (), what="empty node beat")

    rank0, rank1 = setup.log("train", 0), setup.log("train", 1)
    assert rank0.startswith("==== ") and "start k-train of job train on node-a" in rank0
    env0, env1 = env_of(rank0), env_of(rank1)
    assert (env0["RANK"], env1["RANK"], env1["LOCAL_RANK"]) == ("0", "1", "1")
    assert env0["WORLD_SIZE"] == env0["LOCAL_WORLD_SIZE"] == env0["HOPS_TOTAL_GPUS"] == "2"
    assert env0["CUDA_VISIBLE_DEVICES"] == env1["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env0["MASTER_ADDR"] == "127.0.0.1" and int(env0["MASTER_PORT"]) >= 29500
    assert float(env0["HOPS_LR"]) == 0.2  # base_lr 0.1 at 1 GPU, linear rule
    assert env0["HOPS_THREADS"] == env0["OMP_NUM_THREADS"] == "1"  # declared devices
    assert env0["HOPS_REPORT_FILE"] == str(setup.runs / "train" / "reports" / "node-a.jsonl")
    assert env0["HOPS_CHECKPOINT_DIR"] == str(setup.runs / "train" / "checkpoint")
    assert "HOPS_NATS_URL" not in env0 and "HOPS_SAMPLE_S" in env0  # the job's, not the system's
    assert f"CWD {setup.work}" in rank0
    assert setup.state().jobs == ()  # ended: nothing to adopt

    profiles = await client.collect(subjects.reports(A, "prof"), ev.decode_report)
    prof = start_cmd("k-prof", setup.spec("prof"), A, {A: 1}, (1,), mode="profile")
    assert (await client.command(A, prof)).ok
    await eventually(lambda: bool(profiles), 15, "profile_reported")
    (report,) = profiles
    assert isinstance(report, ev.ProfileReported)
    assert (report.report.server_id, report.report.gpu_type) == (A, "cpu")
    assert report.report.batch_size == 32 and len(report.report.modules.t_d) == 5
    assert env_of(setup.log("prof"))["WORLD_SIZE"] == "1"


async def test_stops_failures_and_refusals(procs: Procs, client: Client, tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    registered = await registrar(client)
    setup.executor(procs)
    await eventually(lambda: bool(registered), 20, "registration")
    reports = await client.collect(f"hops.v1.reports.{A}.*", ev.decode_report)

    def ends() -> list[ev.JobFinished | ev.JobFailed]:
        return [r for r in reports if isinstance(r, ev.JobFinished | ev.JobFailed)]

    beats = await client.collect(subjects.job_heartbeat(A, "long"), ev.decode_job_heartbeat)

    # a stop: SIGTERM, the job checkpoints and exits 0; the ack says how far it got
    assert (await client.command(A, start_cmd("k-long", setup.spec("long"), A, {A: 1},
                                              (0,)))).ok
    stubborn = setup.spec("stubborn", STANDIN_IGNORE_TERM="1")
    assert (await client.command(A, start_cmd("k-stub", stubborn, A, {A: 1}, (1,)))).ok
    await eventually(lambda: any(b.samples_done > 0 for b in beats), 10, "progress")
    (pgid,) = [j.pgid for j in setup.state().jobs if j.cmd.job_id == "stubborn"]
    await eventually(lambda: len(group_members(pgid)) == 2, 10, "the stubborn job's child")
    long_ack, stub_ack = await asyncio.gather(
        client.command(A, ev.StopJob(key="s-long", job_id=JobId("long"))),
        client.command(A, ev.StopJob(key="s-stub", job_id=JobId("stubborn"))))
    assert long_ack.ok and long_ack.samples_done > 0 and long_ack.exit_code == 0
    assert f"checkpointed at {long_ack.samples_done:g}" in long_ack.log_tail.replace(".0", "")
    lines = (setup.runs / "long" / "reports" / "node-a.jsonl").read_bytes().splitlines()
    assert isinstance(decode_line(lines[-1]), Checkpointed)
    # SIGTERM ignored: after the grace, SIGKILL to the whole group, its child included
    assert stub_ack.ok and stub_ack.exit_code == -signal.SIGKILL
    assert group_members(pgid) == []

    # the command fails: job_failed with its exit code and the end of its log
    boom = setup.spec("boom", command=(sys.executable, "-c",
                                       "import sys; print('boom'); sys.exit(3)"))
    assert (await client.command(A, start_cmd("k-boom", boom, A, {A: 1}, (0,)))).ok
    await eventually(lambda: any(e.job_id == "boom" for e in ends()), 10, "job_failed")
    (failed,) = [e for e in ends() if e.job_id == "boom"]
    assert isinstance(failed, ev.JobFailed) and failed.exit_code == 3
    assert "boom" in failed.log_tail and "exited with code 3 on node-a" in failed.reason
    # one rank of two fails: the other is stopped, the failed one's log is the tail
    half = setup.spec("half", command=(sys.executable, "-c", (
        "import os, sys, time; r = os.environ['LOCAL_RANK']; print('rank', r, flush=True); "
        "time.sleep(0.3); sys.exit(4) if r == '1' else time.sleep(60)")))
    began = time.monotonic()
    assert (await client.command(A, start_cmd("k-half", half, A, {A: 2}, (0, 1)))).ok
    await eventually(lambda: any(e.job_id == "half" for e in ends()), 10, "job_failed")
    (half_failed,) = [e for e in ends() if e.job_id == "half"]
    assert isinstance(half_failed, ev.JobFailed) and half_failed.exit_code == 4
    assert "rank 1" in half_failed.log_tail and time.monotonic() - began < 5  # not 60 s

    # refused, and failed: it could run nowhere
    cases = {
        "nocmd": (JobSpec(JobId("nocmd"), "m", 32, 1000, 10, requirements=(1,)),
                  "job nocmd has no command; executor node-a runs real jobs"),
        "nowhere": (setup.spec("nowhere", workdir=str(tmp_path / "missing")),
                    f"working folder {tmp_path / 'missing'} does not exist on node-a"),
        "noexe": (setup.spec("noexe", command=(str(tmp_path / "no-such-program"),)),
                  "No such file or directory"),
    }
    for job, (spec, why) in cases.items():
        ack = await client.command(A, start_cmd(f"k-{job}", spec, A, {A: 1}, (1,)))
        assert (ack.ok, ack.code) == (False, "invalid") and why in ack.error, ack
    await eventually(lambda: {e.job_id for e in ends()} >= set(cases), 10, "job_failed")
    for e in ends():
        if e.job_id in cases:
            assert isinstance(e, ev.JobFailed) and cases[e.job_id][1] in e.reason
    assert (await client.command(A, start_cmd("k-free", setup.spec("free"), A, {A: 2},
                                              (0, 1)))).ok  # every GPU was given back


async def place(client: Client, job: str, gpus: tuple[int, ...]) -> None:
    """The ``hops_alloc`` entry, as the placer writes it after the acks."""
    p = Placement(job_id=JobId(job), configuration=Configuration.of({A: len(gpus)}),
                  gpu_indices={A: gpus}, mode="run", key=f"test:{job}")
    await client.kv_put(subjects.KV_ALLOC, job, p)


async def test_a_restarted_executor_adopts_running_jobs_and_reports_lost_ones(
        procs: Procs, client: Client, tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    # a deadline longer than the executor's restart: its node is not lost meanwhile
    procs.monitor(HOPS_HEARTBEAT_TIMEOUT_S="8")
    first = setup.executor(procs)
    await client.wait_node(A)
    events = await client.collect(subjects.JOB_EVENTS_ALL, ev.decode_job_event)
    nodes = await client.collect(subjects.node_heartbeat(A), ev.decode_node_heartbeat)
    finish = tmp_path / "finish-keep"
    keep = setup.spec("keep", total=400, STANDIN_FINISH_FILE=str(finish))
    assert (await client.command(A, start_cmd("k-keep", keep, A, {A: 1}, (0,)))).ok
    assert (await client.command(A, start_cmd("k-gone", setup.spec("gone"), A, {A: 1},
                                              (1,)))).ok
    await place(client, "keep", (0,))
    await place(client, "gone", (1,))
    await eventually(lambda: any(n.running == ("gone", "keep") for n in nodes), 10, "running")
    jobs = {j.cmd.job_id: j for j in setup.state().jobs}

    first.send_signal(signal.SIGKILL)  # the executor dies; its jobs do not
    await asyncio.to_thread(first.wait)
    os.killpg(jobs[JobId("gone")].pgid, signal.SIGKILL)  # one of them dies meanwhile
    await eventually(lambda: group_members(jobs[JobId("gone")].pgid) == [], 5, "gone died")
    assert all(group_members(jobs[JobId("keep")].pgid) for _ in range(3))
    beats = await client.collect(subjects.job_heartbeat(A, "keep"), ev.decode_job_heartbeat)

    setup.executor(procs, name="executor-again")
    await eventually(lambda: any(n.lost == ("gone",) for n in nodes), 20, "lost listed")
    assert next(n for n in nodes if n.lost).running == ("keep",)
    # the monitor releases the lost job at once, as a vanished process
    await eventually(lambda: any(e.job_id == "gone" for e in events), 10, "gone released")
    (stopped,) = [e for e in events if e.job_id == "gone"]
    assert isinstance(stopped, ev.JobStopped) and stopped.reason == VANISHED
    await eventually(lambda: len(beats) >= 2, 10, "the adopted job's heartbeats")
    assert "job adopted" in procs.log("executor-again")

    finish.touch()  # the adopted job does its last step and reports its end
    await eventually(lambda: any(e.job_id == "keep" for e in events), 15, "job_finished")
    (done,) = [e for e in events if e.job_id == "keep"]
    assert isinstance(done, ev.JobFinished) and done.exit_code is None  # not our child
    assert "finished at 400" in done.log_tail
    await eventually(lambda: setup.state().jobs == (), 5, "state emptied")
    deadline = time.monotonic() + 10
    while await client.placement("keep") is not None:  # the monitor released it
        assert time.monotonic() < deadline, "keep never released"
        await asyncio.sleep(0.1)
