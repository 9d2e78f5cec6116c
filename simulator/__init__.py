"""The simulators' engines, pure: the trace-driven round simulator
(:mod:`simulator.engine`, a virtual clock around the same policies the live
leader runs, fed by :mod:`simulator.workloads`) and the task-level one for
relaxed-sync jobs (:mod:`simulator.tasks`). Each experiment's own workload,
rules and report live under ``experiments/``."""
