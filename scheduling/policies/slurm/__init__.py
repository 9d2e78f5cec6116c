"""A Slurm-style baseline: multifactor priority with EASY backfill."""
