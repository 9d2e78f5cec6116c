"""A relaxed-sync job's split of its S micro-batches through the live
system (hare.md §6): nats-server, every service and an EMULATED cluster of
two GPU types, each its own OS process (:mod:`tests.livestack`).

The policies plan each job on one GPU type, so the scheduler runs with a
test layer (this module run as the scheduler process, as
tests/cores_layer.py does) that puts every relaxed job's two GPUs on one
server of each type, where the estimates differ and the split is uneven.
The layer notes in the plan's reasons the per-rank speeds it read from the
snapshot's estimates, the estimates the leader splits by.

* The leader's ``plan_issued`` carries the job's split: one entry per GPU
  of its configuration, summing to S, in proportion to the noted speeds
  (3:1 for RTX3090 against TitanXP); a job without a sync scale gets none.
* The placer's ``start_job`` commands (seen on ``hops.v1.exec.*``, which
  the test listens to beside the executors) carry that split to each
  server of the configuration; a profiling run and the plain job carry none.
* An executor refuses a forged ``start_job`` whose split does not sum to S
  (``invalid``, with the sums, and an ``error_record``) and runs nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from nats.aio.msg import Msg

from scheduling.layers.base import annotate
from scheduling.policy import Policy
from shared.configuration import Configuration
from shared.ids import GpuType, JobId, ServerId
from shared.relaxed import rank_speeds, relaxed_split
from shared.snapshot import Assignment, LayerRecord, Plan, Snapshot
from tests.helpers import catalog_spec
from tests.livestack import Bus, LiveStack, until

CLUSTER = """\
name: relaxed
gpu_types:
  - {name: RTX3090, link_bandwidth: 2.5e9, net_bandwidth: 1.0e9}
  - {name: TitanXP, link_bandwidth: 1.25e9, net_bandwidth: 1.0e9}
servers:
  - {id: rtx-0, gpu_type: RTX3090, gpus: 4}
  - {id: titan-0, gpu_type: TitanXP, gpus: 4}
"""
SCALE = 4  # S: micro-batches per step of the relaxed job
SHORT = 10_000_000  # a second or two of wall time at x600
LAYER = "spread-relaxed"
RELAXED, PLAIN = "relaxed-1", "plain-1"


class SpreadRelaxed:
    """Moves each relaxed job's two-GPU assignment to one GPU on the first
    server of each of two GPU types, and notes the speeds per rank of that
    configuration by the snapshot's estimates (JSON: job -> speeds)."""

    name = LAYER

    def plan(self, snapshot: Snapshot, inner: Policy) -> Plan:
        plan = inner.plan(snapshot)
        relaxed = {j.spec.id for j in snapshot.jobs if j.spec.sync_scale > 0}
        firsts: dict[GpuType, ServerId] = {}
        for server in snapshot.cluster.servers:
            firsts.setdefault(server.gpu_type, server.id)
        spread = Configuration.of({s: 1 for s in list(firsts.values())[:2]})
        assignments: list[Assignment] = []
        speeds: dict[JobId, tuple[float, ...] | None] = {}
        for a in plan.assignments:
            if a.job_id in relaxed and a.config.total_gpus == spread.total_gpus == 2:
                a = msgspec.structs.replace(a, config=spread)
                est = snapshot.estimates.get(a.job_id)
                speeds[a.job_id] = rank_speeds(est, snapshot.cluster, spread) if est else None
            assignments.append(a)
        plan = msgspec.structs.replace(plan, assignments=tuple(assignments))
        return annotate(plan, LayerRecord(self.name, note=json.dumps(speeds)))


def listen(bus: Bus, subject: str) -> list[dict[str, Any]]:
    """Every JSON message on ``subject`` from now on (a list filled as they
    come). No reply: the executors answer the placer's requests."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    async def record(msg: Msg) -> None:
        with lock:
            seen.append(json.loads(msg.data))

    async def subscribe() -> None:
        await bus.nc.subscribe(subject, cb=record)
        await asyncio.sleep(0)  # nats-py: let the SUB go out before the flush
        await bus.nc.flush()

    bus.call(subscribe())
    return seen


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("relaxed"), CLUSTER, schedulers=1,
                   modules={"scheduler": "tests.test_live_relaxed"}) as s:
        yield s


def assigned(plan: dict[str, Any], job_id: str) -> dict[str, Any] | None:
    """The configuration ``plan`` (a ``plan_issued`` body) gives ``job_id``."""
    return next((a["config"] for a in plan["plan"]["assignments"] if a["job_id"] == job_id),
                None)


def noted_speeds(plan: dict[str, Any], job_id: str) -> Any:
    (record,) = [r for r in plan["plan"]["reasons"]["layers"] if r["name"] == LAYER]
    return json.loads(record["note"]).get(job_id)


def check_plans(plans: list[dict[str, Any]], why: str) -> tuple[int, ...]:
    """Every plan that places the relaxed job carries its split, by the
    speeds the plan was made with; no plan carries one for the plain job.
    Returns that split, the same in every plan (the estimates barely move)."""
    mine = [p for p in plans if assigned(p, RELAXED) is not None]
    assert mine, why
    assert any(assigned(p, PLAIN) is not None for p in plans), why
    splits = set()
    for p in mine:
        config = assigned(p, RELAXED)
        assert config is not None and config["parts"] == [["rtx-0", 1], ["titan-0", 1]], config
        split = tuple(p.get("micro_batches", {}).get(RELAXED, ()))
        speeds = noted_speeds(p, RELAXED)
        assert speeds is not None and len(speeds) == 2, (speeds, why)
        assert len(split) == 2 and sum(split) == SCALE, (split, why)
        assert split == relaxed_split(SCALE, speeds), (split, speeds)
        assert speeds[0] > 5 / 3 * speeds[1]  # RTX3090 ~1.9x TitanXP: 3 and 1 of 4
        splits.add(split)
        assert PLAIN not in p.get("micro_batches", {}), p
    assert splits == {(3, 1)}, splits
    return splits.pop()


def test_the_plans_split_reaches_every_start_of_the_job(stack: LiveStack) -> None:
    bus = stack.bus_()
    commands = listen(bus, "hops.v1.exec.*")
    relaxed = catalog_spec(RELAXED, SHORT, requirements=[2], sync_scale=SCALE)
    for spec in (relaxed, catalog_spec(PLAIN, SHORT, requirements=[2])):
        assert stack.submit(spec)["ok"] is True, spec
    phases = stack.wait_final([RELAXED, PLAIN], 90)
    assert phases == {RELAXED: "finished", PLAIN: "finished"}, stack.logs()
    why = stack.logs()
    split = check_plans(bus.plans(), why)

    starts = [c for c in commands if c["type"] == "start_job"]
    runs = [c for c in starts if c["job_id"] == RELAXED and c.get("mode", "run") == "run"]
    assert {c["server_id"] for c in runs} == {"rtx-0", "titan-0"}, (runs, why)
    for c in runs:
        assert tuple(c["micro_batches"]) == split, c
        assert c["configuration"]["parts"] == [["rtx-0", 1], ["titan-0", 1]], c
    others = [c for c in starts if c not in runs]
    assert {(c["job_id"], c.get("mode", "run")) for c in others} >= {
        (RELAXED, "profile"), (PLAIN, "run")}, others
    assert all(not c.get("micro_batches") for c in others), others
    assert not [e for e in bus.errors() if "micro-batches" in e["error"]], why  # none refused


def forged_start(split: list[int]) -> bytes:
    """A ``start_job`` of a relaxed job over both servers, rtx-0's part, with ``split``."""
    spec = catalog_spec("forged", SHORT, requirements=[2], sync_scale=SCALE)
    body = {"type": "start_job", "key": "start:test:forged@rtx-0", "job_id": "forged",
            "server_id": "rtx-0", "spec": spec, "gpu_indices": [3],
            "configuration": {"parts": [["rtx-0", 1], ["titan-0", 1]]},
            "micro_batches": split}
    return json.dumps(body).encode()


def test_an_executor_refuses_a_split_that_is_not_the_sync_scale(stack: LiveStack) -> None:
    bus = stack.bus_()
    t0 = time.monotonic()
    ack = bus.request("hops.v1.exec.rtx-0", forged_start([2, 1]))
    assert (ack["ok"], ack["code"]) == (False, "invalid"), ack
    assert "micro-batches [2, 1] sum to 3, not the sync scale 4" in ack["error"], ack
    until(lambda: [e for e in bus.errors(since=t0)
                   if e["subject"] == "hops.v1.exec.rtx-0" and e["code"] == "invalid"
                   and "sum to 3" in e["error"]], "the refusal's error record", 10)
    # Refused as it was read: nothing ran, nothing was booked, nothing happened to the job.
    assert stack.job_pids("forged") == [] and "forged" not in stack.allocs()
    assert bus.job_events("forged") == [] and stack.record("forged") is None


if __name__ == "__main__":
    from services.scheduler.__main__ import main

    sys.exit(main(layers=(SpreadRelaxed(),)))
