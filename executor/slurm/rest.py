"""slurmrestd (REST API v0.0.38) with a JWT: what Hops reads from Slurm and
the signals it sends, for one Slurm user.

slurmctld issues the token (``scontrol token username=<user>``: root or
the SlurmUser may ask for another user's, anyone for their own); it is
renewed when a fifth of its life is left. slurmrestd runs as that user's
peer (``SLURM_JWT=daemon``) and acts with the user's rights: it may signal
the user's own jobs only, so Hops submits as the same user.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import httpx

from executor.slurm.cli import SlurmFailure
from executor.slurm.records import SlurmJob, SlurmNode, decode_jobs, decode_nodes

API = "/slurm/v0.0.38"
TokenSource = Callable[[int], Awaitable[str]]


class SlurmRest:
    """slurmrestd at ``url`` acting as ``user``, with tokens from ``token``
    (called with the lifespan wanted, in seconds)."""

    def __init__(self, url: str, user: str, token: TokenSource, *,
                 lifespan_s: int = 3600, timeout_s: float = 10.0) -> None:
        self.user = user
        self._token_source = token
        self._lifespan_s = lifespan_s
        self._token = ""
        self._renew_at = 0.0
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _headers(self, *, renew: bool = False) -> dict[str, str]:
        now = time.monotonic()
        if renew or not self._token or now >= self._renew_at:
            self._token = await self._token_source(self._lifespan_s)
            self._renew_at = now + self._lifespan_s * 0.8
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token}

    async def _call(self, method: str, path: str, params: dict[str, str] | None = None) -> bytes:
        answer = await self._send(method, path, params, renew=False)
        if answer.status_code == 500:
            # slurmrestd hands a token on unchecked; slurmctld's refusal of a
            # stale or revoked one comes back as a 500 ("Unspecified error"):
            # one more try with a fresh token tells the two apart.
            answer = await self._send(method, path, params, renew=True)
        if answer.status_code in (401, 403):
            raise SlurmFailure("slurm_rest_refused",
                               f"slurmrestd refused {method} {path} for {self.user} "
                               f"({answer.status_code}): {answer.text[:200]}")
        if answer.status_code != 200:
            raise SlurmFailure("slurm_rest_failed", f"slurmrestd {method} {path} answered "
                               f"{answer.status_code}: {answer.text[-300:]}")
        return answer.content

    async def _send(self, method: str, path: str, params: dict[str, str] | None, *,
                    renew: bool) -> httpx.Response:
        try:
            return await self._http.request(method, API + path, params=params,
                                            headers=await self._headers(renew=renew))
        except httpx.TimeoutException as e:  # slurmrestd waits on a slurmctld that is away
            raise SlurmFailure("slurm_rest_timeout", f"slurmrestd {method} {path} did not "
                               f"answer in time: {e!r}") from e
        except httpx.TransportError as e:
            raise SlurmFailure("slurm_rest_unreachable",
                               f"slurmrestd {method} {path}: {e!r}") from e
        except httpx.HTTPError as e:
            raise SlurmFailure("slurm_rest_failed", f"slurmrestd {method} {path}: {e!r}") from e

    async def jobs(self) -> list[SlurmJob]:
        jobs, errors = decode_jobs(await self._call("GET", "/jobs"))
        if errors and not jobs:
            raise SlurmFailure("slurm_rest_failed", f"slurmrestd /jobs: {errors[0].error}")
        return jobs

    async def job(self, job_id: int) -> list[SlurmJob]:
        """Job ``job_id`` alone (``GET /job/<id>``); [] once slurmctld has
        forgotten it."""
        try:
            raw = await self._call("GET", f"/job/{job_id}")
        except SlurmFailure as e:
            if "invalid job id" in e.error.lower():
                return []
            raise
        jobs, errors = decode_jobs(raw)
        if errors and not jobs:
            if any("invalid job id" in err.error.lower() for err in errors):
                return []
            raise SlurmFailure("slurm_rest_failed", f"slurmrestd /job/{job_id}: "
                               f"{errors[0].error}")
        return jobs

    async def nodes(self) -> list[SlurmNode]:
        nodes, errors = decode_nodes(await self._call("GET", "/nodes"))
        if errors and not nodes:
            raise SlurmFailure("slurm_rest_failed", f"slurmrestd /nodes: {errors[0].error}")
        return nodes

    async def signal(self, job_id: int, signal: str) -> None:
        """Sends ``signal`` (``TERM``, ``KILL``) to every process of the job,
        its batch script included (slurmrestd signals the full job)."""
        await self._call("DELETE", f"/job/{job_id}", {"signal": f"SIG{signal}"})

    async def cancel(self, job_id: int) -> None:
        """Cancels the job, pending or running (slurmrestd's DELETE sends
        SIGKILL when no signal is named)."""
        await self._call("DELETE", f"/job/{job_id}")
