"""``python -m services.profiler``: the profiler service (see
:mod:`services.profiler.service`). Settings: :mod:`services.runtime.settings`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.profiler.service import run
from services.runtime.service import service_main


def main(argv: Sequence[str] | None = None) -> int:
    return service_main("profiler", run, argv)


if __name__ == "__main__":
    sys.exit(main())
