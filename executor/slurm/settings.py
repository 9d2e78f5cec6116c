"""The Slurm bridge's settings, in one place (docs/slurm.md).

Each variable below is read by ``python -m executor.slurm`` (the bridge)
and by ``hops up --backend slurm``, which reads the nodes from Slurm to
describe the cluster:

==========================  ============================  ===========================
variable                    default                       meaning
==========================  ============================  ===========================
``HOPS_SLURM_CONF``         ``$SLURM_CONF``, else         the cluster's slurm.conf
                            Slurm's own default
``HOPS_SLURM_PARTITION``    ``hops``                      the partition Hops owns
``HOPS_SLURM_USER``         the bridge's own user         the Slurm user jobs run as
``HOPS_SLURM_REST_URL``     none (the CLI alone)          slurmrestd's URL
``HOPS_SLURM_GPU_TYPE``     the GRES type (``gpu:T:n``)   the Hops GPU type of the nodes
``HOPS_SLURM_RUN_DIR``      ``$HOPS_RUN_DIR``             a folder the bridge and the
                                                          nodes share, the user writes
``HOPS_SLURM_PYTHON``       this interpreter              Python on the nodes
``HOPS_SLURM_PYTHONPATH``   none                          more of the jobs' PYTHONPATH
``HOPS_SLURM_POLL_S``       ``0.5``                       seconds between reads of
                                                          Slurm's jobs and nodes
``HOPS_SLURM_DOWN_S``       ``3``                         a node reads dead this long
                                                          before Hops calls it dead
``HOPS_SLURM_TIMEOUT_S``    ``10``                        the most a Slurm call, or a
                                                          start's or stop's wait for
                                                          a reading of Slurm, takes
==========================  ============================  ===========================

Without ``HOPS_SLURM_CONF`` or ``SLURM_CONF`` the Slurm commands find their
configuration as they do by themselves (the path Slurm was built with,
``/etc/slurm/slurm.conf`` on Debian, or slurmctld's in a configless
cluster).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from executor.slurm.client import DEFAULT_TIMEOUT_S, SlurmClusterSettings

DEFAULT_POLL_S = 0.5
# A resumed node reads not-responding for about a second (docs/slurm.md,
# "Quirks"): a node must read dead longer than that before Hops says so.
DEFAULT_DOWN_S = 3.0


class BridgeSettingsError(ValueError):
    """A setting the bridge cannot use; the message names the variable."""


@dataclass(frozen=True)
class BridgeSettings:
    """See the module docstring."""

    slurm: SlurmClusterSettings
    gpu_type: str = ""
    run_dir: Path = Path(".hops/runs")
    python: str = sys.executable
    pythonpath: str = ""
    poll_s: float = DEFAULT_POLL_S
    down_s: float = DEFAULT_DOWN_S


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BridgeSettingsError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise BridgeSettingsError(f"{name} must be > 0, got {raw!r}")
    return value


def slurm_conf(env: Mapping[str, str]) -> str:
    """The slurm.conf ``env`` names: ``HOPS_SLURM_CONF``, else Slurm's own
    ``SLURM_CONF``; '' for none (Slurm's commands then find theirs)."""
    return env.get("HOPS_SLURM_CONF") or env.get("SLURM_CONF") or ""


def bridge_settings(env: Mapping[str, str], run_dir: Path) -> BridgeSettings:
    """The settings ``env`` gives (``run_dir``: the executor's run folder,
    used unless ``HOPS_SLURM_RUN_DIR`` names another)."""
    slurm = SlurmClusterSettings(slurm_conf=slurm_conf(env),
                          partition=env.get("HOPS_SLURM_PARTITION") or "hops",
                          user=env.get("HOPS_SLURM_USER", ""),
                          rest_url=env.get("HOPS_SLURM_REST_URL", ""),
                          timeout_s=_number(env, "HOPS_SLURM_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    shared = env.get("HOPS_SLURM_RUN_DIR", "")
    return BridgeSettings(slurm=slurm, gpu_type=env.get("HOPS_SLURM_GPU_TYPE", ""),
                          run_dir=Path(shared).resolve() if shared else run_dir,
                          python=env.get("HOPS_SLURM_PYTHON") or sys.executable,
                          pythonpath=env.get("HOPS_SLURM_PYTHONPATH", ""),
                          poll_s=_number(env, "HOPS_SLURM_POLL_S", DEFAULT_POLL_S),
                          down_s=_number(env, "HOPS_SLURM_DOWN_S", DEFAULT_DOWN_S))


def from_environ(run_dir: Path) -> BridgeSettings:
    return bridge_settings(os.environ, run_dir)
