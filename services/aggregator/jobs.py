"""One hosted job of the aggregator service: its model, built from the
job's spec by the training script's ``hops_task`` (:mod:`hops.trainer`),
its :class:`~hops.aggregator.Aggregator`, the grants it saw and its
checkpoint (docs/hare.md §7, "Step 3b"). No bus here: the service is the
shell around it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from hops.aggregator import Aggregator
from hops.aggregator.codec import (
    BadCheckpoint,
    Checkpoint,
    checkpoint_of,
    decode_checkpoint,
    encode_checkpoint,
    encode_params,
    restore,
)
from hops.trainer.api import TaskJob, load_task
from hops.trainer.spec import task_config, task_script
from scheduling.live.taskrun import rounds_of
from services.aggregator.rules import Grant, kept
from shared.gradients import split
from shared.ids import JobId
from shared.job import JobSpec


@dataclass
class Hosted:
    """A job the service aggregates: ``rounds`` in all (the leader's count),
    ``grants`` those seen for rounds not applied, ``saved`` those its last
    checkpoint holds; ``finished`` once its ``job_finished`` came."""

    spec: JobSpec
    task: TaskJob
    aggregator: Aggregator
    rounds: int
    grants: set[Grant] = field(default_factory=set)
    saved: set[Grant] = field(default_factory=set)
    finished: bool = False
    _params: tuple[int, list[bytes]] | None = None

    @property
    def job_id(self) -> JobId:
        return self.spec.id

    @property
    def done(self) -> bool:
        """Every round of the job applied."""
        return self.aggregator.applied >= self.rounds

    def grant(self, grants: Iterable[Grant]) -> bool:
        """Add ``grants`` (of rounds not applied); whether any was new."""
        new = kept(grants, self.aggregator.applied) - self.grants
        self.grants |= new
        return bool(new)

    def unsaved(self, grant: Grant) -> bool:
        return grant in self.grants and grant not in self.saved

    def checkpoint(self) -> bytes:
        """The job's checkpoint now (the grants it holds become ``saved``)."""
        applied = self.aggregator.applied
        self.grants = kept(self.grants, applied)
        self.saved = set(self.grants)
        extra = {"spec": msgspec.json.encode(self.spec).decode(),
                 "grants": [list(g) for g in sorted(self.grants)]}
        return encode_checkpoint(checkpoint_of(applied, self.aggregator.parameters,
                                               self.aggregator.optimizer, extra))

    def final(self) -> bytes:
        """The job's parameters now (:func:`hops.aggregator.codec.encode_params`)."""
        return encode_params(self.aggregator.parameters)

    def params(self) -> tuple[int, list[bytes]]:
        """(rounds applied, the parameters' chunks), cached until the next round."""
        applied = self.aggregator.applied
        if self._params is None or self._params[0] != applied:
            self._params = (applied, split(self.final()))
        return self._params


def _script(spec: JobSpec, root: Path) -> Path:
    path = task_script(spec)
    return path if path.is_absolute() else root / path


def host(spec: JobSpec, root: Path) -> Hosted:
    """A fresh job: its model as its script builds it, nothing applied."""
    task = load_task(_script(spec, root), task_config(spec))
    params = dict(task.model.named_parameters())
    return Hosted(spec, task, Aggregator(spec.id, spec.sync_scale, params, task.optimizer),
                  rounds_of(spec.total_samples, spec.sync_scale, spec.batch_size))


def rehost(data: bytes, root: Path) -> Hosted:
    """A job from its checkpoint: BadCheckpoint when it is not one."""
    ckpt: Checkpoint = decode_checkpoint(data)
    extra = ckpt.extra
    if not isinstance(extra, dict) or set(extra) != {"spec", "grants"}:
        raise BadCheckpoint("the checkpoint keeps no job spec and grants")
    try:
        spec = msgspec.json.decode(str(extra["spec"]), type=JobSpec)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadCheckpoint(f"its job spec: {e}") from None
    grants = extra["grants"]
    if not isinstance(grants, list) or not all(
            isinstance(g, list) and len(g) == 4 and isinstance(g[0], str)
            and all(type(x) is int for x in g[1:]) for g in grants):
        raise BadCheckpoint("its grants must be [server, round, lo, hi] lists")
    hosted = host(spec, root)
    restore(ckpt, hosted.aggregator.parameters, hosted.aggregator.optimizer)
    hosted.aggregator = Aggregator(spec.id, spec.sync_scale, hosted.aggregator.parameters,
                                   hosted.aggregator.optimizer, applied=ckpt.applied)
    hosted.grants = {(g[0], g[1], g[2], g[3]) for g in grants}
    hosted.saved = set(hosted.grants)
    return hosted
