"""``python -m services.aggregator``: the aggregator service (see
:mod:`services.aggregator.service`). Settings: :mod:`services.runtime.settings`
and :mod:`services.aggregator.settings`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.aggregator.service import run
from services.runtime.service import service_main


def main(argv: Sequence[str] | None = None) -> int:
    return service_main("aggregator", run, argv)


if __name__ == "__main__":
    sys.exit(main())
