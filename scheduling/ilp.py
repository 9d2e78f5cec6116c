"""A small sparse MIP builder and the HiGHS call behind the prior-weighted
ILP of Hops §3.6 (Eq. 11-13); :mod:`scheduling.policies.hops.formulation` builds the
pass models on top of it.

The model is stored column-wise (CSC) as it is built: rows are declared with
their bounds, and each column brings its own non-zeros. That is the layout
HiGHS keeps internally, so :func:`solve_mip` hands the whole model over in one
``passModel`` call with numpy arrays instead of adding variables one by one,
which is far slower from Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import msgspec
import numpy as np
import numpy.typing as npt
from highspy._core import _Highs

INF = float(highspy.kHighsInf)
PRIMAL_SIMPLEX = 4  # HiGHS's simplex_strategy value


Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Block:
    """Consecutive columns: lower and upper bounds, costs, integrality and
    their non-zeros, column ``k`` owning ``rows[ends[k-1]:ends[k]]``."""

    cost: Array
    lower: Array
    upper: Array
    integer: bool
    ends: Index
    rows: Index
    values: Array


class MipModel:
    """Columns (cost, bounds, integrality) and rows (bounds) of a MIP whose
    constraint matrix is kept in compressed sparse column form. Columns are
    kept in the numpy blocks they were added in and joined once per solve;
    passes add thousands of columns in one block."""

    def __init__(self) -> None:
        self._row_lower: list[float] = []
        self._row_upper: list[float] = []
        self._blocks: list[_Block] = []
        self._num_cols = 0
        self._cost: Array | None = None  # all blocks' costs, joined on demand

    @property
    def num_rows(self) -> int:
        return len(self._row_lower)

    @property
    def num_cols(self) -> int:
        return self._num_cols

    def add_row(self, lower: float, upper: float) -> int:
        """Declare a row ``lower <= a.x <= upper``; returns its index."""
        if lower > upper:
            raise ValueError(f"row bounds [{lower}, {upper}] are empty")
        self._row_lower.append(lower)
        self._row_upper.append(upper)
        return len(self._row_lower) - 1

    def _check_rows(self, rows: Index) -> None:
        n_rows = len(self._row_lower)
        if rows.size and not (rows.min() >= 0 and rows.max() < n_rows):
            raise ValueError(f"a column refers to a row outside the {n_rows} rows")

    def _add(self, block: _Block) -> None:
        self._blocks.append(block)
        self._num_cols += block.cost.size
        self._cost = None

    def add_col(
        self,
        cost: float,
        lower: float,
        upper: float,
        *,
        integer: bool,
        rows: Sequence[int],
        values: Sequence[float],
    ) -> int:
        """Add a column with its non-zeros ``(rows[k], values[k])``; returns its index."""
        if len(rows) != len(values):
            raise ValueError("rows and values must have the same length")
        if lower > upper:
            raise ValueError(f"column bounds [{lower}, {upper}] are empty")
        index = np.array(rows, dtype=np.int64)
        self._check_rows(index)
        self._add(_Block(
            np.array([cost], dtype=np.float64), np.array([lower], dtype=np.float64),
            np.array([upper], dtype=np.float64), integer, np.array([len(rows)], dtype=np.int64),
            index, np.array(values, dtype=np.float64),
        ))
        return self._num_cols - 1

    def add_cols(
        self,
        costs: Sequence[float] | Array,
        uppers: Sequence[float] | Array,
        *,
        integer: bool,
        ends: Sequence[int] | Index,
        rows: Sequence[int] | Index,
        values: Sequence[float] | Array,
    ) -> None:
        """Add ``len(costs)`` columns with lower bound 0 at once, as
        :meth:`add_col` would one by one: column ``k`` has the non-zeros
        ``rows[ends[k-1]:ends[k]]`` (from 0 for the first), in that order."""
        if not len(costs) == len(uppers) == len(ends):
            raise ValueError("costs, uppers and ends must have the same length")
        if len(rows) != len(values) or (len(ends) and ends[-1] != len(rows)):
            raise ValueError("rows and values must have the same length")
        upper = np.array(uppers, dtype=np.float64)
        if np.any(upper < 0.0):
            raise ValueError("column bounds are empty")
        index = np.array(rows, dtype=np.int64)
        self._check_rows(index)
        self._add(_Block(
            np.array(costs, dtype=np.float64), np.zeros(upper.size), upper, integer,
            np.array(ends, dtype=np.int64), index, np.array(values, dtype=np.float64),
        ))

    def fixed_to_zero(self, columns: Index) -> MipModel:
        """A copy whose ``columns`` have the upper bound 0: the same rows,
        columns and numbering, those columns barred."""
        copy = MipModel()
        copy._row_lower, copy._row_upper = self._row_lower, self._row_upper
        first = 0
        for block in self._blocks:
            mine = columns[(columns >= first) & (columns < first + block.cost.size)]
            if mine.size:
                upper = block.upper.copy()
                upper[mine - first] = 0.0
                block = dataclasses.replace(block, upper=upper)
            copy._add(block)
            first += block.cost.size
        return copy

    def objective(self, values: Sequence[float] | Array) -> float:
        """``c.x`` for a full column vector."""
        if self._cost is None:
            self._cost = self._joined("cost")
        return float(np.dot(self._cost, np.asarray(values, dtype=np.float64)))

    def _joined(self, name: str) -> Array:
        parts: list[Array] = [getattr(b, name) for b in self._blocks]
        return np.concatenate(parts) if parts else np.zeros(0)

    def _starts(self) -> Index:
        starts, base = [np.zeros(1, dtype=np.int64)], 0
        for block in self._blocks:
            starts.append(block.ends + base)
            base += int(block.ends[-1]) if block.ends.size else 0
        return np.concatenate(starts)

    def to_highs(self, *, maximize: bool, relax: bool = False) -> highspy.HighsLp:
        """The model as a ``HighsLp`` with a column-wise ``a_matrix_``;
        ``relax`` drops integrality (the LP relaxation)."""
        lp = highspy.HighsLp()
        lp.num_col_ = self.num_cols
        lp.num_row_ = self.num_rows
        lp.col_cost_ = self._joined("cost")
        lp.col_lower_ = self._joined("lower")
        lp.col_upper_ = self._joined("upper")
        lp.row_lower_ = np.asarray(self._row_lower, dtype=np.float64)
        lp.row_upper_ = np.asarray(self._row_upper, dtype=np.float64)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_ = self.num_cols
        lp.a_matrix_.num_row_ = self.num_rows
        lp.a_matrix_.start_ = self._starts().astype(np.int32)
        lp.a_matrix_.index_ = self._joined("rows").astype(np.int32)
        lp.a_matrix_.value_ = self._joined("values")
        if not relax:
            kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
            integrality: list[highspy.HighsVarType] = []
            for block in self._blocks:
                integrality += [kinds[block.integer]] * block.cost.size
            lp.integrality_ = integrality
        lp.sense_ = highspy.ObjSense.kMaximize if maximize else highspy.ObjSense.kMinimize
        return lp


class MipOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Solver options. ``threads`` must be the same for every solve in a
    process: HiGHS sizes its thread pool at the first solve and refuses a
    different value afterwards."""

    mip_rel_gap: float = 0.01
    time_limit_s: float = 10.0
    threads: int = 1
    random_seed: int = 0
    presolve: bool = True
    # Branch-and-bound nodes; unlike the time limit, a node limit ends the
    # search at the same point on any machine.
    max_nodes: int | None = None


@dataclass(frozen=True)
class MipResult:
    """What the solver reached. ``values`` is the best incumbent (also on a
    time limit); ``has_solution`` is false when there is none."""

    values: npt.NDArray[np.float64]
    objective: float
    bound: float
    gap: float
    solve_s: float
    status: str
    has_solution: bool


def _configure(h: _Highs, options: MipOptions) -> None:
    settings: dict[str, bool | float | int | str] = {
        "output_flag": False,
        "mip_rel_gap": options.mip_rel_gap,
        "time_limit": options.time_limit_s,
        "threads": options.threads,
        "random_seed": options.random_seed,
        "presolve": "choose" if options.presolve else "off",
    }
    if options.max_nodes is not None:
        settings["mip_max_nodes"] = options.max_nodes
    for name, value in settings.items():
        if h.setOptionValue(name, value) != highspy.HighsStatus.kOk:
            raise ValueError(f"HiGHS rejected option {name}={value!r}")


def _pass_incumbent(h: _Highs, incumbent: Sequence[float]) -> None:
    sol = highspy.HighsSolution()
    sol.col_value = np.asarray(incumbent, dtype=np.float64)
    sol.value_valid = True
    # A rejected start only costs the solver its head start, so the status is
    # deliberately not treated as an error.
    h.setSolution(sol)


def _highs(
    model: MipModel, options: MipOptions, *, maximize: bool, relax: bool
) -> _Highs:
    # The bare binding, not highspy.Highs: that wrapper installs its callbacks
    # in its constructor, and HiGHS prints its banner ("Running HiGHS ...") on
    # stdout the first time that happens with output on, before any option
    # can be set; in a service it would land among the JSON log lines. The
    # binding has every method used here, and _configure turns output off
    # before anything runs.
    h = _Highs()
    _configure(h, options)
    if h.passModel(model.to_highs(maximize=maximize, relax=relax)) != highspy.HighsStatus.kOk:
        raise ValueError("HiGHS rejected the model")
    return h


def solve_relaxation(
    model: MipModel, options: MipOptions | None = None, *, maximize: bool = True
) -> tuple[npt.NDArray[np.float64] | None, float]:
    """Column values of the LP relaxation (None when HiGHS finds no optimum)
    and the solver's run time."""
    relaxed = solve_relaxation_duals(model, options, maximize=maximize)
    return relaxed.values, relaxed.solve_s


@dataclass(frozen=True)
class Relaxation:
    """The LP relaxation's column values and reduced costs (None when HiGHS
    found no optimum) and its run time."""

    values: npt.NDArray[np.float64] | None
    reduced: npt.NDArray[np.float64] | None
    solve_s: float


def solve_relaxation_duals(
    model: MipModel, options: MipOptions | None = None, *, maximize: bool = True
) -> Relaxation:
    """:func:`solve_relaxation` with the columns' reduced costs as well."""
    if model.num_cols == 0:
        return Relaxation(np.zeros(0), np.zeros(0), 0.0)
    h = _highs(model, options or MipOptions(), maximize=maximize, relax=True)
    # Primal simplex: on the planning passes of the ElasticFlow trace (1,400
    # columns, 90 rows typical) it reaches the same optimum as HiGHS's default
    # dual simplex in two thirds of the time (docs/performance.md).
    h.setOptionValue("simplex_strategy", PRIMAL_SIMPLEX)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return Relaxation(None, None, float(h.getRunTime()))
    sol = h.getSolution()
    return Relaxation(
        np.asarray(sol.col_value, dtype=np.float64),
        np.asarray(sol.col_dual, dtype=np.float64),
        float(h.getRunTime()),
    )


def solve_mip(
    model: MipModel,
    options: MipOptions | None = None,
    *,
    maximize: bool = True,
    incumbent: Sequence[float] | None = None,
) -> MipResult:
    """Solve ``model`` with HiGHS; ``incumbent`` (a feasible column vector) is
    passed as a warm start. On a time limit the best incumbent is returned."""
    if model.num_cols == 0:
        return MipResult(np.zeros(0), 0.0, 0.0, 0.0, 0.0, "Empty", True)
    h = _highs(model, options or MipOptions(), maximize=maximize, relax=False)
    if incumbent is not None:
        _pass_incumbent(h, incumbent)
    h.run()
    info = h.getInfo()
    feasible = int(highspy.SolutionStatus.kSolutionStatusFeasible)
    has_solution = int(info.primal_solution_status) == feasible
    values = np.asarray(h.getSolution().col_value, dtype=np.float64)
    return MipResult(
        values=values if has_solution else np.zeros(model.num_cols),
        objective=float(info.objective_function_value) if has_solution else 0.0,
        bound=float(info.mip_dual_bound),
        gap=float(info.mip_gap),
        solve_s=float(h.getRunTime()),
        status=str(h.modelStatusToString(h.getModelStatus())),
        has_solution=bool(has_solution),
    )
