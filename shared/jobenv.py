"""The environment a node executor gives a real job's processes (§2.2, §3.2).

Besides these, every process gets the variables of PyTorch's distributed
launch: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and ``CUDA_VISIBLE_DEVICES`` naming
the GPUs the job holds on that server. ``HOPS_LR`` is the learning rate for
the allocated number of GPUs, from the job's table or its scaling rule
(:meth:`shared.job.JobSpec.learning_rate`); it is absent when the job gave
neither. ``HOPS_CORES`` is the number of CPU cores the job holds on that
server (``Configuration.extras``; 0 when none are allocated); a real job's
processes then get ``OMP_NUM_THREADS`` set to their share of them, and
the executor pins every thread of the job to exactly that many cores
(:mod:`executor.pinning`). The count may change while the job runs (a
``set_cores`` command): the executor then rewrites the file named by
``HOPS_CORES_FILE`` (one line, the new count), which the plugin reads to
resize its threads; ``HOPS_CORES`` stays the count at the start.

A relaxed-sync job (``JobSpec.sync_scale`` S > 0, hare.md §2.2.3) running
gets ``HOPS_SYNC_SCALE`` = S and ``HOPS_MICRO_BATCHES``, the micro-batches
of every rank in rank order, comma-separated (``"3,1"``: rank 0 processes
three per-GPU batches per step, rank 1 one), each at least 1 and summing
to S: the planner's split by the estimated speed of each rank's GPU
(:mod:`shared.relaxed`), else an even one. Each step then processes S
per-GPU batches in all, and ``HOPS_LR`` is the rate for S GPUs, however
many GPUs the job holds. A profiling run, and a job without a sync
scale, get ``HOPS_SYNC_SCALE`` 0 and ``HOPS_MICRO_BATCHES`` empty: one
batch per rank per step.
"""

from __future__ import annotations

# The job's key (shared/jobkeys.py): ``alice/j1`` for tenant alice's j1, so a
# script that makes a path of it writes ``/`` as it sees fit (the executor's
# own directories write it as ``.``).
JOB_ID = "HOPS_JOB_ID"
SERVER_ID = "HOPS_SERVER_ID"
GPU_TYPE = "HOPS_GPU_TYPE"
MODE = "HOPS_MODE"  # "run" or "profile"
REPORT_FILE = "HOPS_REPORT_FILE"
CHECKPOINT_DIR = "HOPS_CHECKPOINT_DIR"
SAMPLES_DONE = "HOPS_SAMPLES_DONE"  # progress the scheduler resumes the job at
TOTAL_SAMPLES = "HOPS_TOTAL_SAMPLES"
BATCH_SIZE = "HOPS_BATCH_SIZE"  # per process (per GPU)
PROFILE_ITERS = "HOPS_PROFILE_ITERS"
SAMPLE_S = "HOPS_SAMPLE_S"  # running-mode report period, seconds
LR = "HOPS_LR"
TOTAL_GPUS = "HOPS_TOTAL_GPUS"
LOCAL_GPUS = "HOPS_LOCAL_GPUS"
NODES = "HOPS_NODES"
NODE_RANK = "HOPS_NODE_RANK"
THREADS = "HOPS_THREADS"  # intra-op threads per process (CPU devices)
CORES = "HOPS_CORES"  # CPU cores the job holds on this server (0: none allocated)
CORES_FILE = "HOPS_CORES_FILE"  # holds the current count; rewritten when it changes
SYNC_SCALE = "HOPS_SYNC_SCALE"  # per-GPU batches per step of a relaxed-sync job
MICRO_BATCHES = "HOPS_MICRO_BATCHES"  # "3,1": each rank's share of them

# The one default of each setting the executor passes and the plugin falls
# back on: profiling-mode iterations (§3.2: "approximately 10-50
# iterations") and the running-mode report period, seconds.
DEFAULT_PROFILE_ITERS = 20
DEFAULT_SAMPLE_S = 10.0

# Set by the executor; a job's own ``env`` may not override them.
RESERVED: frozenset[str] = frozenset({
    JOB_ID, SERVER_ID, GPU_TYPE, MODE, REPORT_FILE, CHECKPOINT_DIR, SAMPLES_DONE,
    TOTAL_SAMPLES, BATCH_SIZE, PROFILE_ITERS, SAMPLE_S, LR, TOTAL_GPUS, LOCAL_GPUS,
    NODES, NODE_RANK, THREADS, CORES, CORES_FILE, SYNC_SCALE, MICRO_BATCHES, "MASTER_ADDR",
    "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
})
