"""From a job's spec to a task runner's script and config
(hops/trainer/spec.py): the command's options, the spec's batch size and
S, the learning rate for S GPUs; a command that is not ``python
<script.py> --option ...`` refused ``not_task_ready``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hops.trainer import (
    NOT_TASK_READY,
    NotTaskReady,
    load_task,
    task_config,
    task_gradients,
    task_script,
)
from shared.ids import JobId
from shared.job import JobSpec

ROOT = Path(__file__).resolve().parents[1]


def spec(*command: str, **fields: Any) -> JobSpec:
    base: dict[str, Any] = {"id": JobId("j1"), "model": "tiny-lm", "batch_size": 2,
                            "params": 10, "total_samples": 64, "requirements": (1, 2),
                            "sync_scale": 4, "base_lr": 0.01, "lr_rule": "sqrt",
                            "command": command}
    return JobSpec(**(base | fields))


LM = ("python", "examples/train_lm.py", "--seq-len", "8", "--vocab=32", "--d-model", "16",
      "--layers", "1", "--seed", "2")


def test_the_script_and_its_config() -> None:
    job = spec(*LM)
    assert task_script(job) == Path("examples/train_lm.py")
    assert task_config(job) == {
        "batch_size": 2, "total_samples": 64, "seq_len": "8", "vocab": "32", "d_model": "16",
        "layers": "1", "seed": "2", "sync_scale": 4, "learning_rate": pytest.approx(0.02)}


def test_the_script_under_the_workdir_and_a_bare_flag() -> None:
    job = spec("/usr/bin/python3.11", "train.py", "--fast", "--batch-size", "8",
               workdir="/srv/job")
    assert task_script(job) == Path("/srv/job/train.py")
    config = task_config(job)
    assert config["fast"] is True
    assert config["batch_size"] == "8"  # the command's option wins, as over HOPS_BATCH_SIZE
    assert task_script(spec("python", "/abs/t.py", workdir="/srv")) == Path("/abs/t.py")


def test_no_learning_rate_when_the_spec_gives_none() -> None:
    assert "learning_rate" not in task_config(spec(*LM, base_lr=None))
    assert task_config(spec(*LM, lr={4: 0.3}))["learning_rate"] == 0.3


def test_a_spec_loads_and_runs_as_tasks() -> None:
    job = spec(*LM)
    task = load_task(ROOT / task_script(job), task_config(job))
    # The options reached the script, typed by its own parser.
    assert dict(task.model.named_parameters())["out.weight"].shape == (32, 16)
    assert task.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    grads = task_gradients(task, 0, 0, 4, 4)
    assert len(grads) == 4 and all(torch.isfinite(g["out.weight"]).all() for g in grads)


NOT_READY: dict[str, JobSpec] = {
    "no command": spec(),
    "a shell script": spec("bash", "train.sh"),
    "python alone": spec("python"),
    "a module": spec("python", "-m", "train"),
    "not a .py": spec("python", "train"),
    "another program": spec("pythonista", "train.py"),
    "a positional argument": spec("python", "train.py", "data/"),
    "a short option": spec("python", "train.py", "-v"),
    "a bare --": spec("python", "train.py", "--", "--x"),
    "not relaxed": spec(*LM, sync_scale=0, requirements=(1,)),
}


@pytest.mark.parametrize("case", sorted(NOT_READY))
def test_a_spec_that_cannot_run_as_tasks_is_refused(case: str) -> None:
    with pytest.raises(NotTaskReady) as refused:
        task_config(NOT_READY[case])
    assert refused.value.code == NOT_TASK_READY == "not_task_ready"
    assert "j1" in str(refused.value)
