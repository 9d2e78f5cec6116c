"""``python -m services.estimator``: one estimator replica (see
:mod:`services.estimator.service`). Run as many as the request load needs;
they share queue group ``estimator``. Settings: :mod:`services.runtime.settings`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.estimator.service import run
from services.runtime.service import run_service
from services.runtime.settings import SettingsError, parse_args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, _ = parse_args(argv, service="estimator")
    except SettingsError as e:
        print(f"hops-estimator: {e}", file=sys.stderr)
        return 2
    return run_service("estimator", run, settings)


if __name__ == "__main__":
    sys.exit(main())
