"""A training script run as Hare's tasks (docs/hare.md §7): the script's
``hops_task(config)`` gives its model, optimiser, data and loss
(:mod:`hops.trainer.api`), its gradients travel without pickle
(:mod:`hops.trainer.wire`), and a job's spec says which script and config
(:mod:`hops.trainer.spec`). A library with no bus and no clock: the
resident trainer processes and the aggregator's service are its shells."""

from hops.trainer.api import (
    ENTRY,
    TaskJob,
    load_task,
    micro_batch_seed,
    reference_rounds,
    script_options,
    sync_scale_of,
    task_gradients,
)
from hops.trainer.spec import NOT_TASK_READY, NotTaskReady, task_config, task_script
from hops.trainer.wire import BAD_TENSOR, DTYPES, BadTensor, decode_tensors, encode_tensors

__all__ = [
    "BAD_TENSOR",
    "DTYPES",
    "ENTRY",
    "NOT_TASK_READY",
    "BadTensor",
    "NotTaskReady",
    "TaskJob",
    "decode_tensors",
    "encode_tensors",
    "load_task",
    "micro_batch_seed",
    "reference_rounds",
    "script_options",
    "sync_scale_of",
    "task_config",
    "task_gradients",
    "task_script",
]
