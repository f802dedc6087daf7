"""What retention (``daemon.keep_days``) costs the decision thread, on SQLite and PostgreSQL.

What is measured
    The admission controller in-process (``controller.admission``, a fake slot clock) at
    the paper's scale: 50 worker + 50 PS servers (``pricing.workload``, seeded), T = 300
    slots of 3600 s, ``keep_days = 1``. ``--jobs`` jobs of ``generate_trace`` (same seed)
    are decided in slot 0 (about a fifth admitted, each with its allocation rows); the
    clock then moves to slot 330, where every job has ended (the tick completes the
    admitted ones), and the jobs are deleted a batch (``PRUNE_BATCH``, 200) at a time,
    each batch one ``Retention._prune_sync`` call, as in the daemon's decision thread.

    Reported per backend: the rows deleted (jobs, allocations, events), each batch's wall
    time (``time.perf_counter``) p50 / max, and jobs deleted per second. A batch is one
    transaction; decisions wait for it, so its time is what a decision may wait once per
    batch at a slot boundary.

    PostgreSQL is a throwaway server (``tests.servers.Postgres``: loopback, ``fsync=off``);
    SQLite a file in a temporary directory with the daemon's default
    ``synchronous=full``.

Usage
    .venv/bin/python -m bench.retention [--jobs 3000] [--backends sqlite,postgresql] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from sqlalchemy import func, select

from bench.machine import describe
from controller.admission import AdmissionController
from controller.admission.retention import PRUNE_BATCH
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.store import AllocationRow, Database, EventRow, JobRow
from pricing.workload import generate_trace

SEED = 1
HOUR = 3600.0


def _counts(c: AdmissionController) -> dict[str, int]:
    with c.db.session() as session:
        return {
            table.__tablename__: int(session.scalar(select(func.count()).select_from(table)) or 0)
            for table in (JobRow, AllocationRow, EventRow)
        }


def measure(url: str, data_dir: Path, jobs: int) -> dict[str, Any]:
    """Decide ``jobs`` jobs into the store at ``url``, then delete them in batches."""
    trace = generate_trace(np.random.default_rng(SEED), n_jobs=jobs, n_worker_servers=50,
                           n_ps_servers=50, horizon=300)  # fmt: skip
    config = from_dict({
        "daemon": {"data_dir": str(data_dir), "store_url": url, "window": 300, "epoch": 0,
                   "keep_days": 1},
        "cluster": {"resources": trace["resources"], "servers": trace["servers"]},
    })  # fmt: skip
    clock = FakeClock(1.0)
    c = AdmissionController(
        config, Database(config.database_url), SlotClock(clock, config.slot_seconds, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )  # fmt: skip
    c.open()
    try:
        started = time.perf_counter()
        admitted = 0
        for spec in trace["jobs"]:  # type: ignore[attr-defined]
            job = {k: v for k, v in spec.items() if k != "arrival"}
            admitted += asyncio.run(c.submit(job)).decision.admitted
        decide_s = time.perf_counter() - started
        clock.t = 330 * HOUR + 1.0
        asyncio.run(_tick_only(c))
        before = _counts(c)
        batches, _ = timed_pass(c)
        after = _counts(c)
    finally:
        c.close()
    arr = np.asarray(batches[:-1] or batches)
    return {
        "jobs": jobs, "admitted": admitted, "decide_seconds": round(decide_s, 1),
        "rows_before": before, "rows_after": after, "batches": len(batches),
        "batch_ms_p50": round(float(np.percentile(arr, 50)), 1),
        "batch_ms_max": round(float(arr.max()), 1),
        "jobs_per_second": round(before["jobs"] / (sum(batches) / 1000.0), 0),
    }  # fmt: skip


def timed_pass(c: AdmissionController) -> tuple[list[float], int]:
    """One retention pass, a step at a time as ``AdmissionController.prune`` runs it:
    each step's milliseconds, and the jobs deleted."""
    steps: list[float] = []
    deleted = 0
    cursor: int | None = 0
    while cursor is not None:
        t0 = time.perf_counter()
        ids, cursor = asyncio.run(c._run(functools.partial(c._prune_sync, after=cursor)))
        steps.append((time.perf_counter() - t0) * 1000.0)
        deleted += len(ids)
    return steps, deleted


async def _tick_only(c: AdmissionController) -> None:
    """The slot boundary's state changes, without the deletion the tick would start."""
    await c._move_jobs()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"machine": describe(), "command": " ".join(sys.argv)}
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="oasis-retention-") as tmp:
            if backend == "sqlite":
                results[backend] = measure("", Path(tmp), args.jobs)
            else:
                from tests.servers import Postgres

                pg = Postgres()
                try:
                    results[backend] = measure(pg.new_database(), Path(tmp), args.jobs)
                finally:
                    pg.close()
        if not args.json:
            r = results[backend]
            print(f"{backend}: {r['rows_before']} deleted in {r['batches']} batches of "
                  f"{PRUNE_BATCH}: {r['batch_ms_p50']} ms p50, {r['batch_ms_max']} ms max a "
                  f"batch, {r['jobs_per_second']:.0f} jobs/s (deciding them took "
                  f"{r['decide_seconds']} s, {r['admitted']} admitted); left {r['rows_after']}",
                  flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
