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

from pricing.best_schedule import _LB_SLACK, _rest_cost, _tighten_idle


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
