"""``python -m services.placer``: the placer service (:mod:`services.placer.service`).

Besides the runtime's settings (:mod:`services.runtime.settings`), each
flag overrides its environment variable:

============================  ==========================  =======  ===========================
variable                      flag                        default  meaning
============================  ==========================  =======  ===========================
``HOPS_COMMAND_TIMEOUT_S``    ``--command-timeout-s``     10       wait for an executor's ack
``HOPS_COMMAND_ATTEMPTS``     ``--command-attempts``      3        tries per command (same key)
============================  ==========================  =======  ===========================
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.placer.service import PlacerSettings, run_placer
from services.runtime.service import ServiceContext, run_service
from services.runtime.settings import SettingsError, build_parser, env_float, env_int, parse_args


def _parser() -> argparse.ArgumentParser:
    p = build_parser("placer")
    p.add_argument("--command-timeout-s", type=float, default=None,
                   help="overrides $HOPS_COMMAND_TIMEOUT_S")
    p.add_argument("--command-attempts", type=int, default=None,
                   help="overrides $HOPS_COMMAND_ATTEMPTS")
    return p


def placer_settings(args: argparse.Namespace) -> PlacerSettings:
    """Flags over environment variables over defaults."""
    timeout = args.command_timeout_s
    if timeout is None:
        timeout = env_float("HOPS_COMMAND_TIMEOUT_S", 10.0)
    attempts = args.command_attempts
    if attempts is None:
        attempts = env_int("HOPS_COMMAND_ATTEMPTS", 3, minimum=1)
    if timeout <= 0 or attempts < 1:
        raise SettingsError("the command timeout must be > 0 and the attempts >= 1")
    return PlacerSettings(command_timeout_s=timeout, command_attempts=attempts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    runtime, args = parse_args(argv, service="placer", parser=parser)
    try:
        settings = placer_settings(args)
    except SettingsError as e:
        parser.error(str(e))

    async def placer_main(ctx: ServiceContext) -> None:
        await run_placer(ctx, settings)

    return run_service("placer", placer_main, runtime)


if __name__ == "__main__":
    sys.exit(main())
