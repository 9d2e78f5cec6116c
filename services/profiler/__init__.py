"""The profiler service: checks profile reports and publishes ``job_profiled``
(Hops §3.2; :mod:`services.profiler.service`, pure checks in
:mod:`services.profiler.tracker`)."""
