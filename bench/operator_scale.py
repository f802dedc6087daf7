"""The operator's reads of the ledger at 10,000 servers: what each costs the decision
thread (every tenant's decision waits for it).

What is measured
    An admission controller (the daemon's, in-process, on a SQLite store in a temporary
    directory) over ``--servers`` worker and as many PS servers (``oasis gen``'s shapes,
    ``pricing.workload.generate_trace``), window ``--window``, with ``--jobs`` jobs of the
    same trace submitted first (some hundreds admitted). Then, each ``--repeat`` times,
    the wall time of the reads monitoring makes, run in the decision thread as the
    daemon runs them (:meth:`AdmissionController.between_decisions`):

    - ``scrape``: a ``/metrics`` scrape's ledger read (``_ControllerCollector._snapshot``:
      use over the window, prices now and their peak, server states);
    - ``prices one server, window``: ``GetPrices(server=..., slots=window)``'s read, as
      ``oasis status`` asks it for the first server of each kind;
    - ``prices all, 12 slots``: ``GetPrices(slots=12)``'s read (``oasis status``,
      ``oasis prices``), and apart from it the listing of its rows (outside the thread);
    - ``utilisation, window``: the console overview's and the scrape's use per slot;
    - ``console heatmap``: the prices page's snapshot (the costliest resource's prices
      and use over the window).

    Then a whole ``/metrics`` scrape in-process (``generate_latest`` of the daemon's
    registry, what the endpoint answers: the ledger read, the store's job counts, the
    text), with the per-server prices (``metrics.per_server_prices_up_to`` set to the
    cluster's size) and with the default (none past 500 servers): its bytes, samples and
    wall time (median and maximum of ``--repeat``, ms).

Methodology
    Each read runs once first (prices derived), then ``--repeat`` times; the table gives
    the median and maximum in ms. Memory is not measured here (tests/test_ledger_reads.py
    bounds it). Other work on the machine disturbs the times: compare runs made together.

Run with
    ``python -m bench.operator_scale`` (``--servers 5000 --window 300 --jobs 600 --repeat 5``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
from prometheus_client import generate_latest

from bench.in_process import opened_controller
from bench.machine import describe
from controller.admission import AdmissionController
from controller.console.data import ConsoleData
from controller.metrics import Metrics, _ControllerCollector
from pricing.workload import generate_trace


def open_controller(tmp: Path, trace: dict[str, Any], window: int) -> AdmissionController:
    return opened_controller(tmp, trace, window, {"rate": 0, "burst": 0})


def timed(c: AdmissionController, fn: Callable[[], Any], repeat: int) -> list[float]:
    """Milliseconds of each of ``repeat`` runs of ``fn`` in the decision thread."""
    c.between_decisions(fn, 600.0)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        c.between_decisions(fn, 600.0)
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def scrape_text(c: AdmissionController, repeat: int) -> dict[str, Any]:
    """A ``/metrics`` scrape's size (bytes, samples) and wall time (ms), each of
    ``repeat`` by a fresh registry (a scrape's reading is otherwise reused for
    ``SCRAPE_INTERVAL``)."""
    text, ms = b"", []
    for _ in range(repeat):
        registry = Metrics(c).registry
        t0 = time.perf_counter()
        text = generate_latest(registry)
        ms.append((time.perf_counter() - t0) * 1000.0)
    samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {"bytes": len(text), "samples": samples, "median ms": round(statistics.median(ms), 1),
            "max ms": round(max(ms), 1)}  # fmt: skip


def run(servers: int, window: int, jobs: int, repeat: int) -> dict[str, Any]:
    trace = generate_trace(np.random.default_rng(3), n_jobs=jobs, n_worker_servers=servers,
                           n_ps_servers=servers, horizon=window)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="oasis-operator-"))
    c = open_controller(tmp, trace, window)
    try:
        admitted = 0
        jobs_of = cast(list[dict[str, Any]], trace["jobs"])
        for job in jobs_of:
            spec = {k: v for k, v in job.items() if k != "arrival"}
            admitted += asyncio.run(c.submit(spec)).decision.admitted
        collector = _ControllerCollector(c)
        console = ConsoleData(c)
        resources = c.cluster.resources
        _, blocks = c.between_decisions(lambda: c.prices(0, 12))
        reads: dict[str, Callable[[], Any]] = {
            "scrape": collector._snapshot,
            "prices one server, window": lambda: c.prices(0, window + 1, "w0"),
            "prices all, 12 slots": lambda: c.prices(0, 12),
            "utilisation, window": lambda: c.utilisation(0, window + 1),
            "console heatmap": lambda: console._price_snapshot(None),
        }
        table = {}
        for name, fn in reads.items():
            ms = timed(c, fn, repeat)
            table[name] = {
                "median ms": round(statistics.median(ms), 1),
                "max ms": round(max(ms), 1),
            }
        t0 = time.perf_counter()
        rows = [row for block in blocks for row in block.rows(resources)]
        table["rows of prices all, 12 slots (outside)"] = {
            "ms": round((time.perf_counter() - t0) * 1000.0, 1), "rows": len(rows)
        }  # fmt: skip
        default = c.config.per_server_prices_up_to
        for name, up_to in (("per server", 2 * servers), ("default", default)):
            c.config = replace(c.config, per_server_prices_up_to=up_to)
            table[f"/metrics scrape, {name} (up to {up_to} servers)"] = scrape_text(c, repeat)
    finally:
        c.close()
    return {"servers": 2 * servers, "window": window, "jobs": jobs, "admitted": admitted,
            "reads": table}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=5000, help="worker (and PS) servers")
    parser.add_argument("--window", type=int, default=300, help="T, slots")
    parser.add_argument("--jobs", type=int, default=600, help="jobs submitted first")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each read")
    args = parser.parse_args()
    result = run(args.servers, args.window, args.jobs, args.repeat)
    print(json.dumps({"machine": describe(), **result}, indent=2))


if __name__ == "__main__":
    main()
