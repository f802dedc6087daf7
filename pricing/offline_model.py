"""The offline optimum's model: the paper's problem (1)-(13) as an integer linear program.

Every job of a trace is known in advance; the ILP's optimum is the most total utility any
admission and allocation can reach under the feasibility rules of the online algorithm
(SPEC 2-5). Built with PuLP, imported lazily (the daemon never loads it); solved by
:mod:`pricing.offline_backends`, from :func:`pricing.offline.solve_offline`.

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
    - (4) ``sum_i w_i[r] * y[i,h,t] <= c[h][r] + 1e-9 max_i w_i[r]``; (5) ``sum_i s_i[r] *
      z[i,k,t] <= c[k][r] + 1e-9 max_i s_i[r]`` (over the jobs that may use the server):
      SPEC 5's room ``floor(free / w + 1e-9)`` lets the online algorithm place up to
      ``1e-9 w`` past what is free (four workers of 4e9 + 1 bytes on 16e9), and an optimum
      held to ``c`` exactly could not run what the online algorithm ran.
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
    a capacity row that no combination of upper bounds can violate is left out; (3)'s
    ``N_i`` is ``Y_i = min(N_i, sum_h of those bounds)``, the most workers job ``i`` can
    have in a slot. The last is also numerics: (3) is a big-M row, and with ``N_i =
    2**26`` a ``v`` of ``1.5e-8``, inside the solver's tolerances, let a worker run
    after the completion slot, so the solver claimed 269.81 for an allocation worth
    269.42 (one job of 2**26 chunks in a 21-job trace).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pricing.errors import OasisError
from pricing.job import ROUNDING, Job, room
from pricing.ledger import CAPACITY_SLACK
from pricing.trace import Trace

__all__ = ["Held", "OfflineError", "Reduction"]


class OfflineError(OasisError):
    """The solver failed, is missing, or returned an allocation that breaks SPEC 3-5."""


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
        most = min(job.chunks, int(y_ub.sum()))  # (3)'s big M: workers a slot can hold
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
            prob += pulp.lpSum(ys_t) <= most * later, f"c3_chunks_{i}_{t}"
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
    """Constraints (4) or (5): one row per server, slot and resource that can bind, with
    SPEC 5's room slack (the module docstring).

    ``capacity`` is ``(T, S, R)``: what is left to the model's jobs per slot.
    """
    pulp = _pulp()

    by_server_slot: dict[tuple[int, int], list[tuple[int, Any]]] = {}
    for (i, s, t), var in units.items():
        by_server_slot.setdefault((s, t), []).append((i, var))
    for (s, t), members in sorted(by_server_slot.items()):
        for r in range(len(trace.cluster.resources)):
            terms = []
            most = largest = 0.0
            for i, var in members:
                need = float(getattr(trace.jobs[i], demand_of)[r])
                if need > 0:
                    terms.append(need * var)
                    most += need * float(var.upBound)
                    largest = max(largest, need)
            free = float(capacity[t, s, r]) + ROUNDING * largest
            if terms and most > free + CAPACITY_SLACK:
                prob += pulp.lpSum(terms) <= free, f"{name}_{s}_{t}_{r}"
