"""A small sparse MIP builder and the HiGHS call behind the prior-weighted
ILP of Hops §3.6 (Eq. 11-13); :mod:`services.scheduler.formulation` builds the
pass models on top of it.

The model is stored column-wise (CSC) as it is built: rows are declared with
their bounds, and each column brings its own non-zeros. That is the layout
HiGHS keeps internally, so :func:`solve_mip` hands the whole model over in one
``passModel`` call with numpy arrays instead of adding variables one by one,
which is far slower from Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import msgspec
import numpy as np
import numpy.typing as npt

INF = float(highspy.kHighsInf)


class MipModel:
    """Columns (cost, bounds, integrality) and rows (bounds) of a MIP whose
    constraint matrix is kept in compressed sparse column form."""

    def __init__(self) -> None:
        self._row_lower: list[float] = []
        self._row_upper: list[float] = []
        self._cost: list[float] = []
        self._col_lower: list[float] = []
        self._col_upper: list[float] = []
        self._integer: list[bool] = []
        self._starts: list[int] = [0]
        self._index: list[int] = []
        self._value: list[float] = []

    @property
    def num_rows(self) -> int:
        return len(self._row_lower)

    @property
    def num_cols(self) -> int:
        return len(self._cost)

    def add_row(self, lower: float, upper: float) -> int:
        """Declare a row ``lower <= a.x <= upper``; returns its index."""
        if lower > upper:
            raise ValueError(f"row bounds [{lower}, {upper}] are empty")
        self._row_lower.append(lower)
        self._row_upper.append(upper)
        return len(self._row_lower) - 1

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
        n_rows = len(self._row_lower)
        for r in rows:
            if not 0 <= r < n_rows:
                raise ValueError(f"column refers to row {r}, only {n_rows} rows exist")
        self._cost.append(cost)
        self._col_lower.append(lower)
        self._col_upper.append(upper)
        self._integer.append(integer)
        self._index.extend(rows)
        self._value.extend(values)
        self._starts.append(len(self._index))
        return len(self._cost) - 1

    def add_cols(
        self,
        costs: Sequence[float],
        uppers: Sequence[float],
        *,
        integer: bool,
        ends: Sequence[int],
        rows: Sequence[int],
        values: Sequence[float],
    ) -> None:
        """Add ``len(costs)`` columns with lower bound 0 at once, as
        :meth:`add_col` would one by one: column ``k`` has the non-zeros
        ``rows[ends[k-1]:ends[k]]`` (from 0 for the first), in that order."""
        if not len(costs) == len(uppers) == len(ends):
            raise ValueError("costs, uppers and ends must have the same length")
        if len(rows) != len(values) or (ends and ends[-1] != len(rows)):
            raise ValueError("rows and values must have the same length")
        if any(up < 0.0 for up in uppers):
            raise ValueError("column bounds are empty")
        n_rows = len(self._row_lower)
        if rows and not (min(rows) >= 0 and max(rows) < n_rows):
            raise ValueError(f"a column refers to a row outside the {n_rows} rows")
        base = len(self._index)
        self._cost.extend(costs)
        self._col_lower.extend([0.0] * len(costs))
        self._col_upper.extend(uppers)
        self._integer.extend([integer] * len(costs))
        self._index.extend(rows)
        self._value.extend(values)
        self._starts.extend([base + e for e in ends] if base else ends)

    def objective(self, values: Sequence[float]) -> float:
        """``c.x`` for a full column vector."""
        return float(np.dot(np.asarray(self._cost), np.asarray(values, dtype=np.float64)))

    def to_highs(self, *, maximize: bool, relax: bool = False) -> highspy.HighsLp:
        """The model as a ``HighsLp`` with a column-wise ``a_matrix_``;
        ``relax`` drops integrality (the LP relaxation)."""
        lp = highspy.HighsLp()
        lp.num_col_ = self.num_cols
        lp.num_row_ = self.num_rows
        lp.col_cost_ = np.asarray(self._cost, dtype=np.float64)
        lp.col_lower_ = np.asarray(self._col_lower, dtype=np.float64)
        lp.col_upper_ = np.asarray(self._col_upper, dtype=np.float64)
        lp.row_lower_ = np.asarray(self._row_lower, dtype=np.float64)
        lp.row_upper_ = np.asarray(self._row_upper, dtype=np.float64)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_ = self.num_cols
        lp.a_matrix_.num_row_ = self.num_rows
        lp.a_matrix_.start_ = np.asarray(self._starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(self._index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(self._value, dtype=np.float64)
        if not relax:
            kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
            lp.integrality_ = (
                [kinds[True]] * self.num_cols
                if all(self._integer)
                else [kinds[flag] for flag in self._integer]
            )
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


def _configure(h: highspy.Highs, options: MipOptions) -> None:
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


def _pass_incumbent(h: highspy.Highs, incumbent: Sequence[float]) -> None:
    sol = highspy.HighsSolution()
    sol.col_value = np.asarray(incumbent, dtype=np.float64)
    sol.value_valid = True
    # A rejected start only costs the solver its head start, so the status is
    # deliberately not treated as an error.
    h.setSolution(sol)


def _highs(model: MipModel, options: MipOptions, *, maximize: bool, relax: bool) -> highspy.Highs:
    # highspy's constructor carries no annotations.
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    _configure(h, options)
    if h.passModel(model.to_highs(maximize=maximize, relax=relax)) != highspy.HighsStatus.kOk:
        raise ValueError("HiGHS rejected the model")
    return h


def solve_relaxation(
    model: MipModel, options: MipOptions | None = None, *, maximize: bool = True
) -> tuple[npt.NDArray[np.float64] | None, float]:
    """Column values of the LP relaxation (None when HiGHS finds no optimum)
    and the solver's run time."""
    if model.num_cols == 0:
        return np.zeros(0), 0.0
    h = _highs(model, options or MipOptions(), maximize=maximize, relax=True)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None, float(h.getRunTime())
    return np.asarray(h.getSolution().col_value, dtype=np.float64), float(h.getRunTime())


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
