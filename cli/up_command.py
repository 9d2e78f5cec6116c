"""``hops up``: the live system on this machine (cli/up/up.py, cli/up/stack.py).
Registered on the ``hops`` app by :mod:`cli.main`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from cli.up.stack import (
    DEFAULT_CLUSTER,
    DEFAULT_DATA_DIR,
    DEFAULT_EXECUTOR,
    DEFAULT_LOG_LEVEL,
    DEFAULT_SCHEDULERS,
    DEFAULT_TIME_SCALE,
)
from scheduling.registry import DEFAULT_POLICY
from services.monitor.endpoint import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT
from services.runtime.settings import DEFAULT_REPLICAS
from shared import ports

POLICY_HELP = (
    "policy spec: hops, sia or gavel, with settings as in sia:lam=1.2 or "
    "hops:sigma=1.6,priority=ftf; hops-profile-preempt and sia-lp-start are variants; "
    "hived, quota and quota-borrow need cells in --tenants (scheduling/registry/, "
    "docs/tenancy.md)"
)


# typer reads every option from the signature, so this command is long by its
# declarations alone: the body is the few lines below them, and every default
# is the stack's own (cli/up/stack.py, shared/ports.py).
def up(
    cluster: Annotated[str, typer.Option(help="cluster: a built-in name or a file")] = (
        DEFAULT_CLUSTER
    ),
    time_scale: Annotated[float, typer.Option(
        help="emulated seconds per real second")] = DEFAULT_TIME_SCALE,
    data_dir: Annotated[Path, typer.Option(help="NATS state, logs")] = DEFAULT_DATA_DIR,
    nats_port: Annotated[int, typer.Option(
        help="NATS client port (0: any free)")] = ports.NATS_PORT,
    gateway_port: Annotated[int, typer.Option(help="HTTP gateway port")] = ports.GATEWAY_PORT,
    gateway_host: Annotated[str, typer.Option(
        envvar="HOPS_GATEWAY_HOST", help="HTTP gateway address (0.0.0.0: every interface)"
    )] = ports.LOOPBACK,
    metrics_host: Annotated[str, typer.Option(
        envvar="HOPS_METRICS_HOST", help="the monitor's Prometheus address (0.0.0.0: every "
        "interface)"
    )] = DEFAULT_METRICS_HOST,
    metrics_port: Annotated[int, typer.Option(
        help="the monitor's Prometheus port"
    )] = DEFAULT_METRICS_PORT,
    round_s: Annotated[float | None, typer.Option(
        help="scheduling round in seconds of this machine's clock (default: the paper's "
        "300 s of the jobs' time: 300 / --time-scale for emulated executors)"
    )] = None,
    policy: Annotated[str, typer.Option(envvar="HOPS_POLICY", help=POLICY_HELP)] = DEFAULT_POLICY,
    schedulers: Annotated[int, typer.Option(
        help="scheduler replicas: all admit jobs, one leads, the others stand by"
    )] = DEFAULT_SCHEDULERS,
    aggregators: Annotated[int, typer.Option(
        help="aggregator shards under a task policy (hare, hare-eft): each relaxed job's "
        "aggregator runs on the shard its id hashes to"
    )] = 1,
    log_level: Annotated[str, typer.Option(
        help="debug, info, warning or error")] = DEFAULT_LOG_LEVEL,
    executor: Annotated[str, typer.Option(
        "--executor", "--backend",
        help="emulated (jobs train nothing), real (each job's command, one process per GPU) "
        "or slurm (jobs as Slurm batch jobs on the nodes Hops plans; docs/slurm.md)"
    )] = DEFAULT_EXECUTOR,
    slurm_conf: Annotated[str, typer.Option(
        envvar="HOPS_SLURM_CONF", help="--backend slurm: the cluster's slurm.conf "
        "(default: $SLURM_CONF, else Slurm's own, as its commands find it)")] = "",
    slurm_partition: Annotated[str, typer.Option(
        envvar="HOPS_SLURM_PARTITION", help="--backend slurm: the partition Hops owns")] = "",
    slurm_user: Annotated[str, typer.Option(
        envvar="HOPS_SLURM_USER", help="--backend slurm: the Slurm user jobs run as")] = "",
    slurm_rest_url: Annotated[str, typer.Option(
        envvar="HOPS_SLURM_REST_URL", help="--backend slurm: slurmrestd (default: the CLI)")] = "",
    slurm_gpu_type: Annotated[str, typer.Option(
        envvar="HOPS_SLURM_GPU_TYPE",
        help="--backend slurm: the nodes' Hops GPU type (default: the GRES type)")] = "",
    slurm_jobs: Annotated[str, typer.Option(
        help="--backend slurm: emulated jobs (train nothing, at --time-scale), or real (each "
        "job's own command, one process per GPU, in real time; docs/slurm.md); without "
        "the flag, $HOPS_EXECUTOR_BACKEND as the bridge reads it, else emulated",
        show_default=False)] = "",
    cpu_affinity: Annotated[str, typer.Option(
        help='real executors on CPU devices: cores per device, e.g. "a=0|1;b=1"'
    )] = "",
    job_user: Annotated[str | None, typer.Option(
        help="real executors: the user jobs run as (default: nobody when run as root, "
        "else your own user)"
    )] = None,
    allow_root_jobs: Annotated[bool, typer.Option(
        "--allow-root-jobs",
        help="real executors running as root: run jobs as root (a root executor refuses "
        "to otherwise)"
    )] = False,
    tenants: Annotated[Path | None, typer.Option(
        help="tenants file: tenants, their tokens, who may run commands (docs/security.md), "
        "and their cells (docs/tenancy.md)"
    )] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="TLS certificate of NATS and the gateway")
                        ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="the key of --tls-cert")] = None,
    tls_ca: Annotated[Path | None, typer.Option(
        help="CA that clients trust (default: --tls-cert itself, for a self-signed one)")] = None,
    nats_cluster: Annotated[int, typer.Option(
        help="nats-servers routed into one cluster (1, 3 or 5); every stream and KV bucket "
        "keeps a copy on each (docs/live.md)")] = DEFAULT_REPLICAS,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="no authentication at all: for measurements only")] = False,
) -> None:
    """Run the live system here, one process each (NATS, services, gateway, and one
    executor per server: EMULATED GPUs, or with --executor real the jobs' own commands;
    with --backend slurm one bridge answers for every node of a Slurm partition and runs
    each job as Slurm batch jobs, emulated or, with --slurm-jobs real, its own command).
    The banner says which."""
    from cli.up.slurm import slurm_flags, slurm_jobs_of
    from cli.up.stack import StackConfig, default_job_user
    from cli.up.up import stdout_say
    from cli.up.up import up as run_up

    slurm = slurm_flags({"HOPS_SLURM_CONF": slurm_conf, "HOPS_SLURM_PARTITION": slurm_partition,
                         "HOPS_SLURM_USER": slurm_user, "HOPS_SLURM_REST_URL": slurm_rest_url,
                         "HOPS_SLURM_GPU_TYPE": slurm_gpu_type}, os.environ,
                        slurm=executor == "slurm")
    if job_user is None:
        job_user = "" if allow_root_jobs else default_job_user(executor, os.geteuid())

    try:
        config = StackConfig(
            cluster=cluster, time_scale=time_scale, data_dir=data_dir,
            gateway_host=gateway_host, gateway_port=gateway_port,
            metrics_host=metrics_host, metrics_port=metrics_port,
            round_s=round_s, policy=policy, schedulers=schedulers, log_level=log_level,
            aggregators=aggregators,
            executor=executor,  # type: ignore[arg-type]  # checked by StackConfig
            cpu_affinity=cpu_affinity, job_user=job_user, allow_root_jobs=allow_root_jobs,
            nats_cluster=nats_cluster, auth=not no_auth, tenants=tenants,
            tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca, slurm=slurm,
            slurm_jobs=slurm_jobs_of(slurm_jobs, os.environ, slurm=executor == "slurm"),
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(run_up(config, nats_port, stdout_say()))
