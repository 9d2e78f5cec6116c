"""The rule of the engine tests (Docker, Ray, a NATS cluster): a test whose
engine is absent says so and is skipped, except under CI (``CI=true``, as
``.ci/run`` runs), where a missing engine is a failure: CI installs them all."""

from __future__ import annotations

import os

import pytest


def require(name: str, present: bool, why: str, *, module: bool = False) -> None:
    """Skip the calling test (its whole module if ``module``), saying why,
    unless ``present``; fail it under CI."""
    if present:
        return
    message = f"{name} is not available here: {why}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: the engine tests must run there)", pytrace=False)
    pytest.skip(message, allow_module_level=module)
