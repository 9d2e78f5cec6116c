"""Slurm as the execution backend (issue 37): the client Hops drives Slurm
with (:mod:`executor.slurm.client`) and the records it reads back
(:mod:`executor.slurm.records`). docs/slurm.md says which operation goes
through slurmrestd and which through the CLI, and why."""
