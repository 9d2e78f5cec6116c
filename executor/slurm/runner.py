"""``python -m executor.slurm.runner <launch.json>``: a real Hops job's
processes inside its Slurm batch job (docs/slurm.md, "Real jobs").

The bridge writes the launches :func:`executor.launch.launches` computes
for the start (one process per GPU, the in-job plugin's environment, the
rendezvous) to ``launch.json`` in the start's folder; this program, the
batch job's command, starts them in one process group
(:func:`executor.ranks.start_ranks`), each logging to its rank's log file,
with Slurm's ``CUDA_VISIBLE_DEVICES`` (GRES chose the GPUs, docs/slurm.md
"Limits"). It writes two lines to its standard output, which Slurm writes
to the start's output file and the bridge reads:

* ``{"event": "ready", "samples_done": x}`` once every process is
  started: the start's acknowledgement;
* ``{"event": "exited", "samples_done": x, "exits": {"0": code, ...}}``
  once every process has ended.

SIGTERM (Hops' stop, through Slurm) is passed on to the group: the plugin
checkpoints and exits 0. A process that fails takes the others down with
SIGTERM, then SIGKILL after the grace, as under an executor. The job's
progress, samples and profile go to its report file, which the bridge reads
and publishes for it: the job holds no NATS credential.

The runner exits 0 once it has said how the processes ended (Hops, not
Slurm, judges that end); 2 when they could not be started.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import msgspec

from executor.launch import RankLaunch
from executor.ranks import ChildRank, LaunchError, kill_stragglers, signal_group, start_ranks
from executor.reports import End

POLL_S = 0.2
SLURM_GPUS = "CUDA_VISIBLE_DEVICES"


class Launch(msgspec.Struct, frozen=True):
    """One process of :class:`executor.launch.RankLaunch`, as the file holds it."""

    local_rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    log: str


class LaunchFile(msgspec.Struct, frozen=True):
    """The start's processes, what it resumes from and the stop grace."""

    what: str
    samples_done: float
    grace_s: float
    launches: list[Launch]


def launch_file(what: str, launches: Sequence[RankLaunch], samples_done: float,
                grace_s: float) -> bytes:
    return msgspec.json.encode(LaunchFile(what, samples_done, grace_s, [
        Launch(r.local_rank, list(r.argv), r.env, r.cwd, str(r.log)) for r in launches]))


def rank_launches(plan: LaunchFile, slurm_gpus: str | None) -> list[RankLaunch]:
    """The processes to start, with Slurm's GPUs when Slurm names them."""
    gpus = {SLURM_GPUS: slurm_gpus} if slurm_gpus is not None else {}
    return [RankLaunch(local_rank=r.local_rank, argv=tuple(r.argv), env={**r.env, **gpus},
                       cwd=r.cwd, log=Path(r.log)) for r in plan.launches]


def say(event: str, samples_done: float, **more: object) -> None:
    print(json.dumps({"event": event, "samples_done": samples_done, **more}), flush=True)


def follow(ranks: list[ChildRank], pgid: int, grace_s: float,
           stopping: list[bool]) -> dict[int, int | None]:
    """Every process's exit code, in the order they ended."""
    exits: dict[int, int | None] = {}
    kill_at: float | None = None
    while len(exits) < len(ranks):
        for rank in ranks:
            if rank.local_rank not in exits and (ended := rank.ended())[0]:
                exits[rank.local_rank] = ended[1]
        failed = End(exits).failure() is not None
        if kill_at is None and (failed or stopping[0]) and len(exits) < len(ranks):
            signal_group(pgid, signal.SIGTERM)  # a failed rank takes the others down
            kill_at = time.monotonic() + grace_s
        if kill_at is not None and time.monotonic() > kill_at:
            signal_group(pgid, signal.SIGKILL)
            kill_at = float("inf")
        time.sleep(POLL_S)
    kill_stragglers(pgid)
    return exits


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m executor.slurm.runner <launch.json>", file=sys.stderr)
        return 2
    plan = msgspec.json.decode(Path(args[0]).read_bytes(), type=LaunchFile)
    stopping = [False]

    def on_term(signum: int, frame: FrameType | None) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        ranks, pgid = start_ranks(rank_launches(plan, os.environ.get(SLURM_GPUS)), plan.what)
    except LaunchError as e:
        print(f"cannot start {plan.what}: {e}", flush=True)
        return 2
    say("ready", plan.samples_done, pids=[r.pid for r in ranks])
    exits = follow(ranks, pgid, plan.grace_s, stopping)
    say("exited", plan.samples_done, exits={str(k): v for k, v in exits.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
