"""The aggregator service: one Hare parameter server per relaxed-sync job
that a task sequence names (docs/hare.md §7, "Step 3b")."""
