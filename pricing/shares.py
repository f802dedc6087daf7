"""Per-slot summaries of a side's amounts, compiled: the least share of each resource over
the servers, and whether anything is allocated (:mod:`pricing.ledger`).

One pass over ``(slots, n, R)`` amounts with no temporaries; the floats are those of the
numpy expressions they replace (an IEEE division per cell, then an exact ``min``)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from pricing.jit import kernel

__all__ = ["least_shares"]


@kernel
def least_shares(
    used: NDArray[np.float64],
    capacity: NDArray[np.float64],
    lo: int,
    hi: int,
    least: NDArray[np.float64],
    busy: NDArray[np.bool_],
) -> None:
    """For window slots ``lo .. hi - 1`` of ``used`` ``(S, n, R)`` against ``capacity``
    ``(n, R)``: ``least[t, r]`` (``(S, R)``) gets ``min_h used[t, h, r] / capacity[h, r]``,
    a share of 1 where the server lacks the resource (1 with no server), and ``busy[t]``
    (``(S,)``) whether any amount of the slot is not zero."""
    n, n_res = capacity.shape
    for t in range(lo, hi):
        any_used = False
        for r in range(n_res):
            least[t, r] = 1.0 if n == 0 else np.inf
        for h in range(n):
            for r in range(n_res):
                u = used[t, h, r]
                if u != 0.0:
                    any_used = True
                c = capacity[h, r]
                share = u / c if c > 0 else 1.0
                least[t, r] = min(least[t, r], share)
        busy[t] = any_used
