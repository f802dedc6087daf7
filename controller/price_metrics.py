"""The unit prices of a ``/metrics`` scrape (:mod:`controller.metrics`), with a number of
series that does not grow with the cluster past ``metrics.per_server_prices_up_to``.

- ``oasis_unit_price_quantile{kind, resource, quantile}``: quantiles (:data:`QUANTILES`:
  the lowest, median, 90th and 99th percentiles and the highest) of the unit price in
  the current slot over the servers of a kind in service that have the resource;
  5 series per kind and resource (none while no such server is in service).
- ``oasis_unit_price_peak{kind, resource}``: the highest over those servers and the
  window, each slot's servers in service; always exported. A failed or cordoned
  server's price is that of a full server, which is not demand: it is in
  ``oasis_unit_price`` alone (and ``oasis_capacity_out_of_service``).
- ``oasis_unit_price{server, kind, resource}``: each server's, in the current slot; only
  for a cluster of at most ``per_server_up_to`` servers. At 10,000 servers these were
  45,000 of a scrape's 45,115 samples, 3.76 MB of text that the operator's Prometheus
  stores as as many series (``bench/RESULTS.md``).

Prices are utility per unit of the resource per slot, as everywhere in the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from prometheus_client.core import GaugeMetricFamily

from controller.admission.ledger_reads import SidePrices

__all__ = ["QUANTILES", "price_families"]

QUANTILES = (0.0, 0.5, 0.9, 0.99, 1.0)
"""The quantiles of ``oasis_unit_price_quantile`` (0: the lowest price, 1: the highest),
linearly interpolated between servers (numpy's default)."""


def price_families(
    prices: Sequence[SidePrices], resources: Sequence[str], per_server_up_to: int
) -> list[GaugeMetricFamily]:
    """The price metrics of the module docstring from ``prices`` (one per kind of
    server, :func:`controller.admission.ledger_reads.price_summary`); the per-server
    family only if the servers of ``prices`` together are at most ``per_server_up_to``.
    ``resources``: the cluster's resource names, in the columns' order."""
    quantile = GaugeMetricFamily(
        "oasis_unit_price_quantile",
        "Quantile of the unit price of a resource in the current slot over the servers of "
        "a kind in service that have it (utility per unit per slot; 0: lowest, 1: highest).",
        labels=["kind", "resource", "quantile"],
    )
    peak = GaugeMetricFamily(
        "oasis_unit_price_peak",
        "Highest unit price of a resource over the servers of a kind and the window, "
        "where each is in service (utility per unit per slot).",
        labels=["kind", "resource"],
    )
    for side in prices:
        sold = side.has & side.serving[:, None]
        for r in np.flatnonzero(side.has.any(axis=0)).tolist():
            if sold[:, r].any():
                values = np.quantile(side.now[sold[:, r], r], QUANTILES)
                for q, v in zip(QUANTILES, values.tolist(), strict=True):
                    quantile.add_metric([side.kind, resources[r], f"{q:g}"], v)
            peak.add_metric([side.kind, resources[r]], float(side.peak[r]))
    if sum(len(side.names) for side in prices) > per_server_up_to:
        return [quantile, peak]
    unit = GaugeMetricFamily(
        "oasis_unit_price",
        "Price of one unit of a resource on a server, current slot (utility per unit per "
        "slot; exported up to metrics.per_server_prices_up_to servers).",
        labels=["server", "kind", "resource"],
    )
    for side in prices:
        now = side.now.tolist()
        for i, server in enumerate(side.names):
            for r in np.flatnonzero(side.has[i]).tolist():
                unit.add_metric([server, side.kind, resources[r]], now[i][r])
    return [unit, peak, quantile]
