"""Hare (HPDC'22): task-level scheduling of relaxed-synchronisation jobs on
heterogeneous GPUs. See docs/hare.md."""
