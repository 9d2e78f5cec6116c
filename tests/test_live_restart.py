"""The whole live system stopped and started again on the same JetStream
data, as ``docker compose down`` and ``up`` (volumes kept) or ``hops up``
run again do (issue 36): a job that was running at the stop, on profiles it
took from an earlier job of its signature, is requeued and finishes.

Every process gets SIGTERM (``hops up``'s stop, as compose's ``down``); the
second stack replays the streams. Before the estimator kept the shared
profiles of ended jobs whichever stream it replayed first, the job waited,
queued, for ever with no estimate (``NoEstimate``)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import catalog_spec
from tests.livestack import LiveStack, until

CLUSTER = """\
name: restart
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""
SHORT = 3_000_000  # samples: a few seconds at the stack's 60x
LONG = 20 * SHORT  # still running when the stack stops


def stack(root: Path) -> LiveStack:
    """compose's pace: jobs 60 times faster than real time, 5 s rounds."""
    return LiveStack(root, CLUSTER, time_scale=60.0, round_s=5.0)


def test_a_job_running_when_everything_stops_finishes_after_the_restart(tmp_path: Path) -> None:
    with stack(tmp_path) as first:
        assert first.submit(catalog_spec("profiled", SHORT, requirements=[1, 2]))["ok"]
        assert first.wait_final(["profiled"], 120) == {"profiled": "finished"}
        assert first.submit(catalog_spec("reusing", LONG, requirements=[1, 2]))["ok"]
        until(lambda: first.phase("reusing") == "running", "reusing running", 120, first.logs)
        record = first.record("reusing") or {}
        assert sorted(record["profiled"]) == ["RTX3090", "TitanXP"]
        assert not [t for p in first.bus_().plans() for t in p["plan"]["profiling"]
                    if t["job_id"] == "reusing"]  # the profiles were taken, not measured
    with stack(tmp_path) as second:
        assert second.phase("profiled") == "finished"
        assert second.wait_final(["reusing"], 180) == {"reusing": "finished"}
        assert (second.record("reusing") or {})["samples_done"] == LONG
