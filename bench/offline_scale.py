"""The offline comparison at real scale: certified bounds, allocations, and the exact ILP.

What is measured
    - ``paper``: the paper's scale, ``oasis gen``'s defaults (300 jobs, 50 + 50 servers,
      T = 300, oracle bounds) with seeds ``--seeds``: ``oasis offline --method colgen``
      with ``--time-limit``. Per trace: wall time, peak memory (RSS of the process that
      ran it), the certified bound, the online utility, the certified share
      ``online / bound`` and the ratio bound ``bound / online``, the allocation found and
      its gap to the bound, the rounds and columns of the column generation.
    - ``exact``: 40 jobs, T = 20, 6 + 6 servers (``oasis gen --jobs 40 --worker-servers 6
      --ps-servers 6 --horizon 20``), seeds ``--seeds``: ``--method ilp`` (the compact ILP
      alone, as before) and ``--method auto`` (column generation, then the ILP reduced by
      its bound), each with ``--time-limit``: status, time to the proof, bound, gap.
    - ``store``: a daemon's history of ``--jobs`` jobs (default 1,000) arriving over
      ``--slots`` slots (default 168, a week of hours), decided by the admission
      controller on a SQLite store (window 48, 20 + 20 servers), then
      ``oasis offline --store`` with ``--time-limit``: wall time, the method ``auto``
      picked, bound, online utility, certified share.

Methodology
    Every case runs ``oasis offline ... --json`` as a child process (``python -m
    controller.cli``), so the peak RSS (``ru_maxrss`` from ``os.wait4`` on it) is that
    command's alone; the wall time includes the online replay (or reading the
    store) and numba's cached start. The machine is shared: the load average at the
    start is printed.

Run with
    .venv/bin/python -m bench.offline_scale paper --seeds 1 --time-limit 240
    .venv/bin/python -m bench.offline_scale exact --seeds 3 --time-limit 60
    .venv/bin/python -m bench.offline_scale store --jobs 1000 --time-limit 240
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe

__all__ = ["main"]


def _offline(args: list[str], timeout: float) -> tuple[dict[str, Any], float, float]:
    """``oasis offline ARGS --json`` in a child: (document, wall seconds, its peak RSS MB)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "offline", *args, "--json", "--no-progress"],
            stdout=out,
            stderr=err,
            text=True,
        )
        killer = threading.Timer(timeout, child.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(child.pid, 0)  # its own rusage, peak RSS included
        finally:
            killer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"oasis offline failed ({child.returncode}): {err.read()[-2000:]}")
        doc = json.loads(out.read())
    return doc, wall, usage.ru_maxrss / 1024.0


def _gen(path: Path, *flags: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "controller.cli", "gen", *flags, "-o", str(path)],
        check=True,
        capture_output=True,
    )


def _row(doc: dict[str, Any], wall: float, rss: float, **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "method": doc["method"],
        "status": doc["status"],
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(rss),
        "bound": doc["bound"],
        "allocation": doc["optimum"],
        "gap": doc["gap"],
        "online": doc["online"],
        "online_share_certified": doc["online_share_certified"],
        "ratio_bound": doc["ratio_bound"],
        "rounds": doc["rounds"],
        "columns": doc["columns"],
        "bound_source": doc["bound_source"],
    }


def paper(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for seed in range(1, args.seeds + 1):
        path = tmp / f"paper{seed}.json"
        _gen(path, "--seed", str(seed))
        doc, wall, rss = _offline(
            [str(path), "--method", "colgen", "--time-limit", str(args.time_limit)],
            args.time_limit * 3 + 300,
        )
        rows.append(_row(doc, wall, rss, seed=seed))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def exact(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for seed in range(1, args.seeds + 1):
        path = tmp / f"exact{seed}.json"
        _gen(path, "--jobs", "40", "--worker-servers", "6", "--ps-servers", "6",
             "--horizon", "20", "--seed", str(seed))  # fmt: skip
        for method in ("ilp", "auto"):
            doc, wall, rss = _offline(
                [str(path), "--method", method, "--time-limit", str(args.time_limit)],
                args.time_limit * 3 + 300,
            )
            rows.append(_row(doc, wall, rss, seed=seed, solve_s=doc["solve_seconds"]))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _history(url_dir: Path, n_jobs: int, slots: int, seed: int) -> str:
    """A daemon's store after ``n_jobs`` jobs arrived over ``slots`` slots."""
    import structlog

    from controller.admission import AdmissionController
    from controller.clock import FakeClock, SlotClock
    from controller.config import from_dict
    from controller.store import Database
    from pricing.workload import generate_trace

    window, slot = 48, 3600.0
    rng = np.random.default_rng(seed)
    raw = generate_trace(rng, n_jobs=n_jobs, n_worker_servers=20, n_ps_servers=20, horizon=window)
    config = from_dict(
        {
            "daemon": {"data_dir": str(url_dir), "window": window, "epoch": 0},
            "pricing": {"bounds": "estimate"},
            "cluster": {"resources": raw["resources"], "servers": raw["servers"]},
        }
    )
    clock = FakeClock(1.0)
    controller = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(clock, slot, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    controller.open()
    arrivals = np.sort(rng.integers(0, slots, size=n_jobs))
    jobs: list[dict[str, Any]] = raw["jobs"]  # type: ignore[assignment]
    now = 0
    try:
        for at, job in zip(arrivals.tolist(), jobs, strict=True):
            while now < at:
                clock.advance(slot)
                asyncio.run(controller.tick())
                now += 1
            asyncio.run(controller.submit({k: v for k, v in job.items() if k != "arrival"}))
    finally:
        controller.close()
    return config.database_url


def store(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    started = time.perf_counter()
    url = _history(tmp, args.jobs, args.slots, 1)
    made = time.perf_counter() - started
    print(f"history of {args.jobs} jobs made in {made:.0f} s", file=sys.stderr, flush=True)
    doc, wall, rss = _offline(
        ["--store", url, "--time-limit", str(args.time_limit)], args.time_limit * 3 + 300
    )
    admitted = sum(bool(j["online_admitted"]) for j in doc["jobs"])
    return [_row(doc, wall, rss, jobs=len(doc["jobs"]), admitted_online=admitted)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("case", choices=("paper", "exact", "store"))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=240.0)
    parser.add_argument("--jobs", type=int, default=1000, help="store: jobs in the history")
    parser.add_argument("--slots", type=int, default=168, help="store: slots they arrive in")
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="oasis-offline-scale-") as tmp:
        rows = {"paper": paper, "exact": exact, "store": store}[args.case](args, Path(tmp))
    print(json.dumps({"machine": describe(), "case": args.case, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
