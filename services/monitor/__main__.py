"""``python -m services.monitor``: the monitor service (:mod:`services.monitor.service`).

Besides the runtime's settings (:mod:`services.runtime.settings`), each
flag overrides its environment variable:

===============================  =============================  =======  =========================
variable                         flag                           default  meaning
===============================  =============================  =======  =========================
``HOPS_HEARTBEAT_TIMEOUT_S``     ``--heartbeat-timeout-s``      3        heartbeat deadline
``HOPS_CHECK_S``                 ``--check-s``                  0.2      deadline check period
``HOPS_METRICS_PORT``            ``--metrics-port``             9464     ``GET /metrics``; 0 picks
                                                                         a free port, ``off`` none
``HOPS_METRICS_HOST``            ``--metrics-host``             127.0.0.1 its address (loopback
                                                                         unless configured)
``HOPS_QUEUE_POLL_S``            ``--queue-poll-s``             5        queue-view polling period
``HOPS_RAQLR_WINDOW_H``          ``--raqlr-window-h``           1        the h of Eq. (7), hours
``HOPS_COMMAND_TIMEOUT_S``       ``--command-timeout-s``        8        wait for a stop's ack
``HOPS_ORPHAN_GRACE_S``          ``--orphan-grace-s``           60       stop a job running without
                                                                         a placement after this
``HOPS_VANISH_GRACE_S``          ``--vanish-grace-s``           30       wait for the event of a job
                                                                         process that ended
``HOPS_NODE_WRITE_S``            ``--node-write-s``             5        write a node's heartbeat
                                                                         time at most this often
``HOPS_REPORT_WAIT_S``           ``--report-wait-s``            5        wait for an executor's
                                                                         report's job to be placed
                                                                         on its server, then refuse
``HOPS_NATS_AUDIT_NKEY``         (none)                         none     seed of the ``audit``
                                                                         identity: count
                                                                         nats-server's refused
                                                                         connections
===============================  =============================  =======  =========================
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from services.monitor.endpoint import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT, metrics_port
from services.monitor.natsaudit import watch_auth_errors
from services.monitor.service import run_monitor
from services.monitor.settings import MonitorSettings
from services.runtime.service import ServiceContext, run_service
from services.runtime.settings import SettingsError, build_parser, env_float, parse_args

_FLOATS = (
    ("heartbeat_timeout_s", "HOPS_HEARTBEAT_TIMEOUT_S", 3.0),
    ("check_s", "HOPS_CHECK_S", 0.2),
    ("queue_poll_s", "HOPS_QUEUE_POLL_S", 5.0),
    ("raqlr_window_h", "HOPS_RAQLR_WINDOW_H", 1.0),
    ("command_timeout_s", "HOPS_COMMAND_TIMEOUT_S", 8.0),
    ("orphan_grace_s", "HOPS_ORPHAN_GRACE_S", 60.0),
    ("vanish_grace_s", "HOPS_VANISH_GRACE_S", 30.0),
    ("node_write_s", "HOPS_NODE_WRITE_S", 5.0),
    ("report_wait_s", "HOPS_REPORT_WAIT_S", 5.0),
)


def _parser() -> argparse.ArgumentParser:
    p = build_parser("monitor")
    for name, var, _ in _FLOATS:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None,
                       help=f"overrides ${var}")
    p.add_argument("--metrics-port", default=None, help="overrides $HOPS_METRICS_PORT")
    p.add_argument("--metrics-host", default=None, help="overrides $HOPS_METRICS_HOST")
    return p


def monitor_settings(args: argparse.Namespace) -> MonitorSettings:
    """Flags over environment variables over defaults."""
    values: dict[str, float] = {}
    for name, var, default in _FLOATS:
        flag = getattr(args, name)
        values[name] = flag if flag is not None else env_float(var, default)
        if values[name] <= 0:
            raise SettingsError(f"{var} must be > 0, got {values[name]}")
    port_raw = args.metrics_port or os.environ.get("HOPS_METRICS_PORT") or str(DEFAULT_METRICS_PORT)
    host = args.metrics_host or os.environ.get("HOPS_METRICS_HOST") or DEFAULT_METRICS_HOST
    return MonitorSettings(metrics_port=metrics_port(port_raw), metrics_host=host,
                           **values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    runtime, args = parse_args(argv, service="monitor", parser=parser)
    try:
        settings = monitor_settings(args)
    except SettingsError as e:
        parser.error(str(e))

    audit = os.environ.get("HOPS_NATS_AUDIT_NKEY", "").strip()

    async def monitor_main(ctx: ServiceContext) -> None:
        if audit:  # nats-server's refusals of credentials (services/monitor/natsaudit.py)
            ctx.spawn(watch_auth_errors(ctx, audit), "nats-audit")
        await run_monitor(ctx, settings)

    return run_service("monitor", monitor_main, runtime)


if __name__ == "__main__":
    sys.exit(main())
