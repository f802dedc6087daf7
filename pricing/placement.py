"""Greedy placement within one slot (the paper's COST_t, SPEC 5), compiled with numba.

Within a slot, prices do not depend on the job being placed, so each server offers
``room`` units at a fixed ``unit`` price: filling the cheapest servers first is optimal.
Ties go to the server listed first (a stable sort).

A side is ``(price, used, capacity, demand)``: ``price`` and ``used`` are ``(S, n, R)``
float64 over the ledger's window (slot, server, resource), ``capacity`` is ``(n, R)`` and
``demand``, one unit's need, is ``(R,)``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from pricing.jit import kernel

__all__ = ["F64", "I64", "cost_curve", "cost_curve_picks", "offers", "place", "place_picks"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

_ROUNDING = 1e-9
_MAX_ROOM = 2**40
"""As :data:`pricing.job.MAX_ROOM`: a tiny demand on a large capacity fits more times than
an int64 holds (``math.floor`` of such a float is INT64_MIN in compiled code)."""


@kernel
def offers(side: tuple[F64, F64, F64, F64], slot: int) -> tuple[F64, I64]:
    """Per server of ``side = (price, used, capacity, demand)`` in window ``slot``: the
    price of one unit of ``demand`` (``(n,)`` float64, utility per slot) and the room,
    how many units fit (``(n,)`` int64: the minimum over demanded resources of
    ``floor(free / demand + 1e-9)``, at least 0 and at most ``2**40``)."""
    price, used, capacity, demand = side
    n_srv, n_res = capacity.shape
    unit = np.empty(n_srv)
    room = np.empty(n_srv, np.int64)
    for h in range(n_srv):
        u = 0.0
        k = _MAX_ROOM
        for r in range(n_res):
            d = demand[r]
            if d > 0.0:
                u += price[slot, h, r] * d
                q = (capacity[h, r] - used[slot, h, r]) / d + _ROUNDING
                if q < _MAX_ROOM:
                    k = min(k, math.floor(q))
        unit[h] = u
        room[h] = max(k, 0)
    return unit, room


@kernel
def cost_curve(
    unit: NDArray[np.float64], room: NDArray[np.int64], limit: int, curve: NDArray[np.float64]
) -> int:
    """Cheapest cost of ``q = 0 .. limit`` units, greedily; returns the most that fit.

    ``curve`` (length ``>= limit + 1``) receives ``curve[q]`` for every ``q`` up to the
    returned count; entries past it are left as they were.
    """
    return cost_curve_picks(unit, room, limit, curve, np.empty((2, 0), np.int64))


@kernel
def cost_curve_picks(
    unit: NDArray[np.float64],
    room: NDArray[np.int64],
    limit: int,
    curve: NDArray[np.float64],
    picks: NDArray[np.int64],
) -> int:
    """:func:`cost_curve`, also recording the servers it fills, in order.

    ``picks`` is ``(2, m)``: ``picks[0, i]`` is the ``i``-th server with room that the
    greedy fill reaches and ``picks[1, i]`` its room, for as many as fit in ``m``, then
    ``picks[0, i] = -1`` if there is space. With ``m >= limit + 1`` that is every server
    :func:`place` fills for any count up to ``limit`` (:func:`place_picks`).
    """
    # only servers with room take units: sort those alone (a stable sort of the subset
    # keeps their order, ties to the server listed first); on a busy cluster most
    # servers of a slot are full, and the sort was most of a slot's curve
    n_srv = unit.shape[0]
    candidates = np.empty(n_srv, np.int64)
    m = 0
    for h in range(n_srv):
        if room[h] > 0:
            candidates[m] = h
            m += 1
    candidates = candidates[:m]
    order = candidates[np.argsort(unit[candidates], kind="mergesort")]
    curve[0] = 0.0
    q = 0
    acc = 0.0
    n = 0
    for i in range(order.shape[0]):
        h = order[i]
        take = min(room[h], limit - q)
        if take > 0 and n < picks.shape[1]:
            picks[0, n] = h
            picks[1, n] = room[h]
            n += 1
        u = unit[h]
        for _ in range(take):
            acc += u
            q += 1
            curve[q] = acc
        if q >= limit:
            break
    if n < picks.shape[1]:
        picks[0, n] = -1
    return q


@kernel
def place_picks(picks: NDArray[np.int64], count: int, out: NDArray[np.int32]) -> int:
    """:func:`place` over the servers :func:`cost_curve_picks` recorded in ``picks``
    (``(2, m)``, ``m >= limit + 1``) for ``count <= limit``: the same units per server
    (``out``, ``(n,)``), without sorting again. Returns how many were placed."""
    out[:] = 0
    left = count
    for i in range(picks.shape[1]):
        h = picks[0, i]
        if h < 0 or left <= 0:
            break
        take = min(picks[1, i], left)
        out[h] = take
        left -= take
    return count - left


@kernel
def place(
    unit: NDArray[np.float64], room: NDArray[np.int64], count: int, out: NDArray[np.int32]
) -> int:
    """Put ``count`` units on the cheapest servers; ``out[n]`` gets the units per server.

    Returns how many were placed (less than ``count`` only if they do not fit).
    """
    order = np.argsort(unit, kind="mergesort")
    out[:] = 0
    left = count
    for i in range(order.shape[0]):
        if left <= 0:
            break
        h = order[i]
        take = min(room[h], left)
        out[h] = take
        left -= take
    return count - left
