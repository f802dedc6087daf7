"""The best schedule of one job against current prices (SPEC 5, the paper's Alg. 2).

For a job arriving at slot ``a`` that may end by ``t1``, choose ``y_t`` workers in each
slot ``t`` in ``a .. t_end`` with ``sum y_t >= W`` to maximise
``f(t_end - a + 1) - sum_t cost_t(y_t)``, where ``cost_t(y)`` places ``y`` workers and
``z(y)`` PS greedily (:mod:`pricing.placement`).

One forward pass serves every end slot: after slot ``t``, ``D_t[w]`` is the least cost
of at least ``w`` worker-slots within ``a .. t``, so the payoff of ending by ``t`` is
``f(t - a + 1) - D_t[W]``. A schedule that ends earlier than ``t`` has a higher utility,
so the maximum over ``t`` is exact (and reached by a schedule using its last slot).

Speed, exactness kept:
- slots nobody has touched share one cost curve, computed once per decision;
- the work reachable after ``k`` slots bounds the ``w`` range of the ``k``-th step;
- the search ends once ``f(t + 1 - a + 1)`` minus a lower bound on any completion's
  cost cannot beat the best payoff found: every unit of work costs at least the
  cheapest possible worker plus its share of the cheapest possible PS (prices never
  fall below ``L``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from numpy.typing import NDArray

from pricing.job import Job
from pricing.ledger import Ledger
from pricing.placement import F64, I64, cost_curve, offers, place
from pricing.schedule import Schedule

__all__ = [
    "TIE",
    "BestSchedule",
    "Schedule",
    "Side",
    "best_schedule",
    "payoff_ceiling",
    "search",
    "warm_up",
]

_LB_SLACK = 1.0 - 1e-9

TIE = 1e-12
"""Relative difference below which two costs or payoffs are equal (float noise)."""


@dataclass(frozen=True, eq=False)
class BestSchedule:
    """The outcome of the search for one job.

    Attributes:
        payoff: ``f(jct) - cost`` of the best schedule; None if no schedule is feasible.
        schedule: the best schedule (None if infeasible).
        cost: its cost at current prices, utility units.
        jct: its completion time ``t_end - a + 1``, slots.
        utility: ``f(jct)``.
        slots_scanned: slots the search examined before it could stop.
    """

    payoff: float | None
    schedule: Schedule | None
    cost: float | None
    jct: int | None
    utility: float | None
    slots_scanned: int

    @property
    def completion_slot(self) -> int | None:
        """The last slot with a worker."""
        return None if self.schedule is None else self.schedule.end


# A side is (price (S, n, R), used (S, n, R), capacity (n, R), demand (R,)): one kind of
# server over the ledger's window and the job's demand per unit on it.
Side = tuple[F64, F64, F64, F64]


@njit(cache=True, nogil=True)
def _slot_curve(wside: Side, pside: Side, slot: int, zt: I64, out: F64) -> int:
    """``out[y] = cost_t(y)`` for ``y = 0 .. N`` (inf where it does not fit); returns the
    largest feasible ``y``."""
    n_max = out.shape[0] - 1
    unit_w, room_w = offers(wside, slot)
    unit_p, room_p = offers(pside, slot)
    curve_w = np.empty(n_max + 1)
    curve_p = np.empty(zt[n_max] + 1)
    nw = cost_curve(unit_w, room_w, n_max, curve_w)
    np_ = cost_curve(unit_p, room_p, zt[n_max], curve_p)
    ymax = 0
    out[0] = 0.0
    for y in range(1, n_max + 1):
        if y <= nw and zt[y] <= np_:
            out[y] = curve_w[y] + curve_p[zt[y]]
            ymax = y
        else:
            out[y] = np.inf
    return ymax


@njit(cache=True, nogil=True)
def _search(
    wside: Side,
    pside: Side,
    touched: NDArray[np.bool_],
    t0: int,
    work: int,
    zt: I64,
    util: F64,
    lb_unit: float,
    d_all: F64,
    c_all: F64,
    ymax_all: I64,
) -> tuple[int, float, int]:
    """Forward DP over slots ``t0 .. t0 + n - 1`` (window indices), ``n = len(util)``.

    Fills ``d_all[k]`` (``(W + 1,)``: least cost of at least w worker-slots by slot k),
    ``c_all[k]`` (``(N + 1,)``: the slot's cost curve) and ``ymax_all[k]``. Returns
    ``(best_k, best_payoff, scanned)``; ``best_k`` is -1 when no end slot is feasible.
    """
    n_slots = util.shape[0]
    idle_curve = np.empty(zt.shape[0])
    idle_ymax = -1

    prev = np.full(work + 1, np.inf)
    prev[0] = 0.0
    reach = 0
    best = -np.inf
    best_k = -1
    for k in range(n_slots):
        slot = t0 + k
        c = c_all[k]
        if not touched[slot] and idle_ymax >= 0:
            c[:] = idle_curve
            ymax = idle_ymax
        else:
            ymax = _slot_curve(wside, pside, slot, zt, c)
            if not touched[slot]:
                idle_curve[:] = c
                idle_ymax = ymax
        ymax_all[k] = ymax

        cur = d_all[k]
        cur[:] = prev
        # w < y needs no update: cost_t rises with y, so choosing y = w covers it as cheaply
        for y in range(1, ymax + 1):
            cy = c[y]
            for w in range(y, min(work, reach + y) + 1):
                cur[w] = min(cur[w], prev[w - y] + cy)
        reach = min(work, reach + ymax)

        if cur[work] < np.inf:
            payoff = util[k] - cur[work]
            # only a gain beyond float noise moves the end: the earliest end wins ties
            if best_k < 0 or payoff > best + TIE * max(abs(best), 1.0):
                best = payoff
                best_k = k
        if k + 1 < n_slots:
            lower = np.inf
            for w in range(reach + 1):
                lower = min(lower, cur[w] + (work - w) * lb_unit)
            if util[k + 1] - lower <= best:
                return best_k, best, k + 1
        prev = cur
    return best_k, best, n_slots


@njit(cache=True, nogil=True)
def _backtrack(d_all: F64, c_all: F64, ymax_all: I64, best_k: int, work: int) -> I64:
    """Workers per slot of a schedule reaching ``d_all[best_k][work]``.

    Walking back from the last slot, the smallest ``y`` whose cost is within a relative
    ``TIE`` of the least wins: equal-cost splits (common, since untouched slots share
    prices) then go the same way whatever float noise the summation order leaves, and
    work goes as early as it can."""
    ys = np.zeros(best_k + 1, np.int64)
    w = work
    for k in range(best_k, -1, -1):
        target = d_all[k, w]
        c = c_all[k]
        found = False
        for y in range(ymax_all[k] + 1):
            rest = w - y
            if rest <= 0:
                base = 0.0
            elif k == 0:
                base = np.inf
            else:
                base = d_all[k - 1, rest]
            if base + c[y] <= target * (1.0 + TIE):
                ys[k] = y
                w = max(rest, 0)
                found = True
                break
        if not found:
            raise RuntimeError("backtrack found no matching choice")
    return ys


@njit(cache=True, nogil=True)
def _materialise(
    wside: Side, pside: Side, t0: int, ys: I64, zt: I64
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """Per-server workers ``(n, H)`` and PS ``(n, K)`` for ``ys`` workers per slot."""
    n = ys.shape[0]
    workers = np.zeros((n, wside[2].shape[0]), np.int32)
    ps = np.zeros((n, pside[2].shape[0]), np.int32)
    for k in range(n):
        if ys[k] == 0:
            continue
        unit_w, room_w = offers(wside, t0 + k)
        unit_p, room_p = offers(pside, t0 + k)
        if place(unit_w, room_w, ys[k], workers[k]) != ys[k]:
            raise RuntimeError("workers do not fit where the search placed them")
        if place(unit_p, room_p, zt[ys[k]], ps[k]) != zt[ys[k]]:
            raise RuntimeError("PS do not fit where the search placed them")
    return workers, ps


def _cost_lower_bound(job: Job, ledger: Ledger) -> float:
    """A lower bound on the cost of one worker-slot in any slot: the cheapest worker
    plus the least PS share per worker, all at the floor prices ``L[r]`` (as priced)."""
    alpha = float(np.exp(ledger.worker_side.log_l) @ job.worker)
    beta = float(np.exp(ledger.ps_side.log_l) @ job.ps)
    y = np.arange(1, job.chunks + 1)
    share = float((job.ps_needed(y) / y).min())
    return (alpha + beta * share) * _LB_SLACK


def best_schedule(
    job: Job, ledger: Ledger, first_slot: int, last_slot: int, arrival: int | None = None
) -> BestSchedule:
    """The payoff-maximising schedule of ``job`` in slots ``first_slot .. last_slot``.

    Args:
        job: the job, validated against the ledger's cluster.
        ledger: allocations and prices before the job.
        first_slot: the first slot it may use (absolute, inside the ledger's window): its
            arrival ``a``, or a later slot for a job that waited.
        last_slot: the latest slot it may use (absolute, inside the window).
        arrival: the slot ``a`` its completion time counts from (``jct = t_end - a + 1``);
            None: ``first_slot``. A job decided again after waiting keeps its arrival, so
            ending in slot ``t`` is worth ``f(t - a + 1)``: still non-increasing in ``t``,
            so the forward pass stays exact.
    """
    t0 = ledger.index(first_slot)
    n_slots = ledger.index(last_slot) - t0 + 1
    wside = ledger.worker_side.kernel_view(job.worker)
    pside = ledger.ps_side.kernel_view(job.ps)
    lb_unit = _cost_lower_bound(job, ledger)
    best, _ = search(job, wside, pside, ledger.touched, t0, n_slots, first_slot, lb_unit, arrival)
    return best


def search(
    job: Job,
    wside: Side,
    pside: Side,
    touched: NDArray[np.bool_],
    t0: int,
    n_slots: int,
    first_slot: int,
    lb_unit: float,
    arrival: int | None = None,
) -> tuple[BestSchedule, F64]:
    """The search of :func:`best_schedule` against any non-negative unit prices.

    Args:
        job: the job.
        wside, pside: ``(price, used, capacity, demand)`` of the worker and PS servers
            (:mod:`pricing.placement`): ``price`` ``(S, n, R)`` >= 0, utility per unit
            per slot; ``used`` ``(S, n, R)``, amounts that leave less room.
        touched: ``(S,)`` bool; False only where the slot's prices and amounts equal
            those of every other False slot (they then share one cost curve).
        t0: window index of ``first_slot``; ``n_slots``: slots the job may use from it.
        first_slot: the first slot it may use, the absolute slot of window index ``t0``.
        lb_unit: a lower bound on the cost of one worker-slot (with its PS) in any of
            these slots; 0 is always valid.
        arrival: the slot its completion time counts from (:func:`best_schedule`);
            None: ``first_slot``.

    Returns:
        The best schedule, and ``(n_slots,)`` float64 upper bounds on the payoff of any
        schedule whose last worker slot is ``t = first_slot + k`` (``-inf`` where none is
        feasible): ``f(t - a + 1) - D_k[W]`` where the search computed the least cost
        ``D_k[W]``, and ``f(t - a + 1) - (W lb_unit)`` past the slot where it stopped.
    """
    ends = np.full(max(n_slots, 0), -np.inf)
    if n_slots < 1:
        return BestSchedule(None, None, None, None, None, 0), ends
    a = first_slot if arrival is None else arrival
    if a > first_slot:
        raise ValueError(f"arrival {a} is after the first slot {first_slot}")
    work = job.work
    zt = job.ps_table()
    util = job.utility.values(np.arange(1, n_slots + 1) + (first_slot - a))
    d_all = np.empty((n_slots, work + 1))
    c_all = np.empty((n_slots, job.chunks + 1))
    ymax_all = np.empty(n_slots, np.int64)
    best_k, _, scanned = _search(
        wside, pside, touched, t0, work, zt, util, lb_unit, d_all, c_all, ymax_all
    )
    ends[:scanned] = util[:scanned] - d_all[:scanned, work]
    ends[scanned:] = util[scanned:] - work * lb_unit
    if best_k < 0:
        return BestSchedule(None, None, None, None, None, int(scanned)), ends
    ys = _backtrack(d_all, c_all, ymax_all, best_k, work)
    workers, ps = _materialise(wside, pside, t0, ys, zt)
    schedule = Schedule(first_slot, workers, ps)
    cost = float(sum(c_all[k, ys[k]] for k in range(ys.shape[0])))
    jct = schedule.end - a + 1
    utility = float(job.utility.values(jct))
    return BestSchedule(utility - cost, schedule, cost, jct, utility, int(scanned)), ends


def payoff_ceiling(job: Job, ledger: Ledger, first_slot: int, arrival: int) -> float:
    """An upper bound on the payoff of ``job`` starting no earlier than ``first_slot``, at
    any prices the ledger's bounds allow: its utility when it ends as early as it can,
    ``f(first_slot + d_min - arrival)``, less its work at the floor price ``L``. Prices
    never fall below ``L``, so when this is not positive the job can never pay off."""
    utility = float(job.utility.values(first_slot - arrival + job.min_slots))
    return utility - job.work * _cost_lower_bound(job, ledger)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel the search uses, on a tiny
    instance, so the first real decision is not charged for it."""
    from pricing.cluster import cluster_from_dict
    from pricing.job import job_from_dict
    from pricing.prices import oracle_bounds

    cluster = cluster_from_dict(
        ["cpu", "bandwidth"],
        [
            {"name": "w", "kind": "worker", "capacity": {"cpu": 2, "bandwidth": 2}},
            {"name": "p", "kind": "ps", "capacity": {"cpu": 2, "bandwidth": 2}},
        ],
    )
    job = job_from_dict(
        {
            "id": "warm-up",
            "arrival": 0,
            "epochs": 1,
            "chunks": 2,
            "minibatches": 1,
            "tau": 1.0,
            "grad_mb": 1.0,
            "worker": {"cpu": 1, "bandwidth": 1},
            "ps": {"cpu": 1, "bandwidth": 1},
            "utility": {"kind": "sigmoid", "priority": 1, "decay": 0, "target": 1},
        },
        cluster,
        slot_seconds=3600.0,
        slots_available=lambda a: 2 - a,
    )
    bounds = oracle_bounds([job], cluster, 2, {job.id: 2})
    best_schedule(job, Ledger(cluster, bounds, 2), 0, 1)
