"""Where the CLI finds the gateway and its bearer token.

Like kubectl with a kubeconfig: a flag wins, then an environment variable,
then the config file, then the default.

==============  =================  =====================  ==============================
what            flag               variable               config file key / default
==============  =================  =====================  ==============================
the gateway     ``--gateway``      ``HOPS_GATEWAY_URL``   ``gateway`` /
                                                          ``http://127.0.0.1:8080``
the token       ``--token``        ``HOPS_TOKEN``         ``token`` / none
the file        ``--config``       ``HOPS_CONFIG``        ``.hops/cli.yaml``
==============  =================  =====================  ==============================

``hops up`` writes ``.hops/cli.yaml`` (mode 0600) with its gateway and the
admin's token, so that the commands work in the folder it ran in. A missing
default file is no error; a missing file that was named is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec
import yaml

from shared import ports

DEFAULT_GATEWAY = ports.GATEWAY_URL
DEFAULT_CONFIG = Path(".hops") / "cli.yaml"
GATEWAY_ENV = "HOPS_GATEWAY_URL"
TOKEN_ENV = "HOPS_TOKEN"
CONFIG_ENV = "HOPS_CONFIG"


class ConfigError(ValueError):
    """The config file cannot be read or used; the message names it."""


class CliConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The config file's keys."""

    gateway: str = ""
    token: str = ""


@dataclass(frozen=True)
class Target:
    """The gateway to call and the token to call it with (None: no token)."""

    gateway: str
    token: str | None


def load_config(text: str, where: str = "config") -> CliConfig:
    """Parse a config file (YAML); :class:`ConfigError` naming ``where``."""
    try:
        raw = yaml.safe_load(text)
        return msgspec.convert(raw if raw is not None else {}, CliConfig)
    except (yaml.YAMLError, msgspec.ValidationError) as e:
        raise ConfigError(f"{where}: {e}") from None


def config_path(flag: str | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read and whether it was named (not the default)."""
    named = flag or env.get(CONFIG_ENV, "").strip()
    return (Path(named), True) if named else (DEFAULT_CONFIG, False)


def read_config(path: Path, named: bool) -> CliConfig:
    """The file at ``path``; an empty config for a default file that is not there."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if named:
            raise ConfigError(f"config file {path} does not exist") from None
        return CliConfig()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    return load_config(text, str(path))


def resolve(gateway: str | None, token: str | None, env: Mapping[str, str],
            config: CliConfig) -> Target:
    """The target from the flags, else the environment, else the config
    file, else the defaults (see the module docstring)."""
    url = gateway or env.get(GATEWAY_ENV, "").strip() or config.gateway or DEFAULT_GATEWAY
    secret = token or env.get(TOKEN_ENV, "").strip() or config.token or None
    return Target(gateway=url, token=secret)


def target(gateway: str | None, token: str | None, config: str | None,
           env: Mapping[str, str]) -> Target:
    """:func:`resolve` with the config file read from where the flags say."""
    path, named = config_path(config, env)
    return resolve(gateway, token, env, read_config(path, named))
