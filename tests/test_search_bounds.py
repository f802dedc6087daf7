"""The lower bounds the search stops on (:mod:`pricing.best_schedule`) are lower bounds,
and tight: checked against an independent brute force on small random cost curves.

The exhaustive tests compare whole decisions with a brute force, but a bound that is a
little too high only stops the search early on some instances, which random traces
seldom reach (a mutation audit: ``cover`` computed one worker-slot too high passed every
test). So the bounds are checked directly: ``cover[w]`` (the least cost of ``w``
worker-slots in any number of slots priced like an untouched one) must equal, up to the
search's slack, the least cost a plain enumeration finds, and never exceed it; the
per-slot bounds must not exceed any slot's cost per worker.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from pricing import Ledger
from pricing.admission import ADMIT_THRESHOLD
from pricing.best_schedule import (
    _LB_SLACK,
    _cost_lower_bound,
    _rest_cost,
    _slot_cost_bounds,
    _slot_curve,
    _tighten_idle,
    best_schedule,
    payoff_ceiling,
)
from tests.test_offline_colgen import _small


def _curve(rng: np.random.Generator, chunks: int) -> tuple[np.ndarray, int]:
    """A slot's cost curve ``(N + 1,)``: 0 at ``y = 0``, rising with ``y`` (per-worker
    costs in any order: not convex), inf past the most that fit; and that most."""
    ymax = int(rng.integers(1, chunks + 1))
    curve = np.full(chunks + 1, np.inf)
    curve[0] = 0.0
    curve[1 : ymax + 1] = np.cumsum(rng.uniform(0.1, 5.0, ymax))
    return curve, ymax


def _least_cover(curve: np.ndarray, ymax: int, work: int) -> list[float]:
    """``[w]``: the least cost of at least ``w`` worker-slots in any number of slots of
    ``curve``, by enumerating the first slot's count (plain recursion)."""

    @functools.cache
    def least(w: int) -> float:
        if w <= 0:
            return 0.0
        return min(float(curve[y]) + least(w - y) for y in range(1, ymax + 1))

    return [least(w) for w in range(work + 1)]


@pytest.mark.parametrize("seed", range(40))
def test_cover_is_the_least_cost_of_w_worker_slots_and_lb_a_per_worker_floor(seed: int) -> None:
    rng = np.random.default_rng(9100 + seed)
    chunks = int(rng.integers(1, 6))
    work = int(rng.integers(1, 16))
    curve, ymax = _curve(rng, chunks)
    unit = min(float(curve[y]) / y for y in range(1, ymax + 1))
    n = int(rng.integers(1, 6))
    lb = rng.uniform(0.0, 0.99, n) * unit  # weaker bounds than the curve's: raised to it
    lb_rest = np.minimum.accumulate(lb[::-1])[::-1].copy()
    cover = np.zeros(work + 1)
    _tighten_idle(curve, ymax, work, lb, lb_rest, cover)

    brute = _least_cover(curve, ymax, work)
    for w in range(work + 1):
        assert cover[w] <= brute[w], (seed, w, cover[w], brute[w])  # a lower bound
        assert cover[w] >= brute[w] * (1.0 - 1e-8), (seed, w, cover[w], brute[w])  # tight
    assert np.all(lb <= unit) and np.all(lb >= unit * (1.0 - 1e-8))
    assert np.array_equal(lb_rest, np.minimum.accumulate(lb[::-1])[::-1])


@pytest.mark.parametrize("seed", range(40))
def test_rest_cost_never_exceeds_a_completion_it_bounds(seed: int) -> None:
    """``_rest_cost(cur, reach, W, unit, cover)`` bounds from below the cost of every
    completion: ``cur[w]`` spent so far, and ``W - w`` more worker-slots each costing at
    least ``unit`` and together at least ``cover[W - w]``. Checked against completions
    by whole slots of the curve (cost ``brute[W - w]`` and at least ``unit`` each)."""
    rng = np.random.default_rng(9300 + seed)
    chunks = int(rng.integers(1, 6))
    work = int(rng.integers(1, 16))
    curve, ymax = _curve(rng, chunks)
    lb, lb_rest, cover = np.zeros(1), np.zeros(1), np.zeros(work + 1)
    _tighten_idle(curve, ymax, work, lb, lb_rest, cover)
    unit = float(lb[0])
    reach = int(rng.integers(0, work + 1))
    cur = np.full(work + 1, np.inf)
    cur[0] = 0.0
    cur[1 : reach + 1] = np.cumsum(rng.uniform(0.1, 5.0, reach))
    brute = _least_cover(curve, ymax, work)
    bound = _rest_cost(cur, reach, work, unit, cover)
    best = min(
        (float(cur[w]) + brute[work - w] for w in range(reach + 1) if math.isfinite(cur[w])),
        default=math.inf,
    )
    assert bound <= best, (seed, bound, best)
    assert bound >= best * _LB_SLACK * (1.0 - 1e-8), (seed, bound, best)  # tight


@pytest.mark.parametrize("seed", range(3))
def test_the_payoff_ceiling_bounds_every_search_and_the_slot_bounds_every_cost(
    seed: int,
) -> None:
    """:func:`payoff_ceiling` (the waiting queue drops a job when it is not positive) is
    never below the payoff the search finds from that slot, on an idle cluster, where
    every price is its floor ``L`` and a fast job's ceiling is nearly reached, and as jobs
    fill it; and the per-slot bounds the search stops on never exceed a slot's cost per
    worker of the schedule it returns."""
    trace = _small(seed, jobs=20, servers=4, horizon=60)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    last = trace.horizon - 1
    checked = 0
    for job in trace.jobs:
        for wait in (0, 1, 3):
            first = job.arrival + wait
            if first > last:
                continue
            best = best_schedule(job, ledger, first, last, job.arrival)
            ceiling = payoff_ceiling(job, ledger, first, job.arrival)
            if best.payoff is None or best.schedule is None:
                continue
            assert best.payoff <= ceiling + 1e-9 * max(1.0, abs(ceiling)), (job.id, wait)
            t0 = ledger.index(first)
            lb = _slot_cost_bounds(job, ledger, t0, t0 + best.schedule.slots)
            counts = best.schedule.worker_counts()
            ws, ps = ledger.worker_side, ledger.ps_side
            ws.prices(0, ledger.length)
            ps.prices(0, ledger.length)
            for k in np.flatnonzero(counts):
                slot = t0 + k
                cost = best.schedule.workers[k] @ (ws.price[slot] @ job.worker)
                cost += best.schedule.ps[k] @ (ps.price[slot] @ job.ps)
                assert lb[k] * counts[k] <= cost * (1 + 1e-12), (job.id, k)
            checked += 1
        best = best_schedule(job, ledger, job.arrival, last)
        if best.payoff is not None and best.payoff > ADMIT_THRESHOLD:
            assert best.schedule is not None
            ledger.admit(job.id, job.worker, job.ps, best.schedule)
    assert checked >= 12


@pytest.mark.parametrize("seed", range(3))
def test_on_an_idle_cluster_the_floor_bounds_are_the_least_cost_per_worker(seed: int) -> None:
    """On an idle cluster every price is its floor ``L``, so the bound of one
    worker-slot at floor prices (:func:`payoff_ceiling`'s) and each slot's bound are the
    least of ``cost_t(y) / y`` over every ``y`` that fits, up to the search's slack: no
    higher (a bound), and no lower than the slack (the PS share is the least over ``y``,
    not the share of one worker). Jobs whose ``N`` workers do not all fit in a slot are
    skipped: the bounds take the least share over every ``y <= N``."""
    trace = _small(seed, jobs=30, servers=12, horizon=8)
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    for side in (ledger.worker_side, ledger.ps_side):
        side.prices(0, ledger.length)
    uneven = 0
    for job in trace.jobs:
        zt = job.ps_table()
        views = [
            (side.price, side.used, side.capacity, np.ascontiguousarray(demand))
            for side, demand in ((ledger.worker_side, job.worker), (ledger.ps_side, job.ps))
        ]
        curve = np.empty(job.chunks + 1)
        none = np.empty((2, 0), np.int64)
        ymax = _slot_curve(views[0], views[1], 0, zt, curve, none, none)
        if ymax < job.chunks:
            continue
        least = min(curve[y] / y for y in range(1, ymax + 1))
        for bound in (_cost_lower_bound(job, ledger), *_slot_cost_bounds(job, ledger, 0, 8)):
            assert least * _LB_SLACK * (1 - 1e-12) <= bound <= least, job.id
        uneven += len({zt[y] / y for y in range(1, ymax + 1)}) > 1
    assert uneven > 0  # some job's PS share per worker depends on y
