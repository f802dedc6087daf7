"""The search's frozen prefix and fixed points skip only updates that change nothing: on
replayed ledgers and on prices where some touched slots are cheaper than the untouched
ones, every value it computes is the float the plain DP over every slot computes
(issue 16)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from numpy.typing import NDArray

from pricing import Ledger
from pricing.admission import ADMIT_THRESHOLD
from pricing.best_schedule import (
    TIE,
    Side,
    _backtrack,
    _slot_cost_bounds,
    _slot_curve,
    best_schedule,
    search,
)
from pricing.job import Job
from pricing.placement import F64, I64
from pricing.utility import Table
from tests.test_lazy_prices import estimated
from tests.test_offline_colgen import _small


def _plain(
    job: Job, wside: Side, pside: Side, t0: int, n_slots: int, util: F64
) -> tuple[F64, F64, I64, int]:
    """The DP with no skipping and no stop: ``D`` ``(n, W + 1)``, curves ``(n, N + 1)``,
    largest ``y`` per slot ``(n,)`` and the best end (-1: none), by the search's tie rule."""
    work, zt = job.work, job.ps_table()
    d = np.empty((n_slots, work + 1))
    c = np.empty((n_slots, job.chunks + 1))
    ymax = np.empty(n_slots, np.int64)
    prev = np.full(work + 1, np.inf)
    prev[0] = 0.0
    best, best_k = -np.inf, -1
    for k in range(n_slots):
        picks = np.empty((2, 0), np.int64)  # none recorded
        ymax[k] = _slot_curve(wside, pside, t0 + k, zt, c[k], picks, picks)
        cur = prev.copy()
        for y in range(1, min(int(ymax[k]), work) + 1):
            cur[y:] = np.minimum(cur[y:], prev[: work + 1 - y] + c[k, y])
        d[k] = cur
        if cur[work] < np.inf:
            payoff = util[k] - cur[work]
            if best_k < 0 or payoff > best + TIE * max(abs(best), 1.0):
                best, best_k = payoff, k
        prev = cur
    return d, c, ymax, best_k


def _check(
    job: Job,
    wside: Side,
    pside: Side,
    touched: NDArray[np.bool_],
    t0: int,
    n: int,
    lb: float | F64,
    cheapest_idle: bool,
) -> tuple[int, int]:
    """Search and plain DP agree bit for bit; returns (slots scanned, best end)."""
    best, ends = search(job, wside, pside, touched, t0, n, t0, lb, None, None, cheapest_idle)
    util = job.utility.values(np.arange(1, n + 1))
    d, c, ymax, best_k = _plain(job, wside, pside, t0, n, util)
    scanned = best.slots_scanned
    assert np.array_equal(ends[:scanned], util[:scanned] - d[:scanned, job.work])
    # past the stop, a bound on the payoff of ending there (column generation prices
    # with it): never below the payoff the plain DP finds for that end
    exact = util[scanned:] - d[scanned:, job.work]
    assert np.all(ends[scanned:] >= exact - 1e-9 * np.abs(np.where(np.isfinite(exact), exact, 0)))
    if best_k < 0:
        assert best.schedule is None
        return scanned, best_k
    assert best.schedule is not None and best.jct == best_k + 1
    ys = _backtrack(d, np.arange(n), c, ymax, best_k, job.work)
    assert np.array_equal(best.schedule.workers.sum(axis=1), ys)
    assert best.cost == float(sum(c[k, ys[k]] for k in range(ys.shape[0])))
    return scanned, best_k


def _views(job: Job, ledger: Ledger) -> tuple[Side, Side]:
    w, p = ledger.worker_side, ledger.ps_side
    return (
        (w.price, w.used, w.capacity, np.ascontiguousarray(job.worker)),
        (p.price, p.used, p.capacity, np.ascontiguousarray(job.ps)),
    )


@pytest.mark.parametrize("seed", [5, 6])
def test_search_on_a_replayed_ledger_equals_the_plain_dp(seed: int) -> None:
    trace = _small(seed, jobs=40, servers=4, horizon=120, bounds="estimate")
    last = trace.horizon - 1
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    late_ends = 0
    for job in estimated(trace, ledger):
        now = best_schedule(job, ledger, job.arrival, last)
        wside, pside = _views(job, ledger)
        t0 = ledger.index(job.arrival)
        n = last - job.arrival + 1
        lb = _slot_cost_bounds(job, ledger, t0, t0 + n)
        _, best_k = _check(job, wside, pside, ledger.touched, t0, n, lb, True)
        assert now.jct == (None if best_k < 0 else best_k + 1)
        late_ends += best_k > 20
        if now.payoff is not None and now.payoff > ADMIT_THRESHOLD:
            assert now.schedule is not None
            ledger.admit(job.id, job.worker, job.ps, now.schedule)
    assert late_ends > 0  # some searches went far past the first slots


@pytest.mark.parametrize("seed", range(6))
def test_touched_slots_cheaper_than_untouched_ones_undo_the_freeze(seed: int) -> None:
    """Prices no ledger holds: some touched slots are cheaper than the untouched ones, so
    a prefix frozen under the untouched slots' curve must be computed again there."""
    rng = np.random.default_rng(seed)
    trace = _small(seed, jobs=6, servers=3, horizon=200)
    cluster = trace.cluster
    n = trace.horizon
    touched = rng.random(n) < 0.15
    sides = []
    for cap in (cluster.worker_capacity, cluster.ps_capacity):
        idle = rng.uniform(0.5, 2.0, cap.shape)
        price = np.broadcast_to(idle, (n, *cap.shape)).copy()
        used = np.zeros((n, *cap.shape))
        busy = np.flatnonzero(touched)
        price[busy] *= rng.uniform(0.3, 3.0, (busy.size, *cap.shape))
        used[busy] = cap * rng.uniform(0.0, 0.9, (busy.size, *cap.shape))
        sides.append((price, used, cap))
    for job in trace.jobs:
        wside = (*sides[0], np.ascontiguousarray(job.worker))
        pside = (*sides[1], np.ascontiguousarray(job.ps))
        _check(job, wside, pside, touched, 0, n, 0.0, False)
        # per-slot bounds: each slot's least cost per worker, so the search stops early
        # and the bounds past the stop vary (an expensive slot after cheap ones)
        util = job.utility.values(np.arange(1, n + 1))
        _, c, ymax, _ = _plain(job, wside, pside, 0, n, util)
        lb = np.array([min((c[k, y] / y for y in range(1, ymax[k] + 1)), default=np.inf)
                       for k in range(n)]) * (1.0 - 1e-9)  # fmt: skip
        _check(job, wside, pside, touched, 0, n, lb, False)


@pytest.mark.parametrize("seed", range(4))
def test_a_touched_slot_cheaper_for_one_worker_only_undoes_the_freeze(seed: int) -> None:
    """A touched slot whose curve is below the untouched one at ``y = 1`` alone (one cheap
    server with room for one worker, every other server dearer): the frozen prefix must
    still be computed again there, so the check of a touched curve covers every ``y``."""
    rng = np.random.default_rng(100 + seed)
    trace = _small(seed, jobs=6, servers=3, horizon=60)
    cluster = trace.cluster
    n = trace.horizon
    touched = np.zeros(n, bool)
    touched[rng.choice(np.arange(8, n), 6, replace=False)] = True
    busy = np.flatnonzero(touched)
    for job in trace.jobs:
        sides = []
        for cap, demand in ((cluster.worker_capacity, job.worker), (cluster.ps_capacity, job.ps)):
            idle = rng.uniform(0.5, 2.0, cap.shape)
            price = np.broadcast_to(idle, (n, *cap.shape)).copy()
            used = np.zeros((n, *cap.shape))
            sides.append((price, used, cap, np.ascontiguousarray(demand)))
        # touched: every worker server ten times dearer, but server 0 a tenth of its
        # untouched price with room for exactly one worker
        wprice, wused, wcap, _ = sides[0]
        wprice[busy] *= 10.0
        wprice[busy, 0] = wprice[0, 0] * 0.1
        wused[busy, 0] = np.where(job.worker > 0, wcap[0] - 1.5 * job.worker, 0.0)
        wside, pside = sides
        _check(job, wside, pside, touched, 0, n, 0.0, False)
        util = job.utility.values(np.arange(1, n + 1))
        _, c, _, _ = _plain(job, wside, pside, 0, n, util)
        k = int(busy[0])
        assert c[k, 1] < c[0, 1] and np.all(c[k, 2:] >= c[0, 2:])  # cheaper at y = 1 only


@pytest.mark.parametrize("cost", [1.0, 0.75, 1.5, 1e-7])
def test_a_later_end_wins_by_more_than_float_noise_only(cost: float) -> None:
    """One worker costs ``cost`` in slot 0 and ``gain`` less in slot 1 (the utility is
    flat at 1, so the payoff is at most 1 in magnitude): a gain of ``TIE / 10`` is noise
    (``TIE`` is relative to ``max(|best|, 1)``) and the earliest end stays; any larger
    gain, however small, moves it, also when per-slot cost bounds let the search stop
    early (an early stop may not pass over a gain of ``1e-8``)."""
    base = _small(0).jobs[0]
    job = replace(base, work=1, chunks=1, utility=Table((1.0,)))
    n = 3
    touched = np.ones(n, bool)
    r = int(np.argmax(job.worker))
    for gain, jct in ((TIE / 10, 1), (10 * TIE, 2), (1e-8, 2), (cost / 2, 2)):
        sides = []
        for demand in (job.worker, job.ps):
            price = np.zeros((n, 1, demand.shape[0]))
            used = np.zeros_like(price)
            sides.append((price, used, np.atleast_2d(demand * 4.0), np.ascontiguousarray(demand)))
        units = np.array([cost, cost - gain, 2 * cost])  # one worker, its PS free
        sides[0][0][:, 0, r] = units / job.worker[r]
        for lb in (0.0, units * (1.0 - 1e-9)):
            _check(job, sides[0], sides[1], touched, 0, n, lb, False)
            found, _ = search(job, sides[0], sides[1], touched, 0, n, 0, lb)
            assert found.payoff is not None and found.jct == jct, (gain, lb, found)


def test_a_frozen_search_over_untouched_slots_stops_at_a_run_end() -> None:
    """Every slot untouched and alike: ``D`` freezes after two slots, so the untouched
    slots after it cost no DP and the search tries to stop only at the end of each run of
    slots it derives prices for. The utility stays flat for 40 slots (later ends tie
    within the stop's slack, no stop), then halves: the search must stop at the end of
    the run where it fell, not scan the window to its end."""
    base = _small(0).jobs[0]
    job = replace(base, work=1, chunks=1, utility=Table((1.0,) * 40 + (0.5,)))
    n = 1000
    touched = np.zeros(n, bool)
    sides = []
    for demand, unit in ((job.worker, 0.1), (job.ps, 0.0)):
        r = int(np.argmax(demand))
        price = np.zeros((n, 1, demand.shape[0]))
        price[:, 0, r] = unit / demand[r]
        sides.append((price, np.zeros_like(price), np.atleast_2d(demand * 4.0), demand.copy()))
    runs: list[tuple[int, int]] = []

    def prepare(lo: int, hi: int, idle: bool) -> None:
        runs.append((lo, hi))

    found, ends = search(job, sides[0], sides[1], touched, 0, n, 0, 0.0, None, prepare)
    assert found.jct == 1 and found.payoff == pytest.approx(0.9)
    assert 40 < found.slots_scanned < n and runs[-1][1] == found.slots_scanned
    assert np.all(ends[found.slots_scanned :] <= 0.5)
    _check(job, sides[0], sides[1], touched, 0, n, 0.0, False)
