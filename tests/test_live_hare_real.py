"""Hare live on REAL executors (docs/hare.md §7, step 4b): the whole system
as ``hops up --executor real --policy hare-eft`` runs it
(:mod:`tests.livestack`: nats-server, every service, the aggregator, two
scheduler replicas, a real executor), CPU training with the examples'
``hops_task`` on resident trainers, one core standing in for one GPU.

Two relaxed jobs (``examples/train_cnn.py`` and ``train_lm.py``, tiny
sizes, S = 3) share one server's two "GPUs". The leader profiles them (their commands),
sequences their micro-batches, the executor runs each entry on its
resident trainer from the round's parameters fetched from the job's
aggregator, sends the gradients, then reports ``task_done``; the leader
takes a job's applied rounds from the aggregator (``HOPS_AGG_APPLIED``).

* Both finish, interleaved on the GPU within a round (Fig. 1c); every
  micro-batch of every round is sent (``HOPS_GRADS``) and reported
  (``HOPS_TASK_DONE``) exactly once, each round applied once
  (``HOPS_AGG_APPLIED``, and the aggregator's log); the final parameters
  (object store ``hops_aggregator``, ``<job>/final``) are bitwise those of
  :func:`hops.trainer.api.reference_rounds` run here.
* Kill -9 of the trainer process, of the aggregator (restarted) and of the
  leader, each once a round of a new pair is applied: the same holds.
* A job whose script raises from its round 1 on (``tests/data/
  raise_on_round1.py``) fails with the code ``task_failed`` and the
  script's words, once; its sequences drop it, the trainers forget it, and
  the job beside it finishes bitwise. The gateway serves the latter's final
  parameters (``GET /jobs/{id}/params``) and refuses the former's
  ``no_final_params``.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import torch

from hops.aggregator.codec import decode_params
from hops.trainer.api import load_task, reference_rounds
from hops.trainer.spec import task_config, task_script
from scheduling.live.taskrun import rounds_of
from services.runtime.objects import get_object
from shared import subjects
from shared.gradients import decode_applied, decode_chunk, final_name
from shared.job import JobSpec
from tests.livestack import LiveStack, descendants, until

ROOT = Path(__file__).resolve().parent.parent
# Two CPU "GPUs" on a slow link: the leader's T^s of a CNN round (its
# all-reduce over the link, 0.1-0.5 s) is longer than a micro-batch, so
# hare-eft fills a round's synchronisation with the other job's tasks.
CLUSTER = """\
name: hare-real
gpu_types:
  - {name: cpu, link_bandwidth: 5.0e5, net_bandwidth: 5.0e5, overlap_residual: 1.0,
     link_latency_s: 2.28e-3, net_latency_s: 2.28e-3}
servers:
  - {id: solo, gpu_type: cpu, gpus: 2}
"""
S = 3
# The CNN's rounds (about 0.25 s each here) outlast the LM's wait for its
# estimate (up to a resend interval, 1 s), so the two run side by side.
ROUNDS = {"cnn": 8, "lm": 6}
JOBS: dict[str, dict[str, Any]] = {
    "cnn": {"model": "small-cnn", "batch_size": 8, "params": 113_738, "base_lr": 0.05,
            "command": [sys.executable, str(ROOT / "examples" / "train_cnn.py"),
                        "--dataset-size", "64", "--seed", "1"]},
    "lm": {"model": "small-lm", "batch_size": 4, "params": 13_216, "base_lr": 0.001,
           "lr_rule": "sqrt",
           "command": [sys.executable, str(ROOT / "examples" / "train_lm.py"), "--seq-len", "16",
                       "--vocab", "64", "--d-model", "32", "--layers", "1", "--seed", "2"]},
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    env = {"HOPS_PROFILE_ITERS": "5", "HOPS_SAMPLE_S": "0.5", "HOPS_STOP_GRACE_S": "15",
           "HOPS_ALLOW_ROOT_JOBS": "1", "HOPS_TASK_RESEND_S": "1",
           "HOPS_TRAINERS_PER_GPU": "1", "HOPS_TASK_PARAMS_WAIT_S": "60"}
    with LiveStack(tmp_path_factory.mktemp("hare-real"), CLUSTER, env=env, executor="real",
                   policy="hare-eft") as s:
        # A first pair is profiled (one GPU: one profiling run at a time); the
        # pairs of the tests find its signatures' profiles and are sequenced
        # together, at once. So does the failing job's script (it fails).
        warm = submit(s, "w")
        assert s.submit(failing("w-bad")).get("ok")
        phases = s.wait_final([x["id"] for x in warm] + ["w-bad"], timeout=240)
        assert phases == {"w-cnn": "finished", "w-lm": "finished", "w-bad": "failed"}, (
            phases, s.logs())
        yield s


def specs_of(prefix: str) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{name}", **job,
             "total_samples": S * ROUNDS[name] * job["batch_size"],
             "sync_scale": S, "requirements": [1, 2], "workdir": str(ROOT)}
            for name, job in JOBS.items()]


def failing(job: str) -> dict[str, Any]:
    """The CNN's spec, its script raising from round 1 on (tests/data)."""
    return {**specs_of("x")[0], "id": job,
            "command": [sys.executable, str(ROOT / "tests" / "data" / "raise_on_round1.py"),
                        "--dataset-size", "64", "--seed", "1"]}


def submit(stack: LiveStack, prefix: str) -> list[dict[str, Any]]:
    specs = specs_of(prefix)
    for spec in specs:
        assert stack.submit(spec).get("ok"), spec
    return specs


def reference(spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The job's parameters after its rounds in one process, here, with one
    thread as the trainers of a CPU "GPU" (the CNN's kernels split their
    sums by thread count: two threads differ in the last bits)."""
    job = msgspec.convert(spec, JobSpec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task = load_task(task_script(job), task_config(job))
        reference_rounds(task, S, rounds_of(job.total_samples, S, job.batch_size))
    finally:
        torch.set_num_threads(threads)
    return {n: p.detach() for n, p in task.model.named_parameters()}


def log_lines(stack: LiveStack, name: str, msg: str) -> list[dict[str, Any]]:
    return stack.log_events(name, msg)


Synced = dict[tuple[str, int], float]  # (job, round) -> when its aggregator applied it


def check_job(stack: LiveStack, spec: dict[str, Any]) -> tuple[list[dict[str, Any]], Synced]:
    """Every micro-batch of every round sent, reported and applied exactly
    once, and the final parameters bitwise the reference's; its reports and
    when each round was applied."""
    job, bus = spec["id"], stack.bus_()
    rounds = rounds_of(spec["total_samples"], S, spec["batch_size"])
    every = sorted((r, b) for r in range(rounds) for b in range(S))
    done = bus.stored("HOPS_TASK_DONE", f"hops.v1.tasks.done.*.{job}")
    assert sorted((d["round"], b) for d in done for b in range(d["lo"], d["hi"])) == every, done
    chunks = [c for c in bus.stored("HOPS_GRADS", f"hops.v1.grads.*.{job}.*", decode_chunk)
              if c.chunk == 0]
    assert sorted((c.round, b) for c in chunks for b in range(c.lo, c.hi)) == every, chunks
    applied = bus.stored("HOPS_AGG_APPLIED", subjects.agg_applied(job), decode_applied)
    assert [a.round for a in applied] == list(range(rounds)), applied
    logged = [x["round"] for x in log_lines(stack, "aggregator", "round applied")
              if x.get("job_id") == job]
    assert sorted(logged) == list(range(rounds)), logged  # none applied twice, even restarted
    final = bus.call(get_object(bus.nc.jetstream(), subjects.OBJ_AGGREGATOR, final_name(job)))
    assert final is not None
    got, want = decode_params(final), reference(spec)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), job
    rec = stack.record(job)
    assert rec is not None and rec["samples_done"] == spec["total_samples"]
    return done, {(job, a.round): a.at for a in applied}


def interleaved(done: list[dict[str, Any]], synced: Synced) -> bool:
    """Whether a GPU ran one job's task after its entry of the other job's
    round and before that round was synchronised (applied by its
    aggregator: Fig. 1c)."""
    return any(x["job_id"] != y["job_id"] and x["gpu_index"] == y["gpu_index"]
               and x["ended_at"] <= y["started_at"] < synced[(x["job_id"], x["round"])]
               for x in done for y in done)


def finish(stack: LiveStack, specs: list[dict[str, Any]]
           ) -> tuple[list[dict[str, Any]], Synced]:
    phases = stack.wait_final([s["id"] for s in specs], timeout=240)
    assert set(phases.values()) == {"finished"}, (phases, stack.logs())
    ids = {s["id"] for s in specs}
    assert [e for e in stack.bus_().errors() if e.get("code") in (
        "task_refused", "task_failed", "no_params", "not_task_ready")
        and of_jobs(e, ids)] == []
    done: list[dict[str, Any]] = []
    synced: Synced = {}
    for spec in specs:
        reports, applied = check_job(stack, spec)
        done += reports
        synced |= applied
    return done, synced


def of_jobs(error: dict[str, Any], ids: set[str]) -> bool:
    """Whether an error record may concern one of the jobs ``ids``: one on
    another job's ``task_done`` subject does not (a job failed on purpose)."""
    subject = str(error.get("subject", ""))
    return not subject.startswith("hops.v1.tasks.done.") or subject.rsplit(".", 1)[-1] in ids


def first_round_applied(stack: LiveStack, specs: list[dict[str, Any]]) -> None:
    ids = {s["id"] for s in specs}
    until(lambda: any(x.get("job_id") in ids
                      for x in log_lines(stack, "aggregator", "round applied")),
          "a round of the pair applied", 180, stack.logs)


def test_two_real_jobs_interleave_on_one_gpu_and_end_bitwise(stack: LiveStack) -> None:
    specs = submit(stack, "a")
    done, synced = finish(stack, specs)
    assert interleaved(done, synced), sorted(
        (d["started_at"], d["ended_at"], d["job_id"], d["round"]) for d in done)
    for spec in specs:
        kinds = [e.type for e in stack.bus_().job_events(spec["id"])]
        assert kinds.count("job_started") == kinds.count("job_finished") == 1, kinds


def trainers(stack: LiveStack) -> list[int]:
    """The executor's resident trainer processes."""
    return [pid for pid, argv in descendants(stack.executor_pid("solo"))
            if "hops.trainer.resident" in argv]


def test_a_killed_trainer_is_replaced_and_nothing_is_applied_twice(stack: LiveStack) -> None:
    specs = submit(stack, "t")
    first_round_applied(stack, specs)
    before = trainers(stack)
    os.kill(before[0], signal.SIGKILL)
    finish(stack, specs)
    after = trainers(stack)
    assert before[0] not in after and len(after) == len(before), (before, after)


def test_a_killed_aggregator_resumes_and_nothing_is_applied_twice(stack: LiveStack) -> None:
    specs = submit(stack, "g")
    first_round_applied(stack, specs)
    child = stack.procs["aggregator"]
    stack.kill("aggregator")
    stack.procs["aggregator"] = stack.launcher.start(child.component)
    finish(stack, specs)
    assert log_lines(stack, "aggregator", "job restored")


def test_a_killed_leader_is_resumed_from_both_streams(stack: LiveStack) -> None:
    specs = submit(stack, "l")
    first_round_applied(stack, specs)
    lease = stack.leader()
    assert lease is not None
    killed = str(lease["holder"])
    stack.kill(killed)
    until(lambda: (x := stack.leader()) and x["holder"] != killed, "a new leader", 20, stack.logs)
    finish(stack, specs)
    successor = str(stack.leader()["holder"])  # type: ignore[index]
    for spec in specs:
        applied = [x["applied"] for name in (killed, successor)
                   for x in log_lines(stack, name, "round applied") if x["job_id"] == spec["id"]]
        rounds = rounds_of(spec["total_samples"], S, spec["batch_size"])
        assert applied == sorted(set(applied)) and applied[-1] == rounds, applied
    assert log_lines(stack, successor, "task state loaded")


def last_revision(stack: LiveStack) -> tuple[float, list[str]] | None:
    """When the leaders last issued task sequences, and the jobs they name."""
    issued = sorted((datetime.fromisoformat(x["timestamp"]).timestamp(), x["jobs"])
                    for name in stack.procs if name.startswith("scheduler")
                    for x in log_lines(stack, name, "task sequences issued"))
    return issued[-1] if issued else None


def test_a_script_that_raises_fails_its_job_and_the_other_finishes(stack: LiveStack) -> None:
    good, bad = specs_of("f")[1], failing("f-bad")  # sequenced at once: profiled
    for spec in (good, bad):
        assert stack.submit(spec).get("ok"), spec
    phases = stack.wait_final([good["id"], bad["id"]], timeout=240)
    assert phases == {good["id"]: "finished", bad["id"]: "failed"}, (phases, stack.logs())
    rec = stack.record(bad["id"])
    assert rec is not None
    reason = str(rec["reason"])
    assert reason.startswith("task_failed: job f-bad round 1") and reason.endswith(")"), reason
    # the first of its round-1 entries to fail names its micro-batch (3, 4 or 5)
    assert re.search(r"RuntimeError: micro-batch [345] of round 1: this script fails", reason)
    with httpx.Client(base_url=stack.config.gateway_url, timeout=10,
                      headers=stack.headers) as api:  # what `hops job` and the API show
        shown = api.get(f"/jobs/{bad['id']}").json()
        none = api.get(f"/jobs/{bad['id']}/params")
        kept = api.get(f"/jobs/{good['id']}/params")
    assert (none.status_code, none.json()["code"]) == (409, "no_final_params"), none.text
    assert kept.status_code == 200, kept.text  # the other's, as its aggregator saved them
    got, want = decode_params(kept.content), reference(good)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert (shown["phase"], shown["reason"]) == ("failed", reason), shown
    failed_cond = next(c for c in shown["conditions"] if c["type"] == "Failed")
    assert (failed_cond["status"], failed_cond["message"]) == ("True", reason), shown
    bus = stack.bus_()
    kinds = [e.type for e in bus.job_events(bad["id"])]
    assert kinds.count("job_failed") == 1 and "job_finished" not in kinds, kinds
    applied = bus.stored("HOPS_AGG_APPLIED", subjects.agg_applied(bad["id"]), decode_applied)
    assert [a.round for a in applied] == [0]  # round 1 never completes
    # its trainers forget it; the leader's later revisions no longer sequence it
    forgotten = [x for x in log_lines(stack, "cluster", "task job forgotten")
                 if x["job_id"] == bad["id"]]  # the executors log in the cluster's file
    assert forgotten, stack.logs()
    failed_at = rec["finished_at"]
    until(lambda: (last := last_revision(stack)) is not None and last[0] > failed_at
          and bad["id"] not in last[1], "a revision without the failed job", 30, stack.logs)
    check_job(stack, good)  # every micro-batch once, its end bitwise
