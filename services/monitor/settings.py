"""The monitor's settings; their variables and flags are in
:mod:`services.monitor.__main__`."""

from __future__ import annotations

from dataclasses import dataclass

from services.monitor.endpoint import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT


@dataclass(frozen=True)
class MonitorSettings:
    heartbeat_timeout_s: float = 3.0
    check_s: float = 0.2
    metrics_port: int | None = DEFAULT_METRICS_PORT
    metrics_host: str = DEFAULT_METRICS_HOST
    queue_poll_s: float = 5.0
    raqlr_window_h: float = 1.0
    command_timeout_s: float = 8.0
    orphan_grace_s: float = 60.0  # > the placer's command timeout times its attempts
    vanish_grace_s: float = 30.0  # for the event of a job process that ended
    unknown_report_s: float = 60.0
    node_write_s: float = 5.0  # a node's last_heartbeat in hops_nodes, at most this often
    fetch_timeout_s: float = 1.0
    report_wait_s: float = 5.0  # for a report's job to be known placed on its server
    report_retry_s: float = 0.5
