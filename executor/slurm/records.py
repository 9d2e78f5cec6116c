"""Slurm's jobs and nodes as Hops reads them.

``squeue --json``, ``sinfo --json`` and slurmrestd's ``/slurm/v0.0.38/jobs``
and ``/nodes`` write the same schema (Slurm 22.05's data parser v0.0.38), so
one decoder serves both the CLI and the REST path. Only the fields Hops uses
are named; the rest are ignored.
"""

from __future__ import annotations

import re

import msgspec

from shared.slurm import JobVerdict, gpu_gres, gres_indices, job_verdict
from shared.slurm_nodes import NodeHealth, node_health


class SlurmJob(msgspec.Struct, frozen=True):
    """One Slurm job. ``exit_code`` is a wait status (see
    :func:`shared.slurm.wait_status`); ``gres_detail`` names the GPU indices
    Slurm gave it per node (``gpu:fake:2(IDX:0-1)``) while it runs: Slurm
    empties it once the job has ended."""

    job_id: int
    name: str = ""
    job_state: str = ""
    state_reason: str = ""
    nodes: str = ""
    partition: str = ""
    user_name: str = ""
    cpus: int | None = None
    exit_code: int | None = None
    gres_detail: list[str] = []

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The GPU indices Slurm allocated (one node's: Hops' jobs are one
        node each); () before it runs."""
        return tuple(i for d in self.gres_detail for i in gres_indices(d))

    def verdict(self, *, stopping: bool = False) -> JobVerdict:
        return job_verdict(self.job_state, self.exit_code, self.state_reason, stopping=stopping)


class SlurmNode(msgspec.Struct, frozen=True):
    """One Slurm node: its state (``idle``) and flags (``["DRAIN"]``), the
    reason an operator or Slurm gave, its GPUs (``gres``: ``gpu:fake:8``)
    and those in use (``gres_used``), its CPUs."""

    name: str
    address: str = ""  # where slurmctld reaches it (NodeAddr)
    state: str = ""
    state_flags: list[str] = []
    reason: str = ""
    gres: str = ""
    gres_used: str = ""
    cpus: int = 0
    partitions: list[str] = []

    @property
    def health(self) -> NodeHealth:
        return node_health(self.state, tuple(self.state_flags), self.reason)

    @property
    def gpus(self) -> int:
        """How many GPUs the node has (the sum of its ``gpu`` GRES counts)."""
        return sum(count or 0 for _, count in gpu_gres(self.gres))

    @property
    def gpus_in_use(self) -> tuple[int, ...]:
        """The indices of the GPUs jobs hold (from ``gres_used``)."""
        return gres_indices(self.gres_used)


class SlurmError(msgspec.Struct, frozen=True):
    """One entry of the ``errors`` list Slurm's JSON carries."""

    error: str = ""


class _Jobs(msgspec.Struct):
    jobs: list[SlurmJob] = []
    errors: list[SlurmError] = []


class _Nodes(msgspec.Struct):
    nodes: list[SlurmNode] = []
    errors: list[SlurmError] = []


def decode_jobs(raw: bytes) -> tuple[list[SlurmJob], list[SlurmError]]:
    """The jobs (and errors) of a v0.0.38 answer."""
    answer = msgspec.json.decode(raw, type=_Jobs)
    return answer.jobs, answer.errors


def decode_nodes(raw: bytes) -> tuple[list[SlurmNode], list[SlurmError]]:
    """The nodes (and errors) of a v0.0.38 answer."""
    answer = msgspec.json.decode(raw, type=_Nodes)
    return answer.nodes, answer.errors


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)")


def parse_scontrol_job(text: str) -> SlurmJob | None:
    """The job ``scontrol show job -d -o <id>`` describes (one line of
    ``Key=value`` fields; 22.05's scontrol has no JSON; ``-d`` adds each
    node's ``GRES=gpu:fake:2(IDX:0-1)``); None when it names none.
    ``ExitCode=3:0`` (exit code, signal) becomes the wait status the JSON
    carries (768)."""
    fields: dict[str, str] = {}
    gres: list[str] = []  # with -d: each node's GPUs and their indices
    for key, value in _FIELD.findall(text.strip().splitlines()[0] if text.strip() else ""):
        fields.setdefault(key, value)
        if key == "GRES":
            gres.append(value)
    if not fields.get("JobId", "").isdigit():
        return None
    code, _, sig = fields.get("ExitCode", "").partition(":")
    status = (int(code) << 8) | int(sig) if code.isdigit() and sig.isdigit() else None
    nodes = fields.get("NodeList", "")
    cpus = fields.get("NumCPUs", "")
    return SlurmJob(job_id=int(fields["JobId"]), name=fields.get("JobName", ""),
                    job_state=fields.get("JobState", ""),
                    state_reason=fields.get("Reason", ""),
                    nodes="" if nodes == "(null)" else nodes,
                    partition=fields.get("Partition", ""),
                    user_name=fields.get("UserId", "").split("(")[0],
                    cpus=int(cpus) if cpus.isdigit() else None, exit_code=status,
                    gres_detail=gres)
