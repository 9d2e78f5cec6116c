"""The two formulations of a pass's options for Eq. (11)-(13) (see
:mod:`scheduling.policies.hops.passes`): ``direct`` columns per location-specific
configuration, and ``class`` columns per server class with pattern counts.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from scheduling.ilp import INF, MipModel
from scheduling.policies.hops.candidates import FreeIndex, generate_configs, largest_servers
from scheduling.policies.hops.classes import (
    ClassOption,
    Item,
    Pattern,
    ServerClass,
    class_options,
    complete_pattern,
    keep_servers,
    maximal_patterns,
    pin_kept,
    realise_patterns,
    server_classes,
    undominated,
)
from shared.cluster import Cluster
from shared.configuration import Configuration
from shared.estimate import JobEstimate
from shared.ids import GpuType, ServerId


def assignment_model(
    jobs: Sequence[int],
    coeffs: Sequence[float],
    usage: Sequence[Mapping[Hashable, float]],
    capacity: Mapping[Hashable, float],
    supply: Sequence[tuple[float, Mapping[Hashable, float]]] = (),
) -> MipModel:
    """Eq. (11)-(13) as a MIP: binary option columns ``x`` (job ``jobs[o]``,
    objective coefficient ``coeffs[o]`` = w_i * G_ij), at most one per job
    (12), and per resource ``sum_o usage[o][r] * x_o <= capacity[r]`` (13).

    ``supply`` adds integer columns ``0 <= z <= ub`` with raw entries in the
    resource rows; the class formulation uses them for pattern counts (an
    entry ``-count`` supplies items, ``+1`` uses a server of the class).
    (A restricted model fixes columns to 0 afterwards:
    :meth:`~scheduling.ilp.MipModel.fixed_to_zero`.)
    """
    # Options of one shape share their usage mapping: list its pairs once.
    pairs: dict[int, tuple[tuple[Hashable, float], ...]] = {}
    listed = [pairs.get(id(u)) or pairs.setdefault(id(u), tuple(u.items())) for u in usage]
    return _model(jobs, coeffs, listed, capacity, supply)


def _model(
    jobs: Sequence[int],
    coeffs: Sequence[float],
    usage: Sequence[Sequence[tuple[Hashable, float]]],
    capacity: Mapping[Hashable, float],
    supply: Sequence[tuple[float, Mapping[Hashable, float]]],
) -> MipModel:
    """:func:`assignment_model` with each option's usage as (resource, amount)
    pairs, the option columns laid out with numpy and added in bulk. Rows are
    created in the order the options, then the supply columns, first use
    them, and the non-zeros come in the same order as column by column."""
    if not len(jobs) == len(coeffs) == len(usage):
        raise ValueError("jobs, coeffs and usage must have the same length")
    model = MipModel()
    job_rows = {j: model.add_row(-INF, 1.0) for j in sorted(set(jobs))}
    flat = [p for parts in usage for p in parts]
    res_rows: dict[Hashable, int] = {
        r: model.add_row(-INF, float(capacity[r])) for r in dict.fromkeys(r for r, _ in flat)
    }
    lens = np.fromiter(map(len, usage), np.int64, len(usage))
    ends = np.cumsum(lens + 1)
    heads = ends - 1 - lens
    rows = np.empty(int(ends[-1]) if len(usage) else 0, np.int64)
    values = np.empty(rows.size, np.float64)
    rest = np.ones(rows.size, dtype=bool)
    rest[heads] = False
    rows[heads], values[heads] = [job_rows[j] for j in jobs], 1.0
    rows[rest], values[rest] = [res_rows[r] for r, _ in flat], [v for _, v in flat]
    uppers = np.ones(len(jobs))
    model.add_cols(coeffs, uppers, integer=True, ends=ends, rows=rows, values=values)
    col_rows: list[int] = []
    col_values: list[float] = []
    col_ends: list[int] = []
    for _, entries in supply:
        for r, v in entries.items():
            if r not in res_rows:
                res_rows[r] = model.add_row(-INF, float(capacity[r]))
            col_rows.append(res_rows[r])
            col_values.append(v)
        col_ends.append(len(col_rows))
    model.add_cols([0.0] * len(supply), [up for up, _ in supply], integer=True, ends=col_ends,
                   rows=col_rows, values=col_values)
    return model


class PassOption(msgspec.Struct, frozen=True, gc=False):
    """One column of Eq. (11): job ``job`` with gain G_ij and its resources,
    either a concrete configuration (direct) or a class option (class). A
    struct: passes create millions, and frozen dataclasses build slowly."""

    job: int
    gain: float
    throughput: float
    gpus: int
    order: tuple[int, ...]  # cluster-order tie-break
    config: Configuration | None = None
    klass: ClassOption | None = None


@dataclass
class OptionSpace:
    """A pass's options. ``per_job`` lists option indices in greedy order (max
    G, fewer GPUs, cluster order); the class fields are empty in direct mode."""

    formulation: str
    options: list[PassOption]
    per_job: list[list[int]]
    classes: tuple[ServerClass, ...] = ()
    patterns: list[list[Pattern]] = field(default_factory=list)
    kinds: list[list[Item]] = field(default_factory=list)
    klass_of: dict[ServerId, int] = field(default_factory=dict)
    pattern_col: dict[tuple[int, Pattern], int] = field(default_factory=dict)
    # The class model's resource rows, built once (see _class_resources): a
    # pass builds its model more than once (the restricted model).
    resources: ClassResources | None = field(default=None, repr=False)


Usage = Mapping[Hashable, float]
Supply = tuple[float, Mapping[Hashable, float]]
ClassResources = tuple[list[Usage], dict[Hashable, float], list[Supply]]


Assignment = dict[int, tuple[int, Configuration]]  # job index -> (option index, config)


def build_model(
    space: OptionSpace,
    coeffs: Sequence[float],
    free: Mapping[ServerId, int],
) -> MipModel:
    """Eq. (11)-(13) for ``space``: per-server rows (direct), or per class a
    server-count row and per item size a linking row ``items chosen <= items
    supplied by the pattern counts`` (class)."""
    jobs = [o.job for o in space.options]
    if space.formulation == "direct":
        parts = [o.config.parts if o.config else () for o in space.options]
        room: dict[Hashable, float] = {sid: float(g) for sid, g in free.items()}
        return _model(jobs, coeffs, parts, room, ())
    usage, capacity, supply = _class_resources(space)
    return assignment_model(jobs, coeffs, usage, capacity, supply)


def _class_resources(space: OptionSpace) -> ClassResources:
    """Per option its items per class, the classes' rows, and the pattern
    columns' supply; options of one shape in one class share their usage."""
    if space.resources is not None:
        return space.resources
    capacity: dict[Hashable, float] = {}
    usage: list[Usage] = []
    shapes: dict[tuple[int, int, int], Usage] = {}
    for o in space.options:
        assert o.klass is not None
        c = o.klass.klass
        use = shapes.get((c, o.klass.full, o.klass.part))
        if use is None:
            items = Counter(o.klass.items(space.classes[c].free))
            use = {("item", c, s): float(n) for s, n in items.items()}
            shapes[(c, o.klass.full, o.klass.part)] = use
            capacity.update(dict.fromkeys(use, 0.0))
        usage.append(use)
    supply: list[Supply] = []
    for c, patterns in enumerate(space.patterns):
        servers = float(len(space.classes[c].servers))
        capacity[("class", c)] = servers
        for p in patterns:
            entries: dict[Hashable, float] = {
                ("item", c, s): -float(n) for s, n in Counter(p).items()
            }
            entries[("class", c)] = 1.0
            supply.append((servers, entries))
    space.resources = (usage, capacity, supply)
    return space.resources


def incumbent_values(
    space: OptionSpace,
    assignment: Assignment,
    items: Mapping[ServerId, Sequence[Item]],
    n_cols: int,
) -> list[float]:
    """A plan as a column vector: chosen options, then (class mode) pattern
    counts read off the items each server holds."""
    x = [0.0] * n_cols
    for o, _ in assignment.values():
        x[o] = 1.0
    if space.formulation == "class":
        for sid, held in items.items():
            c = space.klass_of[sid]
            pattern = complete_pattern(held, space.classes[c].free, space.kinds[c])
            x[space.pattern_col[(c, pattern)]] += 1.0
    return x


def decode(
    space: OptionSpace,
    x: Sequence[float] | npt.NDArray[np.float64],
    current: Mapping[int, Configuration] | None = None,
    *,
    pin: bool = False,
) -> Assignment:
    """Chosen options as configurations; class solutions are realised on the
    class's servers (:func:`~scheduling.policies.hops.classes.realise_patterns`)
    and then relabelled so jobs keep their ``current`` servers where they can.
    With ``pin``, jobs kept at their class and shape take their current
    servers before the others are placed, where the others still fit
    (:func:`~scheduling.policies.hops.classes.pin_kept`)."""
    chosen = [o for o in range(len(space.options)) if x[o] > 0.5]
    out: Assignment = {}
    for o in chosen:
        config = space.options[o].config
        if config is not None:
            out[space.options[o].job] = (o, config)
    for c, klass in enumerate(space.classes):
        demands = [(o, k) for o in chosen if (k := space.options[o].klass) and k.klass == c]
        counts = [round(x[space.pattern_col[(c, p)]]) for p in space.patterns[c]]
        configs = realise_patterns(klass, space.patterns[c], counts, [k for _, k in demands])
        if current:
            wanted = [current.get(space.options[o].job) for o, _ in demands]
            kept = pin_kept(klass, [k for _, k in demands], wanted) if pin else None
            configs = kept or keep_servers(klass.servers, configs, wanted)
        for (o, _), config in zip(demands, configs, strict=True):
            if config is not None:
                out[space.options[o].job] = (o, config)
    return out


class PassJobLike(Protocol):
    """What the option spaces need of a job of the pass."""

    @property
    def requirements(self) -> tuple[int, ...]: ...
    @property
    def rho(self) -> dict[GpuType, float]: ...
    @property
    def estimate(self) -> JobEstimate: ...


def _finish_space(formulation: str, options: list[PassOption], n_jobs: int) -> OptionSpace:
    per_job: list[list[int]] = [[] for _ in range(n_jobs)]
    for idx, opt in enumerate(options):
        per_job[opt.job].append(idx)
    keys = [(-o.gain, o.gpus, o.order) for o in options]
    for idxs in per_job:
        idxs.sort(key=keys.__getitem__)
    return OptionSpace(formulation, options, per_job)


def direct_space(
    cluster: Cluster, free: Mapping[ServerId, int], jobs: Sequence[PassJobLike], sigma: float
) -> OptionSpace:
    """One option per generated configuration; G over the job's minimum (Table 1)."""
    index, largest = cluster.server_index, largest_servers(cluster)
    options: list[PassOption] = []
    add = options.append
    for i, job in enumerate(jobs):
        cands = generate_configs(
            cluster, free, job.requirements, job.rho, job.estimate, sigma, largest
        )
        low = min((c.throughput for c in cands), default=0.0)
        for c in cands:
            config, tput = c.config, c.throughput
            parts = config.parts
            if len(parts) == 1:
                sid, gpus = parts[0]
                add(PassOption(i, tput / low, tput, gpus, (index[sid],), config))
            else:
                order = tuple(sorted([index[s] for s, _ in parts]))
                add(PassOption(i, tput / low, tput, sum([g for _, g in parts]), order, config))
    return _finish_space("direct", options, len(jobs))


def class_space(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    jobs: Sequence[PassJobLike],
    sigma: float,
    max_patterns: int,
) -> OptionSpace | None:
    """Options per server class, dominated ones dropped, plus each class's
    patterns; None when a class has more than ``max_patterns`` of them."""
    classes = server_classes(cluster, free, [j.estimate for j in jobs])
    first = [cluster.server_index[k.servers[0]] for k in classes]
    largest = largest_servers(cluster)
    options: list[PassOption] = []
    for i, job in enumerate(jobs):
        opts = class_options(
            cluster, classes, job.requirements, job.rho, job.estimate, sigma, largest
        )
        # G is normalised before pruning, over all the job's distinct options.
        low = min((o.throughput for o in opts), default=0.0)
        for o in undominated(opts):
            options.append(
                PassOption(i, o.throughput / low, o.throughput, o.gpus, (first[o.klass],), klass=o)
            )
    space = _finish_space("class", options, len(jobs))
    space.classes = classes
    space.klass_of = {sid: c for c, k in enumerate(classes) for sid in k.servers}
    kinds: list[set[Item]] = [set() for _ in classes]
    for opt in options:
        assert opt.klass is not None
        kinds[opt.klass.klass].update(opt.klass.items(classes[opt.klass.klass].free))
    col = len(options)
    for c, klass in enumerate(classes):
        patterns = _patterns(klass.free, tuple(sorted(kinds[c])), max_patterns)
        if patterns is None:
            return None
        space.patterns.append(list(patterns))
        space.kinds.append(sorted(kinds[c]))
        for p in patterns:
            space.pattern_col[(c, p)] = col
            col += 1
    return space


@functools.lru_cache(maxsize=4096)
def _patterns(capacity: int, kinds: tuple[Item, ...], limit: int) -> tuple[Pattern, ...] | None:
    """:func:`maximal_patterns`, memoised: passes keep meeting the same class
    sizes with the same item kinds, and the enumeration is a pure function."""
    patterns = maximal_patterns(capacity, kinds, limit)
    return None if patterns is None else tuple(patterns)


def option_space(
    cluster: Cluster,
    free: Mapping[ServerId, int],
    jobs: Sequence[PassJobLike],
    *,
    sigma: float,
    direct_max_columns: int,
    max_patterns: int,
) -> OptionSpace:
    """The direct space while it has at most ``direct_max_columns`` columns
    (counted before generating), else the class space where it applies."""
    index = FreeIndex(cluster, free)
    columns = sum(index.count(j.requirements, j.rho, j.estimate, sigma) for j in jobs)
    if columns > direct_max_columns:
        space = class_space(cluster, free, jobs, sigma, max_patterns)
        if space is not None:
            return space
    return direct_space(cluster, free, jobs, sigma)
