"""What Slurm's node and job states mean to Hops (shared/slurm_nodes.py and
shared/slurm.py), and the client's pure parts: its sbatch arguments and the
JSON it decodes."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.slurm.client import JobRequest, SlurmClusterSettings, batch_script, sbatch_argv
from executor.slurm.records import decode_jobs, decode_nodes
from shared.slurm import (
    JOB_UNKNOWN_STATE,
    gpu_gres,
    gres_indices,
    job_name,
    job_verdict,
    parse_job_name,
    wait_status,
)
from shared.slurm_nodes import NODE_UNDETERMINED, NODE_UNKNOWN_STATE, node_health


@pytest.mark.parametrize(("state", "flags", "alive", "drained", "busy", "code"), [
    ("idle", (), True, False, False, "idle"),
    ("IDLE", (), True, False, False, "idle"),
    ("mixed", (), True, False, True, "busy"),
    ("ALLOCATED", (), True, False, True, "busy"),
    ("alloc", (), True, False, True, "busy"),
    ("IDLE+DRAIN", (), True, True, False, "drained"),
    ("idle", ("DRAIN",), True, True, False, "drained"),
    ("drained", (), True, True, False, "drained"),
    ("draining", (), True, True, True, "drained"),
    ("MIXED+DRAIN", (), True, True, True, "drained"),
    ("down", (), False, False, False, "down"),
    ("down*", (), False, False, False, "down"),
    ("DOWN+NOT_RESPONDING", (), False, False, False, "down"),
    ("idle*", (), False, False, False, "not_responding"),
    ("drained*", (), False, True, False, "not_responding"),
    ("IDLE+NOT_RESPONDING", (), False, False, False, "not_responding"),
    ("future", (), False, False, False, "down"),
    ("unknown", (), False, False, False, NODE_UNDETERMINED),
    ("UNKNOWN+NOT_RESPONDING", (), False, False, False, NODE_UNDETERMINED),
    ("unknown*", (), False, False, False, NODE_UNDETERMINED),
    ("idle~", (), True, False, False, "idle"),
    ("BLINKING", (), False, False, False, NODE_UNKNOWN_STATE),
    ("", (), False, False, False, NODE_UNKNOWN_STATE),
])
def test_node_states_read_as_hops_health(state: str, flags: tuple[str, ...], alive: bool,
                                         drained: bool, busy: bool, code: str) -> None:
    health = node_health(state, flags, reason="r")
    assert (health.alive, health.drained, health.busy, health.code) == (alive, drained, busy, code)
    assert health.reason == "r"


@pytest.mark.parametrize(("state", "status", "stopping", "kind", "code"), [
    ("PENDING", None, False, "waiting", "slurm_pending"),
    ("CONFIGURING", None, False, "waiting", "slurm_configuring"),
    ("RUNNING", 0, False, "running", "slurm_running"),
    ("COMPLETING", 0, False, "running", "slurm_completing"),
    ("COMPLETED", 0, False, "finished", "slurm_completed"),
    ("COMPLETED", 0, True, "stopped", "slurm_stopped"),
    ("FAILED", 3 << 8, False, "failed", "slurm_failed"),
    ("FAILED", 9, False, "failed", "slurm_failed"),
    ("OUT_OF_MEMORY", 9, False, "failed", "slurm_out_of_memory"),
    ("NODE_FAIL", None, False, "requeue", "slurm_node_fail"),
    ("NODE_FAIL", None, True, "requeue", "slurm_node_fail"),
    ("PREEMPTED", 15, False, "requeue", "slurm_preempted"),
    ("BOOT_FAIL", None, False, "requeue", "slurm_boot_fail"),
    ("CANCELLED", 15, False, "outside", "slurm_cancelled"),
    ("CANCELLED", 9, True, "stopped", "slurm_stopped"),
    ("TIMEOUT", 15, False, "outside", "slurm_timeout"),
    ("WIBBLE", None, False, "unknown", JOB_UNKNOWN_STATE),
    ("", None, False, "unknown", JOB_UNKNOWN_STATE),
])
def test_job_states_say_what_hops_does(state: str, status: int | None, stopping: bool,
                                       kind: str, code: str) -> None:
    verdict = job_verdict(state, status, "None", stopping=stopping)
    assert (verdict.kind, verdict.code) == (kind, code)


def test_a_failure_says_its_exit_code_or_signal() -> None:
    assert job_verdict("FAILED", 3 << 8).exit_code == 3
    killed = job_verdict("FAILED", 9)
    assert (killed.exit_code, killed.signal) == (None, 9)
    assert "signal 9" in killed.reason
    # Slurm's reason reaches Hops' words; its "None" does not.
    assert "ReqNodeNotAvail" in job_verdict("NODE_FAIL", None, "ReqNodeNotAvail").reason
    assert job_verdict("CANCELLED", 15, "None").reason == "Slurm: CANCELLED outside Hops"


# Slurm 22.05's job states (squeue's "JOB STATE CODES"), written out here
# rather than taken from shared.slurm: those that end a job, and the others.
_ENDS = ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "SPECIAL_EXIT", "NODE_FAIL", "PREEMPTED",
         "BOOT_FAIL", "CANCELLED", "TIMEOUT", "DEADLINE", "REVOKED")
_ACTIVE = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
           "RESV_DEL_HOLD", "POWER_UP_NODE", "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT",
           "RESIZING", "SUSPENDED", "STOPPED", "UPDATE_DB")


@st.composite
def spelled(draw: st.DrawFn, words: tuple[str, ...]) -> tuple[str, str]:
    """(a state as Slurm may write it, its word): any case, a sigil, flags."""
    word = draw(st.sampled_from(words))
    cased = "".join(c.lower() if draw(st.booleans()) else c for c in word)
    sigil = draw(st.sampled_from(["", "*", "~", "#"]))
    flags = draw(st.sampled_from(["", "+COMPLETING", "+REQUEUE_HOLD", "+NODE_FAIL"]))
    return f"{cased}{sigil}{flags}", word


_UNLISTED = st.text(max_size=20).filter(
    lambda t: not any(w in t.upper() for w in _ENDS + _ACTIVE)).map(lambda t: (t, ""))


@given(st.one_of(spelled(_ENDS), spelled(_ACTIVE), _UNLISTED),
       st.one_of(st.none(), st.integers(-1, 1 << 16)), st.text(max_size=20), st.booleans())
def test_a_job_reads_ended_only_when_slurm_names_an_end(state_word: tuple[str, str],
                                                        status: int | None, reason: str,
                                                        stopping: bool) -> None:
    """However Slurm spells it, a job reads ended exactly when its state is
    one of Slurm's ending states (anything else, a word Hops does not know
    included, keeps its booking: reading it ended would requeue a job whose
    processes may still run); whether Hops is stopping it changes nothing
    about a job that has not ended; after Hops' stop an end is never blamed
    on the job or on anyone else (stopped, or requeued when its node lost
    it); and only COMPLETED with exit code 0 reads finished."""
    state, word = state_word
    verdict = job_verdict(state, status, reason, stopping=stopping)
    ended = verdict.kind not in ("waiting", "running", "unknown")
    assert ended == (word in _ENDS), (state, verdict)
    if not ended:
        assert job_verdict(state, status, reason, stopping=not stopping) == verdict
        assert (verdict.kind == "unknown") == (word == "")
    elif stopping:
        assert verdict.kind in ("stopped", "requeue"), (state, verdict)
    if verdict.kind == "finished":
        assert word == "COMPLETED" and wait_status(status) == (0, None), (state, status)


@given(st.text(max_size=24), st.lists(st.text(max_size=10), max_size=3), st.text(max_size=10))
def test_every_node_state_reads_safely(state: str, flags: list[str], reason: str) -> None:
    health = node_health(state, tuple(flags), reason)
    if health.code == NODE_UNKNOWN_STATE:
        assert not health.alive  # no work goes to a node in a state Hops cannot read
    assert health.code in ("idle", "busy", "down", "not_responding", "drained",
                           NODE_UNDETERMINED, NODE_UNKNOWN_STATE)
    if health.busy:
        assert health.alive


@given(st.integers(0, 255), st.integers(1, 127))
def test_wait_status_splits_exit_code_and_signal(code: int, sig: int) -> None:
    assert wait_status(code << 8) == (code, None)
    assert wait_status(sig) == (None, sig)


def test_gres_indices() -> None:
    assert gres_indices("gpu:fake:2(IDX:0-1)") == (0, 1)
    assert gres_indices("gpu:fake:3(IDX:0-1,4)") == (0, 1, 4)
    assert gres_indices("gpu:fake:0(IDX:N/A)") == ()
    assert gres_indices("gpu:2") == ()
    assert gres_indices("license:x(IDX:1)") == ()
    assert gres_indices("gpu:a:1(IDX:0),gpu:b:2(IDX:2-3)") == (0, 2, 3)


def test_gpu_gres() -> None:
    assert gpu_gres("gpu:fake:8(S:0)") == [("fake", 8)]
    assert gpu_gres("gpu:fake:8,gpu:2,license:x:1") == [("fake", 8), ("", 2)]
    assert gpu_gres("gpu:fake:N/A") == [("fake", None)]
    assert gpu_gres("(null)") == []


@given(st.text(min_size=1, max_size=30), st.integers(0, 10_000))
def test_job_names_round_trip(job_id: str, attempt: int) -> None:
    assert parse_job_name(job_name(job_id, attempt)) == (job_id, attempt)


def test_other_jobs_names_are_not_hops() -> None:
    assert parse_job_name("wrap") is None
    assert parse_job_name("hops:x") is None
    assert parse_job_name("other:j1:0") is None


def test_sbatch_pins_the_planned_node_gpus_and_cores() -> None:
    settings = SlurmClusterSettings(slurm_conf="/x/slurm.conf", partition="hops", user="hopsrest")
    req = JobRequest(job_id="j1", attempt=2, node="n3", gpus=2, cores=3,
                     command=["python", "train.py", "--name", "a b"], workdir="/w")
    argv = sbatch_argv(req, settings, as_uid=True, gid=995)
    for arg in ("--nodelist=n3", "--gres=gpu:2", "--cpus-per-task=3", "--partition=hops",
                "--job-name=hops:j1:2", "--no-requeue", "--uid=hopsrest", "--gid=995",
                "--parsable"):
        assert arg in argv
    # Hops keeps a job's time limit itself: Slurm's would end it TIMEOUT
    assert not any(a.startswith(("--time", "--signal")) for a in argv)
    assert batch_script(req.command).decode().splitlines()[-1] == \
        "exec " + shlex.join(req.command)


def test_a_job_request_needs_a_command_and_a_core() -> None:
    with pytest.raises(ValueError, match="command"):
        JobRequest(job_id="j", attempt=0, node="n1", gpus=1, cores=1, command=[], workdir="/")
    with pytest.raises(ValueError, match="cores"):
        JobRequest(job_id="j", attempt=0, node="n1", gpus=1, cores=0, command=["x"], workdir="/")


# Trimmed from what squeue --json and sinfo --json wrote on Slurm 22.05.8.
_JOBS = b"""{"meta": {}, "errors": [], "jobs": [{"job_id": 7, "name": "hops:j-9:1",
 "job_state": "RUNNING", "state_reason": "None", "nodes": "n3", "partition": "hops",
 "user_name": "hopsrest", "cpus": 3, "exit_code": 0, "gres_detail": ["gpu:fake:2(IDX:0-1)"],
 "cpus_per_task": null, "flags": ["TRES_STR_CALC"]}]}"""
_NODES = b"""{"meta": {}, "errors": [], "nodes": [{"name": "n1", "state": "idle",
 "state_flags": ["DRAIN"], "reason": "busy-drain", "gres": "gpu:fake:8",
 "gres_used": "gpu:fake:0(IDX:N/A)", "cpus": 16, "alloc_cpus": 0, "partitions": ["hops"]}]}"""


def test_the_json_decodes_to_records() -> None:
    [job], errors = decode_jobs(_JOBS)
    assert errors == []
    assert (job.job_id, job.nodes, job.gpu_indices, job.verdict().kind) == (7, "n3", (0, 1),
                                                                           "running")
    assert parse_job_name(job.name) == ("j-9", 1)
    [node], _ = decode_nodes(_NODES)
    assert (node.gpus, node.health.code, node.health.reason) == (8, "drained", "busy-drain")
    assert node.gpus_in_use == ()
