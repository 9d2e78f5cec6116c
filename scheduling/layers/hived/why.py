"""HiveD's own reasons (``LayerRecord.why``, code ``TenantCells``) for the
jobs one plan of the layer (:class:`.round.HivedRound`) does not place:

- a job of a tenant without a virtual cluster, or whose sizes no cell of
  its tenant can ever hold (held back when it may not run opportunistically);
- a guaranteed assignment the cells refused to bind (removed);
- a running opportunistic job a guaranteed job reclaimed its cells from
  (§3.3, strict priority), even one that restarts on other idle cells: the
  reclaim reason, from which receipts derive the ``CellReclaim`` rule;
- a waiting job no cell of its tenant can hold that no idle cell took
  opportunistically;
- a waiting job its tenant's inner plan left out while the GPUs its VC had
  left after that plan are fewer than its smallest size (the tenant's own
  jobs hold its cells), and that no idle cell took opportunistically.

Other waiting jobs get the mechanism's reason (scheduling.explain).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from scheduling.explain.records import cells_why, reclaimed_why
from shared.cluster import Cluster
from shared.explain import Why
from shared.ids import GpuType, JobId
from shared.snapshot import JobState, Plan, Snapshot


def vc_left(view: Snapshot, plan: Plan) -> dict[GpuType, int]:
    """GPUs of each type a tenant's VC has free after its inner ``plan``."""
    free = Counter(view.free_gpus())
    for a in plan.assignments:
        free.subtract(a.config.as_dict())
    for t in plan.profiling:
        free[t.server] -= t.gpus
    out: Counter[GpuType] = Counter()
    for s in view.cluster.servers:
        out[s.gpu_type] += max(0, free[s.id])
    return dict(out)


def _short(layer: str, job: JobState, sizes: Sequence[int],
           left: Mapping[GpuType, int]) -> Why | None:
    """A TenantCells reason when no type of the VC has ``job``'s smallest size left."""
    if not sizes:
        return None
    need = min(sizes)
    most, gpu = max(((n, t) for t, n in left.items()), default=(0, ""))
    if most >= need:
        return None
    return cells_why(layer, f"tenant {job.spec.tenant}'s free cells hold {most} GPUs; "
                            f"it needs {need}", gpu_type=gpu, short=need - most)


def round_whys(layer: str, snapshot: Snapshot, vcs: Mapping[str, Cluster | None],
               placed: set[JobId], held_back: Sequence[JobId],
               refused: Mapping[JobId, str], preempted: Sequence[JobId],
               left: Mapping[str, dict[GpuType, int]],
               sizes: Mapping[JobId, tuple[int, ...]]) -> dict[JobId, Why]:
    """The layer's reason for each job of ``snapshot`` it did not place."""
    out: dict[JobId, Why] = {}
    reclaimed = set(preempted)
    for job in snapshot.jobs:
        jid, tenant = job.id, job.spec.tenant
        waiting = job.phase == "queued" or (snapshot.first_plan and job.phase == "running")
        if jid in reclaimed and job.phase == "running":
            # even where it restarts on other idle cells: its receipt's rule
            out[jid] = reclaimed_why(layer)
        elif jid in placed or not waiting:
            continue
        elif jid in refused:
            out[jid] = cells_why(layer, f"its cells could not be bound: {refused[jid]}")
        elif jid in held_back and vcs.get(tenant) is None:
            out[jid] = cells_why(layer, f"tenant {tenant} has no virtual cluster here")
        elif jid in held_back:
            out[jid] = cells_why(layer, f"no cell of tenant {tenant} can hold any of its sizes")
        elif jid in sizes and not sizes[jid]:
            out[jid] = cells_why(layer, f"no cell of tenant {tenant} can hold any of its sizes, "
                                        "and no idle cell of another tenant fits it")
        elif tenant in left and jid in sizes:
            short = _short(layer, job, sizes[jid], left[tenant])
            if short is not None:
                out[jid] = short
    return out
