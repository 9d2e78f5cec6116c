"""The burst scenario's jobs: long jobs of a fixed GPU count submitted
first, then a burst of short one-GPU jobs of a few signatures.

It mirrors ``bench/live_burst.py`` on the paper's physical cluster: 15
long 4-GPU jobs running, then 500 short jobs of at most 10 signatures
(catalog models, 0.5-5 M samples) submitted at once. Pure: a function of
its arguments and the seed.
"""

from __future__ import annotations

import msgspec
import numpy as np

from shared.ids import JobId
from shared.job import JobSpec
from simulator.workloads import SimJob, learning_rate
from world.catalog import builtin_catalog

# Small image models of the paper's catalog (Table 2, category S): the
# burst's signatures are drawn from these.
SHORT_MODELS = (
    "resnet18-cifar10", "resnet50-cifar10", "vgg11-cifar10", "vgg13-cifar10",
    "mobilenetv2-cifar10", "densenet161-cifar10", "convnext-base-cifar10",
)
LONG_MODEL = "resnet18-cifar10"
LONG_PREFIX = "long-"
BURST_PREFIX = "burst-"


class BurstScenario(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The scenario's sizes: ``long_jobs`` jobs of ``long_gpus`` GPUs and
    ``long_samples`` samples each at time 0, then ``burst`` short jobs at
    ``burst_at`` seconds, of ``signatures`` models and
    ``samples`` samples drawn log-uniformly (the issue's bench allows up to
    10 signatures; the catalog has 7 such models)."""

    long_jobs: int = 15
    long_gpus: int = 4
    long_samples: float = 5e9
    burst: int = 500
    burst_at: float = 3600.0
    signatures: int = len(SHORT_MODELS)
    samples: tuple[float, float] = (0.5e6, 5e6)
    seed: int = 0


def _job(job_id: str, model: str, samples: float, reqs: tuple[int, ...],
         submit: float) -> SimJob:
    m = builtin_catalog()[model]
    lr, rule = learning_rate(m)
    spec = JobSpec(id=JobId(job_id), model=m.name, batch_size=m.batch_size,
                   params=m.params, total_samples=max(1, round(samples)), requirements=reqs,
                   base_lr=lr, lr_rule=rule, submit_time=submit)
    return SimJob(spec, m.name)


def burst_jobs(s: BurstScenario) -> list[SimJob]:
    """The long jobs, then the burst, of the first ``signatures`` models of
    :data:`SHORT_MODELS` (a signature is a model at its catalog batch
    size)."""
    rng = np.random.default_rng(s.seed)
    sigs = SHORT_MODELS[: max(1, s.signatures)]
    jobs = [_job(f"{LONG_PREFIX}{i:02d}", LONG_MODEL, s.long_samples, (s.long_gpus,), 0.0)
            for i in range(s.long_jobs)]
    lo, hi = np.log(s.samples[0]), np.log(s.samples[1])
    for i in range(s.burst):
        model = sigs[int(rng.integers(len(sigs)))]
        samples = float(np.exp(rng.uniform(lo, hi)))
        jobs.append(_job(f"{BURST_PREFIX}{i:04d}", model, samples, (1,), s.burst_at))
    return jobs
