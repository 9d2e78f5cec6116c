"""A policy's traits: what the mechanism asks of it (cells, cores, tenant
admission, tenant views) is answered by the layers of the stack a spec
names, from the spec alone; every spec, task-level ones included, goes
through the one grammar and back; a policy registered from outside runs
through admission and the leader's snapshot with no change to them."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Literal, get_args, get_origin

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduling.layers.hived import HivedLayer
from scheduling.layers.traits import PolicyTraits, TenantAdmission
from scheduling.live import admission as adm
from scheduling.live.clock import Inflight
from scheduling.live.snapshot import build_snapshot
from scheduling.live.state import new_record
from scheduling.policies.hare.names import TASK_POLICIES, task_policy
from scheduling.registry import (
    SPECS,
    TASK_SPECS,
    HareEftSpec,
    HareSpec,
    PolicyError,
    make_policy,
    make_task_policy,
    parse_any,
    parse_policy,
    parse_task,
    policy_traits,
    register,
    spec_name,
    spec_text,
    with_settings,
)
from services.scheduler.admission import Checks
from services.scheduler.settings import SchedulerSettings
from shared.cluster import GpuTypeSpec, Server
from shared.ids import GpuType, JobId, ServerId
from shared.job import JobSpec
from shared.records import NodeRecord
from tests.traits_policy import NAME, FifoCoresSpec

NO = TenantAdmission()
# What the mechanism was told by name before the policies answered for
# themselves: (needs the cells, schedules cores, tenant admission).
BY_NAME: dict[str, tuple[bool, bool, TenantAdmission]] = {
    "hops": (False, False, NO),
    "hops-profile-preempt": (False, False, NO),
    "hops-paper": (False, False, NO),
    "sia": (False, False, NO),
    "sia-lp-start": (False, False, NO),
    "sia-estimator": (False, False, NO),
    "gavel": (False, False, NO),
    "slurm": (False, False, NO),
    "tiresias": (False, False, NO),
    "themis": (False, False, NO),
    "hived": (True, False, TenantAdmission(beyond=True)),
    "hived:opportunistic=false": (True, False, TenantAdmission(beyond=False)),
    "quota": (True, False, TenantAdmission(beyond=False, quota=True)),
    "quota-borrow": (True, False, TenantAdmission(beyond=True, quota=True)),
    "coda": (False, True, NO),
    "fifo": (False, True, NO),
    "drf": (False, True, NO),
    "fixed-cores": (False, True, NO),
    "fifo:inner=sia:lam=2": (False, True, NO),
}


def test_the_table_covers_every_registered_policy() -> None:
    assert {spec_name(text) for text in BY_NAME} == set(SPECS)


@pytest.mark.parametrize("text", sorted(BY_NAME))
def test_traits_match_what_the_names_said(text: str) -> None:
    traits = policy_traits(parse_policy(text))
    assert (traits.needs_cells, traits.schedules_cores, traits.admission) == BY_NAME[text]
    assert traits.policy == spec_name(text)
    assert policy_traits(text) == traits  # the text, or its spec
    # the views are the HiveD layer's to read; no other layer binds cells
    assert traits.views == (HivedLayer.tenant_views if spec_name(text) == "hived" else None)


def _values(annotation: object) -> st.SearchStrategy[object] | None:
    """Values of a setting's type worth writing as text; None: left as is."""
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(0, 64)
    if annotation is float:
        return st.floats(0.0, 100.0, allow_nan=False) | st.just(float("inf"))
    if get_origin(annotation) is Literal:
        return st.sampled_from(get_args(annotation))
    if isinstance(annotation, types.UnionType) and type(None) in get_args(annotation):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        inner = _values(rest[0]) if len(rest) == 1 else None
        return None if inner is None else st.none() | inner
    return None


ALL = sorted({**SPECS, **TASK_SPECS})


@st.composite
def specs(draw: st.DrawFn) -> msgspec.Struct:
    name = draw(st.sampled_from(ALL))
    spec = parse_any(name)
    values = {}
    for field in msgspec.structs.fields(type(spec)):
        strategy = _values(field.type)
        if strategy is not None and draw(st.booleans()):
            values[field.name] = draw(strategy)
    try:
        return with_settings(spec, values)
    except PolicyError:  # a combination the policy refuses (e.g. sigma <= 1)
        assume(False)
        raise


@pytest.mark.parametrize("name", ALL)
def test_every_registered_spec_prints_and_parses_back(name: str) -> None:
    spec = parse_any(name)
    assert spec_text(spec) == name and parse_any(spec_text(spec)) == spec
    as_json = msgspec.json.encode(spec).decode()
    assert parse_any(as_json) == spec and spec_name(as_json) == name


@settings(max_examples=150, deadline=None)
@given(specs())
def test_parse_print_parse_round_trips(spec: msgspec.Struct) -> None:
    assert parse_any(spec_text(spec)) == spec


def test_task_policies_parse_in_the_one_grammar() -> None:
    assert parse_any("hare:ties=order") == HareSpec(ties="order")
    assert parse_task("hare-eft:ties=order") == HareEftSpec(ties="order")
    assert spec_text(HareEftSpec(ties="order")) == "hare-eft:ties=order"
    for text in (*TASK_POLICIES, "hare:ties=order", "hare-eft:ties=order"):
        assert make_task_policy(parse_task(text)).name == text
        assert task_policy(text).name == text  # the hare package's name for it
    with pytest.raises(PolicyError, match="policy hare takes no setting lam"):
        parse_task("hare:lam=2")
    with pytest.raises(PolicyError, match="unknown task policy 'sia:lam=2'"):
        parse_task("sia:lam=2")
    with pytest.raises(PolicyError, match="task-level policy"):
        parse_policy("srtf")


# --- a policy registered from outside ---------------------------------------------------

A = GpuTypeSpec(GpuType("A"), 2.5e9, 1e9)
NODES = [NodeRecord(server=Server(ServerId(f"a{i}"), A.name, 4, cores=16), gpu_type=A, order=i)
         for i in range(2)]
CPU_JOB = JobSpec(id=JobId("c1"), model="etl", batch_size=1, params=1, total_samples=1000,
                  kind="cpu", cores=4)


@pytest.fixture
def registered() -> Iterator[None]:
    undo = register(FifoCoresSpec)
    try:
        yield
    finally:
        undo()


def test_registration_is_undone_and_a_name_is_registered_once() -> None:
    with pytest.raises(PolicyError, match=f"unknown policy '{NAME}'"):
        parse_policy(NAME)
    undo = register(FifoCoresSpec)
    with pytest.raises(PolicyError, match="registered already"):
        register(FifoCoresSpec)
    undo()
    with pytest.raises(PolicyError, match=f"unknown policy '{NAME}'"):
        parse_policy(NAME)


@pytest.mark.usefixtures("registered")
def test_a_registered_policy_with_cores_is_admitted_and_planned_by_its_traits() -> None:
    spec = parse_policy(NAME)
    assert spec == FifoCoresSpec() and spec_text(spec) == NAME
    assert policy_traits(spec) == PolicyTraits(policy=NAME, schedules_cores=True)
    # admission, as the scheduler's main builds it, takes the CPU job ...
    checks = Checks.of(SchedulerSettings(policy=spec))
    assert (checks.cores, checks.cells, checks.policy) == (True, None, NAME)
    assert adm.policy_refusal(CPU_JOB, checks.cores, checks.policy) is None
    hops = Checks.of(SchedulerSettings())
    refused = adm.policy_refusal(CPU_JOB, hops.cores, hops.policy)
    assert refused is not None and "policy hops does not schedule CPU cores" in refused.message
    # ... and the leader's snapshot shows it to the policy, which places it
    records = {CPU_JOB.id: new_record(CPU_JOB, 0.0)}
    snap = build_snapshot(5.0, records, NODES, {}, {}, {}, Inflight(60.0), True,
                          schedules_cores=policy_traits(spec).schedules_cores).snapshot
    assert [j.id for j in snap.jobs] == [CPU_JOB.id]
    plan = make_policy(spec).plan(snap)
    config = plan.config_of(CPU_JOB.id)
    assert config is not None and config.total_cores == 4 and sum(g for _, g in config.parts) == 0
    assert "fifo" in [r.name for r in plan.reasons.layers]
