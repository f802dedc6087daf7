"""The offline optimum of the paper's problem (1)-(13), as an integer linear program.

Every job of a trace is known in advance; the optimum is the most total utility any
admission and allocation can reach under the feasibility rules of the online algorithm
(SPEC 2-5), so that ``optimum / online`` is the performance ratio of the paper's
evaluation and of its Theorem 4. Built with PuLP, imported lazily (the daemon never loads it).

This module holds the entry points, :func:`solve_offline` and :func:`lp_relaxation`,
and the result they report; the parts are

- :mod:`pricing.offline_model`: the ILP (sets, variables, constraints, why its optimum
  is the paper's, tightenings), the held resources and a bound's reduction;
- :mod:`pricing.offline_backends`: HiGHS and CBC, their setup, verdict, status and gap;
- :mod:`pricing.offline_allocation`: allocations read from the solver or from
  schedules, and their checks against SPEC 3-5;
- :mod:`pricing.theorem4`: the worst-case ratio ``2 alpha`` of Theorem 4.

With a start, the result is the better of the start and the solver's incumbent; both
are checked as :mod:`pricing.offline_allocation` says. The names other code imports
from here are re-exported from the parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pricing.offline_allocation import (
    OfflineJob,
    _incumbent,
    _set_start,
    _total,
    allocation_from_schedules,
    allocation_jobs,
    check_allocation,
)
from pricing.offline_backends import (
    ABS_GAP,
    Report,
    SolverName,
    Status,
    _run,
    status_and_gap,
    within_tolerance,
)
from pricing.offline_model import Held, OfflineError, Reduction, _build, _pulp
from pricing.offline_units import in_solver_units, in_trace_units, utility_scale
from pricing.schedule import Schedule
from pricing.theorem4 import largest_job_share, theorem4_alpha, theorem4_bound
from pricing.trace import Trace

__all__ = [
    "ABS_GAP",
    "Held",
    "OfflineError",
    "OfflineJob",
    "OfflineResult",
    "Reduction",
    "SolverName",
    "Status",
    "allocation_from_schedules",
    "allocation_jobs",
    "check_allocation",
    "largest_job_share",
    "lp_relaxation",
    "result_in_trace_units",
    "solve_offline",
    "status_and_gap",
    "theorem4_alpha",
    "theorem4_bound",
    "within_tolerance",
]

_check = check_allocation  # the name tests written before it was public use


@dataclass(frozen=True)
class OfflineResult:
    """The outcome of one offline solve.

    Attributes:
        optimum: total utility of the best allocation found (recomputed from it), or None
            when the solver found none.
        bound: the solver's best upper bound on the optimum; None when it does not report
            one (CBC stopped by the time limit).
        status: ``"optimal"`` (proven, ``bound - optimum <= ABS_GAP max(1, |optimum|)``),
            ``"feasible"`` (an
            allocation but no proof, e.g. the time limit hit), ``"infeasible"`` (the
            solver claims no allocation exists, which for this problem means a numerical
            failure: admitting nothing is always feasible) or ``"no solution"``.
        gap: relative gap ``(bound - optimum) / optimum`` (HiGHS's definition; ``inf``
            when the optimum is 0 and the bound is not); 0.0 exactly when proven optimal;
            None when no bound is known.
        solve_seconds: wall time of the solver call, seconds.
        build_seconds: wall time to build the model, seconds.
        solver: ``"highs"`` or ``"cbc"``.
        variables, constraints: size of the model handed to the solver.
        jobs: per job, in trace order (empty when there is no allocation).
        method: what ran (:mod:`pricing.offline_solve`): ``"ilp"`` (the ILP of
            :mod:`pricing.offline_model` alone), ``"colgen"`` (the configuration LP's
            certified bound and an allocation rounded from its columns) or
            ``"colgen+ilp"`` (both, then the ILP reduced by the bound and started from
            that allocation).
        bound_source: how ``bound`` was obtained, in words.
        allocation_source: where the allocation came from, in words.
        lp_bound: the configuration LP's certified bound, when it was computed.
        columns, rounds: the column generation's columns and pricing rounds.
    """

    optimum: float | None
    bound: float | None
    status: Status
    gap: float | None
    solve_seconds: float
    build_seconds: float
    solver: SolverName
    variables: int
    constraints: int
    jobs: tuple[OfflineJob, ...]
    method: str = "ilp"
    bound_source: str = ""
    allocation_source: str = ""
    lp_bound: float | None = None
    columns: int | None = None
    rounds: int | None = None


def solve_offline(
    trace: Trace,
    *,
    solver: SolverName = "highs",
    time_limit: float | None = None,
    threads: int | None = None,
    start: Sequence[Schedule | None] | None = None,
    progress: Callable[[str], None] | None = None,
    held: Held | None = None,
    reduction: Reduction | None = None,
) -> OfflineResult:
    """Solve problem (1)-(13) for ``trace`` (:mod:`pricing.offline_model`) and check the
    result. The solver sees the utilities in its units and the result is in the trace's
    (:mod:`pricing.offline_units`); a trace in the solvers' units already is solved as
    given.

    Args:
        trace: the jobs, cluster and horizon.
        solver: ``"highs"`` (HiGHS through highspy) or ``"cbc"`` (the CBC binary).
        time_limit: seconds the solver may run; None for no limit.
        threads: solver threads; None for the solver's default.
        start: one schedule per job (None: not run) handed to the solver as its first
            incumbent, e.g. the online algorithm's; the result is then never worse, even
            when the time limit cuts the search short.
        progress: called with a one-line message before the solve starts, and with
            HiGHS every :data:`~pricing.offline_backends.PROGRESS_SECONDS` with its
            incumbent and bound as it searches.
        held: resources held by jobs outside the trace and each job's last slot
            (default: nothing held, every job may run to ``T - 1``).
        reduction: completion slots and rejections ruled out, and a cutoff; the
            optimum and bound are then those of the reduced model, which equal the full
            model's when ``start`` is the allocation the reduction keeps every better
            one than (:class:`Reduction`); its cutoff is in the solvers' units (from
            :func:`pricing.offline_solve.solve`, whose trace is in them already).

    Raises:
        OfflineError: the solver is unknown, unavailable or crashed, or its allocation
            breaks SPEC 3-5 or delivers less than its objective (numerical trouble), or
            ``start`` breaks SPEC 3-5; never for an unproven result, which comes back as
            status ``"feasible"``.
    """
    started = time.perf_counter()
    scale = utility_scale(trace)
    trace = in_solver_units(trace, scale)
    held = held if held is not None else Held.nothing(trace)
    model = _build(trace, held, reduction)
    n_vars = len(model.prob.variables())
    n_rows = len(model.prob.constraints())
    start_workers = None
    # CBC 2.10.3 (the binary PuLP bundles) crashed with SIGSEGV in 4 of 8 solves given a
    # MIP start here, so only HiGHS gets the start; both are held to it below
    warm = start is not None and solver == "highs"
    if start is not None:
        start_workers, start_ps = allocation_from_schedules(trace, start)
        _set_start(trace, held, model, start_workers, start_ps)
    build_seconds = time.perf_counter() - started
    if progress is not None:
        limit = "no time limit" if time_limit is None else f"time limit {time_limit:g} s"
        label = {"highs": "HiGHS", "cbc": "CBC"}[solver]
        from_start = ", starting from the given allocation" if warm else ""
        progress(
            f"solving ILP with {label} ({n_vars} variables, {n_rows} constraints, "
            f"{limit}{from_start})..."
        )
    started = time.perf_counter()
    verdict = _run(model, solver, time_limit, threads, warm, _reporter(progress, scale))
    solve_seconds = time.perf_counter() - started

    jobs = _incumbent(trace, held, model) if verdict.incumbent else None
    if start_workers is not None:
        given = allocation_jobs(trace, start_workers)
        if jobs is None or _total(given) > _total(jobs) + ABS_GAP:
            if verdict.proven:
                raise OfflineError("the given allocation beats the solver's proven optimum")
            jobs = given
    optimum = None if jobs is None else _total(jobs)
    tolerance = ABS_GAP * max(1.0, abs(optimum or 0.0))
    if optimum is not None and verdict.bound is not None and optimum > verdict.bound + tolerance:
        raise OfflineError(
            f"an allocation of utility {optimum:.9g} beats the solver's bound "
            f"{verdict.bound:.9g}: its proof is wrong"
        )
    status, gap, bound = status_and_gap(verdict.proven, verdict.infeasible, optimum, verdict.bound)
    result = OfflineResult(
        optimum=optimum,
        bound=bound,
        status=status,
        gap=gap,
        solve_seconds=solve_seconds,
        build_seconds=build_seconds,
        solver=solver,
        variables=n_vars,
        constraints=n_rows,
        jobs=jobs or (),
    )
    return result_in_trace_units(result, scale)


def _reporter(progress: Callable[[str], None] | None, scale: float) -> Report | None:
    """A one-line progress message of the solver's incumbent and bound, in the trace's
    units (the model's times ``scale``)."""
    if progress is None:
        return None
    say = progress

    def report(best: float | None, bound: float | None, seconds: float) -> None:
        gap = ""
        if best is not None and bound is not None and best > 0:
            gap = f", gap {(bound - best) / best:.3g}"
        best_text = "none yet" if best is None else f"{best * scale:.6g}"
        bound_text = "none yet" if bound is None else f"{bound * scale:.6g}"
        say(f"ILP: best allocation {best_text}, solver's bound {bound_text}{gap}, {seconds:.0f} s")

    return report


def result_in_trace_units(result: OfflineResult, scale: float) -> OfflineResult:
    """``result`` of a solve in the solvers' units (utilities divided by ``scale``) in the
    trace's: every utility and bound multiplied back (exact: ``scale`` is a power of
    two); the gap is relative and stays."""
    if scale == 1.0:
        return result

    def back(x: float | None) -> float | None:
        return None if x is None else x * scale

    return replace(
        result,
        optimum=back(result.optimum),
        bound=back(result.bound),
        lp_bound=back(result.lp_bound),
        jobs=in_trace_units(result.jobs, scale),
    )


def lp_relaxation(trace: Trace, held: Held | None = None) -> float:
    """The optimum of the ILP (:mod:`pricing.offline_model`) with every variable
    continuous (HiGHS): the plain LP relaxation of problem (1)-(13), an upper bound on the
    optimum, for comparison with the configuration LP's (:mod:`pricing.column_generation`).

    Raises:
        OfflineError: HiGHS did not solve it.
    """
    pulp = _pulp()
    scale = utility_scale(trace)
    trace = in_solver_units(trace, scale)
    model = _build(trace, held if held is not None else Held.nothing(trace))
    for var in model.prob.variables():
        var.cat = pulp.LpContinuous
    model.prob.solve(pulp.HiGHS(msg=False))
    if model.prob.status != pulp.LpStatusOptimal:
        raise OfflineError(f"the LP relaxation was not solved: {pulp.LpStatus[model.prob.status]}")
    return float(pulp.value(model.prob.objective) or 0.0) * scale
