"""Write stalls across a JetStream leader election, on a NATS cluster of three
(``python bench/nats_election.py --kills 4``).

It starts three routed nats-servers (:class:`~services.runtime.natscluster.NatsCluster`)
with every stream and bucket of the live system at R3
(:class:`~services.runtime.bus.JetStreamLayout`). One writer publishes a
``job_submitted``-sized message to ``HOPS_JOBS`` every 50 ms, as admission
does (:func:`~services.runtime.retry.publish_retried`: retried with the same
message id), and another puts the scheduler's lease key in ``hops_leader``
every 50 ms (:func:`~services.runtime.retry.kv_write`), and a reader gets
that key every 50 ms. Each round kills -9
the current leader of ``HOPS_JOBS`` (as JetStream names it in
``$JS.API.STREAM.INFO``), waits for the writes to flow again, starts the dead
server again on its port and data dir, and waits until it is current.

Printed: per kill, how long each writer and the reader stalled (the longest single write
after the kill); then the stall of every submission issued in the 10 s after
each kill, p50/p99/max; and whether every acknowledged submission is in the
stream exactly once after all kills (the count of messages against the count
of acks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import nats
from nats.js import JetStreamContext

from services.runtime.bus import JetStreamLayout, ensure_jetstream
from services.runtime.natscluster import NatsCluster, stream_leader
from services.runtime.retry import kv_write, publish_retried
from shared import subjects

_EVERY_S = 0.05
_AFTER_KILL_S = 10.0
_PAYLOAD = b"x" * 600  # about a job_submitted event


@dataclass
class Writes:
    """Each write's start (monotonic) and how long it took."""

    done: list[tuple[float, float]] = field(default_factory=list)
    acked: int = 0

    def longest_after(self, t0: float, span: float) -> float:
        return max((d for s, d in self.done if t0 <= s + d and s < t0 + span), default=0.0)

    def within(self, t0: float, span: float) -> list[float]:
        return [d for s, d in self.done if t0 - d <= s < t0 + span]


async def _submit_loop(js: JetStreamContext, writes: Writes, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        await publish_retried(js, subjects.job_events(f"bench-{n}"), _PAYLOAD,
                              msg_id=f"bench-{n}", within=60.0)
        writes.done.append((started, time.monotonic() - started))
        writes.acked += 1
        await asyncio.sleep(_EVERY_S)


async def _lease_loop(js: JetStreamContext, writes: Writes, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        await kv_write(js, subjects.KV_LEADER, "bench", b"%d" % n, msg_id=f"lease-{n}",
                       within=60.0)
        writes.done.append((started, time.monotonic() - started))
        await asyncio.sleep(_EVERY_S)


async def _read_loop(js: JetStreamContext, writes: Writes, stop: asyncio.Event) -> None:
    kv = await js.key_value(subjects.KV_LEADER)
    while not stop.is_set():
        started = time.monotonic()
        # direct gets: any replica answers, the leader or not; a read that
        # fails counts as its whole wait
        with contextlib.suppress(Exception):
            await kv.get("bench")
        writes.done.append((started, time.monotonic() - started))
        await asyncio.sleep(_EVERY_S)


async def _kill_leader(cluster: NatsCluster, js: JetStreamContext) -> tuple[str, float]:
    name = await stream_leader(js, subjects.STREAM_JOBS.name)
    member = cluster.member(name)
    killed_at = time.monotonic()
    member.kill()
    return name, killed_at


async def _quiet(_e: Exception) -> None:
    """The client's reconnect errors (the killed server refuses): expected here."""


async def run(kills: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, NatsCluster(tmp, 3) as cluster:
        nc = await nats.connect(servers=list(cluster.urls), max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2, error_cb=_quiet)
        js = nc.jetstream()
        await ensure_jetstream(js, JetStreamLayout(replicas=3))
        subs, lease, reads, stop = Writes(), Writes(), Writes(), asyncio.Event()
        loops = [asyncio.create_task(_submit_loop(js, subs, stop)),
                 asyncio.create_task(_lease_loop(js, lease, stop)),
                 asyncio.create_task(_read_loop(js, reads, stop))]
        await asyncio.sleep(2.0)
        kill_times = []
        for k in range(kills):
            name, t0 = await _kill_leader(cluster, js)
            kill_times.append(t0)
            await asyncio.sleep(_AFTER_KILL_S)
            print(f"kill {k + 1}: {name}; submissions stalled "
                  f"{subs.longest_after(t0, _AFTER_KILL_S):.2f} s, lease writes "
                  f"{lease.longest_after(t0, _AFTER_KILL_S):.2f} s, lease reads "
                  f"{reads.longest_after(t0, _AFTER_KILL_S):.2f} s", flush=True)
            await asyncio.to_thread(cluster.member(name).start)
            await asyncio.sleep(3.0)  # the restarted member catches up
        stop.set()
        await asyncio.gather(*loops)
        stalls = sorted(d for t0 in kill_times for d in subs.within(t0, _AFTER_KILL_S))
        info = await js.stream_info(subjects.STREAM_JOBS.name)
        await nc.close()
    q = statistics.quantiles(stalls, n=100, method="inclusive")
    print(f"submissions within {_AFTER_KILL_S:g} s of a leader kill: {len(stalls)}; stall "
          f"p50 {q[49]:.3f} s, p99 {q[98]:.3f} s, max {stalls[-1]:.3f} s")
    print(f"acknowledged {subs.acked}, in the stream {info.state.messages} "
          f"({'none lost, none doubled' if info.state.messages == subs.acked else 'MISMATCH'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=4, help="stream leader kills")
    asyncio.run(run(parser.parse_args().kills))


if __name__ == "__main__":
    main()
