"""A resident model's state: given, checked, evicted and reloaded
(docs/hare.md §7, step 4).

Hare keeps a model in GPU memory when its job's next task comes soon and
otherwise moves it out (§4, speculative memory management). Here a model's
state is its parameters and buffers by name. Evicted, it goes to a file,
in shared memory (``/dev/shm``) unless the trainer is given a folder, as
:mod:`hops.trainer.wire` encodes tensors (no pickle), and the model keeps
its modules with empty tensors: its memory is freed, its structure (and the
optimiser's references to its parameters) stays for the reload.

**On a GPU** (written, untested without one): the evicted state is also
kept in pinned host memory, and :func:`pipelined_reload` copies it back
layer by layer on a side stream, each layer's forward waiting for its own
copy only (a forward pre-hook waits on that layer's event), so the first
layers compute while the later ones still travel.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch import nn

from hops.trainer.wire import decode_tensors, encode_tensors

SHM = Path("/dev/shm")


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s parameters and buffers by name, detached (not copied)."""
    out = {n: p.detach() for n, p in model.named_parameters()}
    out.update((n, b.detach()) for n, b in model.named_buffers())
    return out


def params_problem(model: nn.Module, given: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``given`` cannot be ``model``'s state (None when it can): every
    parameter named, and nothing but parameters and buffers of their shapes
    and dtypes (buffers may be left out: an aggregator holds none)."""
    params = dict(model.named_parameters())
    known: dict[str, torch.Tensor] = {**dict(model.named_buffers()), **params}
    missing = sorted(set(params) - set(given))
    if missing:
        return f"no tensor for parameters {missing[:3]}{'...' if len(missing) > 3 else ''}"
    for name, tensor in given.items():
        own = known.get(name)
        if own is None:
            return f"{name!r} is no parameter or buffer of the model"
        shape = _shapes(model).get(name, own.shape)
        if (tuple(tensor.shape), tensor.dtype) != (tuple(shape), own.dtype):
            return (f"{name}: {tuple(tensor.shape)} {tensor.dtype}, the model's "
                    f"{tuple(shape)} {own.dtype}")
    return None


_SHAPES = "_hops_shapes"  # an evicted model's shapes, kept on the module


def _shapes(model: nn.Module) -> dict[str, torch.Size]:
    shapes: dict[str, torch.Size] = getattr(model, _SHAPES, {})
    return shapes


def assign(model: nn.Module, given: Mapping[str, torch.Tensor], device: torch.device) -> None:
    """Make ``given`` (checked by :func:`params_problem`) the model's state
    on ``device``; the tensors become the model's, uncopied on the CPU."""
    state = {**dict(model.named_buffers()), **dict(model.named_parameters())}
    for name, tensor in given.items():
        state[name].data = tensor.to(device)
    if hasattr(model, _SHAPES):
        delattr(model, _SHAPES)


def free(model: nn.Module) -> None:
    """Drop the memory of ``model``'s state and gradients (its shapes kept
    for :func:`params_problem`)."""
    shapes = {n: t.shape for n, t in state_of(model).items()}
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.grad = None
        tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    setattr(model, _SHAPES, shapes)


def evict_folder(folder: str) -> Path:
    """Where evicted state goes: ``folder``, else shared memory (the
    temporary folder where there is no ``/dev/shm``)."""
    if folder:
        return Path(folder)
    return SHM if SHM.is_dir() else Path(tempfile.gettempdir())


def evict_path(folder: Path, pid: int, job: str) -> Path:
    """The file of ``job``'s evicted state in trainer ``pid`` (the job id
    made safe as a file name; the pid keeps two trainers' files apart and
    lets a pool remove a dead trainer's)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in job)[:64]
    tag = hashlib.sha256(job.encode()).hexdigest()[:12]  # two ids made alike stay apart
    return folder / f"hops-trainer-{pid}-{safe}-{tag}.state"


def save_state(path: Path, state: Mapping[str, torch.Tensor], round_: int | None) -> int:
    """Write ``state`` of round ``round_`` (None: the script's seeded
    state) to ``path`` whole (a temporary file renamed); its bytes."""
    body = msgspec.msgpack.encode({"round": round_, "tensors": encode_tensors(state)})
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".evict-", delete=False) as f:
        f.write(body)
    Path(f.name).replace(path)  # a reader sees the old file or the whole new one
    return len(body)


def load_state(path: Path) -> tuple[int | None, dict[str, torch.Tensor]]:
    """The round and the state :func:`save_state` wrote to ``path``."""
    raw: Any = msgspec.msgpack.decode(path.read_bytes())
    round_ = raw["round"]
    return (None if round_ is None else int(round_)), decode_tensors(raw["tensors"])


def pin(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pinned host copies of a GPU model's ``state`` (untested here)."""
    return {n: t.to("cpu").pin_memory() for n, t in state.items()}


def pipelined_reload(model: nn.Module, pinned: Mapping[str, torch.Tensor],
                     device: torch.device, stream: Any) -> Callable[[], None]:
    """Copy ``pinned`` back to ``device`` on the side ``stream``, one module
    (layer) at a time in registration order; each module's forward waits
    for its own layer's event only. Returns the function that removes the
    hooks (after the first forward). Written for CUDA, untested here."""
    hooks: list[Any] = []
    for prefix, module in model.named_modules():
        own = [(n, t) for n, t in [*module.named_parameters(recurse=False),
                                   *module.named_buffers(recurse=False)]]
        if not own:
            continue
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream):
            for name, tensor in own:
                full = f"{prefix}.{name}" if prefix else name
                tensor.data = pinned[full].to(device, non_blocking=True)
                # Made on the side stream, used on the compute stream.
                tensor.data.record_stream(torch.cuda.current_stream())
            event.record(stream)

        def wait(_m: nn.Module, _a: Any, ev: Any = event) -> None:
            torch.cuda.current_stream().wait_event(ev)

        hooks.append(module.register_forward_pre_hook(wait))

    def remove() -> None:
        for hook in hooks:
            hook.remove()

    return remove
