"""The node executor of the live system, in an EMULATED form for machines
without GPUs.

One executor runs per server (``python -m executor``): it registers the
server with the monitor, beats, and answers the placer's ``start_job`` and
``stop_job`` commands by running each job as a real OS subprocess
(``python -m executor.job``). The subprocess does not train anything: it is
an emulator that advances at the simulator's ground-truth rate
(:class:`simulator.truth.GroundTruth`) times a time-scale factor and reports
what a real job would report (heartbeats, running-mode throughput samples,
profiles, ``job_finished``), so the rest of the system runs unchanged.
"""
