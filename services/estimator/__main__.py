"""``python -m services.estimator``: one estimator replica (see
:mod:`services.estimator.service`). Run as many as the request load needs;
they share queue group ``estimator``. Settings: :mod:`services.runtime.settings`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.estimator.service import run
from services.runtime.service import service_main


def main(argv: Sequence[str] | None = None) -> int:
    return service_main("estimator", run, argv)


if __name__ == "__main__":
    sys.exit(main())
