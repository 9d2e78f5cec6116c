"""Policies by name for the command line: the registry of the core
(:mod:`scheduling.registry`) with the CLI's override flags, and
``hops policies``, which lists what the registry knows and, for one spec,
its settings and the traits the live system asks of it.

``--policy`` takes a spec (``hops``, ``sia:lam=1.2``); ``--priority``,
``--lam`` and the like, when given, set that one setting of it
(:func:`scheduling.registry.resolve`), and are an error for a policy that
does not take it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
import typer

from scheduling.policy import Policy
from scheduling.registry import (
    CORE_POLICIES,
    POLICIES,
    TASK_POLICIES,
    TASK_TYPES,
    TENANT_POLICIES,
    PolicyError,
    parse_any,
    policy_traits,
    resolve,
    spec_text,
)
from scheduling.registry import make_policy as _make

__all__ = ["POLICIES", "PolicyError", "describe", "make_policy", "policies", "resolve"]


def make_policy(name: str, priority: str | None = None, lam: float | None = None) -> Policy:
    """The policy spec ``name`` names; ``priority`` and ``lam``, when given,
    override its queue priority and its lambda."""
    return _make(resolve(name, priority=priority, lam=lam))


def describe(text: str) -> dict[str, object]:
    """What ``hops policies SPEC`` prints: the spec as the registry reads it
    (every setting with its value) and, for a round-based policy, its traits:
    whether it plans with the tenants' cells (then ``hops up --tenants``
    needs a ``cells`` section), whether it schedules CPU cores (else CPU
    jobs are refused ``unschedulable``), and what a tenant's job may do
    beyond its reservation. A task-level policy runs only under
    ``hops experiment hare``."""
    spec = parse_any(text)
    settings = msgspec.to_builtins(spec)
    if isinstance(spec, TASK_TYPES):
        return {"spec": spec_text(spec), "kind": "task-level (hops experiment hare)",
                "settings": settings}
    traits = policy_traits(spec)
    return {
        "spec": spec_text(spec),
        "kind": "round-based",
        "settings": settings,
        "needs_cells": traits.needs_cells,
        "schedules_cores": traits.schedules_cores,
        "beyond_reservation": traits.admission.beyond,
        "quota_per_gpu_type": traits.admission.quota,
    }


def policies(
    spec: Annotated[str | None, typer.Argument(
        help="a policy spec, e.g. sia:lam=1.2 or hived:inner=hops")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The policies the registry knows; with SPEC, its settings and what the
    live system asks of it (cells, CPU cores, tenant admission)."""
    if spec is None:
        groups = {"cluster": POLICIES, "tenant": TENANT_POLICIES, "cores": CORE_POLICIES,
                  "task": TASK_POLICIES}
        if as_json:
            typer.echo(msgspec.json.encode(groups).decode())
            return
        for group, names in groups.items():
            typer.echo(f"{group + ':':9} {', '.join(names)}")
        return
    try:
        info = describe(spec)
    except (PolicyError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(msgspec.json.encode(info).decode())
        return
    for key, value in info.items():
        typer.echo(f"{key + ':':19} {_plain(value)}")


def _plain(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items() if k != "name")
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
