"""The aggregator service's own settings, read from environment variables.

=======================================  ===============================
variable                                 default
=======================================  ===============================
``HOPS_AGGREGATOR_ROOT``                 ``.`` (the working directory):
                                         the folder under which a job's
                                         script given by a relative path
                                         is found
``HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S``   10: how long gradients that
                                         arrive before the sequence that
                                         admits them wait before they are
                                         refused ``not_sequenced``
=======================================  ===============================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.runtime.settings import SettingsError, env_float

ROOT_ENV = "HOPS_AGGREGATOR_ROOT"
WAIT_ENV = "HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S"


@dataclass(frozen=True)
class AggregatorSettings:
    """See the module docstring."""

    root: Path = Path(".")
    unsequenced_wait_s: float = 10.0


def aggregator_settings(env: Mapping[str, str]) -> AggregatorSettings:
    """Settings from ``env``; SettingsError naming the variable."""
    defaults = AggregatorSettings()
    root = Path(env.get(ROOT_ENV, "").strip() or defaults.root)
    if root.exists() and not root.is_dir():
        raise SettingsError(f"{ROOT_ENV}: {root} is not a folder")
    wait = env_float(WAIT_ENV, defaults.unsequenced_wait_s, env=env, minimum=0.0)
    return AggregatorSettings(root=root, unsequenced_wait_s=wait)
