"""The unit prices of a ``/metrics`` scrape at a cluster's size (controller/price_metrics.py):
past ``metrics.per_server_prices_up_to`` servers (500 by default) no series per server,
the quantiles over the servers of each kind always.

At 10,000 servers a scrape held 45,000 ``oasis_unit_price{server, kind, resource}``
samples, 3.76 MB of text and as many series in the operator's Prometheus
(bench/RESULTS.md). Scraped here in-process (``generate_latest`` of the daemon's
registry, what ``/metrics`` answers) on a cluster of 510 servers, just past the default.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest

from controller.admission import AdmissionController
from controller.admission.ledger_reads import SidePrices
from controller.config import ConfigError, from_dict, load
from controller.metrics import Metrics
from controller.price_metrics import QUANTILES, price_families
from tests.servers import CLUSTER_TOML, example_config
from tests.test_ledger_reads import busy_controller
from tests.test_metrics import Samples, parse

WORKERS, PS, WINDOW = 400, 110, 12  # 510 servers: past the default of 500


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdmissionController]:
    c = busy_controller(tmp_path_factory.mktemp("price-metrics"), WORKERS, PS, WINDOW, 4)
    # into the slot the jobs run in: some servers' prices now above the floor
    c.slots.clock.advance(3600.0)  # type: ignore[attr-defined]
    asyncio.run(c.tick())
    yield c
    c.close()


def _scrape(c: AdmissionController) -> tuple[Samples, int]:
    """A scrape's samples and its size in bytes, by a fresh registry (no cached read)."""
    text = generate_latest(Metrics(c).registry)
    return parse(text.decode()), len(text)


def _named(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def test_past_the_default_a_scrape_has_quantiles_and_no_series_per_server(
    controller: AdmissionController,
) -> None:
    c = controller
    assert c.config.per_server_prices_up_to == 500 < WORKERS + PS
    bounded, bounded_bytes = _scrape(c)
    assert not [key for key in bounded if dict(key[1]).get("server")]  # none per server
    assert not _named(bounded, "oasis_unit_price")

    c.config = replace(c.config, per_server_prices_up_to=WORKERS + PS)  # at the limit
    try:
        full, full_bytes = _scrape(c)
    finally:
        c.config = replace(c.config, per_server_prices_up_to=500)
    unit = _named(full, "oasis_unit_price")
    assert len(unit) == WORKERS * 5 + PS * 4  # a PS server has no GPU: no price
    assert bounded_bytes < full_bytes / 10, (bounded_bytes, full_bytes)

    # the quantiles are those of the per-server prices, in both scrapes alike
    by_side: dict[tuple[str, str], list[float]] = {}
    for labels, v in unit.items():
        d = dict(labels)
        by_side.setdefault((d["kind"], d["resource"]), []).append(v)
    assert len(by_side) == 9
    quantiles = _named(bounded, "oasis_unit_price_quantile")
    assert len(quantiles) == 9 * len(QUANTILES)
    assert quantiles == _named(full, "oasis_unit_price_quantile")
    for (kind, resource), values in by_side.items():
        want = np.quantile(values, QUANTILES)
        for q, expected in zip(QUANTILES, want, strict=True):
            key = (("kind", kind), ("quantile", f"{q:g}"), ("resource", resource))
            assert quantiles[key] == pytest.approx(expected, rel=1e-12), key
        low = (("kind", kind), ("quantile", "0"), ("resource", resource))
        high = (("kind", kind), ("quantile", "1"), ("resource", resource))
        assert (quantiles[low], quantiles[high]) == (min(values), max(values))
        peak = bounded[("oasis_unit_price_peak", (("kind", kind), ("resource", resource)))]
        assert peak >= max(values)
    gpu = by_side[("worker", "gpu")]
    assert max(gpu) > min(gpu)  # the admitted jobs made some servers dearer


def test_per_server_prices_up_to_is_read_and_checked(tmp_path: Path) -> None:
    base = {"daemon": {"data_dir": str(tmp_path)}, **tomllib.loads(CLUSTER_TOML)}
    assert from_dict(base).per_server_prices_up_to == 500
    given = from_dict({**base, "metrics": {"per_server_prices_up_to": 0}})
    assert given.per_server_prices_up_to == 0
    for bad, says in ((-1, "must be >= 0"), ("many", "must be an integer"),
                      (2.5, "must be an integer"), (True, "must be an integer")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            from_dict({**base, "metrics": {"per_server_prices_up_to": bad}})
        assert "metrics.per_server_prices_up_to" in str(err.value), err.value
        assert says in str(err.value), err.value
    example = load(example_config(tmp_path))
    assert example.per_server_prices_up_to == 500


def _samples(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_servers_out_of_service_are_in_no_quantile_and_every_peak_is_exported() -> None:
    """The mutation audit: the quantiles could take a cordoned server's price (priced as
    full: it is no demand), and a kind with no server in service could lose its peak, or
    fail the whole scrape on the quantile of no price, with every test passing."""
    workers = SidePrices(
        "worker", ["w0", "w1", "w2"],
        now=np.array([[1.0, 5.0], [2.0, 6.0], [100.0, 7.0]]),
        peak=np.array([3.0, 8.0]),
        has=np.array([[True, True], [True, True], [True, False]]),
        serving=np.array([True, True, False]),  # w2 cordoned: its gpu priced as full
    )  # fmt: skip
    ps = SidePrices(
        "ps", ["p0"], now=np.array([[0.0, 9.0]]), peak=np.array([0.0, 0.0]),
        has=np.array([[False, True]]), serving=np.array([False]),  # every PS out of service
    )  # fmt: skip
    got = _samples(price_families([workers, ps], ["gpu", "cpu"], 4))

    def q(kind: str, resource: str, quantile: str) -> float:
        key = (("kind", kind), ("quantile", quantile), ("resource", resource))
        return got[("oasis_unit_price_quantile", key)]

    assert (q("worker", "gpu", "0"), q("worker", "gpu", "1")) == (1.0, 2.0)  # not w2's 100
    # the five the module docstring promises (dashboards and alerts name them)
    named = {dict(k[1])["quantile"] for k in got if k[0] == "oasis_unit_price_quantile"}
    assert named == {"0", "0.5", "0.9", "0.99", "1"}
    assert (q("worker", "cpu", "0"), q("worker", "cpu", "1")) == (5.0, 6.0)
    assert not [k for k in got if k[0] == "oasis_unit_price_quantile" and ("kind", "ps") in k[1]]
    peaks = {k[1]: v for k, v in got.items() if k[0] == "oasis_unit_price_peak"}
    assert peaks == {(("kind", "worker"), ("resource", "gpu")): 3.0,
                     (("kind", "worker"), ("resource", "cpu")): 8.0,
                     (("kind", "ps"), ("resource", "cpu")): 0.0}  # fmt: skip
    # each server's own price, the cordoned one's too, for the resources it has
    unit = {dict(k[1])["server"] + "/" + dict(k[1])["resource"]: v
            for k, v in got.items() if k[0] == "oasis_unit_price"}  # fmt: skip
    assert unit == {"w0/gpu": 1.0, "w0/cpu": 5.0, "w1/gpu": 2.0, "w1/cpu": 6.0,
                    "w2/gpu": 100.0, "p0/cpu": 9.0}  # fmt: skip
    # 4 servers: at the limit each has its series, past it none has
    assert not [k for k in _samples(price_families([workers, ps], ["gpu", "cpu"], 3))
                if k[0] == "oasis_unit_price"]  # fmt: skip
