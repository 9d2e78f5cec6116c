"""The placer's channel to the node executors (docs/events.md, *Node-scoped
subjects*): each command is a request on the server's
``hops.v1.exec.<server>.commands``, retried on timeout with the same
idempotency key up to ``attempts`` times, and an ``error_record`` when no
ack came or the ack cannot be read; where a job's processes meet (its first
server's executor); and undoing a start that failed on some server.

:mod:`services.placer.service` decides what to send and what the acks
mean; this module only sends and says what came back.
"""

from __future__ import annotations

import asyncio

import nats.errors

from services.placer.commands import Start, command_key
from services.runtime.bus import request
from services.runtime.service import ServiceContext
from shared import subjects
from shared.events import CommandAck, SetCores, StartJob, StopJob, WireError, decode_ack
from shared.ids import ServerId
from shared.node import Rendezvous, rendezvous_port


class Executors:
    """Commands to the executors of ``ctx``'s cluster; ``addresses`` are
    their rendezvous addresses (``hops_nodes``), refreshed by each plan."""

    def __init__(self, ctx: ServiceContext, timeout_s: float, attempts: int,
                 retry_delay_s: float) -> None:
        self.ctx = ctx
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.retry_delay_s = retry_delay_s
        self.addresses: dict[ServerId, str] = {}

    async def send(self, server: ServerId,
                   cmd: StartJob | StopJob | SetCores) -> CommandAck | None:
        """The executor's ack, retried with the same key; None if none came."""
        where = subjects.exec_commands(server)
        for attempt in range(1, self.attempts + 1):
            try:
                return await request(self.ctx.nc, where, cmd, decode_ack, timeout=self.timeout_s)
            except nats.errors.NoRespondersError:
                await asyncio.sleep(self.retry_delay_s)
            except nats.errors.TimeoutError:
                pass
            except WireError as e:
                await self.ctx.reporter.report(where, str(e), e.code)
                return None
            self.ctx.log.info("no ack; retrying", job_id=cmd.job_id, server_id=server,
                              key=cmd.key, attempt=attempt)
        await self.ctx.reporter.report(where, f"no ack for {cmd.key} after {self.attempts} "
                                       "attempts", "timeout")
        return None

    def rendezvous(self, start: Start, prefix: str) -> Rendezvous:
        """Where the job's processes meet: its first server's executor, on a
        port drawn from this start (the same for all of its servers)."""
        first = start.placement.configuration.parts[0][0]
        addr = self.addresses.get(first) or "127.0.0.1"
        return Rendezvous(master_addr=addr, master_port=rendezvous_port(f"{prefix}:{start.job_id}"))

    async def undo(self, start: Start, acks: list[CommandAck | None], prefix: str,
                   why: str | None = None) -> None:
        """A start failed somewhere (or, ``why``, its servers do not run it
        as one job): stop the job where it did start, then say so."""
        job = start.job_id
        pairs = list(zip(start.launches, acks, strict=True))
        await asyncio.gather(*(
            self.send(launch.server, StopJob(key=command_key("undo", prefix, job, launch.server),
                                             job_id=job, reason="start failed"))
            for launch, a in pairs if a is not None and a.ok))
        failed = [f"{launch.server}: {a.code + ' ' + a.error if a else 'no answer'}"
                  for launch, a in pairs if a is None or not a.ok]
        if why is not None:
            failed.append(f"{why}: stopped where it ran")
        await self.ctx.reporter.report(subjects.PLANS, f"job {job} could not start "
                                       f"({'; '.join(failed)})", "start_failed")
