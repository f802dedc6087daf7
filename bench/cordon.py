"""What a cordon (``oasis cordon SERVER``) costs: the decision thread is busy for its
whole step, so every tenant's calls wait that long once.

What is measured
    The admission controller in-process (``controller.admission``, a fake slot clock,
    SQLite with the daemon's defaults) with ``--servers`` worker + as many PS servers of
    the paper's workload (``pricing.workload``, seeded), a window of ``--window`` slots.
    ``--jobs`` jobs of ``generate_trace`` are decided in slot 0 (their arrivals dropped:
    the daemon decides at the current slot). Then the worker server holding the most
    planned worker-slots is cordoned, twice over: ``--dry-run`` (the moves tried on a
    copy of the ledger) and for real (``--force``: tried, then done, and stored), each
    one ``_cordon_sync`` step timed with ``time.perf_counter``; then it is uncordoned.
    Reported: the jobs moved by how, and each step's wall time. With ``--for SLOTS`` the
    cordon has an end (a planned maintenance, ``oasis cordon --for``): it blocks slots
    ``1 .. SLOTS`` only, and only the jobs planned there move. With ``--tiny`` every job
    is made one worker (``chunks = 1``) with 9 slots of work, its worker the least of
    one resource a worker may ask (:mod:`bench.tiny_workers`; 0.001 of each resource
    before that rule) and its PS 0.001 of cpu and mem: one tenant's many small jobs, up to
    about 1,020 on one server (thousands before the rule; the observability audit: such
    a cordon held every tenant's calls for 4 minutes).
    With ``--together N`` the N busiest worker servers are cordoned in one step
    (``oasis cordon A B ...``), dry run and real, and, on a second controller holding
    the same jobs, one server a step in the same order: the moves each way, and how many
    jobs the one-a-step cordons moved more than once.

Usage
    .venv/bin/python -m bench.cordon [--servers 50] [--window 300] [--jobs 300]
        [--for SLOTS] [--together N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.in_process import opened_controller
from bench.machine import describe
from bench.tiny_workers import tiny_ps, tiny_worker
from controller.admission import AdmissionController
from pricing.cluster import cluster_from_dict
from pricing.workload import generate_trace

SEED = 1


def measure(
    servers: int,
    window: int,
    jobs: int,
    data_dir: Path,
    length: int | None = None,
    tiny: bool = False,
    together: int = 1,
) -> dict[str, Any]:
    if together > 1:
        return measure_together(servers, window, jobs, data_dir, length, together)
    trace = _trace(servers, window, jobs)
    if tiny:
        cluster = cluster_from_dict(trace["resources"], trace["servers"])
        for i, spec in enumerate(trace["jobs"]):
            spec.update(chunks=1, epochs=1, minibatches=40, tau=0.2, grad_mb=1)  # 9 slots
            spec["worker"] = tiny_worker(cluster, i)
            spec["ps"] = tiny_ps(spec["worker"])
    c = _controller(trace, window, data_dir)
    try:
        admitted = _submit_all(c, trace)
        ledger = c._ledger
        held = ledger.worker_side.used[1:, :, 0].sum(axis=0)  # the first resource, by server
        busiest = c.cluster.worker_names[int(np.argmax(held))]
        out: dict[str, Any] = {"servers": servers, "window": window, "jobs": jobs,
                               "admitted": admitted, "server": busiest,
                               "cordon_slots": length or "no end", "tiny": tiny}  # fmt: skip
        until = None if length is None else c.slot + 1 + length
        for name, dry_run in (("dry_run", True), ("cordon", False)):
            step = functools.partial(
                c._cordon_sync, busiest, "bench", "bench", dry_run, True, until
            )
            started = time.perf_counter()
            view, _events = c.between_decisions(step, 600.0)
            out[f"{name}_ms"] = round((time.perf_counter() - started) * 1e3, 1)
            out[f"{name}_moved"] = dict(Counter(view["moved"].values()))
        started = time.perf_counter()
        c.between_decisions(lambda: c._uncordon_sync(busiest, "bench"), 600.0)
        out["uncordon_ms"] = round((time.perf_counter() - started) * 1e3, 1)
        return out
    finally:
        c.close()


def _trace(servers: int, window: int, jobs: int) -> dict[str, Any]:
    """The workload: ``jobs`` jobs of ``generate_trace`` on ``servers`` worker + as many
    PS servers, over ``window`` slots (seed :data:`SEED`)."""
    return generate_trace(np.random.default_rng(SEED), n_jobs=jobs, n_worker_servers=servers,
                          n_ps_servers=servers, horizon=window)  # fmt: skip


def _controller(trace: dict[str, Any], window: int, data_dir: Path) -> AdmissionController:
    """An opened controller of ``trace``'s cluster on a SQLite store in ``data_dir``."""
    return opened_controller(data_dir, trace, window, {"max_utility": 0})


def _submit_all(c: AdmissionController, trace: dict[str, Any]) -> int:
    """Decide every job of ``trace`` in slot 0 (arrivals dropped); how many admitted."""
    admitted = 0
    for spec in trace["jobs"]:
        job = {k: v for k, v in spec.items() if k != "arrival"}
        admitted += bool(asyncio.run(c.submit(job)).decision.admitted)
    return admitted


def measure_together(
    servers: int, window: int, jobs: int, data_dir: Path, length: int | None, n: int
) -> dict[str, Any]:
    """The ``n`` busiest worker servers cordoned in one step, and one a step."""
    trace = _trace(servers, window, jobs)
    out: dict[str, Any] = {"servers": servers, "window": window, "jobs": jobs, "together": n,
                           "cordon_slots": length or "no end"}  # fmt: skip
    one = _controller(trace, window, data_dir / "together")
    try:
        out["admitted"] = _submit_all(one, trace)
        held = one._ledger.worker_side.used[1:, :, 0].sum(axis=0)
        names = [one.cluster.worker_names[int(i)] for i in np.argsort(-held, kind="stable")[:n]]
        until = None if length is None else one.slot + 1 + length
        for name, dry_run in (("together_dry_run", True), ("together", False)):
            step = functools.partial(one._cordon_sync, names[0], "bench", "bench", dry_run,
                                     True, until, None, names[1:])  # fmt: skip
            started = time.perf_counter()
            view, _events = one.between_decisions(step, 600.0)
            out[f"{name}_ms"] = round((time.perf_counter() - started) * 1e3, 1)
            out[f"{name}_moved"] = dict(Counter(view["moved"].values()))
    finally:
        one.close()
    each = _controller(trace, window, data_dir / "one-a-step")
    try:
        _submit_all(each, trace)
        moves: Counter[str] = Counter()
        how: Counter[str] = Counter()
        started = time.perf_counter()
        for name in names:
            step = functools.partial(each._cordon_sync, name, "bench", "bench", False, True, until)
            view, _events = each.between_decisions(step, 600.0)
            moves.update(view["moved"].keys())
            how.update(view["moved"].values())
        out["one_a_step_ms"] = round((time.perf_counter() - started) * 1e3, 1)
        out["one_a_step_moved"] = dict(how)
        out["one_a_step_jobs_moved_twice_or_more"] = sum(1 for c in moves.values() if c > 1)
        out["one_a_step_moves_of_a_job_max"] = max(moves.values(), default=0)
    finally:
        each.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", type=int, default=50, help="worker servers (and as many PS)")
    p.add_argument("--window", type=int, default=300, help="slots, T")
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--for", dest="length", type=int, metavar="SLOTS",
                   help="give the cordon an end: it blocks this many slots")  # fmt: skip
    p.add_argument("--tiny", action="store_true",
                   help="one worker per job at most, 0.001 of each resource")  # fmt: skip
    p.add_argument("--together", type=int, default=1, metavar="N",
                   help="cordon the N busiest worker servers in one step, and one a "
                   "step")  # fmt: skip
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.together < 1:
        p.error("--together must be >= 1")
    with tempfile.TemporaryDirectory(prefix="oasis-cordon-") as d:
        measured = measure(args.servers, args.window, args.jobs, Path(d), args.length, args.tiny,
                           args.together)  # fmt: skip
        result = {"machine": describe(), **measured}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
