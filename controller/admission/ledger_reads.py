"""The ledger's prices and use as monitoring reads them, in numpy, without a Python float
per cell: at 10,000 servers x 300 slots x 5 resources a read that listed every cell built
15 million floats in the decision thread (1.3 s a metrics scrape, 0.85 s a one-server
``GetPrices`` of the window), while every tenant's call waited.

Each function runs in the decision thread (between two ledger changes) and costs numpy
work over the slots and servers it is asked for; only what is returned becomes Python
objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from controller.admission.price_pages import ROW_OVERHEAD_BYTES
from pricing.cluster import Cluster
from pricing.ledger import Ledger, Side

__all__ = ["PriceBlock", "SidePrices", "in_service_use", "price_blocks", "price_summary"]


@dataclass(frozen=True)
class SidePrices:
    """One kind of server's prices now and at their peak ahead.

    Attributes:
        kind: ``"worker"`` or ``"ps"``.
        names: ``n`` server names, in the cluster's order.
        now: ``(n, R)`` float64, the unit price in the first slot read (utility per unit
            per slot).
        peak: ``(R,)`` float64, the highest unit price over the servers that have the
            resource and the slots read, each where its server is in service; 0 where
            none is. A failed or cordoned server's cells are priced as full (nothing
            there is for sale): counted, a cordon of one idle server raised the peak of
            every resource of its kind (cpu 0.115 -> 3.48) as if demand had.
        has: ``(n, R)`` bool, the server has some of the resource (capacity > 0): a
            resource a server lacks has no price to show.
        serving: ``(n,)`` bool, the server is in service in the first slot read.
    """

    kind: str
    names: list[str]
    now: NDArray[np.float64]
    peak: NDArray[np.float64]
    has: NDArray[np.bool_]
    serving: NDArray[np.bool_]


def _sides(ledger: Ledger, cluster: Cluster) -> tuple[tuple[str, Side, tuple[str, ...]], ...]:
    return (
        ("worker", ledger.worker_side, cluster.worker_names),
        ("ps", ledger.ps_side, cluster.ps_names),
    )


def price_summary(ledger: Ledger, cluster: Cluster, lo: int, hi: int) -> list[SidePrices]:
    """Per kind of server, unit prices in window slot ``lo`` and their peak over window
    slots ``lo .. hi - 1`` (``hi > lo``). ``O(S n R)`` numpy work for the ``S`` slots
    read (prices derived where stale, as any read derives them)."""
    out = []
    for kind, side, names in _sides(ledger, cluster):
        cells = side.prices(lo, hi)[lo:hi]  # (S, n, R)
        has = side.capacity > 0
        serving = ~side.blocked[lo:hi]  # (S, n): out of service (failed, cordoned)
        if cells.shape[1]:
            sold = has[None, :, :] & serving[:, :, None]
            peak = np.where(sold, cells, 0.0).max(axis=(0, 1))
        else:
            peak = np.zeros(side.capacity.shape[1])
        out.append(SidePrices(kind, list(names), cells[0].copy(), peak, has, serving[0].copy()))
    return out


@dataclass(frozen=True)
class PriceBlock:
    """Copied unit prices of some servers of one kind, for :meth:`rows` to list outside
    the decision thread.

    Attributes:
        kind: ``"worker"`` or ``"ps"``.
        names: ``k`` server names, in the cluster's order.
        cells: ``(k, R, S)`` float64, unit prices per server, resource and slot read.
        has: ``(k, R)`` bool, the server has some of the resource.
    """

    kind: str
    names: tuple[str, ...]
    cells: NDArray[np.float64]
    has: NDArray[np.bool_]

    def answer_bytes(self) -> int:
        """About the bytes its rows take in a ``GetPricesResponse`` (a little more: each
        row's name, resource and framing counted as :data:`ROW_OVERHEAD_BYTES`)."""
        return int(self.has.sum()) * (8 * int(self.cells.shape[2]) + ROW_OVERHEAD_BYTES)

    def rows(self, resources: tuple[str, ...]) -> list[tuple[str, str, str, list[float]]]:
        """``(server, kind, resource, prices per slot)`` for each resource a server has."""
        cells, has = self.cells.tolist(), self.has.tolist()
        return [
            (name, self.kind, res, cells[j][r])
            for j, name in enumerate(self.names)
            for r, res in enumerate(resources)
            if has[j][r]
        ]


def price_blocks(
    ledger: Ledger,
    cluster: Cluster,
    lo: int,
    hi: int,
    server: str = "",
    start: int = 0,
    count: int | None = None,
) -> list[PriceBlock]:
    """Unit prices over window slots ``lo .. hi - 1`` per kind of server: of ``count``
    servers (None: all) from the ``start``-th, counting workers first, then parameter
    servers, each in the cluster's order (a page); with ``server``, only its (none: no
    such server). Only the servers returned are copied, and no float becomes a Python
    object here (a list of every cell's price built 15 million floats in the decision
    thread for a one-server read of the window at 10,000 servers): :meth:`PriceBlock.rows`
    lists them after."""
    out = []
    offset = 0  # the place of this side's first server in the count
    for kind, side, names in _sides(ledger, cluster):
        n = len(names)
        if server:
            first = names.index(server) if server in names else n
            last = min(first + 1, n)
        else:
            first = min(max(start - offset, 0), n)
            last = n if count is None else min(max(start + count - offset, 0), n)
        offset += n
        if first >= last:
            continue
        cells = side.prices(lo, hi)[lo:hi, first:last].transpose(1, 2, 0)  # (k, R, S)
        has = side.capacity[first:last] > 0
        out.append(PriceBlock(kind, names[first:last], np.ascontiguousarray(cells), has))
    return out


def in_service_use(side: Side, lo: int, hi: int) -> NDArray[np.float64]:
    """``(S, R)`` float64: the amounts jobs use per window slot ``lo .. hi - 1`` and
    resource, summed over the servers in service (a blocked server's cells hold its
    capacity, not use). A product with the in-service mask (a matrix product per slot),
    without the ``(S, n, R)`` copy a masked sum made (50 ms a side at 5,000 servers)."""
    serving = (~side.blocked[lo:hi]).astype(np.float64)  # (S, n)
    used: NDArray[np.float64] = np.matmul(serving[:, None, :], side.used[lo:hi])[:, 0, :]
    return used
