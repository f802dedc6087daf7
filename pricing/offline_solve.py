"""The offline comparison at any size: the exact ILP, or a certified bound and an
allocation, picked by size and time limit.

Methods
    - ``"ilp"``: the compact ILP of :mod:`pricing.offline` alone, as before.
    - ``"colgen"``: the configuration LP by column generation
      (:mod:`pricing.column_generation`) for a certified upper bound, and an
      allocation rounded from its columns (:mod:`pricing.offline_rounding`), checked
      against SPEC 3-5. The gap between them is reported; "optimal" only when the
      allocation reaches the bound.
    - ``"auto"``: ``"colgen"`` first; then, if the bound is not reached yet and the
      compact ILP is small enough (:data:`AUTO_ILP_VARIABLES`, :func:`ilp_size`), the
      ILP reduced by the bound (:func:`reduction`) and started from that allocation,
      for the rest of the time (method ``"colgen+ilp"``). Larger problems stop at the
      bound and the allocation.

Time
    With a time limit ``L``: column generation gets up to ``0.4 L`` when the ILP may
    follow (``0.7 L`` otherwise), the ILP over its columns up to ``0.15 L`` (``0.3 L``),
    the reduced ILP whatever is left. Without one, column generation runs until the
    configuration LP is solved, the columns' ILP gets :data:`COLUMNS_ILP_SECONDS`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from pricing.column_generation import BoundResult, configuration_bound
from pricing.job import room
from pricing.offline import (
    ABS_GAP,
    Held,
    OfflineError,
    OfflineJob,
    OfflineResult,
    Reduction,
    SolverName,
    result_in_trace_units,
    solve_offline,
    status_and_gap,
)
from pricing.offline_allocation import check_schedules, schedule_jobs
from pricing.offline_rounding import Primal, round_columns
from pricing.offline_units import in_solver_units, utility_scale
from pricing.schedule import Schedule
from pricing.trace import Trace

__all__ = ["AUTO_ILP_VARIABLES", "COLUMNS_ILP_SECONDS", "Method", "ilp_size", "reduction", "solve"]

Method = Literal["ilp", "colgen", "auto"]

AUTO_ILP_VARIABLES = 30_000
"""``"auto"`` runs the reduced exact ILP after column generation only up to this many
ILP variables (:func:`ilp_size`): above it, HiGHS rarely closes the gap within minutes,
and building the model alone takes seconds (bench/RESULTS.md, "Offline at scale")."""

COLUMNS_ILP_SECONDS = 60.0
"""Seconds for the ILP over the generated columns when there is no time limit."""


def ilp_size(trace: Trace, held: Held) -> int:
    """Variables of the compact ILP (``y``, ``z``, ``u``, ``x``) before any reduction
    (the running sums ``v`` of (3), one per ``u``, are not counted)."""
    c = trace.cluster
    total = 0
    for i, job in enumerate(trace.jobs):
        slots = int(held.last_slot[i]) - job.arrival + 1
        if slots <= 0:
            continue
        units = int((np.minimum(room(c.worker_capacity, job.worker), job.chunks) > 0).sum())
        units += int((np.minimum(room(c.ps_capacity, job.ps), job.chunks) > 0).sum())
        total += slots * units + max(slots - job.min_slots + 1, 0) + 1
    return total


def reduction(bound: BoundResult, incumbent: float) -> Reduction:
    """What ``bound`` rules out of the ILP given an allocation of utility ``incumbent``:
    completion slots and rejections under which no allocation reaches
    ``incumbent - 1e-6 max(1, |incumbent|)`` (:meth:`BoundResult.end_bounds`), and
    the bound itself as a cutoff."""
    floor = incumbent - ABS_GAP * max(1.0, abs(incumbent))
    n = len(bound.ends)
    return Reduction(
        ends=tuple(bound.end_bounds(i) >= floor for i in range(n)),
        must_run=np.array([bound.reject_bound(i) < floor for i in range(n)], dtype=np.bool_),
        cutoff=bound.bound,
    )


def solve(
    trace: Trace,
    *,
    method: Method = "auto",
    solver: SolverName = "highs",
    time_limit: float | None = None,
    threads: int | None = None,
    start: Sequence[Schedule | None] | None = None,
    progress: Callable[[str], None] | None = None,
    held: Held | None = None,
) -> OfflineResult:
    """The offline comparison of ``trace`` by ``method`` (module docstring).

    Args are those of :func:`pricing.offline.solve_offline`; ``start`` must be feasible
    (it is checked) and the result is never worse than it. The solvers see the
    utilities in their units, the result is in the trace's (:mod:`pricing.offline_units`).

    Raises:
        OfflineError: a solver failed, or an allocation breaks SPEC 3-5.
    """
    if method == "ilp":
        return solve_offline(
            trace,
            solver=solver,
            time_limit=time_limit,
            threads=threads,
            start=start,
            progress=progress,
            held=held,
        )
    scale = utility_scale(trace)  # progress and the result in the trace's units
    trace = in_solver_units(trace, scale)
    held = held if held is not None else Held.nothing(trace)
    say = progress if progress is not None else (lambda _m: None)
    started = time.perf_counter()
    size = ilp_size(trace, held)
    then_ilp = method == "auto" and size <= AUTO_ILP_VARIABLES
    if method == "auto":
        say(
            f"auto: the ILP would have {size} variables; "
            + (
                "column generation, then the ILP reduced by its bound"
                if then_ilp
                else f"over {AUTO_ILP_VARIABLES}: certified bound and allocation only"
            )
        )
    limit = math.inf if time_limit is None else time_limit
    start_utility = None
    if start is not None:
        problems = check_schedules(trace, held, start)
        if problems:
            raise OfflineError("the starting allocation breaks SPEC 3-5: " + "; ".join(problems))
        start_utility = float(sum(j.utility for j in schedule_jobs(trace, start)))

    say("column generation on the configuration LP (certified bound at every round)...")
    bound = configuration_bound(
        trace,
        held,
        start=start,
        time_limit=None if time_limit is None else (0.4 if then_ilp else 0.7) * limit,
        progress=progress,
        unit=scale,
    )
    say(
        f"column generation: {bound.stop} after {_rounds(bound)}, certified bound "
        f"{bound.bound * scale:.6g}, {bound.seconds:.1f} s"
    )
    columns_time = (
        COLUMNS_ILP_SECONDS if time_limit is None else (0.15 if then_ilp else 0.3) * limit
    )
    columns_time = min(columns_time, limit - (time.perf_counter() - started))
    say(f"rounding: greedy, then the ILP over {len(bound.master.columns)} columns...")
    primal = round_columns(
        bound, time_limit=max(columns_time, 0.0), start=start, start_utility=start_utility
    )
    jobs = _checked(trace, held, primal)
    optimum = float(sum(j.utility for j in jobs))
    status, gap, best = status_and_gap(False, False, optimum, bound.bound)
    # the gap is over the allocation: 19055.5 under a bound of 32526 was "70.7% below" it
    say(
        f"allocation ({primal.source}): {optimum * scale:.6g}; the bound is "
        f"{_gap_text(gap)} above it"
    )
    result = OfflineResult(
        optimum=optimum,
        bound=best,
        status=status,
        gap=gap,
        solve_seconds=time.perf_counter() - started,
        build_seconds=0.0,
        solver="highs",
        variables=len(bound.master.columns),
        constraints=bound.master.n_rows,
        jobs=jobs,
        method="colgen",
        bound_source=_bound_text(bound),
        allocation_source=_source_text(primal),
        lp_bound=bound.bound,
        columns=len(bound.master.columns),
        rounds=bound.iterations,
    )
    left = limit - (time.perf_counter() - started)
    if not then_ilp or status == "optimal" or left <= 1.0:
        return result_in_trace_units(result, scale)

    cut = reduction(bound, optimum)
    kept = sum(int(e.sum()) for e in cut.ends)
    total = sum(int(e.shape[0]) for e in cut.ends)
    say(
        f"the bound rules out {total - kept} of {total} completion slots and fixes "
        f"{int(cut.must_run.sum())} jobs as run"
    )
    exact = solve_offline(  # in the solvers' units already: solved as given
        trace,
        solver=solver,
        time_limit=None if time_limit is None else left,
        threads=threads,
        start=list(primal.schedules),
        progress=progress,
        held=held,
        reduction=cut,
    )
    assert exact.optimum is not None  # it started from the allocation
    # the reduced model lost only allocations below the start, so its bound holds for
    # the full problem; the configuration LP's holds too: keep the lower
    ilp_bound = exact.bound if exact.bound is not None else math.inf
    status, gap, best = status_and_gap(
        exact.status == "optimal", False, exact.optimum, min(ilp_bound, bound.bound)
    )
    improved = exact.optimum > optimum + ABS_GAP
    # the cutoff row caps the ILP's bound at the LP's: only a lower one is the ILP's own
    ilp_tighter = ilp_bound < bound.bound - ABS_GAP * max(1.0, abs(bound.bound))
    result = OfflineResult(
        optimum=exact.optimum,
        bound=best,
        status=status,
        gap=gap,
        solve_seconds=time.perf_counter() - started,
        build_seconds=exact.build_seconds,
        solver=solver,
        variables=exact.variables,
        constraints=exact.constraints,
        jobs=exact.jobs,
        method="colgen+ilp",
        bound_source=(
            "proven by the ILP"
            if exact.status == "optimal"
            else ("the ILP's dual bound" if ilp_tighter else _bound_text(bound))
        )
        + " (ILP reduced by the configuration LP's bound)",
        allocation_source="the reduced ILP" if improved else _source_text(primal),
        lp_bound=bound.bound,
        columns=len(bound.master.columns),
        rounds=bound.iterations,
    )
    return result_in_trace_units(result, scale)


def _checked(trace: Trace, held: Held, primal: Primal) -> tuple[OfflineJob, ...]:
    problems = check_schedules(trace, held, primal.schedules)
    if problems:
        raise OfflineError(
            f"the allocation rounded from the columns ({primal.source}) breaks SPEC 3-5: "
            + "; ".join(problems)
        )
    return schedule_jobs(trace, primal.schedules)


def _gap_text(gap: float | None) -> str:
    return "?" if gap is None else f"{100 * gap:.3g}%"


def _bound_text(bound: BoundResult) -> str:
    how = {
        "converged": "solved",
        "gap": "solved to within 1e-6",
        "time limit": "stopped by the time limit",
        "iterations": "stopped after the most rounds",
        "stalled": "stopped: its LP duals were inexact",
    }[bound.stop]
    return (
        f"configuration LP by column generation ({how}, {_rounds(bound)}): the "
        "least Lagrangian bound of its duals"
    )


def _rounds(bound: BoundResult) -> str:
    """``1 round``, ``27 rounds`` (the demo trace's bound was "1 rounds")."""
    return f"{bound.iterations} round{'' if bound.iterations == 1 else 's'}"


def _source_text(primal: Primal) -> str:
    return {
        "greedy": "greedy rounding of the configuration LP's columns",
        "columns ILP": "the ILP over the configuration LP's columns, repaired",
        "Lagrangian heuristic": "jobs one by one at the configuration LP's dual prices",
        "start": "the starting (online) allocation",
    }[primal.source]
