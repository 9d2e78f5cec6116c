"""The aggregator service's rules, pure (docs/hare.md §7, "Step 3b").

**Grants.** A server may send the gradients of micro-batches ``lo .. hi -
1`` of round r of a job only if a task sequence the leader sent gave that
very entry to one of its GPUs: a *grant* (server, round, lo, hi). The
service keeps every grant it saw for the rounds not yet applied, whatever
later revisions say (the leader stops listing an entry once it is reported
done, before its round is applied), and keeps them in its checkpoint,
written before a report a new grant admits is counted: so a restarted
aggregator still admits, when it replays them, the reports it admitted
before. A report no grant admits waits (``HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S``:
its sequence may come after it) and is then refused, ``not_sequenced``.

**Shards.** Several replicas of the service share the jobs: replica k of
n hosts the jobs :func:`shard_of` gives to k (a stable hash of the job id,
the same in every process and release), so each job has one aggregator
wherever its replicas run; every replica reads every sequence and every
gradient chunk, and passes over those of the other shards' jobs without a
word (their own shard answers, refuses and records).

**Refusals**, each changing nothing, each with a stable code and words:
``not_sequenced`` (no grant), ``other_job`` (the body names another job
than its subject, or a job this service does not host), ``bad_span`` (the
body names another round than its subject), ``bad_tensor`` (the tensors
lie, :mod:`hops.trainer.wire`), and the core's
(:data:`hops.aggregator.REFUSAL_CODES`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final

from shared.events import TaskSequence
from shared.gradients import GradientChunk
from shared.ids import JobId, ServerId

NOT_SEQUENCED: Final = "not_sequenced"
OTHER_JOB: Final = "other_job"
BAD_SPAN: Final = "bad_span"
UNKNOWN_JOB: Final = "unknown_job"  # a parameters request for a job not hosted
PARAMS_MOVED: Final = "params_moved"  # a chunk asked of parameters since replaced

Grant = tuple[ServerId, int, int, int]  # (server, round, lo, hi)


def shard_of(job: JobId, shards: int) -> int:
    """The shard (0 .. ``shards`` - 1) whose replica aggregates ``job``:
    CRC-32 of its id, not Python's ``hash`` (salted per process)."""
    return zlib.crc32(job.encode()) % shards


def grants_of(seq: TaskSequence) -> dict[JobId, set[Grant]]:
    """The grants a revision gives, per job."""
    out: dict[JobId, set[Grant]] = {}
    for gpu in seq.gpus:
        for e in gpu.entries:
            out.setdefault(e.job_id, set()).add((seq.server_id, e.round, e.lo, e.hi))
    return out


def relaxed_specs(seq: TaskSequence) -> dict[JobId, int]:
    """The relaxed jobs a revision names, with their S."""
    return {s.id: s.sync_scale for s in seq.specs if s.sync_scale > 0}


def kept(grants: Iterable[Grant], applied: int) -> set[Grant]:
    """The grants of rounds not applied yet."""
    return {g for g in grants if g[1] >= applied}


def header_problem(subject: tuple[ServerId, JobId, int],
                   chunk: GradientChunk) -> tuple[str, str] | None:
    """(code, reason) when a chunk's body disagrees with its subject."""
    server, job, round_ = subject
    if chunk.job_id != job:
        return OTHER_JOB, (f"gradients of job {chunk.job_id!r} on the subject of job {job!r} "
                           f"(server {server})")
    if chunk.round != round_:
        return BAD_SPAN, f"gradients of round {chunk.round} on the subject of round {round_}"
    return None


def grant_problem(grants: set[Grant], server: ServerId,
                  chunk: GradientChunk) -> tuple[str, str] | None:
    """(code, reason) when no grant admits ``server``'s report ``chunk``."""
    if (server, chunk.round, chunk.lo, chunk.hi) in grants:
        return None
    return NOT_SEQUENCED, (f"no task sequence gave micro-batches {chunk.lo}..{chunk.hi - 1} of "
                           f"round {chunk.round} of {chunk.job_id} to server {server}")
