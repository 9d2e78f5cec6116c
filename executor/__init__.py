"""The node executor of the live system: one per server, EMULATED or REAL.

One executor runs per server (``python -m executor``): it registers the
server with the monitor (with its rendezvous address and devices), beats,
and answers the placer's ``start_job`` and ``stop_job`` commands
(:mod:`executor.service`, shared by both kinds). What runs a job is a
backend (:mod:`executor.backend`):

* **emulated** (the default, :mod:`executor.emulated`), for machines without
  GPUs: each job is a real OS subprocess (``python -m executor.job``) that
  trains nothing; it advances at the world model's ground-truth rate
  (:class:`world.truth.GroundTruth`) times a time-scale factor and
  reports what a real job would report, so the rest of the system runs
  unchanged;
* **real** (``--backend real``, :mod:`executor.real`): each job's own
  command, one process per GPU (:mod:`executor.launch`), with the executor
  speaking for it on NATS from what it writes to its report file
  (:mod:`executor.reports`); GPUs come from NVML or, without it, from the
  cluster file (:mod:`executor.discovery`); jobs outlive a crash of their
  executor, which adopts them when it comes back (:mod:`executor.adopt`).
"""
