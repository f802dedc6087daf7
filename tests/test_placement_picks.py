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


def _reference_curve(unit: np.ndarray, room: np.ndarray, limit: int) -> tuple[list[float], int]:
    """SPEC 5's greedy fill in plain Python: every server in a stable sort by unit price
    (ties to the server listed first), each taking what fits, summed in that order."""
    curve, acc, q = [0.0], 0.0, 0
    for h in sorted(range(len(unit)), key=lambda i: float(unit[i])):
        for _ in range(min(int(room[h]), limit - q)):
            acc += float(unit[h])
            q += 1
            curve.append(acc)
        if q >= limit:
            break
    return curve, q


@pytest.mark.parametrize("seed", range(40))
def test_the_curve_is_the_greedy_fill_over_every_server(seed: int) -> None:
    """The compiled curve sorts only the servers with room; it must give the float sums
    of the fill over all servers, bit for bit, with full servers anywhere in the order."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 60))
    unit = rng.choice([0.25, 1.0, 3.0], n) if seed % 2 else rng.uniform(0.0, 5.0, n)
    full = rng.random(n) < rng.uniform(0.0, 1.0)  # from no server full to all of them
    room = np.where(full, 0, rng.integers(1, 5, n)).astype(np.int64)
    limit = int(rng.integers(0, 40))
    curve = np.full(limit + 1, -1.0)
    picks = np.empty((2, limit + 1), np.int64)
    fitted = cost_curve_picks(unit, room, limit, curve, picks)
    want, q = _reference_curve(unit, room, limit)
    assert fitted == q
    assert curve[: q + 1].tolist() == want


def test_a_server_over_its_capacity_within_the_slack_has_no_room_and_takes_nothing() -> None:
    """The ledger admits amounts up to a hair over a capacity (its slack for the room
    rule's rounding, :func:`pricing.ledger.capacity_slack`). Such a server offers no
    room, not a negative one: :func:`place` (a re-plan's placement) would take a
    negative count there and put that many more units on the next server."""
    from pricing.ledger import capacity_slack
    from pricing.placement import offers

    capacity = np.array([[8.0, 100.0], [8.0, 100.0]])  # two servers, two resources
    used = np.zeros((1, 2, 2))
    used[0, 0] = capacity[0] + capacity_slack(capacity[0])  # server 0: just over
    price = np.ones((1, 2, 2))
    demand = np.array([1.0, 10.0])
    unit, room = offers((price, used, capacity, demand), 0)
    assert room.tolist() == [0, 8]
    out = np.empty(2, np.int32)
    assert place(unit, room, 8, out) == 8
    assert out.tolist() == [0, 8]
