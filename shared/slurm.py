"""What Slurm's job states mean to Hops (issue 37), as pure functions.

A job's state is one word (``RUNNING``, ``NODE_FAIL``…); :func:`job_verdict`
says what Hops does about it. An unknown word never raises: it gets a safe
reading and a code saying it was not understood. Also here: why a Slurm
operation failed, the GPUs a GRES string names, the names Hops gives its
Slurm jobs, and the rules a start's readings are judged by. Node states,
and when a node counts alive, are :mod:`shared.slurm_nodes`.
"""

from __future__ import annotations

import re
from typing import Literal, Protocol

import msgspec

from shared.slurm_nodes import STATE_SIGILS

# What Hops does about a Slurm job:
# waiting: not started yet; running: runs (keep the booking);
# finished: done, exit 0; failed: the job's own failure (no restart);
# requeue: Slurm or the node lost it, not the job's fault (start it again
#   from its progress);
# stopped: ended after Hops asked it to stop (checkpointed; the plan goes on);
# outside: ended by someone or something other than Hops (a scancel, a
#   time limit): reported with the reason, never restarted blindly;
# unknown: a state Hops does not know: keep the booking, restart nothing,
#   report the code (restarting could run the job twice).
VerdictKind = Literal[
    "waiting", "running", "finished", "failed", "requeue", "stopped", "outside", "unknown",
]
JOB_UNKNOWN_STATE = "slurm_job_state_unknown"

_WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                      "RESV_DEL_HOLD", "POWER_UP_NODE"})
_RUNNING = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING",
                      "SUSPENDED", "STOPPED", "UPDATE_DB"})
_LOST = {"NODE_FAIL": "slurm_node_fail", "PREEMPTED": "slurm_preempted",
         "BOOT_FAIL": "slurm_boot_fail"}
_OWN_FAILURE = {"FAILED": "slurm_failed", "OUT_OF_MEMORY": "slurm_out_of_memory",
                "SPECIAL_EXIT": "slurm_special_exit"}
_OUTSIDE = {"CANCELLED": "slurm_cancelled", "TIMEOUT": "slurm_timeout",
            "DEADLINE": "slurm_deadline", "REVOKED": "slurm_revoked"}


class JobVerdict(msgspec.Struct, frozen=True):
    """What Hops does about a Slurm job (``kind``), why (``code``, stable;
    ``reason``, words), and how its batch script ended: ``exit_code`` its
    exit status, ``signal`` the signal that ended it (None: not ended, or
    not by that)."""

    kind: VerdictKind
    code: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None


def wait_status(status: int | None) -> tuple[int | None, int | None]:
    """Slurm's ``exit_code`` (a wait status: exit code times 256, or the
    signal) as (exit code, signal)."""
    if status is None or status < 0:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return status >> 8, None


def job_verdict(state: str, status: int | None = None, reason: str = "",
                *, stopping: bool = False) -> JobVerdict:
    """What Hops does about a Slurm job in ``state`` whose batch script
    ended with wait ``status``, Slurm saying ``reason``. ``stopping``: Hops
    asked it to stop (a TERM, then a cancel), so its end, however Slurm
    records it (COMPLETED when the job exits 0 after its checkpoint,
    CANCELLED when the grace ran out), is the stop Hops asked for."""
    word = state.strip().upper().split("+")[0].rstrip(STATE_SIGILS)
    code, sig = wait_status(status)
    why = "" if reason in ("", "None") else reason

    def verdict(kind: VerdictKind, slug: str, words: str = "") -> JobVerdict:
        return JobVerdict(kind=kind, code=slug, reason=words or why, exit_code=code, signal=sig)

    if word in _WAITING:
        return verdict("waiting", f"slurm_{word.lower()}")
    if word in _RUNNING:
        return verdict("running", f"slurm_{word.lower()}")
    if stopping and (word == "COMPLETED" or word in _OUTSIDE or word in _OWN_FAILURE):
        return verdict("stopped", "slurm_stopped", f"stopped by Hops ({word})")
    if word == "COMPLETED":
        if code == 0:
            return verdict("finished", "slurm_completed")
        return verdict("failed", "slurm_failed", f"exit code {code}, signal {sig}")
    if word in _LOST:
        return verdict("requeue", _LOST[word], f"Slurm: {word}{f' ({why})' if why else ''}")
    if word in _OWN_FAILURE:
        detail = f"signal {sig}" if sig is not None else f"exit code {code}"
        return verdict("failed", _OWN_FAILURE[word], f"Slurm: {word}, {detail}")
    if word in _OUTSIDE:
        return verdict("outside", _OUTSIDE[word],
                       f"Slurm: {word} outside Hops{f' ({why})' if why else ''}")
    return verdict("unknown", JOB_UNKNOWN_STATE, f"Slurm state {state!r} not understood")


# Why a Slurm operation of a start or stop did not happen, as the command's
# refusal says it (docs/slurm.md, "What each Hops command becomes"):
# unavailable: slurmctld (or slurmrestd) did not answer in time, or could not
#   be reached: nothing is known to have changed; try again later;
# refused: Slurm answered and said no (sbatch rejected the job: a bad node,
#   no such partition, an invalid GRES), with Slurm's words.
# stop_timeout: the job still held its node the timeout after its SIGKILL.
SLURM_UNAVAILABLE = "slurm_unavailable"
SLURM_REFUSED = "slurm_refused"
SLURM_STOP_TIMEOUT = "slurm_stop_timeout"
# The client's own codes for a Slurm that did not answer (executor.slurm.cli).
_NO_ANSWER = frozenset({"slurm_cli_timeout", "slurm_cli_missing", "slurm_rest_timeout",
                        "slurm_rest_unreachable", "slurm_no_reading"})
# What Slurm's commands say when slurmctld cannot be reached (Slurm 22.05's
# slurm_strerror texts for the communication errors; sbatch, squeue and
# scontrol write them after their own retries).
_UNREACHABLE = ("unable to contact slurm controller", "socket timed out",
                "zero bytes were transmitted", "communication connection failure",
                "connection refused", "slurmctld not responding",
                "unable to establish a connection", "could not establish a configuration source")


def failure_code(code: str, error: str) -> str:
    """The stable code of a start or stop that a Slurm operation failed
    (``code``: the client's, ``slurm_cli_failed``...; ``error``: what Slurm
    said): :data:`SLURM_UNAVAILABLE` when Slurm did not answer, else
    :data:`SLURM_REFUSED` (:data:`SLURM_STOP_TIMEOUT` stays itself)."""
    if code == SLURM_STOP_TIMEOUT:
        return code
    said = error.lower()
    if code in _NO_ANSWER or any(words in said for words in _UNREACHABLE):
        return SLURM_UNAVAILABLE
    return SLURM_REFUSED


_GPU_INDICES = re.compile(r"(?:^|,)gpu[^,(]*\(IDX:([^)]*)\)")


def gpu_gres(gres: str) -> list[tuple[str, int | None]]:
    """The ``gpu`` entries of a node's GRES string as (type, count):
    ``gpu:fake:8,gpu:2(S:0)`` → [("fake", 8), ("", 2)]; a count that is not a
    number is None."""
    out: list[tuple[str, int | None]] = []
    for part in gres.split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == "gpu":
            out.append((fields[1] if len(fields) == 3 else "",
                        int(fields[-1]) if fields[-1].isdigit() else None))
    return out


def gres_indices(text: str) -> tuple[int, ...]:
    """The GPU indices a GRES string names (a job's ``gres_detail`` entry,
    a node's ``gres_used``): ``gpu:fake:3(IDX:0-1,4)`` → (0, 1, 4); () where
    none are (``IDX:N/A``, or no GPU)."""
    out: list[int] = []
    for spec in _GPU_INDICES.findall(text):
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()):
                out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


_NAME_PREFIX = "hops"


def job_name(job_id: str, attempt: int) -> str:
    """The Slurm job name of attempt ``attempt`` of Hops job ``job_id``: how
    Hops finds its jobs in Slurm again after a restart."""
    return f"{_NAME_PREFIX}:{job_id}:{attempt}"


def parse_job_name(name: str) -> tuple[str, int] | None:
    """(Hops job id, attempt) of a Slurm job named by :func:`job_name`;
    None for any other job (not Hops': never touched)."""
    prefix, _, rest = name.partition(":")
    job_id, _, attempt = rest.rpartition(":")
    if prefix != _NAME_PREFIX or not job_id or not attempt.isdigit():
        return None
    return job_id, int(attempt)


# The rules the bridge judges its readings of a job by (docs/slurm.md,
# "Slurm's states become Hops' records and events"). Pure: the shell
# (executor.slurm) reads Slurm and the clock and hands both in; times are
# seconds of one clock (time.time() in the bridge).

JOB_GONE = "slurm_job_gone"
# A COMPLETED job whose last line is not "finished" was stopped by a signal
# Hops did not send (scancel --signal=TERM behind its back).
STOPPED_OUTSIDE = "slurm_stopped_outside"
_HOLDING: frozenset[VerdictKind] = frozenset({"waiting", "running", "unknown"})


class JobReading(Protocol):
    """One Slurm job as a reading shows it (``executor.slurm.records.SlurmJob``)."""

    @property
    def name(self) -> str: ...
    @property
    def nodes(self) -> str: ...
    @property
    def job_state(self) -> str: ...
    @property
    def state_reason(self) -> str: ...
    @property
    def exit_code(self) -> int | None: ...


class StartOf(msgspec.Struct, frozen=True):
    """One start as its readings are judged: Hops job ``job_id`` on node
    ``server``, Slurm job ``slurm_id``, whose sbatch returned at
    ``submitted_at`` (from then on slurmctld holds the job: a reading begun
    later shows it)."""

    job_id: str
    server: str
    slurm_id: int
    submitted_at: float


def holds_node(verdict: JobVerdict) -> bool:
    """Whether a job with ``verdict`` has not ended: waiting, running, or in
    a state Hops does not know (which counts as running, see
    :func:`job_verdict`)."""
    return verdict.kind in _HOLDING


def names_job(name: str, job_id: str) -> bool:
    """Whether a Slurm job named ``name`` is a start of Hops job ``job_id``."""
    parsed = parse_job_name(name)
    return parsed is not None and parsed[0] == job_id


def is_this_start(start: StartOf, job: JobReading) -> bool:
    """Whether ``job``, read by ``start``'s Slurm id, is that start's: a
    start of the same Hops job on the same node (or on none yet). A
    slurmctld restarted without its last jobs gives their ids again
    (docs/slurm.md, "Quirks"): an id alone never says whose job it is."""
    return names_job(job.name, start.job_id) and job.nodes in ("", start.server)


def start_verdict(start: StartOf, job: JobReading | None, read_at: float, *,
                  stopping: bool) -> JobVerdict | None:
    """What a reading of Slurm that began at ``read_at`` says of ``start``,
    ``job`` being the job it lists under the start's Slurm id (None: none).
    None: nothing yet (the reading began no later than the submission, and
    may predate the job). Gone (:data:`JOB_GONE`, requeued from its
    progress) when the reading lists no job of this start under its id:
    Slurm forgot it, or gave its id to another job. Else the job's own
    :func:`job_verdict` (``stopping``: Hops asked it to stop)."""
    if job is None or not is_this_start(start, job):
        if read_at <= start.submitted_at:
            return None
        return JobVerdict(kind="requeue", code=JOB_GONE,
                          reason=f"Slurm no longer knows job {start.slurm_id}")
    return job_verdict(job.job_state, job.exit_code, job.state_reason, stopping=stopping)


def stop_read_end(start: StartOf, job: JobReading | None) -> JobVerdict | None:
    """The end a stop's own reading of its one job shows (the stop asked for
    it, so any end is ``stopped``); None when that reading shows no end of
    this start (not ended, forgotten, or its id another job's): the stop
    then waits for the next reading of the whole queue."""
    if job is None or not is_this_start(start, job):
        return None
    verdict = job_verdict(job.job_state, job.exit_code, job.state_reason, stopping=True)
    return None if holds_node(verdict) else verdict


def end_verdict(verdict: JobVerdict, last_event: str) -> JobVerdict:
    """A start's end, given the last progress line its job wrote
    (``last_event``; '' when it wrote none): a job Slurm reads finished
    (COMPLETED, exit 0) whose last line is neither ``finished`` nor absent
    was ended by a signal Hops did not send (:data:`STOPPED_OUTSIDE`,
    reported, never restarted blindly); any other end is Slurm's verdict."""
    if verdict.kind == "finished" and last_event not in ("finished", ""):
        return JobVerdict(kind="outside", code=STOPPED_OUTSIDE,
                          reason=f"the job ended ({last_event}) without Hops asking it to",
                          exit_code=verdict.exit_code)
    return verdict
