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
- a prefix ``D[0 .. f]`` that a step with the untouched slots' curve gave back unchanged
  is *frozen*: it depends only on itself and that curve, so no later step with that
  curve, or with a curve no lower at any ``y`` (checked per touched slot), changes it,
  and later steps update only ``w > f``. Once all of ``D`` is frozen an untouched slot
  costs no DP at all (a priced-out job's search used to run the full window here: its
  ``D`` stops changing a few slots after its best end, but later ends tie within the
  early stop's slack). Every value is still the float the plain DP computes;
- the search ends once ``f(t + 1 - a + 1)`` minus a lower bound on any completion's
  cost cannot beat the best payoff found. The rest of the work costs at least, per
  worker-slot, the cheapest unit price per resource of each later slot's servers (from
  the ledger's least shares: prices rise with use), walked over the runs of later slots
  where that bound falls; and, since no slot is cheaper than an untouched one, at least
  what the untouched slots' shared cost curve charges for it (a covering DP over that
  curve). Prices never fall below ``L``, so the old floor-price bound is the weakest case;
- prices are derived from the amounts only for the slots the search scans, a run of
  slots at a time (:class:`pricing.ledger.Side`), so a change of bounds costs a decision
  no more than the slots it reads;
- the schedule is placed on the servers the greedy fill of each slot's cost curve
  reached (:func:`pricing.placement.cost_curve_picks`), so placing it reads no price
  and sorts nothing again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pricing.jit import kernel
from pricing.job import Job
from pricing.ledger import Ledger
from pricing.placement import F64, I64, cost_curve_picks, offers, place_picks
from pricing.prices import spread
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
        slots_priced: slots whose prices it derived (after a change of bounds), over
            both kinds of server.
    """

    payoff: float | None
    schedule: Schedule | None
    cost: float | None
    jct: int | None
    utility: float | None
    slots_scanned: int
    slots_priced: int = 0

    @property
    def completion_slot(self) -> int | None:
        """The last slot with a worker."""
        return None if self.schedule is None else self.schedule.end


# A side is (price (S, n, R), used (S, n, R), capacity (n, R), demand (R,)): one kind of
# server over the ledger's window and the job's demand per unit on it.
Side = tuple[F64, F64, F64, F64]


@kernel
def _slot_curve(
    wside: Side, pside: Side, slot: int, zt: I64, out: F64, picks_w: I64, picks_p: I64
) -> int:
    """``out[y] = cost_t(y)`` for ``y = 0 .. N`` (inf where it does not fit); returns the
    largest feasible ``y``. ``picks_w`` ``(2, N + 1)`` and ``picks_p`` ``(2, z(N) + 1)``
    receive the servers the greedy placement fills, in order
    (:func:`pricing.placement.cost_curve_picks`), to place the schedule without sorting
    again."""
    n_max = out.shape[0] - 1
    unit_w, room_w = offers(wside, slot)
    unit_p, room_p = offers(pside, slot)
    curve_w = np.empty(n_max + 1)
    curve_p = np.empty(zt[n_max] + 1)
    nw = cost_curve_picks(unit_w, room_w, n_max, curve_w, picks_w)
    np_ = cost_curve_picks(unit_p, room_p, zt[n_max], curve_p, picks_p)
    ymax = 0
    out[0] = 0.0
    for y in range(1, n_max + 1):
        if y <= nw and zt[y] <= np_:
            out[y] = curve_w[y] + curve_p[zt[y]]
            ymax = y
        else:
            out[y] = np.inf
    return ymax


@kernel
def _search(
    wside: Side,
    pside: Side,
    touched: NDArray[np.bool_],
    t0: int,
    work: int,
    zt: I64,
    util: F64,
    lb: F64,
    lb_rest: F64,
    cover: F64,
    cheapest_idle: bool,
    d_all: F64,
    rows: I64,
    c_all: F64,
    ymax_all: I64,
    picks_w: I64,
    picks_p: I64,
    src: I64,
    idle_curve: F64,
    state: F64,
    k_lo: int,
    k_hi: int,
) -> int:
    """Forward DP over slots ``t0 + k_lo .. t0 + k_hi - 1`` (window indices) of the
    ``n = len(util)`` slots from ``t0``, resuming where the call that ended at
    ``k_lo`` stopped (``k_lo = 0``: from the start).

    Fills ``d_all[rows[k]]`` (``(W + 1,)``: least cost of at least w worker-slots by slot
    k; a slot that leaves it unchanged shares the row of the slot before), ``c_all[k]``
    (``(N + 1,)``: the slot's cost curve) and ``ymax_all[k]``; ``picks_w[src[k]]`` and
    ``picks_p[src[k]]`` are the servers that place slot ``k``'s workers and PS
    (:func:`_slot_curve`; ``src[k]`` is ``k``, or the first untouched slot for an untouched
    one). ``lb[k]`` (``(n,)``)
    is a lower bound on the cost of one worker-slot in slot ``k``, ``lb_rest[k]`` its
    least over slots ``k .. n - 1``; ``cover`` ``(W + 1,)`` lower bounds on the cost of
    ``w`` worker-slots anywhere (zeros: none known), which with ``cheapest_idle`` the
    first untouched slot's curve tightens, with ``lb`` (:func:`_tighten_idle`).
    ``state`` (``(7,)``) carries ``best payoff, best k (-1: none), reach, idle ymax (-1:
    none), stopped, frozen, first untouched k`` between calls; ``idle_curve`` ``(N + 1,)``
    the cost curve of untouched slots. Returns the slots scanned so far; ``state[4]`` is 1
    once no later end can beat the best payoff found.

    ``frozen`` (-1: none) is the last ``w`` of a prefix ``D[0 .. frozen]`` that no slot can
    change any more (:func:`_freeze`): each step updates only ``w > frozen``, and once the
    whole of ``D`` is frozen a slot costs no DP at all. Every value is the float the plain
    DP computes: a skipped update is one whose result is known to be its input.
    """
    n_slots = util.shape[0]
    best = state[0]
    best_k = int(state[1])
    reach = int(state[2])
    idle_ymax = int(state[3])
    frozen = int(state[5])
    idle_k = int(state[6])
    if k_lo == 0:
        prev = np.full(work + 1, np.inf)
        prev[0] = 0.0
    else:
        prev = d_all[rows[k_lo - 1]]
    for k in range(k_lo, k_hi):
        slot = t0 + k
        c = c_all[k]
        idle = not touched[slot]
        if idle and idle_ymax >= 0:
            c[:] = idle_curve
            ymax = idle_ymax
            src[k] = idle_k
        else:
            ymax = _slot_curve(wside, pside, slot, zt, c, picks_w[k], picks_p[k])
            src[k] = k
            if idle:
                idle_curve[:] = c
                idle_ymax = ymax
                idle_k = k
                if cheapest_idle:
                    _tighten_idle(c, ymax, work, lb, lb_rest, cover)
            elif frozen >= 0 and not _dominates(c, idle_curve):
                frozen = -1  # this slot may lower the frozen prefix
        ymax_all[k] = ymax

        if frozen >= work:  # D is a fixed point of this slot
            rows[k] = rows[k - 1]
            cur = prev
        else:
            rows[k] = k
            cur = d_all[k]
            cur[:] = prev
            # w < y needs no update: cost_t rises with y, so choosing y = w covers it as
            # cheaply; w <= frozen would keep its value
            for y in range(1, ymax + 1):
                lo = max(y, frozen + 1)
                hi = min(work, reach + y) + 1
                if hi > lo:
                    _relax(cur[lo:hi], prev[lo - y : hi - y], c[y])
            if idle:
                frozen = _freeze(cur, prev, frozen, work)
        reach = min(work, reach + ymax)

        if cur[work] < np.inf:
            payoff = util[k] - cur[work]
            # only a gain beyond float noise moves the end: the earliest end wins ties
            if best_k < 0 or payoff > best + TIE * max(abs(best), 1.0):
                best = payoff
                best_k = k
        prev = cur
        # with D frozen, an untouched slot costs nothing: try to stop only before a
        # touched slot or the end of the run (the caller then derives more prices)
        if (
            k + 1 < n_slots
            and (frozen < work or touched[slot + 1] or k + 1 == k_hi)
            and _cannot_beat(cur, reach, work, util, lb, lb_rest, cover, k, best)
        ):
            _keep(state, best, best_k, reach, idle_ymax, 1.0, frozen, idle_k)
            return k + 1
    _keep(state, best, best_k, reach, idle_ymax, 0.0, frozen, idle_k)
    return k_hi


@kernel
def _relax(cur: F64, prev: F64, cy: float) -> None:
    """``cur[i] = min(cur[i], prev[i] + cy)`` (``cur`` and ``prev`` ``(m,)``, views of two
    DP rows, ``cy`` the cost of ``y`` workers in the slot). A loop over two views from
    index 0 is one the compiler vectorises; the same loop indexed ``w`` and ``w - y`` in
    the caller was not, and ran several times slower for the same floats."""
    for i in range(cur.shape[0]):
        cur[i] = min(cur[i], prev[i] + cy)


@kernel
def _freeze(cur: F64, prev: F64, frozen: int, work: int) -> int:
    """The frozen prefix after a step with the untouched slots' curve ``c``: ``frozen``
    extended over every ``w`` where the step left ``cur[w] == prev[w]``.

    ``cur[0 .. f]`` depends only on ``prev[0 .. f]`` and ``c``; when the step gave it back
    unchanged, every later step with ``c``, or with a curve no lower than ``c`` at any
    ``y`` (:func:`_dominates`: float addition is monotone), gives it back unchanged too."""
    w = frozen + 1
    while w <= work and cur[w] == prev[w]:
        w += 1
    return w - 1


@kernel
def _dominates(curve: F64, idle_curve: F64) -> bool:
    """True if ``curve[y] >= idle_curve[y]`` for every ``y`` (``(N + 1,)`` each; inf where
    ``y`` workers do not fit)."""
    return bool(np.all(curve[1:] >= idle_curve[1:]))


@kernel
def _rest_cost(cur: F64, reach: int, work: int, unit: float, cover: F64) -> float:
    """A lower bound on the cost of ``work`` worker-slots when those after the slot of
    ``cur`` cost at least ``unit`` each (inf: none fits) and ``w`` of them at least
    ``cover[w]``: ``min_w cur[w] + max((work - w) unit, cover[work - w])``."""
    lower: float = cur[work]
    for w in range(min(reach, work - 1) + 1):
        lower = min(lower, cur[w] + max((work - w) * unit, cover[work - w]))
    return lower


@kernel
def _tighten_idle(curve: F64, ymax: int, work: int, lb: F64, lb_rest: F64, cover: F64) -> None:
    """Tighten the bounds with the cost ``curve`` of an untouched slot, when no slot is
    cheaper (:func:`search`'s ``idle_cheapest``): raise every per-slot bound ``lb`` (and
    ``lb_rest``) to its least cost per worker, and set ``cover[w]`` (``(W + 1,)``) to the
    least cost of ``w`` worker-slots in any number of slots priced like it (inf when not
    one worker fits), a lower bound on ``w`` worker-slots anywhere."""
    unit = np.inf
    for y in range(1, ymax + 1):
        unit = min(unit, curve[y] / y * _LB_SLACK)
    n = lb.shape[0]
    least = np.inf
    for j in range(n - 1, -1, -1):
        lb[j] = max(lb[j], unit)
        least = min(least, lb[j])
        lb_rest[j] = least
    cover[0] = 0.0
    for w in range(1, work + 1):
        low = np.inf
        for y in range(1, ymax + 1):
            low = min(low, cover[max(w - y, 0)] + curve[y])
        cover[w] = low * _LB_SLACK


_MAX_RUNS = 8
"""Runs of slots, each with one lower bound, that :func:`_cannot_beat` tries."""


@kernel
def _cannot_beat(
    cur: F64, reach: int, work: int, util: F64, lb: F64, lb_rest: F64, cover: F64, k: int,
    best: float,
) -> bool:  # fmt: skip
    """True if no end after slot ``k`` can beat the payoff ``best``.

    An end ``j > k`` costs at least ``min_w cur[w] + (work - w) min(lb[k + 1 .. j])``
    (and ``cur[w] + cover[work - w]``, :func:`_tighten_idle`), and
    is worth ``util[j]``, which does not rise with ``j``. First with the least bound over
    every later slot; then, walking the later slots, once per slot where their running
    least bound falls (the first end of such a run is worth the most in it), at most
    ``_MAX_RUNS`` times, up to the run of the least bound of all; an end worth no more
    than ``best`` ends the walk (costs are >= 0). False when it cannot tell."""
    if util[k + 1] - _rest_cost(cur, reach, work, lb_rest[k + 1], cover) <= best:
        return True
    least = np.inf
    runs = 0
    for j in range(k + 1, util.shape[0]):
        if util[j] <= best:
            return True
        if lb[j] < least:
            least = lb[j]
            runs += 1
            if runs > _MAX_RUNS or util[j] - _rest_cost(cur, reach, work, least, cover) > best:
                return False
            if least <= lb_rest[k + 1]:  # the least of all: no later run is cheaper
                return True
    return True


@kernel
def _keep(
    state: F64,
    best: float,
    best_k: int,
    reach: int,
    idle_ymax: int,
    stop: float,
    frozen: int,
    idle_k: int,
) -> None:
    """Store the search's state between runs of slots (see :func:`_search`)."""
    state[0] = best
    state[1] = best_k
    state[2] = reach
    state[3] = idle_ymax
    state[4] = stop
    state[5] = frozen
    state[6] = idle_k


@kernel
def _backtrack(d_all: F64, rows: I64, c_all: F64, ymax_all: I64, best_k: int, work: int) -> I64:
    """Workers per slot of a schedule reaching ``d_all[rows[best_k]][work]`` (slot ``k``'s
    DP is row ``rows[k]`` of ``d_all``, :func:`_search`).

    Walking back from the last slot, the smallest ``y`` whose cost is within a relative
    ``TIE`` of the least wins: equal-cost splits (common, since untouched slots share
    prices) then go the same way whatever float noise the summation order leaves, and
    work goes as early as it can."""
    ys = np.zeros(best_k + 1, np.int64)
    w = work
    for k in range(best_k, -1, -1):
        target = d_all[rows[k], w]
        c = c_all[k]
        found = False
        for y in range(ymax_all[k] + 1):
            rest = w - y
            if rest <= 0:
                base = 0.0
            elif k == 0:
                base = np.inf
            else:
                base = d_all[rows[k - 1], rest]
            if base + c[y] <= target * (1.0 + TIE):
                ys[k] = y
                w = max(rest, 0)
                found = True
                break
        if not found:
            raise RuntimeError("backtrack found no matching choice")
    return ys


@kernel
def _materialise(
    picks_w: I64, picks_p: I64, src: I64, ys: I64, zt: I64, n_w: int, n_p: int
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """Per-server workers ``(n, n_w)`` and PS ``(n, n_p)`` for ``ys`` workers per slot,
    placed on the servers the search's greedy fill of each slot picked (:func:`_search`'s
    ``picks_w``, ``picks_p``, ``src``): what :func:`pricing.placement.place` gives."""
    n = ys.shape[0]
    workers = np.zeros((n, n_w), np.int32)
    ps = np.zeros((n, n_p), np.int32)
    for k in range(n):
        if ys[k] == 0:
            continue
        j = src[k]
        if place_picks(picks_w[j], ys[k], workers[k]) != ys[k]:
            raise RuntimeError("workers do not fit where the search placed them")
        if place_picks(picks_p[j], zt[ys[k]], ps[k]) != zt[ys[k]]:
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


def _slot_cost_bounds(job: Job, ledger: Ledger, lo: int, hi: int) -> F64:
    """``(hi - lo,)``: per window slot, a lower bound on the cost of one worker-slot
    there: the cheapest unit price of each resource over the slot's servers (whether or
    not they have room) for the worker, plus the least PS share per worker at the PS
    servers' cheapest prices. Derived from the least shares, no price array is read."""
    alpha = ledger.worker_side.min_unit_price(job.worker, lo, hi)
    beta = ledger.ps_side.min_unit_price(job.ps, lo, hi)
    y = np.arange(1, job.chunks + 1)
    share = float((job.ps_needed(y) / y).min())
    out: F64 = (alpha + beta * share) * _LB_SLACK
    return out


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

    Prices are derived (:class:`pricing.ledger.Side`) only for the slots the search
    scans, a run of slots at a time, so the search's early stop also bounds the cost of
    a change of bounds; :attr:`BestSchedule.slots_priced` counts them.
    """
    t0 = ledger.index(first_slot)
    n_slots = ledger.index(last_slot) - t0 + 1
    sides = (ledger.worker_side, ledger.ps_side)
    derived = ledger.worker_side.derived + ledger.ps_side.derived

    def prepare(lo: int, hi: int, idle: bool) -> None:
        for side in sides:
            side.prices(lo, hi, idle)

    wside = (*ledger.worker_side.kernel_view(job.worker, t0, t0),)
    pside = (*ledger.ps_side.kernel_view(job.ps, t0, t0),)
    lb = _slot_cost_bounds(job, ledger, t0, t0 + n_slots)
    rising = all((side.log_u >= side.log_l).all() for side in sides)  # prices rise with use
    best, _ = search(
        job, wside, pside, ledger.touched, t0, n_slots, first_slot, lb, arrival, prepare, rising
    )
    priced = ledger.worker_side.derived + ledger.ps_side.derived - derived
    return BestSchedule(best.payoff, best.schedule, best.cost, best.jct, best.utility,
                        best.slots_scanned, priced)  # fmt: skip


_FIRST_RUN = 32
"""Slots the search scans before it derives more prices; each later run is twice as long."""


def search(
    job: Job,
    wside: Side,
    pside: Side,
    touched: NDArray[np.bool_],
    t0: int,
    n_slots: int,
    first_slot: int,
    lb_unit: float | F64,
    arrival: int | None = None,
    prepare: Callable[[int, int, bool], None] | None = None,
    cheapest_idle: bool = False,
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
            these slots, or ``(n_slots,)``, one per slot; 0 is always valid.
        arrival: the slot its completion time counts from (:func:`best_schedule`);
            None: ``first_slot``.
        prepare: called as ``prepare(lo, hi, False)`` before the search reads prices of
            window slots ``lo .. hi - 1``, of which it reads only the touched slots and
            one untouched slot (None: prices are ready). Placing the schedule reads no
            price: it uses the servers the search's greedy fill picked.
        cheapest_idle: True if no slot costs less than an untouched one for any number
            of workers (prices rise with use, as in a ledger): the first untouched slot's
            cost curve then bounds the cost of the rest of the work, so the search may
            stop sooner.

    Returns:
        The best schedule, and ``(n_slots,)`` float64 upper bounds on the payoff of any
        schedule whose last worker slot is ``t = first_slot + k`` (``-inf`` where none is
        feasible): ``f(t - a + 1) - D_k[W]`` where the search computed the least cost
        ``D_k[W]``, and ``f(t - a + 1) - W min(lb_unit[:k + 1])`` past the slot where it
        stopped.
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
    lb = np.array(spread(lb_unit, (n_slots,)))  # a copy
    lb_rest = np.ascontiguousarray(np.minimum.accumulate(lb[::-1])[::-1])
    cover = np.zeros(work + 1)
    d_all = np.empty((n_slots, work + 1))
    rows = np.empty(n_slots, np.int64)
    c_all = np.empty((n_slots, job.chunks + 1))
    ymax_all = np.empty(n_slots, np.int64)
    picks_w = np.empty((n_slots, 2, job.chunks + 1), np.int64)
    picks_p = np.empty((n_slots, 2, int(zt[job.chunks]) + 1), np.int64)
    src = np.empty(n_slots, np.int64)
    idle_curve = np.empty(job.chunks + 1)
    state = np.array([-np.inf, -1.0, 0.0, -1.0, 0.0, -1.0, -1.0])
    scanned, run = 0, _FIRST_RUN
    while scanned < n_slots and not state[4]:
        hi = n_slots if prepare is None else min(n_slots, scanned + run)
        if prepare is not None:
            prepare(t0 + scanned, t0 + hi, False)
        args = (wside, pside, touched, t0, work, zt, util, lb, lb_rest, cover, cheapest_idle,
                d_all, rows, c_all, ymax_all, picks_w, picks_p, src)  # fmt: skip
        scanned = _search(*args, idle_curve, state, scanned, hi)
        run *= 2
    best_k = int(state[1])
    ends[:scanned] = util[:scanned] - d_all[rows[:scanned], work]
    ends[scanned:] = util[scanned:] - work * np.minimum.accumulate(lb)[scanned:]
    if best_k < 0:
        return BestSchedule(None, None, None, None, None, int(scanned)), ends
    ys = _backtrack(d_all, rows, c_all, ymax_all, best_k, work)
    n_w, n_p = wside[2].shape[0], pside[2].shape[0]
    workers, ps = _materialise(picks_w, picks_p, src, ys, zt, n_w, n_p)
    schedule = Schedule(first_slot, workers, ps)
    cost = 0.0  # summed slot by slot, in order (as sum() of the slots' costs was)
    for part in c_all[np.arange(ys.shape[0]), ys].tolist():
        cost += part
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
    """Compile (or load from numba's cache) every kernel the search and a rejection's
    explanation use, on a tiny instance, so the first real decision is not charged for
    it."""
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
    from pricing.explain import price_drivers

    bounds = oracle_bounds([job], cluster, 2, {job.id: 2})
    ledger = Ledger(cluster, bounds, 2)
    price_drivers(best_schedule(job, ledger, 0, 1), job, ledger)  # its kernel too
