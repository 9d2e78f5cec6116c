"""Profiles reused across jobs: the profile signature and its rules.

A departure from Hops §3.2–§3.3, which profiles every job on every GPU type
and keeps one database object per job: jobs with the same *profile
signature* share the theoretical layer (the time modules of §3.2) of each
GPU type the signature was profiled on, so a job whose signature was
profiled on a type is not profiled there again. Its own running-mode
samples (§3.5) still fill its own entity and type layers and data-time
history, so its estimate is corrected by what it measures, as in the paper.

The signature is what determines the time modules of Eq. (1): the model,
the per-GPU batch size, the parameter count (T_c of Eq. 2) and, for a real
job (one with a ``command``), the argument list and the working directory,
since relative paths in the command resolve against it, so one argument
list in two directories may run two different programs. ``env`` is left
out: it carries per-job settings (output paths, run names, credentials)
that would make every job its own signature; a job whose environment
changes its speed must differ in its command. Emulated and simulated jobs
(no command, hence no working directory) are their model, batch size and
parameters. A CPU job is never
profiled and has no signature.

A shared record that disagrees with what a job then measures by more than
:data:`STALE_MARGIN` is *stale*: the signature is profiled again on that
type by its next job (:func:`disagrees`). An operator can mark it stale on
demand too.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Sequence, Set
from typing import NewType

import msgspec

from shared.ids import GpuType
from shared.job import JobSpec
from shared.measurements import ThroughputSample

Signature = NewType("Signature", str)

# Hops reuses profiles (the departure above); the baselines do not unless
# their spec says so (docs/baselines.md, "Profiles reused"): Sia and Gavel
# measure each job themselves, as their papers describe.
PROFILE_REUSE = True
BASELINE_PROFILE_REUSE = False

# Measured throughput more than 25% away from the shared record's estimate
# marks the record stale. The paper's estimates of stable jobs are within 5%
# (§4.1, Figure 6) and the one-GPU profile of a job with unstable data
# loading starts up to ~20% off before its history fills (Figure 7b), so a
# gap beyond 25% says the signature's jobs do not run alike (another
# dataset behind one command, a changed script), not noise.
STALE_MARGIN = 0.25

_SIGNATURE_HEX = 16


class _Key(msgspec.Struct, frozen=True, array_like=True):
    model: str
    batch_size: int
    params: int
    command: tuple[str, ...]
    workdir: str


def profile_signature(spec: JobSpec) -> Signature | None:
    """The job's profile signature (see the module docstring); None for a
    CPU job. Stable across processes and runs: a hash of a canonical encoding."""
    if spec.kind == "cpu":
        return None
    key = _Key(spec.model, spec.batch_size, spec.params, spec.command, spec.workdir)
    digest = hashlib.sha256(msgspec.json.encode(key)).hexdigest()[:_SIGNATURE_HEX]
    return Signature(digest)


def must_profile(supported: Iterable[GpuType], shared: Set[GpuType]) -> frozenset[GpuType]:
    """The GPU types a new job is profiled on: those it can run on less the
    types its signature holds a current (not stale) shared profile of. The
    simulator and the live leader both decide with this function."""
    return frozenset(t for t in supported if t not in shared)


def disagrees(estimated: float, measured: float, margin: float = STALE_MARGIN) -> bool:
    """Whether a measured throughput is more than ``margin`` (a fraction of
    the estimate) away from the estimate the shared record gave; nothing to
    compare (a zero on either side) is no disagreement."""
    if estimated <= 0.0 or measured <= 0.0:
        return False
    return abs(measured - estimated) > margin * estimated


def first_samples_disagree(
    estimated: float, samples: Sequence[ThroughputSample], gpus: int
) -> float | None:
    """The throughput a job's first running samples on a type measured (their
    mean per-GPU throughput times its ``gpus``) when it :func:`disagrees` with
    the ``estimated`` throughput of the same GPUs that its signature's shared
    profile gave; None when it agrees or there are no samples. The simulator
    and the live estimators both mark a profile stale by this rule."""
    if not samples:
        return None
    measured = statistics.fmean(s.per_gpu_throughput for s in samples) * gpus
    return measured if disagrees(estimated, measured) else None
