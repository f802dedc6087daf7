"""The servers the greedy fill records while building a slot's cost curve place any count
up to its limit exactly as :func:`pricing.placement.place` does (issue 16: the schedule is
placed without sorting every slot's servers again)."""

from __future__ import annotations

import numpy as np
import pytest

from pricing.placement import cost_curve, cost_curve_picks, place, place_picks


@pytest.mark.parametrize("seed", range(20))
def test_picks_place_as_place_does(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    unit = rng.choice([0.5, 1.0, 1.5, 2.0], n) if seed % 2 else rng.uniform(0.1, 3.0, n)
    room = rng.integers(0, 4, n).astype(np.int64)  # ties and servers with no room
    limit = int(rng.integers(0, 30))
    curve, again = np.full(limit + 1, -1.0), np.full(limit + 1, -1.0)
    picks = np.empty((2, limit + 1), np.int64)
    fitted = cost_curve_picks(unit, room, limit, curve, picks)
    assert fitted == cost_curve(unit, room, limit, again)
    assert np.array_equal(curve, again)
    for count in range(fitted + 1):
        want, got = np.empty(n, np.int32), np.empty(n, np.int32)
        assert place_picks(picks, count, got) == place(unit, room, count, want) == count
        assert np.array_equal(got, want)
