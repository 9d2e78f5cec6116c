"""From a job's spec to what :func:`hops.trainer.api.load_task` needs.

A real executor runs a job's ``command`` (``JobSpec.command``) with the
job's settings in its environment (shared/jobenv.py). A resident trainer
runs the same script's ``hops_task(config)`` instead, so the config carries
what that environment and those arguments would have told the script:

- each ``--option value`` (or ``--option=value``, or a bare ``--flag``:
  True) after the script, under the option's destination name
  (``--seq-len 32`` -> ``seq_len``: ``"32"``, a string the script's own
  parser converts, :func:`hops.trainer.api.script_options`);
- ``batch_size`` and ``total_samples``: the spec's (``HOPS_BATCH_SIZE``,
  ``HOPS_TOTAL_SAMPLES``), unless the command gives them, which wins as it
  wins over the environment in the script;
- ``sync_scale``: S; ``learning_rate``: the rate for S GPUs from the spec's
  table or rule (``HOPS_LR``, which the plugin prefers to the script's
  base rate), absent when the spec gives none.

A spec is refused, ``not_task_ready``, when its command is not ``python
<script.py> [--option ...]`` or it is not relaxed (S = 0): a task is a
share of a relaxed round.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from shared.job import JobSpec

NOT_TASK_READY: Final = "not_task_ready"
_PYTHON: Final = re.compile(r"python(3(\.\d+)?)?")


class NotTaskReady(ValueError):
    """A job that cannot run as tasks; ``code`` is :data:`NOT_TASK_READY`."""

    code: Final = NOT_TASK_READY


def task_script(spec: JobSpec) -> Path:
    """The script of ``python <script.py> ...``, under ``workdir`` when
    the spec has one and the path is relative."""
    command = spec.command
    if (len(command) < 2 or not _PYTHON.fullmatch(Path(command[0]).name)
            or not command[1].endswith(".py") or command[1].startswith("-")):
        raise NotTaskReady(f"job {spec.id}: its command {list(command)!r} is not "
                           "`python <script.py> [--option ...]`, so no task runner can load it")
    if not spec.sync_scale:
        raise NotTaskReady(f"job {spec.id} is not relaxed (sync_scale 0): tasks are shares of "
                           "a relaxed round")
    script = Path(command[1])
    return Path(spec.workdir) / script if spec.workdir and not script.is_absolute() else script


def task_config(spec: JobSpec) -> dict[str, object]:
    """What ``hops_task(config)`` gets for ``spec`` (module doc)."""
    task_script(spec)  # the same refusals
    config: dict[str, object] = {"batch_size": spec.batch_size,
                                 "total_samples": spec.total_samples}
    config.update(_options(spec))
    config["sync_scale"] = spec.sync_scale
    lr = spec.learning_rate(spec.sync_scale)
    if lr is not None:
        config["learning_rate"] = lr
    return config


def _options(spec: JobSpec) -> dict[str, object]:
    """The command's options after the script (module doc)."""
    args = spec.command[2:]
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise NotTaskReady(f"job {spec.id}: argument {arg!r} of its command is not a "
                               "--option, which a task's config cannot name")
        key, eq, value = arg[2:].partition("=")
        has_value = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        out[key.replace("-", "_")] = value if eq else args[i + 1] if has_value else True
        i += 2 if has_value else 1
    return out
