"""The offline optimum of the paper's problem (1)-(13), as an integer linear program.

Every job of a trace is known in advance; the optimum is the most total utility any
admission and allocation can reach under the feasibility rules of the online algorithm
(SPEC 2-5), so that ``optimum / online`` is the performance ratio of the paper's
evaluation and of its Theorem 4. Built with PuLP, imported lazily (the daemon never loads it).

Sets
    ``i``: jobs of the trace; ``h``: worker servers; ``k``: PS servers; ``r``: resources;
    ``t``: slots ``a_i .. T-1`` of job ``i`` (arrival ``a_i``, horizon ``T``).

Data
    ``W_i`` work in worker-slots, ``N_i`` chunks, ``w_i[r]`` and ``s_i[r]`` demand of one
    worker and one PS, ``b_i / B_i`` its worker / PS bandwidth, ``c[h][r]`` and ``c[k][r]``
    capacities, ``f_i`` the (non-increasing) utility of the completion time in slots.

Variables
    - ``x_i`` binary: job ``i`` is admitted.
    - ``y[i,h,t]`` integer >= 0: workers of job ``i`` on worker server ``h`` in slot ``t``.
    - ``z[i,k,t]`` integer >= 0: PS of job ``i`` on PS server ``k`` in slot ``t``.
    - ``u[i,t]`` binary: job ``i`` completes in slot ``t``.

Objective
    ``max  sum_i sum_t u[i,t] * f_i(t - a_i + 1)``

Constraints, for every ``i``, ``t``, ``h``, ``k``, ``r`` (paper's numbers)
    - ``sum_t u[i,t] = x_i``: an admitted job completes exactly once, a rejected one never.
    - (2) ``sum_{h,t} y[i,h,t] >= W_i * x_i``: enough worker-slots.
    - (3) ``sum_h y[i,h,t] <= N_i * sum_{t' >= t} u[i,t']``: at most ``N_i`` workers per
      slot, and none after the completion slot (so a rejected job gets no workers). The
      sum is a continuous ``v[i,t] = u[i,t] + v[i,t+1]`` where ``u[i,t]`` exists (the
      next one's elsewhere): the model grows linearly with the slots, not quadratically.
    - (4) ``sum_i w_i[r] * y[i,h,t] <= c[h][r]``; (5) ``sum_i s_i[r] * z[i,k,t] <= c[k][r]``.
    - (6) ``sum_k z[i,k,t] >= (b_i / B_i) * sum_h y[i,h,t] - 1e-9``: the PS carry the
      workers' bandwidth, with SPEC 3's slack (``z(y) = ceil(y b / B - 1e-9)`` is the least
      integer meeting it, so (6) admits exactly the PS counts the online algorithm may use).
    - (7) ``sum_k z[i,k,t] <= sum_h y[i,h,t]``.
    - (9), (10): no ``y``, ``z`` or ``u`` before ``a_i``; the variables do not exist there.

Why ``u`` recovers the paper's (8)
    The paper's completion time (8) is the last slot with a worker, a non-linear function
    of ``y``. Here ``u`` picks a completion slot and (3) forbids work after it, so the
    chosen slot is at or after the true last worker slot. Choosing a later slot never
    helps: ``f_i`` is non-increasing, so moving ``u`` back to the true last worker slot
    keeps (3) satisfied and cannot lower the objective. Hence some optimum of this ILP
    puts every ``u`` on the true last worker slot, and the two optima are equal. The
    utility reported per job is always recomputed from the true last worker slot.

Held resources and last slots (:class:`Held`, optional)
    To compare over part of a daemon's history, the jobs outside the comparison keep the
    allocation they were given: their use ``held[t][s][r]`` is subtracted from every
    capacity in (4) and (5). Job ``i`` may be given a last slot ``l_i <= T-1`` (the
    daemon plans a job only up to ``a_i + T_window - 1``): no variable exists after it.

Tightenings that change no feasible point
    ``y[i,h,t] <= min(N_i, room of an empty h)`` and ``z`` likewise (implied by (3), (4),
    (5), (7)); a variable whose bound is 0 is left out; ``u[i,t]`` exists only from
    ``a_i + d_min_i - 1`` (no job completes in fewer than ``d_min = ceil(W / N)`` slots);
    a capacity row that no combination of upper bounds can violate is left out.

Solvers, status and gap
    - HiGHS (through highspy, ``pulp.HiGHS``), without its MIP presolve, which returned
      wrong "optimal" answers on this model (see ``_solver``). Status, incumbent and the
      dual bound are read from the ``highspy.Highs`` object PuLP keeps. A given start
      allocation is handed to it as its first incumbent.
    - CBC (the binary PuLP bundles, ``pulp.COIN_CMD``). PuLP reports only "optimal",
      "stopped with an incumbent" or "infeasible"; CBC's own log tells a time limit from
      infeasibility, and CBC's bound does not come back, so a stopped CBC solve has status
      ``"feasible"`` and gap None. It gets no start (its MIP start crashed it here).
    Both run with a relative gap tolerance of 0 and an absolute one of ``ABS_GAP``.
    "optimal" means proven; the gap is 0.0 only then (:func:`status_and_gap`). With a
    start, the result is the better of the start and the solver's incumbent.

Checks
    The solver's incumbent is rounded to integers and checked against SPEC 3-5 with the
    ledger's capacity slack (``1e-7``). The utility recomputed from it must not fall below
    the solver's objective. No known feasible allocation may beat the solver's bound.
    Any failure raises :class:`OfflineError` rather than report a number for an
    allocation that does not exist, or a proof that does not hold.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from pricing.errors import OasisError
from pricing.job import ROUNDING, Job, room
from pricing.ledger import CAPACITY_SLACK
from pricing.schedule import Schedule
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
    "solve_offline",
    "status_and_gap",
    "theorem4_alpha",
    "theorem4_bound",
]

SolverName = Literal["highs", "cbc"]
Status = Literal["optimal", "feasible", "infeasible", "no solution"]

ABS_GAP = 1e-6
"""Utility by which the optimum may fall short of the bound and still count as proven:
both solvers run with a relative gap tolerance of 0 and this absolute one."""

SYMMETRY_MAX_COLUMNS = 100_000
"""HiGHS looks for symmetry (identical servers) in a model of at most this many columns:
its search checks no time limit, and in one of 160,000 (a horizon of 20,000 slots) it
ran for minutes past a limit of 10 s."""

INTERRUPT_MARGIN_SECONDS = 1.0
"""Past its time limit, HiGHS is interrupted from its callbacks after this long more
(its own limit, where it checks it, ends it first)."""

_INTEGRALITY = 1e-5
"""Largest distance from an integer accepted in the solver's integer values."""


class OfflineError(OasisError):
    """The solver failed, is missing, or returned an allocation that breaks SPEC 3-5."""


@dataclass(frozen=True)
class OfflineJob:
    """One job in the best allocation found.

    Attributes:
        id: the job's identifier.
        admitted: whether the allocation runs it.
        completion_slot: the last slot with a worker; None if not admitted.
        jct: ``completion_slot - a + 1``, slots; None if not admitted.
        utility: ``f(jct)``; 0.0 if not admitted.
    """

    id: str
    admitted: bool
    completion_slot: int | None
    jct: int | None
    utility: float


@dataclass(frozen=True, eq=False)
class Held:
    """What the jobs of an ILP may not use, and until when each may run.

    Attributes:
        worker_used: ``(T, H, R)`` float64, resources of worker servers held by jobs
            outside the model, per slot.
        ps_used: ``(T, K, R)`` float64, the same for PS servers.
        last_slot: ``(J,)`` int64, the last slot each job of the trace may use
            (``<= T - 1``), in trace order.
    """

    worker_used: NDArray[np.float64]
    ps_used: NDArray[np.float64]
    last_slot: NDArray[np.int64]

    @staticmethod
    def nothing(trace: Trace) -> Held:
        """Nothing held; every job may run to ``T - 1``."""
        c, T = trace.cluster, trace.horizon
        return Held(
            np.zeros((T, *c.worker_capacity.shape)),
            np.zeros((T, *c.ps_capacity.shape)),
            np.full(len(trace.jobs), T - 1, dtype=np.int64),
        )

    def worker_capacity(self, trace: Trace) -> NDArray[np.float64]:
        """``(T, H, R)``: what worker servers leave to the model's jobs per slot."""
        return trace.cluster.worker_capacity[None] - self.worker_used

    def ps_capacity(self, trace: Trace) -> NDArray[np.float64]:
        """``(T, K, R)``: what PS servers leave to the model's jobs per slot."""
        return trace.cluster.ps_capacity[None] - self.ps_used


@dataclass(frozen=True, eq=False)
class Reduction:
    """What a bound rules out of the ILP without losing any allocation better than a
    known one (:func:`pricing.offline_solve.solve` derives it from the configuration LP).

    Attributes:
        ends: per job, ``(l_i - a_i + 1,)`` bool: may it complete in each slot from its
            arrival on? No ``u`` exists where it is False, nor any unit after its last
            True slot; a job with none is not run.
        must_run: ``(J,)`` bool: jobs every better allocation runs (``x_i = 1``).
        cutoff: a bound on the optimum, added as ``objective <= cutoff``; None for none.
    """

    ends: tuple[NDArray[np.bool_], ...]
    must_run: NDArray[np.bool_]
    cutoff: float | None


@dataclass(frozen=True)
class OfflineResult:
    """The outcome of one offline solve.

    Attributes:
        optimum: total utility of the best allocation found (recomputed from it), or None
            when the solver found none.
        bound: the solver's best upper bound on the optimum; None when it does not report
            one (CBC stopped by the time limit).
        status: ``"optimal"`` (proven, ``bound - optimum <= ABS_GAP``), ``"feasible"`` (an
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
        method: what ran (:mod:`pricing.offline_solve`): ``"ilp"`` (this module's ILP
            alone), ``"colgen"`` (the configuration LP's certified bound and an
            allocation rounded from its columns) or ``"colgen+ilp"`` (both, then the ILP
            reduced by the bound and started from that allocation).
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


# ---------------------------------------------------------------------------------------
# Theorem 4
# ---------------------------------------------------------------------------------------


def theorem4_alpha(trace: Trace) -> float:
    """``alpha = max(1, max_r ln(U1[r] / L1), max_r ln(U2[r] / L2))`` of the trace's bounds.

    The paper's Theorem 4 (appendix E) states that Alg. 1 is ``2 alpha``-competitive. The
    extracted text lost the formula; what survives fixes its shape: Lemma 1 gives a
    ratio of ``2 alpha`` when every job raises the dual objective by at most ``alpha``
    times the primal (and the initial dual is at most half the optimum, which the
    ``eta`` scaling of ``L`` ensures); alpha "is just the maximum" of per-server,
    per-resource ``alpha_h^r`` and ``alpha_k^r``; and Lemma 3 takes them from the price
    function (22). For ``p(g) = L (U/L)^(g/c)``, ``dp/dg = p ln(U/L) / c``, so the
    differential allocation-cost relationship ``p dg >= (c / alpha) dp`` holds exactly
    when ``alpha >= ln(U/L)``. The 1 in the maximum is the published statement as we
    read it; the extracted text can neither confirm nor refute it, and it only matters
    when every ``U < e L``.

    The proof assumes each worker's and PS's demand is much smaller than a server's
    capacity (appendix E, before Definition 2), so that a price barely moves while one
    job is placed. On small clusters, where one job can fill a server, the measured
    ratio can exceed ``2 alpha`` (see bench/RESULTS.md).
    """
    b = trace.bounds
    return max(
        1.0,
        float(np.max(b.log_u1 - b.log_l1)),
        float(np.max(b.log_u2 - b.log_l2)),
    )


def largest_job_share(trace: Trace) -> tuple[float, str]:
    """The largest share of the cluster one job can take in one slot, and of which
    resource: over jobs, its most workers per slot on the empty cluster and their
    ``z(y)`` PS, against the cluster's total of each resource (worker demand against
    the worker servers' total, PS demand against the PS servers'). Theorem 4 assumes
    this is small (:func:`theorem4_alpha`); ``oasis gen --max-share`` bounds it."""
    from pricing.job import max_workers_per_slot

    c = trace.cluster
    total_w = c.worker_capacity.sum(axis=0)
    total_p = c.ps_capacity.sum(axis=0)
    share, name = 0.0, c.resources[0]
    for job in trace.jobs:
        y = max_workers_per_slot(job, c)
        z = int(job.ps_needed(y))
        for r, resource in enumerate(c.resources):
            for need, total in ((y * job.worker[r], total_w[r]), (z * job.ps[r], total_p[r])):
                if need > 0 and total > 0 and need / total > share:
                    share, name = float(need / total), resource
    return share, name


def theorem4_bound(trace: Trace) -> float:
    """The worst-case competitive ratio ``2 alpha`` of Theorem 4 (see :func:`theorem4_alpha`)."""
    return 2.0 * theorem4_alpha(trace)


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Model:
    """The PuLP problem and its variables, keyed as in the module docstring."""

    prob: Any
    x: dict[int, Any]
    y: dict[tuple[int, int, int], Any]
    z: dict[tuple[int, int, int], Any]
    u: dict[tuple[int, int], Any]
    v: dict[tuple[int, int], Any]  # running sums of u, keyed as u: (3)


def _pulp() -> Any:
    """The ``pulp`` module, imported here so that only the offline tools load it."""
    try:
        import pulp
    except ImportError as err:  # pragma: no cover - pulp is a dependency
        raise OfflineError("the offline optimum needs PuLP: pip install pulp highspy") from err
    return pulp


def _upper_bounds(
    job: Job, capacity: NDArray[np.float64], demand: NDArray[np.float64]
) -> NDArray[np.int64]:
    """``(n,)`` int64: ``min(N, room of each empty server)`` for one kind of unit."""
    return np.minimum(room(capacity, demand), job.chunks)


def _build(trace: Trace, held: Held, reduction: Reduction | None = None) -> _Model:
    """Problem (1)-(13) as in the module docstring, less what ``reduction`` rules out."""
    pulp = _pulp()

    cluster = trace.cluster
    prob = pulp.LpProblem("oasis_offline", pulp.LpMaximize)
    x: dict[int, Any] = {}
    y: dict[tuple[int, int, int], Any] = {}
    z: dict[tuple[int, int, int], Any] = {}
    u: dict[tuple[int, int], Any] = {}
    v: dict[tuple[int, int], Any] = {}
    objective = []
    for i, job in enumerate(trace.jobs):
        a, last = job.arrival, int(held.last_slot[i])
        first_end = a + job.min_slots - 1
        ends = [
            t for t in range(first_end, last + 1) if reduction is None or reduction.ends[i][t - a]
        ]
        stop = ends[-1] + 1 if ends else a  # no unit after the last end slot allowed
        x[i] = prob.add_variable(f"x_{i}", 0, 1, pulp.LpBinary)
        y_ub = _upper_bounds(job, cluster.worker_capacity, job.worker)
        z_ub = _upper_bounds(job, cluster.ps_capacity, job.ps)
        ys: list[Any] = []
        for t in range(a, stop):
            ys_t = [
                y.setdefault((i, h, t), prob.add_variable(f"y_{i}_{h}_{t}", 0, ub, pulp.LpInteger))
                for h, ub in enumerate(y_ub.tolist())
                if ub > 0
            ]
            zs_t = [
                z.setdefault((i, k, t), prob.add_variable(f"z_{i}_{k}_{t}", 0, ub, pulp.LpInteger))
                for k, ub in enumerate(z_ub.tolist())
                if ub > 0
            ]
            ys += ys_t
            # (3), (6), (7) of slot t; (3) takes the u of slots >= t, added below
            prob += (
                pulp.lpSum(zs_t) >= job.ps_ratio * pulp.lpSum(ys_t) - ROUNDING,
                f"c6_ps_bandwidth_{i}_{t}",
            )
            prob += pulp.lpSum(zs_t) <= pulp.lpSum(ys_t), f"c7_ps_count_{i}_{t}"
        utility = job.utility.values(np.array(ends, dtype=np.int64) - a + 1)
        for t, f in zip(ends, utility.tolist(), strict=True):
            u[i, t] = prob.add_variable(f"u_{i}_{t}", 0, 1, pulp.LpBinary)
            objective.append(f * u[i, t])
        # (3) through running sums: v[i,t] = sum_{t' >= t} u[i,t'] (a variable where a u
        # is, the later one's elsewhere), so each row is O(1), not O(T): summed afresh for
        # every slot, a job of 20,000 slots made 10^8 entries (minutes and 6 GB in PuLP)
        later: Any = 0
        for t in range(stop - 1, a - 1, -1):
            if (i, t) in u:
                v[i, t] = prob.add_variable(f"v_{i}_{t}", 0, 1, pulp.LpContinuous)
                prob += v[i, t] == u[i, t] + later, f"c3_later_{i}_{t}"
                later = v[i, t]
            ys_t = [y[i, h, t] for h in range(len(cluster.worker_names)) if (i, h, t) in y]
            prob += pulp.lpSum(ys_t) <= job.chunks * later, f"c3_chunks_{i}_{t}"
        prob += pulp.lpSum(u[i, t] for t in ends) == x[i], f"complete_once_{i}"
        prob += pulp.lpSum(ys) >= job.work * x[i], f"c2_work_{i}"
        if reduction is not None and reduction.must_run[i]:
            prob += x[i] == 1, f"must_run_{i}"
    prob += pulp.lpSum(objective)
    if reduction is not None and reduction.cutoff is not None:
        prob += pulp.lpSum(objective) <= reduction.cutoff, "cutoff"

    for name, units, capacity, demand_of in (
        ("c4_worker_capacity", y, held.worker_capacity(trace), "worker"),
        ("c5_ps_capacity", z, held.ps_capacity(trace), "ps"),
    ):
        _capacity_rows(prob, trace, name, units, capacity, demand_of)
    return _Model(prob, x, y, z, u, v)


def _capacity_rows(
    prob: Any,
    trace: Trace,
    name: str,
    units: dict[tuple[int, int, int], Any],
    capacity: NDArray[np.float64],
    demand_of: str,
) -> None:
    """Constraints (4) or (5): one row per server, slot and resource that can bind.

    ``capacity`` is ``(T, S, R)``: what is left to the model's jobs per slot.
    """
    pulp = _pulp()

    by_server_slot: dict[tuple[int, int], list[tuple[int, Any]]] = {}
    for (i, s, t), var in units.items():
        by_server_slot.setdefault((s, t), []).append((i, var))
    for (s, t), members in sorted(by_server_slot.items()):
        for r in range(len(trace.cluster.resources)):
            terms = []
            most = 0.0
            for i, var in members:
                need = float(getattr(trace.jobs[i], demand_of)[r])
                if need > 0:
                    terms.append(need * var)
                    most += need * float(var.upBound)
            if terms and most > capacity[t, s, r] + CAPACITY_SLACK:
                prob += pulp.lpSum(terms) <= float(capacity[t, s, r]), f"{name}_{s}_{t}_{r}"


# ---------------------------------------------------------------------------------------
# Solving and reading the solver's verdict
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Verdict:
    """What the solver says, before the incumbent is checked.

    Attributes:
        proven: the solver proved its incumbent optimal (within ``ABS_GAP``).
        incumbent: it holds an integer-feasible allocation.
        infeasible: it claims no allocation exists.
        bound: its best upper bound on the optimum, if it reports one.
    """

    proven: bool
    incumbent: bool
    infeasible: bool
    bound: float | None


def _highs(warm: bool, time_limit: float | None) -> Any:
    """``pulp.HiGHS`` that, with ``warm``, hands HiGHS the variables' current values as a
    starting solution (PuLP's HiGHS API class has no warm start of its own), and with a
    ``time_limit`` also interrupts it from its simplex, interior-point and MIP callbacks
    once that many seconds (and a margin) have passed: HiGHS's own limit went unchecked
    in the root LP of a model of 220,000 rows (a horizon of 20,000 slots), which ran for
    minutes past a limit of 10 s."""
    import highspy

    class HiGHSBounded(_pulp().HiGHS):  # type: ignore[misc]
        def callSolver(self, lp: Any) -> None:  # noqa: N802 - PuLP's name
            model = lp.solverModel
            if model.getNumCol() > SYMMETRY_MAX_COLUMNS:
                model.setOptionValue("mip_detect_symmetry", False)
            if warm:
                cols = lp.variables()
                index = np.array([v.index for v in cols], dtype=np.int32)
                value = np.array([float(v.varValue or 0.0) for v in cols])
                if model.setSolution(len(cols), index, value) == highspy.HighsStatus.kError:
                    raise OfflineError("HiGHS rejected the starting allocation")
            if time_limit is not None:
                deadline = time.monotonic() + time_limit + INTERRUPT_MARGIN_SECONDS

                def interrupt(kind: int, message: str, out: Any, into: Any, data: Any) -> None:
                    if time.monotonic() > deadline:
                        into.user_interrupt = True

                model.setCallback(interrupt, None)
                kinds = highspy.cb.HighsCallbackType
                for kind in (kinds.kCallbackSimplexInterrupt, kinds.kCallbackIpmInterrupt,
                             kinds.kCallbackMipInterrupt):  # fmt: skip
                    model.startCallback(kind)
            super().callSolver(lp)

    return HiGHSBounded


def _solver(
    name: SolverName,
    time_limit: float | None,
    threads: int | None,
    warm: bool,
    log_path: str | None = None,
) -> Any:
    """A configured PuLP solver: relative gap 0, absolute gap ``ABS_GAP``, quiet; with
    ``warm``, it starts from the variables' current values; CBC writes its log to
    ``log_path``."""
    pulp = _pulp()

    if name == "highs":
        # HiGHS's MIP presolve (1.15.1, the newest available here) returns wrong
        # "optimal" answers on this model: 4 of 150 random tiny traces in a check against
        # exhaustive search (CBC and HiGHS without presolve: 0). Similar reports upstream:
        # ERGO-Code/HiGHS issues 3043, 3073, 3094, 3274. Branch and bound stays on.
        solver = _highs(warm, time_limit)(
            msg=False,
            timeLimit=time_limit,
            threads=threads,
            gapRel=0.0,
            gapAbs=ABS_GAP,
            presolve="off",
        )
    elif name == "cbc":
        # PULP_CBC_CMD is deprecated; COIN_CMD runs the same CBC binary PuLP bundles
        # when no ``cbc`` is on PATH.
        options = {
            "msg": False,
            "timeLimit": time_limit,
            "threads": threads,
            "gapRel": 0.0,
            "gapAbs": ABS_GAP,
            "warmStart": warm,
            "logPath": log_path,
        }
        solver = pulp.COIN_CMD(**options)
        if not solver.available():
            solver = pulp.COIN_CMD(path=pulp.PULP_CBC_CMD.pulp_cbc_path, **options)
    else:
        raise OfflineError(f"unknown solver {name!r} (known: highs, cbc)")
    if not solver.available():
        raise OfflineError(f"solver {name!r} is not available in this environment")
    return solver


def _highs_threads() -> None:
    """Let the next HiGHS run take its own ``threads`` option.

    HiGHS keeps a scheduler per thread, sized by the thread's first run; a later run in
    that thread asking another thread count does not run at all ("already been
    initialized"), and its status was read as no solution with bound 0 (an audit:
    ``oasis offline --threads 1`` after column generation's LPs). Resetting it
    (blocking) lets the next run size it again; other threads' runs are not disturbed
    (checked by the session's review)."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)


def _highs_verdict(prob: Any) -> _Verdict:
    """Read HiGHS's model status and bound from the ``highspy.Highs`` PuLP kept.

    Raises:
        OfflineError: HiGHS did not run (its model status is still "not set")."""
    import highspy

    h = prob.solverModel
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kNotset:
        raise OfflineError("the highs solver did not run (its model status is not set)")
    info = h.getInfo()
    incumbent = int(info.primal_solution_status) == int(
        highspy.SolutionStatus.kSolutionStatusFeasible
    )
    # PuLP hands HiGHS the minimisation of -objective: its dual bound is -(our bound)
    dual = float(info.mip_dual_bound)
    bound = -dual if math.isfinite(dual) else None
    return _Verdict(
        proven=status == highspy.HighsModelStatus.kOptimal and incumbent,
        incumbent=incumbent,
        infeasible=status == highspy.HighsModelStatus.kInfeasible,
        bound=bound,
    )


def _cbc_verdict(prob: Any, log: str) -> _Verdict:
    """Read CBC's verdict as PuLP reports it; PuLP does not return CBC's bound.

    CBC stopped by the time limit before it found an integer solution writes "Integer
    infeasible", which PuLP reports as infeasible; its log's "Result - Stopped on time"
    line tells the two apart. An unreadable log leaves no incumbent and no verdict,
    never "infeasible": admitting nothing is always feasible.
    """
    pulp = _pulp()

    proven = prob.sol_status == pulp.LpSolutionOptimal
    # stopped inside the root LP, CBC writes "Stopped on iterations - objective value"
    # and the LP's fractional values, which PuLP reports as an integer solution; only a
    # branch and bound that ran (its "Result - " line) holds a real one
    searched = "Result - " in log
    incumbent = searched and (proven or prob.sol_status == pulp.LpSolutionIntegerFeasible)
    finished = searched and "Result - Stopped" not in log
    return _Verdict(
        proven=proven and searched,
        incumbent=incumbent,
        infeasible=prob.status == pulp.LpStatusInfeasible and finished,
        bound=None,
    )


def _run(
    model: _Model, solver: SolverName, time_limit: float | None, threads: int | None, warm: bool
) -> _Verdict:
    """Solve the model in place and read the solver's verdict."""
    pulp = _pulp()
    with tempfile.TemporaryDirectory(prefix="oasis-offline-") as tmp:
        log_path = str(Path(tmp) / "cbc.log") if solver == "cbc" else None
        engine = _solver(solver, time_limit, threads, warm, log_path)
        if solver == "cbc":
            engine.tmpDir = tmp  # PuLP leaves its model files behind when CBC fails
        if solver == "highs" and threads is not None:
            _highs_threads()
        try:
            model.prob.solve(engine)
        except pulp.PulpSolverError as err:
            raise OfflineError(f"the {solver} solver failed: {err}") from err
        except (ArithmeticError, LookupError, ValueError) as err:  # PuLP reading a failed
            # solve back (an objective past 1e20, which HiGHS takes as infinite, did so)
            raise OfflineError(
                f"the {solver} solver failed ({type(err).__name__}: {str(err)[:200]}); "
                "utilities near 1e20 or above are past what the solvers represent"
            ) from err
        if solver == "highs":
            return _highs_verdict(model.prob)
        assert log_path is not None
        log = Path(log_path).read_text(errors="replace") if Path(log_path).exists() else ""
        return _cbc_verdict(model.prob, log)


def status_and_gap(
    verdict_proven: bool,
    verdict_infeasible: bool,
    optimum: float | None,
    bound: float | None,
) -> tuple[Status, float | None, float | None]:
    """``(status, gap, bound)`` from the solver's verdict and the checked incumbent.

    Optimal only when proven: by the solver, or by a reported bound within ``ABS_GAP`` of
    the optimum (a bound below the optimum by float noise is raised to it). A proven
    optimum without a reported bound is its own bound. Otherwise the gap is
    ``(bound - optimum) / optimum``, or None without a bound.
    """
    if optimum is None:
        return ("infeasible" if verdict_infeasible else "no solution"), None, bound
    if bound is not None and bound - optimum <= ABS_GAP:
        return "optimal", 0.0, max(bound, optimum)
    if verdict_proven:
        return "optimal", 0.0, optimum if bound is None else bound
    if bound is None:
        return "feasible", None, None
    gap = (bound - optimum) / abs(optimum) if optimum != 0 else math.inf
    return "feasible", gap, bound


# ---------------------------------------------------------------------------------------
# Reading and checking the allocation
# ---------------------------------------------------------------------------------------


def _integer(var: Any) -> int:
    value = var.varValue
    if value is None:
        return 0
    n = round(float(value))
    if abs(float(value) - n) > _INTEGRALITY:
        raise OfflineError(f"{var.name} = {value} is not an integer")
    return int(n)


def _allocation(trace: Trace, model: _Model) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(J, T, H)`` workers and ``(J, T, K)`` PS of the incumbent, as integers."""
    shape = (len(trace.jobs), trace.horizon)
    workers = np.zeros((*shape, len(trace.cluster.worker_names)), dtype=np.int64)
    ps = np.zeros((*shape, len(trace.cluster.ps_names)), dtype=np.int64)
    for (i, h, t), var in model.y.items():
        workers[i, t, h] = _integer(var)
    for (i, k, t), var in model.z.items():
        ps[i, t, k] = _integer(var)
    return workers, ps


def allocation_from_schedules(
    trace: Trace, schedules: Sequence[Schedule | None]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(J, T, H)`` workers and ``(J, T, K)`` PS from one schedule per job (None: the
    job is not run), e.g. the online algorithm's, in trace order."""
    if len(schedules) != len(trace.jobs):
        raise ValueError(f"{len(schedules)} schedules for {len(trace.jobs)} jobs")
    shape = (len(trace.jobs), trace.horizon)
    workers = np.zeros((*shape, len(trace.cluster.worker_names)), dtype=np.int64)
    ps = np.zeros((*shape, len(trace.cluster.ps_names)), dtype=np.int64)
    for i, s in enumerate(schedules):
        if s is not None and s.slots:
            if s.start < 0 or s.start + s.slots > trace.horizon:
                raise ValueError(f"schedule of {trace.jobs[i].id} leaves slots 0 .. T-1")
            workers[i, s.start : s.start + s.slots] = s.workers
            ps[i, s.start : s.start + s.slots] = s.ps
    return workers, ps


def _set_start(
    trace: Trace,
    held: Held,
    model: _Model,
    workers: NDArray[np.int64],
    ps: NDArray[np.int64],
) -> None:
    """Give every variable the value of the (checked) allocation, as the solver's start."""
    problems = check_allocation(trace, held, workers, ps)
    if problems:
        raise OfflineError("the starting allocation breaks SPEC 3-5: " + "; ".join(problems))
    for var in model.prob.variables():
        var.varValue = 0.0
    try:
        for (i, h, t), var in model.y.items():
            var.setInitialValue(int(workers[i, t, h]))
        for (i, k, t), var in model.z.items():
            var.setInitialValue(int(ps[i, t, k]))
    except ValueError as err:
        raise OfflineError(f"the starting allocation does not fit the model: {err}") from err
    placed = sum(int(v.varValue) for v in model.y.values())
    placed += sum(int(v.varValue) for v in model.z.values())
    if placed != int(workers.sum() + ps.sum()):
        raise OfflineError("the starting allocation puts a unit where none of its job fits")
    for i, job in enumerate(allocation_jobs(trace, workers)):
        if job.completion_slot is not None:
            model.x[i].setInitialValue(1)
            model.u[i, job.completion_slot].setInitialValue(1)
            for t in range(trace.jobs[i].arrival, job.completion_slot + 1):
                if (i, t) in model.v:
                    model.v[i, t].setInitialValue(1)


def check_allocation(
    trace: Trace, held: Held, workers: NDArray[np.int64], ps: NDArray[np.int64]
) -> list[str]:
    """Every way the allocation (``(J, T, H)`` workers, ``(J, T, K)`` PS) breaks SPEC 3-5
    (empty when it is feasible): the check of every allocation reported, online or
    offline."""
    problems = []
    for i, job in enumerate(trace.jobs):
        per_slot = workers[i].sum(axis=1)
        ps_slot = ps[i].sum(axis=1)
        if per_slot[: job.arrival].any() or ps_slot[: job.arrival].any():
            problems.append(f"{job.id}: runs before its arrival")
        after = int(held.last_slot[i]) + 1
        if per_slot[after:].any() or ps_slot[after:].any():
            problems.append(f"{job.id}: runs after its last slot {after - 1}")
        if per_slot.any() and per_slot.sum() < job.work:
            problems.append(f"{job.id}: {per_slot.sum()} worker-slots < W = {job.work}")
        if (per_slot > job.chunks).any():
            problems.append(f"{job.id}: more than N = {job.chunks} workers in a slot")
        if (ps_slot < job.ps_needed(per_slot)).any() or (ps_slot > per_slot).any():
            problems.append(f"{job.id}: PS count outside z(y) .. y")
    if not trace.jobs:  # nothing allocated (and no (J, R) demand array to build)
        return problems
    used_w = np.einsum("ith,ir->thr", workers, np.array([j.worker for j in trace.jobs]))
    used_p = np.einsum("itk,ir->tkr", ps, np.array([j.ps for j in trace.jobs]))
    if (used_w > held.worker_capacity(trace) + CAPACITY_SLACK).any():
        problems.append("a worker server's capacity is exceeded")
    if (used_p > held.ps_capacity(trace) + CAPACITY_SLACK).any():
        problems.append("a PS server's capacity is exceeded")
    return problems


_check = check_allocation  # the name tests written before it was public use


def allocation_jobs(trace: Trace, workers: NDArray[np.int64]) -> tuple[OfflineJob, ...]:
    """Per job: admitted iff it has workers; completion at its last worker slot."""
    out = []
    for i, job in enumerate(trace.jobs):
        used = np.flatnonzero(workers[i].sum(axis=1))
        if used.size == 0:
            out.append(OfflineJob(job.id, False, None, None, 0.0))
            continue
        end = int(used[-1])
        jct = end - job.arrival + 1
        out.append(OfflineJob(job.id, True, end, jct, float(job.utility.values(jct))))
    return tuple(out)


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------


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
    """Solve problem (1)-(13) for ``trace`` (module docstring) and check the result.

    Args:
        trace: the jobs, cluster and horizon.
        solver: ``"highs"`` (HiGHS through highspy) or ``"cbc"`` (the CBC binary).
        time_limit: seconds the solver may run; None for no limit.
        threads: solver threads; None for the solver's default.
        start: one schedule per job (None: not run) handed to the solver as its first
            incumbent, e.g. the online algorithm's; the result is then never worse, even
            when the time limit cuts the search short.
        progress: called with a one-line message before the solve starts.
        held: resources held by jobs outside the trace and each job's last slot
            (default: nothing held, every job may run to ``T - 1``).
        reduction: completion slots and rejections ruled out, and a cutoff; the
            optimum and bound are then those of the reduced model, which equal the full
            model's when ``start`` is the allocation the reduction keeps every better
            one than (:class:`Reduction`).

    Raises:
        OfflineError: the solver is unknown, unavailable or crashed, or its allocation
            breaks SPEC 3-5 or delivers less than its objective (numerical trouble), or
            ``start`` breaks SPEC 3-5; never for an unproven result, which comes back as
            status ``"feasible"``.
    """
    started = time.perf_counter()
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
    verdict = _run(model, solver, time_limit, threads, warm)
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
    return OfflineResult(
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


def lp_relaxation(trace: Trace, held: Held | None = None) -> float:
    """The optimum of this module's ILP with every variable continuous (HiGHS): the plain
    LP relaxation of problem (1)-(13), an upper bound on the optimum, for comparison
    with the configuration LP's (:mod:`pricing.column_generation`).

    Raises:
        OfflineError: HiGHS did not solve it.
    """
    pulp = _pulp()
    model = _build(trace, held if held is not None else Held.nothing(trace))
    for var in model.prob.variables():
        var.cat = pulp.LpContinuous
    model.prob.solve(pulp.HiGHS(msg=False))
    if model.prob.status != pulp.LpStatusOptimal:
        raise OfflineError(f"the LP relaxation was not solved: {pulp.LpStatus[model.prob.status]}")
    return float(pulp.value(model.prob.objective) or 0.0)


def _total(jobs: tuple[OfflineJob, ...]) -> float:
    return float(sum(j.utility for j in jobs))


def _incumbent(trace: Trace, held: Held, model: _Model) -> tuple[OfflineJob, ...]:
    """The solver's allocation, checked against SPEC 3-5 and against its objective."""
    workers, ps = _allocation(trace, model)
    problems = check_allocation(trace, held, workers, ps)
    if problems:
        raise OfflineError("the solver's allocation breaks SPEC 3-5: " + "; ".join(problems))
    jobs = allocation_jobs(trace, workers)
    total = _total(jobs)
    # u sits at or after each true last worker slot, so the solver's objective can only
    # fall short of the recomputed utility (module docstring), never exceed it
    claimed = float(_pulp().value(model.prob.objective) or 0.0)
    if claimed > total + ABS_GAP * max(1.0, abs(total)):
        raise OfflineError(
            f"the solver's objective {claimed:.9g} exceeds the utility {total:.9g} "
            "its allocation achieves"
        )
    return jobs
