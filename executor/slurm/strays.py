"""Slurm jobs Hops has disowned, to be cancelled as soon as Slurm shows them,
so that no Slurm job runs that Hops does not know of (docs/slurm.md,
"When Slurm does not answer"):

* an ``sbatch`` that timed out may still have submitted its job (slurmctld
  may take the request from its queue after the client gave up): it is
  known by its name alone (``hops:<job>:<attempt>``, the attempt a start's
  own), which no other start ever has;
* a start refused after its submission (Slurm did not answer while it was
  waiting to run) whose cancel could not reach Slurm: known by its Slurm job
  id, and cancelled only while that id still names the same Hops job (a
  slurmctld that lost its state gives ids again).

Each is kept for :data:`KEEP_S` (an unanswered request that slurmctld has
not taken within it is not taken at all) and cancelled at every reading that
shows it still holding its node. Pure: :class:`executor.slurm.watch.SlurmWatch`
reads Slurm and cancels.
"""

from __future__ import annotations

from collections.abc import Iterable

from executor.slurm.records import SlurmJob
from shared.slurm import holds_node, names_job

# Longer than Slurm's MessageTimeout (10 s by default) many times over, and
# than slurmctld's own retries; shorter than MinJobAge (300 s).
KEEP_S = 240.0


class Strays:
    """See the module docstring. Times are the caller's clock (seconds)."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._names: dict[str, float] = {}  # job name -> until when
        self._ids: dict[int, tuple[str, float]] = {}  # Slurm id -> (Hops job, until when)

    def add_name(self, name: str, now: float) -> None:
        """Cancel any job named ``name`` (a timed-out submission's)."""
        self._names[name] = now + self.keep_s

    def add_id(self, slurm_id: int, job_id: str, now: float) -> None:
        """Cancel Slurm job ``slurm_id`` while it is Hops job ``job_id``'s."""
        self._ids[slurm_id] = (job_id, now + self.keep_s)

    def __len__(self) -> int:
        return len(self._names) + len(self._ids)

    def due(self, jobs: Iterable[SlurmJob], now: float) -> list[SlurmJob]:
        """The jobs of a reading to cancel now: disowned, still holding a
        node (pending, running, or in a state Hops does not know); entries
        past their time are dropped first."""
        self._names = {n: t for n, t in self._names.items() if t > now}
        self._ids = {i: e for i, e in self._ids.items() if e[1] > now}
        out = []
        for job in jobs:
            if not holds_node(job.verdict()):
                continue
            owned = self._ids.get(job.job_id)
            if job.name in self._names or (owned is not None and names_job(job.name, owned[0])):
                out.append(job)
        return out

    def cancelled(self, job: SlurmJob) -> None:
        """``job`` was cancelled: nothing more to do for it (one submission
        makes one job at most, so its name goes too)."""
        self._names.pop(job.name, None)
        self._ids.pop(job.job_id, None)
