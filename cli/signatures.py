"""``hops signatures``: the profile signatures whose shared profiles the
estimators hold (:mod:`shared.reuse`), and ``hops signatures reprofile``,
which has a signature profiled again by its next job (``GET /signatures``,
``POST /signatures/{signature}/reprofile``; admins only). The commands are
registered on the ``hops`` app by :mod:`cli.main`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from cli.client import Answer, GatewayClient
from shared.job import JobSpec
from shared.jobkeys import parse_ref
from shared.reuse import profile_signature

HEADER = ("signature", "model", "batch", "profiled on", "stale on", "jobs")
_JOBS_SHOWN = 5


class SignatureNotFound(Exception):
    """A job that has no profile signature (a CPU job) or a bad spec."""


def job_signature(client: GatewayClient, ref: str) -> str:
    """The profile signature of the job ``ref`` names (``[TENANT/]ID``, from
    its spec, as the executors compute it); :class:`SignatureNotFound` for
    a CPU job."""
    tenant, job_id = parse_ref(ref)
    record = client.job(job_id, tenant)
    try:
        spec = msgspec.convert(record.get("spec"), JobSpec, strict=False)
    except (msgspec.ValidationError, ValueError) as e:
        raise SignatureNotFound(f"job {job_id}: its spec cannot be read ({e})") from None
    signature = profile_signature(spec)
    if signature is None:
        raise SignatureNotFound(f"job {job_id} is a CPU job: it is never profiled")
    return signature


def _jobs(ids: Sequence[str]) -> str:
    shown = " ".join(ids[:_JOBS_SHOWN])
    more = f" (+{len(ids) - _JOBS_SHOWN})" if len(ids) > _JOBS_SHOWN else ""
    return f"{shown}{more}" or "-"


def render_signatures(body: Mapping[str, Any]) -> str:
    """One line per signature: its model and batch size, the types it holds
    a current profile of, the stale ones and its jobs not ended."""
    rows = [[s["signature"], s.get("model") or "-", str(s.get("batch_size", 0) or "-"),
             ",".join(s.get("current", ())) or "-", ",".join(s.get("stale", ())) or "-",
             _jobs(s.get("jobs", []))] for s in body.get("signatures", [])]
    if not rows:
        return "no shared profiles yet (no job with a profile signature has been profiled)"
    widths = [max(len(x) for x in col) for col in zip(HEADER, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*HEADER).rstrip(), *(fmt.format(*r).rstrip() for r in rows)])


def render_reprofile(signature: str, answer: Answer) -> str:
    if not answer.ok:
        code = answer.body.get("code", "")
        return f"{signature}: refused ({answer.status} {code}): {answer.body.get('error', '')}"
    types = ", ".join(answer.body.get("gpu_types", ()))
    when = ("" if answer.body.get("applied")
            else " (the estimators have not applied it yet; `hops signatures` shows when)")
    return f"{signature}: stale on {types}; its next job is profiled there{when}"
