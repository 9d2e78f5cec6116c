"""``python -m services.profiler``: the profiler service (see
:mod:`services.profiler.service`). Settings: :mod:`services.runtime.settings`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.profiler.service import run
from services.runtime.service import run_service
from services.runtime.settings import SettingsError, parse_args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, _ = parse_args(argv, service="profiler")
    except SettingsError as e:
        print(f"hops-profiler: {e}", file=sys.stderr)
        return 2
    return run_service("profiler", run, settings)


if __name__ == "__main__":
    sys.exit(main())
