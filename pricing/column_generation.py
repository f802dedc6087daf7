"""A certified upper bound on the offline optimum at any scale: the configuration LP of
problem (1)-(13), solved by column generation with the best-schedule search as pricing.

The configuration LP
    One column per job ``i`` and schedule ``s`` of that job alone: any ``y_t`` workers
    and ``z_t`` PS per server and slot that SPEC 3 and 5 allow job ``i`` on the cluster
    left by the held resources (rooms ``floor(free / d + 1e-9)``, ``y_t <= N``,
    ``z(y_t) <= z_t <= y_t``, slots ``a_i .. l_i``, at least ``W_i`` worker-slots).
    Its value ``f_i(s)`` is the utility of its last worker slot; ``a[i,s][c]`` is what it
    takes of cell ``c`` = (slot, server, resource)::

        max  sum_{i,s} f_i(s) lam[i,s]
        s.t. sum_s lam[i,s] <= 1                            for each job i      (mu_i)
             sum_{i,s} a[i,s][c] lam[i,s] <= cap[c]         for each cell c     (pi_c)
             lam >= 0

    ``cap[c]`` is the capacity less the held use. Every allocation of problem (1)-(13)
    picks one schedule per admitted job that is feasible alone and fits the cells
    together: ``lam`` = 1 on those columns is feasible here with the same utility. So
    the LP's optimum is an upper bound on the offline optimum, and a much tighter one
    than the LP relaxation of the compact ILP: every per-job rule (N, z(y), W, the
    completion time) holds exactly inside each column.

Pricing
    For duals ``pi >= 0`` the most valuable column of job ``i`` maximises
    ``f_i(s) - sum_c pi_c a[i,s][c]``: exactly the best-schedule search
    (:func:`pricing.best_schedule.search`) with ``pi`` as unit prices, which is exact for
    any non-negative prices (a per-slot greedy placement at fixed unit prices is the
    cheapest, more PS than ``z(y)`` or more workers than needed never cost less, and the
    DP over slots and end slots is exhaustive). Its payoff is ``P_i(pi)``; the column's
    reduced cost is ``P_i(pi) - mu_i``, and columns with a positive one are added.

The certified bound (Lagrangian, valid at every iteration)
    For ANY ``pi >= 0`` and any allocation of the offline problem, with schedules
    ``s_i`` of the admitted jobs, ``sum_i f_i(s_i) = sum_i (f_i(s_i) - pi a[i,s_i])
    + pi sum_i a[i,s_i] <= sum_i max(0, P_i(pi)) + pi cap``. So
    ``UB(pi) = pi cap + sum_i max(0, P_i(pi))`` bounds the optimum whatever ``pi`` is:
    optimal duals or not, converged or stopped by the time limit. It is at most the
    Farley bound ``LP + sum_i max(0, P_i - mu_i)`` and equals the LP's value once no
    column has a positive reduced cost. The reported bound is the least ``UB(pi)`` seen,
    raised by :data:`FLOAT_MARGIN` of the magnitudes summed, which covers the search's
    float noise (its relative tie tolerance is ``1e-12``) and the summation's. The
    duals are the LP solver's, clipped at 0; they need not be exact for the bound to
    hold.

Per end slot (used to shrink the exact ILP)
    With the same ``pi``, an allocation in which job ``i`` ends in slot ``t`` has value at
    most ``UB(pi) - max(0, P_i) + Q_i(t)``, where ``Q_i(t)`` bounds the payoff of job
    ``i``'s schedules ending in ``t`` (the search's ``f(t - a + 1) - D_t[W]``).
    :class:`BoundResult` keeps these for the ``pi`` of the best bound.

Jobs not searched
    A job that cannot finish in its slots even on the empty cluster
    (:func:`pricing.explain.cannot_finish`) has no column and ``P_i = -inf``, as its
    search would find: it is not searched (before, its tables were sized by its work,
    and one such job of ``3.2e12`` worker-slots in a 20-job trace ran ``oasis offline``
    out of memory). A job whose search's tables would take more than
    :data:`MAX_PRICING_BYTES` is not searched either: it gets no column, and
    ``P_i(pi) <= f_i(d_min)`` (costs are >= 0) stands in for its payoff, and
    ``f_i(t - a + 1)`` for its per-end-slot bounds, so every bound stays certified.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from pricing.best_schedule import BestSchedule, search
from pricing.errors import OasisError
from pricing.explain import cannot_finish
from pricing.job import Job
from pricing.offline import Held
from pricing.schedule import Schedule
from pricing.trace import Trace

if TYPE_CHECKING:
    import highspy

__all__ = [
    "FLOAT_MARGIN",
    "MAX_PRICING_BYTES",
    "BoundResult",
    "Cells",
    "Column",
    "ColumnGenerationError",
    "Master",
    "configuration_bound",
    "price_jobs",
    "search_bytes",
    "touched_slots",
]

FLOAT_MARGIN = 1e-9
"""Relative margin added to every Lagrangian bound: ``UB * (1 + margin)`` in magnitude
terms (see the module docstring)."""

REDUCED_COST_TOLERANCE = 1e-7
"""A column enters the master only if its reduced cost exceeds this (absolute, plus the
same relative to the job's dual)."""


MAX_PRICING_BYTES = 1 << 30
"""The most one job's search tables may take (:func:`search_bytes`); a larger job is
priced by its utility alone (module docstring, "Jobs not searched")."""


class ColumnGenerationError(OasisError):
    """The LP solver failed or is missing."""


class OutOfTimeError(Exception):
    """An LP solve reached its time limit."""


@dataclass(frozen=True, eq=False)
class Column:
    """One job's schedule as a column of the master.

    Attributes:
        job: index of the job in the trace.
        utility: ``f(jct)`` of the schedule's last worker slot.
        schedule: the schedule.
        cells: ``(n,)`` int64, the cells (:class:`Cells`) it uses.
        amounts: ``(n,)`` float64, how much of each, in the resource's unit.
    """

    job: int
    utility: float
    schedule: Schedule
    cells: NDArray[np.int64]
    amounts: NDArray[np.float64]


class Cells:
    """The capacity cells (slot, server, resource) of a trace, flattened.

    Worker cells come first, ``((t * H) + h) * R + r``; PS cells follow at an offset of
    ``T * H * R``, ``((t * K) + k) * R + r``. A *group* is every cell of one kind, slot
    and resource: the whole cluster's worker (or PS) servers in slot ``t``.

    Attributes:
        capacity: ``(T * (H + K) * R,)`` float64, capacity less the held use.
        full_capacity: the same, without the held use subtracted.
        group: ``(T * (H + K) * R,)`` int64, each cell's group: ``t * R + r`` for worker
            cells, ``T * R + t * R + r`` for PS cells.
        group_capacity: ``(2 * T * R,)`` float64, the sum of its cells' capacities.
    """

    def __init__(self, trace: Trace, held: Held) -> None:
        self.trace = trace
        self.held = held
        c = trace.cluster
        self.T = trace.horizon
        self.H, self.R = c.worker_capacity.shape
        self.K = c.ps_capacity.shape[0]
        self.offset = self.T * self.H * self.R
        self.capacity: NDArray[np.float64] = np.concatenate(
            [held.worker_capacity(trace).ravel(), held.ps_capacity(trace).ravel()]
        )
        self.full_capacity: NDArray[np.float64] = np.concatenate(
            [
                np.broadcast_to(c.worker_capacity, (self.T, self.H, self.R)).ravel(),
                np.broadcast_to(c.ps_capacity, (self.T, self.K, self.R)).ravel(),
            ]
        )
        n_cells = self.capacity.shape[0]
        cell = np.arange(n_cells)
        worker = cell < self.offset
        slot = np.where(
            worker, cell // (self.H * self.R), (cell - self.offset) // (self.K * self.R)
        )
        self.group: NDArray[np.int64] = (
            np.where(worker, 0, self.T * self.R) + slot * self.R + (cell % self.R)
        )
        self.group_capacity: NDArray[np.float64] = np.bincount(
            self.group, self.capacity, minlength=2 * self.T * self.R
        ).astype(np.float64)

    @property
    def size(self) -> int:
        return int(self.capacity.shape[0])

    def column(self, i: int, job: Job, schedule: Schedule) -> Column:
        """The column of job ``i`` running ``schedule``."""
        parts_c: list[NDArray[np.int64]] = []
        parts_a: list[NDArray[np.float64]] = []
        for units, demand, n, base in (
            (schedule.workers, job.worker, self.H, 0),
            (schedule.ps, job.ps, self.K, self.offset),
        ):
            ks, ss = np.nonzero(units)
            rs = np.flatnonzero(demand > 0)
            slot_server = (schedule.start + ks) * n + ss
            parts_c.append((base + slot_server[:, None] * self.R + rs[None, :]).ravel())
            parts_a.append((units[ks, ss][:, None] * demand[rs][None, :]).ravel())
        end = schedule.end
        utility = float(job.utility.values(end - job.arrival + 1)) if end >= job.arrival else 0.0
        return Column(
            i,
            utility,
            schedule,
            np.concatenate(parts_c).astype(np.int64),
            np.concatenate(parts_a).astype(np.float64),
        )

    def by_kind(
        self, values: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """A per-cell array as ``(T, H, R)`` (worker servers) and ``(T, K, R)`` (PS)."""
        pw = np.ascontiguousarray(values[: self.offset].reshape(self.T, self.H, self.R))
        pp = np.ascontiguousarray(values[self.offset :].reshape(self.T, self.K, self.R))
        return pw, pp


def price_jobs(
    cells: Cells,
    pw: NDArray[np.float64],
    pp: NDArray[np.float64],
    jobs: Sequence[int] | None = None,
    used: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None,
    touched: NDArray[np.bool_] | None = None,
) -> list[tuple[BestSchedule, NDArray[np.float64]]]:
    """The best schedule of each job against unit prices ``pw`` ``(T, H, R)`` and ``pp``
    ``(T, K, R)`` (>= 0), with per-end-slot payoff bounds (:func:`search`).

    ``jobs``: indices to price (default: all); ``used``: ``(T, H, R)`` and ``(T, K, R)``
    amounts that leave less room (default: the held use); ``touched``: ``(T,)``, the
    slots where a price or a use is not 0, if the caller keeps them (default: found here,
    four passes over the arrays).
    """
    trace, held = cells.trace, cells.held
    cluster = trace.cluster
    used_w, used_p = used if used is not None else (held.worker_used, held.ps_used)
    if touched is None:
        touched = touched_slots(pw, pp, used_w, used_p)
    out = []
    for i in range(len(trace.jobs)) if jobs is None else jobs:
        job = trace.jobs[i]
        a = job.arrival
        n_slots = int(held.last_slot[i]) - a + 1
        if cannot_finish(job, cluster, n_slots) is not None:
            out.append((_NO_SCHEDULE, np.full(max(n_slots, 0), -np.inf)))
            continue
        if search_bytes(job, n_slots) > MAX_PRICING_BYTES:
            out.append(_utility_ceiling(job, n_slots))
            continue
        wside = (pw, used_w, cluster.worker_capacity, np.ascontiguousarray(job.worker))
        pside = (pp, used_p, cluster.ps_capacity, np.ascontiguousarray(job.ps))
        out.append(search(job, wside, pside, touched, a, n_slots, a, 0.0))
    return out


def touched_slots(*arrays: NDArray[np.float64]) -> NDArray[np.bool_]:
    """``(T,)``: the slots where any of ``arrays`` (each ``(T, n, R)``: prices or use of
    worker or PS servers) is not 0, those the search cannot share one cost curve over."""
    touched: NDArray[np.bool_] = np.zeros(arrays[0].shape[0], bool)
    for values in arrays:
        touched |= np.any(values, axis=(1, 2))
    return touched


_NO_SCHEDULE = BestSchedule(None, None, None, None, None, 0)


def search_bytes(job: Job, n_slots: int) -> int:
    """Bytes of :func:`pricing.best_schedule.search`'s tables for ``job`` over
    ``n_slots`` slots: ``(n + 1) (W + 1)`` costs by work level, and ``(5 n + 1) (N + 1)``
    for the slots' cost curves and the workers' and PS's picks, 8 bytes each."""
    n = max(n_slots, 0)
    return 8 * ((n + 1) * (job.work + 1) + (5 * n + 1) * (job.chunks + 1))


def _utility_ceiling(job: Job, n_slots: int) -> tuple[BestSchedule, NDArray[np.float64]]:
    """A job not searched: no schedule, its best utility ``f(d_min)`` as its payoff and
    ``f(t - a + 1)`` as the bound of any schedule ending in slot ``t`` (-inf before
    ``d_min``): upper bounds, costs being >= 0."""
    jcts = np.arange(1, n_slots + 1)
    ends = np.where(jcts >= job.min_slots, job.utility.values(jcts), -np.inf)
    best = job.best_utility
    return BestSchedule(best, None, None, None, None, 0), ends


# ---------------------------------------------------------------------------------------
# The restricted master
# ---------------------------------------------------------------------------------------


def _highs() -> highspy.Highs:
    try:
        import highspy
    except ImportError as err:  # pragma: no cover - highspy is a dependency
        raise ColumnGenerationError("column generation needs highspy: pip install highspy") from err
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    return h


class Master:
    """The configuration LP over the columns added so far, in HiGHS (highspy).

    Rows ``0 .. J-1`` are the jobs' convexity rows; then one row per cell group (the
    sum of a kind's cells in one slot and resource, :class:`Cells`), implied by the
    cells' rows. Cell rows are generated: a cell gets its row only once an LP solution
    overfills it (:meth:`separate`), since most of the ``T (H + K) R`` cells never
    bind. A cell's dual is its group's plus its own row's (0 without one): every row is
    a valid inequality of the configuration LP, so every Lagrangian bound holds. The
    LP's value is the configuration LP's once no cell is overfilled. Each solve starts
    from the previous basis: primal simplex after columns were added, dual simplex after
    rows were.
    """

    def __init__(self, cells: Cells, n_jobs: int) -> None:
        import highspy

        self._hs = highspy
        self.cells = cells
        self.n_jobs = n_jobs
        self.h = _highs()
        h = self.h
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        h.setOptionValue("presolve", "off")
        h.setOptionValue("solver", "simplex")
        self.inf = highspy.kHighsInf
        self._add_rows(np.full(n_jobs, 1.0), np.zeros(n_jobs, np.int32), _NO_INT, _NO_FLOAT)
        n_groups = cells.group_capacity.shape[0]
        self._add_rows(cells.group_capacity, np.zeros(n_groups, np.int32), _NO_INT, _NO_FLOAT)
        self.first_cell_row = n_jobs + n_groups
        self.row_of_cell = np.full(cells.size, -1, dtype=np.int64)
        self.n_rows = self.first_cell_row
        self.columns: list[Column] = []
        self._index: dict[tuple[int, int, bytes, bytes], int] = {}
        # every column's entries, for the rows generated later
        self._cells: list[NDArray[np.int64]] = []
        self._cols: list[NDArray[np.int64]] = []
        self._amounts: list[NDArray[np.float64]] = []
        self._strategy = 4  # primal simplex

    def _add_rows(
        self,
        upper: NDArray[np.float64],
        starts: NDArray[np.int32],
        index: NDArray[np.int32],
        value: NDArray[np.float64],
    ) -> None:
        n = int(upper.shape[0])
        self.h.addRows(
            n, np.full(n, -self.inf), upper, int(index.shape[0]), starts[:n], index, value
        )

    def add(self, columns: Sequence[Column]) -> int:
        """Add the columns not already in the master; returns how many were new."""
        fresh: list[Column] = []
        first = len(self.columns)
        for col in columns:
            key = _key(col)
            if key not in self._index:
                self._index[key] = first + len(fresh)
                fresh.append(col)
        if not fresh:
            return 0
        starts = np.zeros(len(fresh), dtype=np.int32)
        idx: list[NDArray[np.int64]] = []
        val: list[NDArray[np.float64]] = []
        nnz = 0
        for n, col in enumerate(fresh):
            groups, inverse = np.unique(self.cells.group[col.cells], return_inverse=True)
            rows = self.row_of_cell[col.cells]
            has = rows >= 0
            starts[n] = nnz
            idx += [np.array([col.job]), self.n_jobs + groups, rows[has]]
            sums = np.bincount(inverse, col.amounts).astype(np.float64)
            val += [np.array([1.0]), sums, col.amounts[has]]
            nnz += 1 + int(groups.shape[0]) + int(has.sum())
            self._cells.append(col.cells)
            self._cols.append(np.full(col.cells.shape[0], first + n, dtype=np.int64))
            self._amounts.append(col.amounts)
        self.h.addCols(
            len(fresh),
            np.array([c.utility for c in fresh]),
            np.zeros(len(fresh)),
            np.full(len(fresh), self.inf),
            nnz,
            starts,
            np.concatenate(idx).astype(np.int32),
            np.concatenate(val),
        )
        self.columns += fresh
        self._strategy = 4
        return len(fresh)

    def index(self, col: Column) -> int | None:
        """The position of an equal column in :attr:`columns`, if there is one."""
        return self._index.get(_key(col))

    def usage(self, lam: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(cells,)``: what the columns take of each cell at weights ``lam``."""
        out = np.zeros(self.cells.size)
        for n in np.flatnonzero(lam > 0):
            col = self.columns[n]
            out[col.cells] += lam[n] * col.amounts
        return out

    def separate(self, lam: NDArray[np.float64], tolerance: float = 1e-7, most: int = 1000) -> int:
        """Add a row for the ``most`` cells the weights ``lam`` overfill most (beyond
        ``tolerance``, relative to the capacity, at least 1); returns how many. Adding
        a few at a time keeps each re-solve short: an LP solution that spreads the jobs
        anew overfills fewer cells."""
        cap = self.cells.capacity
        excess = self.usage(lam) - cap - tolerance * np.maximum(np.abs(cap), 1.0)
        new = np.flatnonzero((excess > 0) & (self.row_of_cell < 0))
        if new.size > most:
            new = np.sort(new[np.argsort(-excess[new], kind="stable")[:most]])
        return self.add_rows(new)

    def add_rows(self, new: NDArray[np.int64]) -> int:
        """Add the capacity rows of cells ``new`` (which have none yet)."""
        if new.size == 0:
            return 0
        self.row_of_cell[new] = self.n_rows + np.arange(new.size)
        self.n_rows += int(new.size)
        order = np.zeros(0, dtype=np.int64)
        cols = np.zeros(0, dtype=np.int64)
        amounts = np.zeros(0)
        if self._cells:
            all_cells = np.concatenate(self._cells)
            mine = self.row_of_cell[all_cells] >= self.n_rows - new.size
            rows = self.row_of_cell[all_cells[mine]] - (self.n_rows - new.size)
            order = np.argsort(rows, kind="stable")
            cols = np.concatenate(self._cols)[mine][order]
            amounts = np.concatenate(self._amounts)[mine][order]
            order = rows[order]
        starts = np.searchsorted(order, np.arange(new.size)).astype(np.int32)
        self._add_rows(self.cells.capacity[new], starts, cols.astype(np.int32), amounts)
        self._strategy = 1
        return int(new.size)

    def solve(
        self, time_limit: float = math.inf
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """Solve the LP: ``(value, lam (n_cols,), pi (cells,) >= 0, mu (J,) >= 0)``.

        Raises:
            OutOfTimeError: the solve took ``time_limit`` seconds.
        """
        h = self.h
        if not self.columns:  # no job has a schedule: nothing to solve
            return 0.0, np.zeros(0), np.zeros(self.cells.size), np.zeros(self.n_jobs)
        h.setOptionValue("simplex_strategy", self._strategy)
        # HiGHS holds its time limit against the run time of every solve of this object
        # added up, not this one's: the limit is that total plus the time left, else a
        # long column generation reported "time limit" once its LPs had taken as long
        # as what was left (139-206 s of a 210 s budget in bench/results/quality.md)
        h.setOptionValue(
            "time_limit",
            h.getRunTime() + max(time_limit, 0.01) if math.isfinite(time_limit) else self.inf,
        )
        h.run()
        status = h.getModelStatus()
        if status == self._hs.HighsModelStatus.kTimeLimit:
            raise OutOfTimeError
        if status != self._hs.HighsModelStatus.kOptimal:
            raise ColumnGenerationError(
                f"HiGHS did not solve the master LP: {h.modelStatusToString(status)}"
            )
        sol = h.getSolution()
        value = float(h.getInfo().objective_function_value)
        lam = np.asarray(sol.col_value, dtype=np.float64)
        dual = np.maximum(np.asarray(sol.row_dual, dtype=np.float64), 0.0)
        pi = dual[self.n_jobs : self.first_cell_row][self.cells.group]
        with_row = np.flatnonzero(self.row_of_cell >= 0)
        pi[with_row] += dual[self.row_of_cell[with_row]]
        return value, lam, pi, dual[: self.n_jobs]

    def solve_separated(
        self, deadline: float = math.inf
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """Solve, add the rows of overfilled cells, and solve again until none is, by
        ``deadline`` (``time.perf_counter()``; else :class:`OutOfTimeError`)."""
        while True:
            value, lam, pi, mu = self.solve(deadline - time.perf_counter())
            if self.separate(lam) == 0:
                return value, lam, pi, mu

    def reduced_costs(
        self, columns: Sequence[Column], pi: NDArray[np.float64], mu: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``f - pi a - mu_i`` of each column."""
        return np.array(
            [c.utility - float(pi[c.cells] @ c.amounts) - float(mu[c.job]) for c in columns]
        )

    def solve_integer(
        self, time_limit: float, start: NDArray[np.float64] | None
    ) -> NDArray[np.float64] | None:
        """The best 0/1 choice of columns HiGHS finds within ``time_limit`` seconds
        (``(n_cols,)``, rounded), started from ``start``; None when it finds none.

        It holds the rows the master has: the groups' and the cells' generated so far,
        so a choice may still overfill a cell without a row (the caller repairs it). The
        LP master is left as it was.
        """
        hs = self._hs
        mip = _highs()
        mip.passModel(self.h.getLp())
        n = len(self.columns)
        index = np.arange(n, dtype=np.int32)
        mip.changeColsIntegrality(n, index, np.full(n, hs.HighsVarType.kInteger))
        mip.changeColsBounds(n, index, np.zeros(n), np.ones(n))
        mip.setOptionValue("time_limit", max(float(time_limit), 0.01))
        mip.setOptionValue("mip_rel_gap", 0.0)
        # its presolve took 9 s of a 9 s budget on 615 columns (85k nonzeros) here
        mip.setOptionValue("presolve", "off")
        if start is not None:
            mip.setSolution(n, index, start)
        mip.run()
        info = mip.getInfo()
        if int(info.primal_solution_status) != int(hs.SolutionStatus.kSolutionStatusFeasible):
            return None
        chosen: NDArray[np.float64] = np.round(np.asarray(mip.getSolution().col_value, float))
        return chosen


def _key(col: Column) -> tuple[int, int, bytes, bytes]:
    s = col.schedule
    return col.job, s.start, s.workers.tobytes(), s.ps.tobytes()


_NO_INT = np.zeros(0, dtype=np.int32)
_NO_FLOAT = np.zeros(0)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class BoundResult:
    """The outcome of column generation.

    Attributes:
        bound: the certified upper bound on the offline optimum (least Lagrangian bound
            seen, with :data:`FLOAT_MARGIN`).
        lp_value: the restricted master's LP value at the last solve (a lower bound on
            the configuration LP's value).
        converged: no column had a positive reduced cost at the last pricing, so the
            configuration LP is solved (``bound`` is then its value, up to tolerances).
        iterations: pricing rounds.
        seconds: wall time, seconds.
        master: the master with every column generated, and its last LP solution
            ``lam``.
        lam: ``(n_cols,)`` the last LP solution.
        pi: ``(cells,)`` the duals of the best bound.
        payoff: ``(J,)`` ``max(0, P_i(pi))`` of the best bound.
        ends: per job, ``(l_i - a_i + 1,)`` bounds on its payoff when it ends in each
            slot from its arrival on, at the ``pi`` of the best bound (``-inf``: no
            schedule ends there; empty for a job arriving after its last slot).
        stop: why the loop ended: ``"converged"``, ``"gap"`` (bound and LP within
            ``rel_gap``), ``"time limit"``, ``"iterations"``, or ``"stalled"`` (every
            entering column was already in the master: the LP's duals are inexact).
    """

    bound: float
    lp_value: float
    converged: bool
    iterations: int
    seconds: float
    master: Master
    lam: NDArray[np.float64]
    pi: NDArray[np.float64]
    payoff: NDArray[np.float64]
    ends: tuple[NDArray[np.float64], ...]
    stop: str

    def end_bounds(self, i: int) -> NDArray[np.float64]:
        """``(l_i - a_i + 1,)``: a bound on the total utility of any allocation in which job
        ``i`` ends in each slot from its arrival on."""
        ends = self.ends[i]
        finite = np.isfinite(ends)
        raised = np.where(finite, ends + FLOAT_MARGIN * np.abs(np.where(finite, ends, 0.0)), ends)
        out: NDArray[np.float64] = self.bound - self.payoff[i] + raised
        return out

    def reject_bound(self, i: int) -> float:
        """A bound on the total utility of any allocation that rejects job ``i``."""
        return self.bound - float(self.payoff[i])


def lagrangian_bound(cells: Cells, pi: NDArray[np.float64], payoff: NDArray[np.float64]) -> float:
    """``UB(pi) = pi cap + sum_i max(0, P_i)`` raised by :data:`FLOAT_MARGIN` of the
    magnitudes summed; ``payoff`` is already ``max(0, P_i)``."""
    terms = pi * cells.capacity
    value = math.fsum(terms.tolist()) + math.fsum(payoff.tolist())
    magnitude = math.fsum(np.abs(terms).tolist()) + math.fsum(np.maximum(payoff, 1.0).tolist())
    return value + FLOAT_MARGIN * magnitude


def configuration_bound(
    trace: Trace,
    held: Held,
    *,
    start: Sequence[Schedule | None] | None = None,
    time_limit: float | None = None,
    rel_gap: float = 1e-6,
    max_iterations: int = 10_000,
    smoothing: float = 0.5,
    progress: Callable[[str], None] | None = None,
    progress_every: float = 5.0,
    unit: float = 1.0,
) -> BoundResult:
    """Column generation on the configuration LP (module docstring).

    Two phases: first the master holds only the groups' capacity rows (the whole
    cluster's per kind, slot and resource: 2 T R rows, quick to solve; at the paper's
    scale this phase converged in 75 s); once it converges, or its bound meets its LP,
    the cells it overfills get their own rows (:meth:`Master.separate`) and the loop
    goes on until no cell is overfilled. Each round solves the master, then prices
    every job twice: at the LP's duals ``pi``, and at ``smoothing * pi* + (1 - smoothing) * pi``
    where ``pi*`` gave the best bound so far (Wentges smoothing: the LP's duals swing
    from round to round, the smoothed ones improve the bound steadily). Both give a
    certified bound and columns; a column enters if its reduced cost at the LP's duals
    is positive. The loop ends when pricing at the LP's duals finds no such column
    (the configuration LP is solved), when the bound is within ``rel_gap`` of the LP's
    value, or at the time limit.

    Args:
        trace: the jobs, cluster and horizon.
        held: resources held by jobs outside the problem and each job's last slot.
        start: one schedule per job (None: not run), added as the first columns, e.g.
            the online algorithm's; each must be feasible for its job alone.
        time_limit: seconds; the bound found by then is still certified. A round whose
            pricing would end past it (guessed by the last round's length) is not
            begun, so the first may not be either: the bound is then that of the
            opening pricing, at zero duals.
        rel_gap: stop once ``bound - LP <= rel_gap * max(1, LP)``.
        max_iterations: pricing rounds at most.
        smoothing: the weight of the best bound's duals, in ``[0, 1)``.
        progress: called with a one-line message every ``progress_every`` seconds.
        unit: what one utility of ``trace`` is in the units the messages give
            (:mod:`pricing.offline_units`); the result stays in ``trace``'s.
    """
    started = time.perf_counter()
    deadline = math.inf if time_limit is None else started + time_limit
    cells = Cells(trace, held)
    master = Master(cells, len(trace.jobs))
    first: list[Column] = []
    if start is not None:
        first += [
            cells.column(i, trace.jobs[i], s)
            for i, s in enumerate(start)
            if s is not None and s.work() > 0
        ]
    best = _Priced.at(cells, np.zeros(cells.size))
    first += best.columns(cells)
    master.add(first)

    iterations, stop = 0, "iterations"
    value, lam = 0.0, np.zeros(0)
    last_report = started
    per_cell = False  # first the groups' rows only, then the cells' as they overfill
    # a round's pricing cannot be cut short (its bound needs every job priced): one that
    # would end past the deadline is not begun, its length guessed by the last round's
    # (the first's by twice the pricing above). Begun anyway, a round of 17 s ran
    # 2,000 jobs' `--time-limit 30` to 45 s
    round_seconds = 2.0 * (time.perf_counter() - started)
    while iterations < max_iterations:
        began = time.perf_counter()
        if began + round_seconds > deadline:
            stop = "time limit"
            break
        try:
            if per_cell:
                value, lam, pi, mu = master.solve_separated(deadline)
            else:
                value, lam, pi, mu = master.solve(deadline - time.perf_counter())
        except OutOfTimeError:
            stop = "time limit"
            break
        iterations += 1
        if time.perf_counter() > deadline:
            stop = "time limit"
            break
        if best.bound - value <= rel_gap * max(1.0, abs(value)):
            if per_cell or master.separate(lam) == 0:
                stop = "gap"
                break
            per_cell = True  # a round without pricing: no guess for the next
            continue
        at_lp = _Priced.at(cells, pi)
        candidates = at_lp.columns(cells)
        n_lp = len(candidates)
        priced = [at_lp]
        if smoothing > 0:
            centre = smoothing * best.pi + (1.0 - smoothing) * pi
            priced.append(_Priced.at(cells, centre))
            candidates += priced[-1].columns(cells)
        for p in priced:
            if p.bound < best.bound:
                best = p
        rc = master.reduced_costs(candidates, pi, mu)
        tolerance = REDUCED_COST_TOLERANCE * (1.0 + mu[np.array([c.job for c in candidates], int)])
        entering = [c for c, r, tol in zip(candidates, rc, tolerance, strict=True) if r > tol]
        now = time.perf_counter()
        if progress is not None and now - last_report >= progress_every:
            last_report = now
            progress(
                f"column generation: round {iterations}, LP {value * unit:.6g}, certified "
                f"bound {best.bound * unit:.6g}, {len(master.columns)} columns, "
                f"{master.n_rows - master.n_jobs} capacity rows, {now - started:.0f} s"
            )
        if not (rc[:n_lp] > tolerance[:n_lp]).any():
            # no column improves this master: done if it holds every cell's row it needs
            if per_cell or master.separate(lam) == 0:
                stop = "converged"
                break
            per_cell = True
            round_seconds = time.perf_counter() - began
            continue
        if master.add(entering) == 0:  # the LP's duals are off by more than the tolerance
            stop = "stalled"
            break
        round_seconds = time.perf_counter() - began
    return BoundResult(
        bound=best.bound,
        lp_value=value,
        converged=stop == "converged",
        iterations=iterations,
        seconds=time.perf_counter() - started,
        master=master,
        lam=np.pad(lam, (0, len(master.columns) - lam.shape[0])),
        pi=best.pi,
        payoff=best.payoff,
        ends=best.ends,
        stop=stop,
    )


@dataclass(frozen=True, eq=False)
class _Priced:
    """Every job priced at duals ``pi``: the best schedules, ``max(0, P_i)``, the
    per-end-slot bounds and the certified bound ``UB(pi)``."""

    pi: NDArray[np.float64]
    best: tuple[BestSchedule, ...]
    payoff: NDArray[np.float64]
    ends: tuple[NDArray[np.float64], ...]
    bound: float

    @staticmethod
    def at(cells: Cells, pi: NDArray[np.float64]) -> _Priced:
        pw, pp = cells.by_kind(pi)
        priced = price_jobs(cells, pw, pp)
        payoff = np.array([max(0.0, b.payoff or 0.0) for b, _ in priced])
        return _Priced(
            pi,
            tuple(b for b, _ in priced),
            payoff,
            tuple(e for _, e in priced),
            lagrangian_bound(cells, pi, payoff),
        )

    def columns(self, cells: Cells) -> list[Column]:
        """The best schedule of every job that has one, as columns."""
        return [
            cells.column(i, cells.trace.jobs[i], b.schedule)
            for i, b in enumerate(self.best)
            if b.schedule is not None
        ]
