"""Server x slot grids binned to a bounded size, so a page never ships one cell per
server and slot (1,000 servers x 300 slots would be 300,000 cells).

Rows (servers) and columns (slots) are cut into at most ``max_rows`` and ``max_cols``
contiguous bins of near-equal size; each bin keeps the minimum, maximum and mean of the
cells it covers. Pure numpy: no store, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["LEVELS", "MAX_BINS", "BinnedGrid", "bin_edges", "bin_grid", "price_levels"]

MAX_BINS = 100
"""The default bound on rows and on columns of a binned grid."""
LEVELS = 255
"""A price's colour level is an integer 0 (the floor L) .. LEVELS (the top U)."""


def bin_edges(n: int, bins: int) -> NDArray[np.int64]:
    """``(min(n, bins) + 1,)`` int64: strictly increasing cut points from 0 to ``n``
    (``n >= 0``, ``bins >= 1``); bin ``k`` covers ``edges[k] .. edges[k + 1] - 1``."""
    count = max(1, min(n, bins))
    if n == 0:
        return np.zeros(1, np.int64)
    return np.round(np.linspace(0, n, count + 1)).astype(np.int64)


@dataclass(frozen=True)
class BinnedGrid:
    """A ``(rows, cols)`` grid reduced to bins.

    Attributes:
        row_edges: ``(R + 1,)`` cut points over the rows of the full grid.
        col_edges: ``(C + 1,)`` cut points over its columns.
        low, high, mean: ``(R, C)`` float64, the minimum, maximum and mean of each bin.
    """

    row_edges: NDArray[np.int64]
    col_edges: NDArray[np.int64]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    mean: NDArray[np.float64]


def bin_grid(values: NDArray[np.float64], max_rows: int = MAX_BINS,
             max_cols: int = MAX_BINS) -> BinnedGrid:  # fmt: skip
    """Bin ``values`` (``(rows, cols)``, finite, both dimensions >= 1) into at most
    ``max_rows x max_cols`` bins; see the module docstring."""
    rows, cols = values.shape
    if rows == 0 or cols == 0:
        raise ValueError(f"cannot bin an empty grid of shape {values.shape}")
    re = bin_edges(rows, max_rows)
    ce = bin_edges(cols, max_cols)
    starts_r, starts_c = re[:-1], ce[:-1]
    low = np.minimum.reduceat(np.minimum.reduceat(values, starts_r, axis=0), starts_c, axis=1)
    high = np.maximum.reduceat(np.maximum.reduceat(values, starts_r, axis=0), starts_c, axis=1)
    total = np.add.reduceat(np.add.reduceat(values, starts_r, axis=0), starts_c, axis=1)
    counts = np.outer(np.diff(re), np.diff(ce)).astype(np.float64)
    return BinnedGrid(re, ce, low, high, total / counts)


def price_levels(prices: NDArray[np.float64], floor: float, top: float) -> NDArray[np.int64]:
    """Prices (> 0) as integer levels ``0 .. LEVELS`` on the log scale from ``floor`` to
    ``top`` (both > 0), clipped to it; every level is 0 if ``top <= floor``."""
    span = math.log(top) - math.log(floor)
    if span <= 0:
        return np.zeros(prices.shape, np.int64)
    t = (np.log(np.maximum(prices, 1e-300)) - math.log(floor)) / span
    levels: NDArray[np.int64] = np.rint(np.clip(t, 0.0, 1.0) * LEVELS).astype(np.int64)
    return levels
