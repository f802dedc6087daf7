"""CPU of the commit process's work alone: ``write_decisions`` (fenced, as the commit
process runs it) over a workload's write sets, in this process, per decision.

The decisions' write sets (job row, allocation rows, estimate rows, ``decided`` event)
are collected from a controller in-process (:func:`bench.throughput_ceilings.write_sets`),
then written to a fresh store ``--batch`` at a time through
:func:`controller.store.commit_process._commit`, the commit process's own step, each
batch fenced by the store's writer epoch and the batch's last estimate written, as the
daemon's group commit does. Reported: this process's CPU (``time.process_time``) and
wall milliseconds per decision; the store server's CPU (PostgreSQL's) is not counted.

Run with
    .venv/bin/python -m bench.commit_cpu --backends sqlite,postgresql --jobs 900 --batch 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.daemon_throughput import workload, write_config
from bench.machine import describe
from bench.throughput_ceilings import write_sets
from controller.config import load
from controller.store import Database
from controller.store.commit_process import _commit
from controller.store.database import migrate
from controller.store.models import MetaRow
from controller.store.writer_lock import RECORD_KEY, this_process
from pricing.shared_estimate import submitter_key
from tests.servers import Postgres

EPOCH = 7
"""The writer epoch recorded in the fresh store, every batch fenced with it."""


class Stores:
    """Fresh stores of each backend, in ``workdir`` (SQLite) or on one throwaway
    PostgreSQL server started on first use."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.postgres: Postgres | None = None

    def fresh(self, backend: str, name: str) -> str:
        """The URL of a new, empty store of ``backend``."""
        if backend == "sqlite":
            return f"sqlite:///{self.workdir / f'{name}.db'}"
        if self.postgres is None:
            self.postgres = Postgres()
        return self.postgres.new_database()

    def close(self) -> None:
        if self.postgres is not None:
            self.postgres.close()


def measure(
    backend: str,
    stores: Stores,
    jobs: list[dict[str, Any]],
    servers: list[dict[str, Any]],
    batch: int,
) -> dict[str, Any]:
    """One backend: the write sets of ``jobs`` decided on one store, then written to a
    fresh one ``batch`` at a time."""
    workdir = stores.workdir
    decide_url = stores.fresh(backend, "decide")
    decided = write_config(workdir / f"{backend}-decide.toml", workdir / f"{backend}-d",
                           decide_url, servers, epoch=time.time())  # fmt: skip
    sets = write_sets(decided, jobs, "r")
    payloads = [  # each batch's last write set carries its submitter's estimate rows
        ws.rows.payload(
            {submitter_key(ws.rows.job["submitter"])}
            if i % batch == batch - 1 and ws.rows.estimate is not None
            else None
        )
        for i, ws in enumerate(sets)
    ]
    store_url = stores.fresh(backend, "write")
    config = load(write_config(workdir / f"{backend}.toml", workdir / f"{backend}-w", store_url,
                               servers, epoch=time.time()))  # fmt: skip
    config.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(config.database_url, sqlite_synchronous=config.sqlite_synchronous)
    try:
        migrate(db)
        with db.session() as session:
            session.merge(MetaRow(key=RECORD_KEY, value=this_process(EPOCH, "").to_dict()))
        last = None
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(0, len(payloads), batch):
            chunk = payloads[i : i + batch]
            answer = _commit(db, ("commit", chunk, last, EPOCH, None))
            if answer[0] != "ok":
                raise RuntimeError(f"batch {i // batch} not written: {answer}")
            last = answer[1] + len(chunk) - 1
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        db.dispose()
    n = len(payloads)
    return {
        "backend": backend,
        "decisions": n,
        "batch": batch,
        "cpu_ms_per_decision": 1000 * cpu / n,
        "wall_ms_per_decision": 1000 * wall / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--backends", default="sqlite,postgresql", help="sqlite,postgresql")
    parser.add_argument("--jobs", type=int, default=900, help="decisions written (900)")
    parser.add_argument("--batch", type=int, default=2, help="decisions per transaction (2)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    servers, jobs = workload(args.seed, args.jobs)
    results = []
    with tempfile.TemporaryDirectory(prefix="oasis-commit-cpu-") as tmp:
        stores = Stores(Path(tmp))
        try:
            for backend in args.backends.split(","):
                results.append(measure(backend, stores, jobs, servers, args.batch))
        finally:
            stores.close()
    if args.json:
        print(json.dumps({"machine": describe(), "results": results}, indent=1))
        return 0
    print("| store | decisions | per transaction | CPU ms a decision | wall ms a decision |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['backend']} | {r['decisions']} | {r['batch']} | "
              f"{r['cpu_ms_per_decision']:.3f} | {r['wall_ms_per_decision']:.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
