"""The live scheduler's own settings, read from environment variables.

==============================  =======================  =========================
variable                        flag                     default
==============================  =======================  =========================
``HOPS_ROUND_S``                ``--round-s``            300 (round length, §3.6)
``HOPS_PRIORITY_REFRESH_S``     ``--priority-refresh-s`` 30 (queue view refresh)
``HOPS_ESTIMATE_TIMEOUT_S``     ``--estimate-timeout-s`` 5 (per estimate request)
``HOPS_REPLICA_ID``             ``--replica-id``         ``<hostname>-<pid>``
``HOPS_REPLAN_DELAY_S``         ``--replan-delay-s``     1 (events within this
                                                         time share one fill plan)
``HOPS_PLACEMENT_GRACE_S``      ``--placement-grace-s``  60 (how long an issued
                                                         start or profiling task
                                                         is awaited)
``HOPS_TENANTS``                ``--tenants``            none: the one tenant
                                                         ``default`` (the tenants
                                                         file, shared.tenants)
``HOPS_POLICY``                 ``--policy``             ``hops`` (a policy spec,
                                                         e.g. ``sia:lam=1.2``;
                                                         :mod:`.registry`), or a
                                                         task policy (``hare``,
                                                         ``hare-eft``, ...)
``HOPS_TASK_RESEND_S``          ``--task-resend-s``      3 (a task policy: each
                                                         server's revision sent
                                                         again this often)
``HOPS_TASK_HORIZON``           (none)                   4 (a task policy: the
                                                         most rounds of a job one
                                                         revision sequences)
``HOPS_TASK_TIME_SCALE``        (none)                   1 (a task policy: the
                                                         executors' seconds of
                                                         the jobs' time per wall
                                                         second; ``hops up`` sets
                                                         its ``--time-scale`` for
                                                         emulated executors)
==============================  =======================  =========================

A task policy (hare.md, "Live mechanism") replaces the round-based plan
loop with the task loop (:mod:`.tasks`); ``policy`` then keeps its default
for what the leader still builds from it (the queue view, the explainer).

A tenants file with a ``cells`` section (HiveD's cells, docs/tenancy.md) is
checked here as far as it can be without the registered nodes
(:func:`scheduling.live.cells.tenant_cells`); a policy whose traits need
the cells (``hived``, ``quota``, ``quota-borrow``) needs one.

The lease TTL is the runtime's ``HOPS_LEADER_TTL`` (default 5 s; the lease
bucket's max age), see :mod:`services.runtime.settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduling.cells import CellModel
from scheduling.live.cells import tenant_cells
from scheduling.live.tasks import LiveTaskSettings
from scheduling.registry import (
    DEFAULT_POLICY,
    TASK_POLICIES,
    PolicyError,
    PolicySpec,
    TaskSpec,
    parse_policy,
    parse_task,
    policy_traits,
    spec_name,
)
from scheduling.rounds import ROUND_S
from services.runtime.settings import SettingsError, env_float, env_int
from shared.tenants import DEFAULT_TENANTS, TENANTS_ENV, TenantsFile, read_tenants


@dataclass(frozen=True)
class SchedulerSettings:
    """See the module docstring; ``policy`` is the spec the leader plans with."""

    round_s: float = ROUND_S
    refresh_s: float = 30.0
    estimate_timeout_s: float = 5.0
    replica_id: str = ""
    replan_delay_s: float = 1.0
    grace_s: float = 60.0
    policy: PolicySpec = field(default_factory=lambda: parse_policy(DEFAULT_POLICY))
    # who may submit, and run commands (admission, :mod:`scheduling.live.tenancy`)
    tenants: TenantsFile = field(default_factory=lambda: DEFAULT_TENANTS)
    # the tenants file's path (for messages), and its cells (None: none)
    tenants_source: str = "tenants file"
    cells: CellModel | None = None
    # A task policy's spec (None: the round-based ``policy`` plans), its
    # resend interval and horizon (scheduling.live.tasks.LiveTaskSettings).
    task_policy: TaskSpec | None = None
    task_resend_s: float = 3.0
    task_horizon: int = 4
    # The estimates are in the jobs' time; emulated executors run it this
    # many times faster than the wall clock the sequences are planned on.
    task_time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.task_horizon < 1:
            raise ValueError("task_horizon must be >= 1")
        for name in ("round_s", "refresh_s", "estimate_timeout_s", "task_resend_s",
                     "task_time_scale"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    def live_tasks(self) -> LiveTaskSettings:
        """What the task loop replans with (its horizon): one object for the
        leader and for whatever runs the leader's way (the parity bench's
        simulation, :meth:`simulator.tasks.TaskSimSettings.of_leader`)."""
        return LiveTaskSettings(horizon_rounds=self.task_horizon)

    def replica(self, hostname: str, pid: int) -> str:
        """The replica id: the configured one, else ``<hostname>-<pid>``."""
        return self.replica_id or f"{hostname}-{pid}"


# (field, environment variable, flag)
FIELDS = (
    ("round_s", "HOPS_ROUND_S", "--round-s"),
    ("refresh_s", "HOPS_PRIORITY_REFRESH_S", "--priority-refresh-s"),
    ("estimate_timeout_s", "HOPS_ESTIMATE_TIMEOUT_S", "--estimate-timeout-s"),
    ("replan_delay_s", "HOPS_REPLAN_DELAY_S", "--replan-delay-s"),
    ("grace_s", "HOPS_PLACEMENT_GRACE_S", "--placement-grace-s"),
    ("task_resend_s", "HOPS_TASK_RESEND_S", "--task-resend-s"),
)


def scheduler_settings(
    env: Mapping[str, str], flags: Mapping[str, object] | None = None
) -> SchedulerSettings:
    """Settings from ``env``, overridden by ``flags`` (field name → value,
    ``None`` for a flag not given). Raises ``SettingsError`` naming the
    variable or the flag, or ``TenantsError`` naming the tenants file."""
    flags = flags or {}
    values: dict[str, object] = {}
    defaults = SchedulerSettings()
    for name, var, flag in FIELDS:
        minimum = 0.0 if name == "replan_delay_s" else 0.001
        values[name] = env_float(var, getattr(defaults, name), env=env, minimum=minimum)
        given = flags.get(name)
        if given is not None:
            values[name] = env_float(flag, 0.0, env={flag: str(given)}, minimum=minimum)
    values["task_horizon"] = env_int("HOPS_TASK_HORIZON", 4, env=env, minimum=1)
    values["task_time_scale"] = env_float("HOPS_TASK_TIME_SCALE", 1.0, env=env, minimum=1e-6)
    values["replica_id"] = str(flags.get("replica_id") or env.get("HOPS_REPLICA_ID", "")).strip()
    policy = str(flags.get("policy") or env.get("HOPS_POLICY", "")).strip()
    if policy:
        source = "--policy" if flags.get("policy") else "HOPS_POLICY"
        try:
            if spec_name(policy) in TASK_POLICIES:
                values["task_policy"] = parse_task(policy)
            else:
                values["policy"] = parse_policy(policy)
        except PolicyError as e:
            raise SettingsError(f"{source}: {e}") from None
    tenants = str(flags.get("tenants") or env.get(TENANTS_ENV, "")).strip()
    if tenants:
        file = read_tenants(tenants)
        values.update(tenants=file, tenants_source=tenants, cells=tenant_cells(file, (), tenants))
    traits = policy_traits(values.get("policy", parse_policy(DEFAULT_POLICY)))  # type: ignore[arg-type]
    if traits.needs_cells and values.get("cells") is None:
        raise SettingsError(
            f"policy {traits.policy} needs the tenants' cells: give {TENANTS_ENV} (--tenants) a "
            "tenants file with a cells section (docs/tenancy.md)")
    return SchedulerSettings(**values)  # type: ignore[arg-type]
