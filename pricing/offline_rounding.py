"""A feasible offline allocation from the configuration LP's columns (price and branch).

Column generation (:mod:`pricing.column_generation`) leaves a pool of schedules, one
column each, and fractional weights. Three allocations are built from them and the
best is kept:

- **greedy**: jobs by the LP weight of their heaviest column, then its utility; that
  column is taken if it fits what is left, as it is, or with its workers and PS per
  slot placed again on the servers with room (:func:`place_again`), or else the job's
  best schedule on the room left (:meth:`Residual.replan`);
- **the columns' ILP**: the master with 0/1 weights (HiGHS, a time limit, started from
  the greedy allocation). It holds the rows the LP generated, so its choice is
  repaired the same way (in order of utility; a job that no longer fits is dropped);
- **Lagrangian heuristic**: jobs one by one (by payoff at the best bound's duals, then
  by best utility), each on its best schedule at those duals as prices on the room
  left;
- **a given start** (e.g. the online algorithm's allocation), if it is better.

Each greedy or repaired allocation then gets a fill pass: every job still out is
searched against the duals of the best bound as prices, on the room left, and runs if
any schedule fits. The caller checks the result against SPEC 3-5
(:func:`pricing.offline.check_allocation`), as for the online schedules.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pricing.column_generation import BoundResult, Cells, Column, price_jobs, touched_slots
from pricing.job import Job, room
from pricing.ledger import capacity_slack
from pricing.placement import place
from pricing.schedule import Schedule

__all__ = ["Primal", "Residual", "place_again", "round_columns"]


@dataclass(frozen=True, eq=False)
class Primal:
    """A feasible allocation: one schedule per job (None: not run), its total utility,
    and where it came from (``"columns ILP"``, ``"greedy"``, ``"Lagrangian heuristic"``
    or ``"start"``)."""

    schedules: tuple[Schedule | None, ...]
    utility: float
    source: str


class Residual:
    """What is left of every cell while an allocation is built.

    ``tie`` breaks ties between equally priced servers towards the fullest that fits
    (best fit, which keeps large servers free for large jobs): :meth:`prices` adds
    ``tie`` times each cell's free share to its price, too little to matter otherwise.
    """

    def __init__(self, cells: Cells, tie: float = 0.0) -> None:
        self.cells = cells
        self.left = cells.capacity.copy()
        self.chosen: dict[int, Column] = {}
        self.tie = tie
        full = cells.full_capacity
        self._scale = np.divide(1.0, full, out=np.zeros_like(full), where=full > 0)
        # half the ledger's slack past a capacity: what SPEC 5's room places fits (four
        # workers of 4e9 + 1 bytes on 16e9), with room to spare for the check's sums
        self._slack = capacity_slack(full) / 2
        # kept cell by cell as jobs are taken, each cell by the same expression as a whole
        # array would be (so to the bit): recomputed whole, the prices, the use and the
        # slots they touch took 5.1 of the 8.5 s of 1,000 jobs' fill on 500 + 500 servers
        self._used = full - self.left
        self._priced: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]] | None
        self._priced = None  # (pi, its prices, the slots touched) for the last pi asked

    def prices(self, pi: NDArray[np.float64]) -> NDArray[np.float64]:
        """Cell prices ``pi`` with the best-fit tie-break (an array kept up to date by
        :meth:`take` while ``pi`` is the one asked last: read it, do not write it)."""
        return self._priced_at(pi)[1]

    def touched(self, pi: NDArray[np.float64]) -> NDArray[np.bool_]:
        """``(T,)``: the slots with a price (:meth:`prices`) or a use (:meth:`used`) that
        is not 0 (:func:`pricing.column_generation.price_jobs`'s ``touched``)."""
        return self._priced_at(pi)[2]

    def _priced_at(
        self, pi: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
        if self._priced is None or self._priced[0] is not pi:
            prices = pi + self.tie * np.maximum(self.left, 0.0) * self._scale
            touched = touched_slots(*self.cells.by_kind(prices), *self.used())
            self._priced = (pi, prices, touched)
        return self._priced

    def fits(self, col: Column) -> bool:
        at = col.cells
        return bool((col.amounts <= self.left[at] + self._slack[at]).all())

    def take(self, col: Column) -> None:
        at = col.cells
        self.left[at] -= col.amounts
        self._used[at] = self.cells.full_capacity[at] - self.left[at]
        if self._priced is not None:
            pi, prices, touched = self._priced
            prices[at] = pi[at] + self.tie * np.maximum(self.left[at], 0.0) * self._scale[at]
            cells = self.cells
            # a column's amounts are > 0: its slots are in use now
            touched[(cells.group[at] % (cells.T * cells.R)) // cells.R] = True
        self.chosen[col.job] = col

    def used(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(T, H, R)`` and ``(T, K, R)``: held plus chosen amounts (the room's
        complement; views kept up to date by :meth:`take`: read them, do not write)."""
        return self.cells.by_kind(self._used)

    def add(self, col: Column, pi: NDArray[np.float64]) -> bool:
        """Take ``col``, or its counts placed again at cell prices ``pi``
        (:func:`place_again`), or its job's best schedule on the room left
        (:meth:`replan`); False if none fits."""
        if col.job in self.chosen:
            return False
        if self.fits(col):
            self.take(col)
            return True
        job = self.cells.trace.jobs[col.job]
        moved = place_again(self.cells, job, col.schedule, self, self.prices(pi))
        if moved is not None:
            again = self.cells.column(col.job, job, moved)
            if self.fits(again):  # else float noise between room() and the cells' sums
                self.take(again)
                return True
        return self.replan(col.job, pi)

    def replan(self, i: int, pi: NDArray[np.float64]) -> bool:
        """Run job ``i`` on its best schedule against cell prices ``pi`` on the room
        left, if it has one with a positive utility."""
        cells = self.cells
        pw, pp = cells.by_kind(self.prices(pi))
        ((best, _),) = price_jobs(cells, pw, pp, [i], self.used(), self.touched(pi))
        if best.schedule is None or best.schedule.work() == 0:
            return False
        col = cells.column(i, cells.trace.jobs[i], best.schedule)
        if col.utility <= 0 or not self.fits(col):
            return False
        self.take(col)
        return True

    def total(self) -> float:
        return float(sum(c.utility for c in self.chosen.values()))

    def schedules(self) -> tuple[Schedule | None, ...]:
        n = len(self.cells.trace.jobs)
        return tuple(self.chosen[i].schedule if i in self.chosen else None for i in range(n))


def place_again(
    cells: Cells, job: Job, schedule: Schedule, residual: Residual, unit: NDArray[np.float64]
) -> Schedule | None:
    """The same workers per slot as ``schedule``, with ``z(y)`` PS, placed on the room
    ``residual`` leaves, cheapest first at cell prices ``unit`` (ties: listing order);
    None if some slot does not fit."""
    c = cells.trace.cluster
    used_w, used_p = residual.used()
    price_w, price_p = cells.by_kind(unit)
    ys = schedule.worker_counts()
    zs = job.ps_needed(ys)
    workers = np.zeros_like(schedule.workers)
    ps = np.zeros_like(schedule.ps)
    for k, (y, z) in enumerate(zip(ys.tolist(), zs.tolist(), strict=True)):
        t = schedule.start + k
        for count, capacity, used, prices, demand, out in (
            (y, c.worker_capacity, used_w, price_w, job.worker, workers),
            (z, c.ps_capacity, used_p, price_p, job.ps, ps),
        ):
            if count == 0:
                continue
            fit = room(capacity - used[t], demand)
            row = np.zeros(fit.shape[0], np.int32)
            if place(prices[t] @ demand, fit, count, row) != count:
                return None
            out[k] = row
    return Schedule(schedule.start, workers, ps)


def _fill(residual: Residual, pi: NDArray[np.float64], order: Iterable[int]) -> None:
    """Run every job still out, in ``order``, on its best schedule against cell prices
    ``pi`` on the room left, if it has one."""
    for i in order:
        if i not in residual.chosen:
            residual.replan(i, pi)


def _tie(result: BoundResult) -> float:
    return 1e-9 * max(1.0, abs(result.bound))


def _greedy(result: BoundResult, fill_order: list[int]) -> Residual:
    cols = result.master.columns
    lam = result.lam
    # each job once, at its heaviest column: if that does not fit, placed again or
    # planned again, its lighter columns would hardly do better
    order = sorted(np.flatnonzero(lam > 0).tolist(), key=lambda n: (-lam[n], -cols[n].utility, n))
    residual = Residual(result.master.cells, _tie(result))
    tried: set[int] = set()
    for n in order:
        if cols[n].job not in tried:
            tried.add(cols[n].job)
            residual.add(cols[n], result.pi)
    _fill(residual, result.pi, fill_order)
    return residual


def _choice(result: BoundResult, schedules: Sequence[Schedule | None]) -> NDArray[np.float64]:
    """The columns' 0/1 vector of an allocation (its schedules added as columns)."""
    cells, master = result.master.cells, result.master
    cols = [
        cells.column(i, cells.trace.jobs[i], s)
        for i, s in enumerate(schedules)
        if s is not None and s.work() > 0
    ]
    master.add(cols)
    x = np.zeros(len(master.columns))
    for col in cols:
        n = master.index(col)
        assert n is not None  # just added
        x[n] = 1.0
    return x


def round_columns(
    result: BoundResult,
    *,
    time_limit: float,
    start: Sequence[Schedule | None] | None = None,
    start_utility: float | None = None,
) -> Primal:
    """The best of the greedy allocation, the columns' ILP (repaired) and ``start``.

    Args:
        result: column generation's outcome, with its master and columns.
        time_limit: seconds for the Lagrangian heuristic and the columns' ILP, after
            the greedy allocation (0: greedy only; before, the heuristic ran whatever
            the time left).
        start: a feasible allocation, one schedule per job (None: not run).
        start_utility: its total utility.
    """
    started = time.perf_counter()
    fill_order = [int(i) for i in np.argsort(-result.payoff, kind="stable")]
    greedy = _greedy(result, fill_order)
    best = Primal(greedy.schedules(), greedy.total(), "greedy")
    del greedy  # its kept arrays (use, prices: 8 bytes a cell each) are not needed again
    repair_seconds = time.perf_counter() - started  # the ILP's repair takes about as long
    # Lagrangian heuristic: jobs one by one on their best schedule at the duals' prices
    cells = result.master.cells
    # a job arriving at or after the horizon has no end slot at all: it sorts last
    by_utility = sorted(
        range(len(result.ends)), key=lambda i: -float(np.max(result.ends[i], initial=-np.inf))
    )
    for order in (fill_order, by_utility):  # within the time limit: 2.6 s each for 2,000 jobs
        if time.perf_counter() - started >= time_limit:
            break
        passed = Residual(cells, _tie(result))
        _fill(passed, result.pi, order)
        if passed.total() > best.utility:
            best = Primal(passed.schedules(), passed.total(), "Lagrangian heuristic")
        del passed
    if start is not None and start_utility is not None and start_utility > best.utility:
        best = Primal(tuple(start), start_utility, "start")
    left = time_limit - (time.perf_counter() - started) - repair_seconds
    if left <= 0:
        return best
    x0 = _choice(result, best.schedules)
    x = result.master.solve_integer(left, x0)
    if x is None:
        return best
    cols = result.master.columns
    chosen = sorted(np.flatnonzero(x > 0.5).tolist(), key=lambda n: (-cols[n].utility, n))
    repaired = Residual(result.master.cells, _tie(result))
    for n in chosen:
        repaired.add(cols[n], result.pi)
    _fill(repaired, result.pi, fill_order)
    if repaired.total() > best.utility:
        best = Primal(repaired.schedules(), repaired.total(), "columns ILP")
    return best
