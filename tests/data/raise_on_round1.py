"""A relaxed job whose script raises from its round 1 on: examples/train_cnn.py
(its model, data and ``main``, so that its profiling run trains as the CNN's
does) but for ``hops_task``, whose micro-batches of round 1 and later raise.
tests/test_live_hare_real.py runs it: the job fails ``task_failed``."""

from __future__ import annotations

import dataclasses
import runpy
from collections.abc import Mapping
from pathlib import Path

from hops.trainer import TaskJob, sync_scale_of
from hops.trainer.api import load_task

CNN = Path(__file__).resolve().parents[2] / "examples" / "train_cnn.py"


def hops_task(config: Mapping[str, object]) -> TaskJob:
    task = load_task(CNN, config)
    scale = sync_scale_of(config)

    def batch(k: int) -> object:
        if k >= scale:  # global micro-batch k is of round k // S
            raise RuntimeError(f"micro-batch {k} of round {k // scale}: this script fails "
                               "from round 1 on")
        return task.batch(k)

    return dataclasses.replace(task, batch=batch)


if __name__ == "__main__":
    runpy.run_path(str(CNN), run_name="__main__")  # the CNN's main, its exit status
