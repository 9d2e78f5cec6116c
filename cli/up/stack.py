"""The live system's processes, in one table that ``hops up`` and compose.yaml share.

Each :class:`Component` is one program of the live system (§3: the scheduler
with its estimator and profiler, the placer, the monitor, the HTTP gateway
and the GPU cluster's executors, emulated or real) and the exact command that runs it,
``python -m <module> [args]``. ``hops up`` (:mod:`cli.up.up`) runs each command
as a local process; every service of compose.yaml runs the same command in
a container (``tests/test_compose.py`` checks that they agree). Everything
that differs between the two, such as where NATS is, travels in environment
variables, never in the command.

Everything here is pure: the table and each process's environment are
computed from a :class:`StackConfig`, so they are unit-tested without
starting anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from scheduling.registry import DEFAULT_POLICY, any_traits, parse_any
from scheduling.rounds import ROUND_S
from services.monitor.endpoint import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT
from services.runtime.settings import DEFAULT_REPLICAS
from shared import ports

# The interpreter as written in commands; ``hops up`` puts its own in its place.
PYTHON = "python"

DEFAULT_CLUSTER = "paper-physical"
DEFAULT_TIME_SCALE = 60.0
DEFAULT_DATA_DIR = Path(".hops")
DEFAULT_LOG_LEVEL = "info"
# Scheduler replicas: a leader and a standby, so that admission goes on and
# a standby takes the lease over when one of them dies.
DEFAULT_SCHEDULERS = 2
# Restarts of a process that died: the first after 1 s, each next one twice
# as late up to 30 s, back to 1 s once it had run for a minute.
RESTART_DELAY_S = (1.0, 30.0)
STABLE_S = 60.0
EXECUTORS = ("emulated", "real", "slurm")
ExecutorKind = Literal["emulated", "real", "slurm"]
DEFAULT_EXECUTOR: ExecutorKind = "emulated"


@dataclass(frozen=True)
class StackConfig:
    """What ``hops up`` is asked for (its flags)."""

    cluster: str = DEFAULT_CLUSTER
    time_scale: float = DEFAULT_TIME_SCALE
    data_dir: Path = DEFAULT_DATA_DIR
    nats_url: str = ports.NATS_URL
    gateway_host: str = ports.LOOPBACK
    gateway_port: int = ports.GATEWAY_PORT
    metrics_host: str = DEFAULT_METRICS_HOST
    metrics_port: int = DEFAULT_METRICS_PORT
    # None: the paper's round (scheduling.rounds.ROUND_S) in the emulated
    # cluster's time, i.e. divided by the time scale (:attr:`round_wall_s`).
    round_s: float | None = None
    policy: str = DEFAULT_POLICY  # the leader's policy spec (scheduling/registry/)
    log_level: str = DEFAULT_LOG_LEVEL
    executor: ExecutorKind = DEFAULT_EXECUTOR
    cpu_affinity: str = ""  # real executors on CPU devices: cores per device
    schedulers: int = DEFAULT_SCHEDULERS
    aggregators: int = 1  # aggregator shards, under a policy that sequences tasks
    job_user: str = ""  # real executors: the user jobs run as ('' : the executor's)
    allow_root_jobs: bool = False  # real executors running as root may run jobs as root
    # NATS authentication (docs/security.md); off only for measurements.
    auth: bool = True
    tenants: Path | None = None  # the operator's tenants file
    tls_cert: Path | None = None  # NATS and the gateway serve TLS with these
    tls_key: Path | None = None
    tls_ca: Path | None = None  # what clients trust; the certificate itself by default
    # nats-servers, routed into one cluster; every stream and bucket has this many copies
    nats_cluster: int = DEFAULT_REPLICAS
    # --executor slurm: the bridge's HOPS_SLURM_* settings (executor/slurm/settings.py)
    slurm: Mapping[str, str] = field(default_factory=dict)
    slurm_jobs: str = "emulated"  # --executor slurm: "real" runs the jobs' own commands

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, "
                             f"got {self.executor!r}")
        if (self.slurm or self.slurm_jobs != "emulated") and self.executor != "slurm":
            raise ValueError("Slurm settings are for the Slurm backend (--backend slurm)")
        if self.slurm_jobs not in ("emulated", "real"):
            raise ValueError(f"Slurm jobs are emulated or real, got {self.slurm_jobs!r}")
        if self.nats_cluster not in (1, 3, 5):  # JetStream's quorum wants an odd size
            raise ValueError(f"--nats-cluster must be 1, 3 or 5, got {self.nats_cluster}")
        if self.cpu_affinity and self.executor != "real":
            raise ValueError("a CPU affinity is for real executors (--executor real)")
        if (self.job_user or self.allow_root_jobs) and self.executor != "real":
            raise ValueError("a job user is for real executors (--executor real)")
        if self.schedulers < 1:
            raise ValueError(f"at least one scheduler must run, got {self.schedulers}")
        if self.aggregators < 1:
            raise ValueError(f"at least one aggregator must run, got {self.aggregators}")
        if self.time_scale <= 0:
            raise ValueError(f"time scale must be > 0, got {self.time_scale:g}")
        if self.round_s is not None and self.round_s <= 0:
            raise ValueError(f"round length must be > 0 s, got {self.round_s:g}")
        parse_any(self.policy)  # a bad spec fails here, not in every replica (a task
        # policy too: the leader runs its task loop, services/scheduler/tasks.py)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError("a TLS CA is for a stack with TLS (--tls-cert and --tls-key)")
        for name, port in (("gateway", self.gateway_port), ("metrics", self.metrics_port)):
            if not 0 < port <= 65535:
                raise ValueError(f"{name} port must be in 1..65535, got {port}")

    @property
    def round_wall_s(self) -> float:
        """The leader's round in seconds of this machine's clock: ``round_s``
        if given, else the paper's (:data:`ROUND_S`) in the jobs' time, which
        emulated executors run ``time_scale`` times faster than real time."""
        if self.round_s is not None:
            return self.round_s
        return ROUND_S if self.real_jobs else ROUND_S / self.time_scale

    @property
    def real_jobs(self) -> bool:
        """Whether jobs run their own commands in real time (real executors,
        or the Slurm bridge with real jobs)."""
        return self.executor == "real" or self.slurm_jobs == "real"

    @property
    def gateway_url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return f"{scheme}://{_reachable(self.gateway_host)}:{self.gateway_port}"

    @property
    def credentials_dir(self) -> Path:
        """Seeds, tokens and the effective tenants file (cli/up/credentials.py)."""
        return self.data_dir / "credentials"

    @property
    def cli_config(self) -> Path:
        """The CLI's config file: the gateway and the admin's token."""
        return self.data_dir / "cli.yaml"

    @property
    def trusted_ca(self) -> Path | None:
        """What a client of this stack's TLS trusts, None without TLS."""
        return self.tls_ca or self.tls_cert

    @property
    def metrics_url(self) -> str:
        return f"http://{_reachable(self.metrics_host)}:{self.metrics_port}/metrics"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def nats_dir(self) -> Path:
        return self.data_dir / "nats"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "up.json"

    @property
    def runs_dir(self) -> Path:
        """Where executors keep their jobs' logs (and real ones checkpoints and reports)."""
        return self.data_dir / "runs"


def default_job_user(executor: str, euid: int) -> str:
    """The user real jobs run as when ``hops up`` is not told: ``nobody``
    when it runs as root (a real executor refuses to run jobs as root),
    else none (jobs run as the executor's own user, who runs ``hops up``)."""
    return "nobody" if executor == "real" and euid == 0 else ""


def _reachable(host: str) -> str:
    """Where this machine reaches a server bound to ``host`` (a wildcard
    address is reached on loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


@dataclass(frozen=True)
class Component:
    """One program of the live system.

    ``env`` holds the variables whose values come from the :class:`StackConfig`
    (compose.yaml must set each of them too, with its own values);
    ``replicas`` is how many processes of it run (:func:`processes`; compose
    runs as many by default).
    """

    name: str
    module: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    replicas: int = 1
    doc: str = ""

    @property
    def command(self) -> tuple[str, ...]:
        """The command, as compose.yaml writes it."""
        return (PYTHON, "-m", self.module, *self.args)

    def argv(self, python: str) -> tuple[str, ...]:
        """The command with ``python`` (e.g. ``sys.executable``) as the interpreter."""
        return (python, *self.command[1:])

    def log_file(self, config: StackConfig) -> Path:
        return config.logs_dir / f"{self.name}.log"


def _num(x: float) -> str:
    """A number as a flag or variable value: ``60`` rather than ``60.0``."""
    return f"{x:g}"


def _policy(config: StackConfig) -> dict[str, str]:
    """``HOPS_POLICY`` when another policy than the scheduler's default is
    asked for; with emulated jobs, ``HOPS_TASK_TIME_SCALE`` too: a task
    policy plans on the wall clock, and the estimates are in the jobs' time."""
    if config.policy == DEFAULT_POLICY:
        return {}
    scale = {} if config.real_jobs else {"HOPS_TASK_TIME_SCALE": _num(config.time_scale)}
    return {"HOPS_POLICY": config.policy, **scale}


def _security(config: StackConfig, identity: str, *, tenants: bool = False
              ) -> dict[str, str]:
    """The variables that give a component its NATS identity (``cluster``:
    the folder its supervisor takes each executor's seed from), the CA of
    NATS's TLS and, for the scheduler and the gateway, the tenants file."""
    creds = config.credentials_dir
    env: dict[str, str] = {}
    if config.auth:
        if identity == "cluster":
            env["HOPS_NATS_CREDENTIALS_DIR"] = str(creds)
        else:
            env["HOPS_NATS_NKEY"] = str(creds / f"{identity}.nk")
        if tenants:
            env["HOPS_TENANTS"] = str(creds / "tenants.yaml")
        if identity == "monitor":
            env["HOPS_NATS_AUDIT_NKEY"] = str(creds / "audit.nk")
    elif identity == "gateway":  # no tenants file: the gateway must be told it is open
        env["HOPS_GATEWAY_INSECURE"] = "1"
    if config.trusted_ca is not None:
        env["HOPS_NATS_CA"] = str(config.trusted_ca)
    return env


def components(config: StackConfig) -> tuple[Component, ...]:
    """The processes of the live system, in the order ``hops up`` starts them:
    the monitor first (executors register with it), the gateway last (its
    health answers once everything else has been started)."""
    gateway_tls = {"HOPS_GATEWAY_CERT": str(config.tls_cert),
                   "HOPS_GATEWAY_KEY": str(config.tls_key)} if config.tls_cert else {}
    return (
        Component(
            "monitor",
            "services.monitor",
            env={
                "HOPS_METRICS_HOST": config.metrics_host,
                "HOPS_METRICS_PORT": str(config.metrics_port),
                **_security(config, "monitor"),
            },
            doc="node registry, heartbeats, releases, Prometheus metrics",
        ),
        Component("estimator", "services.estimator", env=_security(config, "estimator"),
                  doc="throughput estimates (§3.3)"),
        Component("profiler", "services.profiler", env=_security(config, "profiler"),
                  doc="profile reports (§3.2)"),
        Component(
            "scheduler",
            "services.scheduler",
            env={"HOPS_ROUND_S": _num(config.round_wall_s), **_policy(config),
                 **_security(config, "scheduler", tenants=True)},
            replicas=config.schedulers,
            doc="admission, leader lease, the policy every round (§3.4-3.6)",
        ),
        Component("placer", "services.placer", env=_security(config, "placer"),
                  doc="applies plans on the executors"),
        *_aggregator(config),
        _cluster(config),
        Component(
            "gateway",
            "gateway",
            env={
                "HOPS_GATEWAY_HOST": config.gateway_host,
                "HOPS_GATEWAY_PORT": str(config.gateway_port),
                **gateway_tls,
                **_security(config, "gateway", tenants=True),
            },
            doc="the HTTP API",
        ),
    )


def _aggregator(config: StackConfig) -> tuple[Component, ...]:
    """The relaxed jobs' aggregator service, under a policy that sequences
    tasks (its traits say so; docs/hare.md §7, step 3b); none otherwise.
    With ``aggregators`` n > 1, n shards named ``aggregator-<k>``, shard
    k - 1 of n each (``HOPS_AGGREGATOR_SHARD``): a job's one aggregator is
    on the shard its id hashes to."""
    if not any_traits(config.policy).sequences_tasks:
        return ()
    doc = "each relaxed job's gradient aggregator (Hare's parameter server)"
    n = config.aggregators
    if n == 1:
        return (Component("aggregator", "services.aggregator",
                          env=_security(config, "aggregator"), doc=doc),)
    return tuple(Component(f"aggregator-{k + 1}", "services.aggregator",
                           env={"HOPS_AGGREGATOR_SHARD": f"{k}/{n}",
                                **_security(config, "aggregator")}, doc=f"{doc}: shard {k}/{n}")
                 for k in range(n))


def _cluster(config: StackConfig) -> Component:
    """The executors: emulated (jobs advance at the ground truth's rate),
    real (each job's own command, one process per GPU, files in the run
    folder), or the Slurm bridge (emulated or real jobs as Slurm batch jobs)."""
    if config.executor == "slurm":
        real = ("--backend", "real") if config.slurm_jobs == "real" else ()
        return Component("cluster", "executor.slurm",
                         args=("--cluster", config.cluster, "--time-scale",
                               _num(config.time_scale), *real),
                         # the jobs hops up says it runs, whatever it inherits
                         env={"HOPS_RUN_DIR": str(config.runs_dir), **config.slurm,
                              "HOPS_EXECUTOR_BACKEND": config.slurm_jobs,
                              **_security(config, "cluster")},
                         doc="the Slurm bridge: one process answering for every Slurm node")
    if config.executor == "real":
        args: tuple[str, ...] = ("--cluster", config.cluster, "--all", "--backend", "real")
        if config.cpu_affinity:
            args += ("--cpu-affinity", config.cpu_affinity)
        if config.job_user:
            args += ("--job-user", config.job_user)
        if config.allow_root_jobs:
            args += ("--allow-root-jobs",)
        return Component("cluster", "executor", args=args,
                         env={"HOPS_RUN_DIR": str(config.runs_dir),
                              **_security(config, "cluster")},
                         doc="the REAL cluster: one executor per server running jobs' commands")
    return Component(
        "cluster",
        "executor",
        # The backend named, so that a HOPS_EXECUTOR_BACKEND=real inherited
        # from the shell cannot make the cluster hops up calls emulated real.
        args=("--cluster", config.cluster, "--all", "--backend", "emulated", "--time-scale",
              _num(config.time_scale)),
        # Emulated jobs write their training log there too (docs/logs.md).
        env={"HOPS_RUN_DIR": str(config.runs_dir), **_security(config, "cluster")},
        doc="the EMULATED GPU cluster: one emulated executor per server",
    )


def processes(config: StackConfig) -> tuple[Component, ...]:
    """Every process ``hops up`` runs, in start order: each component
    ``replicas`` times, replica *k* of several named ``<name>-<k>``
    (``scheduler-1``, ``scheduler-2``), with a log file of its own."""
    out: list[Component] = []
    for comp in components(config):
        if comp.replicas == 1:
            out.append(comp)
        else:
            out.extend(replace(comp, name=f"{comp.name}-{k}") for k in range(1, comp.replicas + 1))
    return tuple(out)


def by_name(config: StackConfig) -> dict[str, Component]:
    return {c.name: c for c in components(config)}


def modules() -> tuple[str, ...]:
    """Every module the stack runs (``executor.job`` is what the executor
    starts for each emulated job; ``executor.slurm.runner``, what a real job's
    Slurm batch job runs)."""
    return (*(c.module for c in components(StackConfig())), "executor.job", "executor.slurm",
            "executor.slurm.runner")


_SECURITY_VARS = ("HOPS_NATS_NKEY", "HOPS_NATS_CREDS", "HOPS_NATS_CREDENTIALS_DIR",
                  "HOPS_NATS_AUDIT_NKEY", "HOPS_NATS_CA", "HOPS_TENANTS", "HOPS_GATEWAY_CERT",
                  "HOPS_GATEWAY_KEY", "HOPS_GATEWAY_INSECURE", "HOPS_TOKEN")


def environment(
    config: StackConfig,
    component: Component,
    base: Mapping[str, str],
    source_root: str | None = None,
) -> dict[str, str]:
    """The environment of ``component``'s process under ``hops up``: ``base``
    (the caller's environment) with the stack's settings on top.

    Local processes share one host, so none of them opens the runtime's
    health port (``HOPS_HEALTH_PORT`` is emptied: a value inherited from the
    caller would make every service bind the same port); the gateway serves
    its own ``/healthz`` on its port, which is what ``hops up`` waits for.
    The caller's NATS credential, CA and tenants file are dropped: each
    component gets its own identity (:func:`components`), or none with
    authentication off.
    ``source_root`` (the folder holding the packages) goes first on
    ``PYTHONPATH``, so that ``python -m`` finds every component from any
    working directory.
    """
    env = dict(base)
    env.update(
        {
            "HOPS_NATS_URL": config.nats_url,
            "HOPS_NATS_REPLICAS": str(config.nats_cluster),
            "HOPS_LOG_LEVEL": config.log_level,
            "HOPS_HEALTH_PORT": "",
            "PYTHONUNBUFFERED": "1",  # log lines reach the log files as they happen
        }
    )
    for inherited in _SECURITY_VARS:  # each component gets its own, or none
        env.pop(inherited, None)
    if source_root:
        rest = base.get("PYTHONPATH", "")
        env["PYTHONPATH"] = source_root + (f":{rest}" if rest else "")
    env.update(component.env)
    return env


def stop_order(config: StackConfig) -> tuple[str, ...]:
    """Process names in the order to stop them: the reverse of the start
    order, so that the gateway stops taking requests before the services
    behind it go."""
    return tuple(reversed([c.name for c in processes(config)]))


def describe_exit(name: str, returncode: int, log_file: Path) -> str:
    """What ``hops up`` says when a process ended without being asked to."""
    how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with {returncode}"
    return f"hops up: {name} {how}; see {log_file}"


def restart_delay(previous: float | None, uptime: float) -> float:
    """How long to wait before restarting a process that died after running
    ``uptime`` seconds, when its previous restart waited ``previous`` (None:
    never restarted)."""
    first, most = RESTART_DELAY_S
    if previous is None or uptime >= STABLE_S:
        return first
    return min(most, previous * 2)
