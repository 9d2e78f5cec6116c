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
``HOPS_AGGREGATOR_SHARD``                ``0/1``: ``k/n``, this replica is
                                         shard k of n; it hosts the jobs
                                         :func:`~services.aggregator.rules.shard_of`
                                         gives to k, and leaves the others
                                         to their shards
=======================================  ===============================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.runtime.settings import SettingsError, env_float

ROOT_ENV = "HOPS_AGGREGATOR_ROOT"
WAIT_ENV = "HOPS_AGGREGATOR_UNSEQUENCED_WAIT_S"
SHARD_ENV = "HOPS_AGGREGATOR_SHARD"


@dataclass(frozen=True)
class AggregatorSettings:
    """See the module docstring."""

    root: Path = Path(".")
    unsequenced_wait_s: float = 10.0
    shard: int = 0
    shards: int = 1


def aggregator_settings(env: Mapping[str, str]) -> AggregatorSettings:
    """Settings from ``env``; SettingsError naming the variable."""
    defaults = AggregatorSettings()
    root = Path(env.get(ROOT_ENV, "").strip() or defaults.root)
    if root.exists() and not root.is_dir():
        raise SettingsError(f"{ROOT_ENV}: {root} is not a folder")
    wait = env_float(WAIT_ENV, defaults.unsequenced_wait_s, env=env, minimum=0.0)
    shard, shards = parse_shard(env.get(SHARD_ENV, "").strip() or "0/1")
    return AggregatorSettings(root=root, unsequenced_wait_s=wait, shard=shard, shards=shards)


def parse_shard(text: str) -> tuple[int, int]:
    """``k/n`` as (k, n), with 0 <= k < n; SettingsError otherwise."""
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise SettingsError(f"{SHARD_ENV}: {text!r} is not k/n with 0 <= k < n (e.g. 0/2)")
    return int(k), int(n)
