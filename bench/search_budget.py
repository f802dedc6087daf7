"""What the daemon's search budget (``[limits] max_search_steps``) costs in time.

What is measured
    The best-schedule DP of ``pricing.best_schedule`` in its worst case: every slot of a
    T = 300 window scanned (the early stop is switched off by a zero lower bound on the
    cost of work) and every slot's cost curve computed (all slots marked touched), for
    jobs of growing size on the paper's cluster shape (50 worker servers with 8 GPUs,
    50 PS servers). For each: ``N``, ``Y`` (workers per slot), ``W``, the bound
    ``T * Y * (W + 1)`` that ``controller/limits.py`` checks, the wall time of the
    search, the time per bound step, the DP tables' size, and the wall time of the
    whole ``best_schedule`` call a decision makes (early stop and placement included)
    on an empty ledger.

Methodology
    The compiled kernel (``_search``, private to ``pricing.best_schedule``) is called
    directly, after one untimed call that compiles or loads it; the best of 3 runs is
    reported (``time.perf_counter``). One job per size, seeded by nothing: the sizes are
    fixed below.

Run with
    .venv/bin/python -m bench.search_budget
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from bench.machine import describe
from controller.limits import Limits, search_size
from pricing.best_schedule import (
    _search,  # the kernel itself: no pruning, no placement
    best_schedule,
)
from pricing.cluster import cluster_from_dict
from pricing.job import job_from_dict
from pricing.ledger import Ledger
from pricing.prices import oracle_bounds

T = 300
SIZES = ((16, 100), (64, 400), (150, 1300), (200, 2000), (400, 2080))  # (N, M)


def cluster() -> Any:
    servers = [
        {"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 8, "cpu": 64, "bandwidth": 40}}
        for i in range(50)
    ] + [
        {"name": f"p{i}", "kind": "ps", "capacity": {"cpu": 64, "bandwidth": 40}} for i in range(50)
    ]
    return cluster_from_dict(["gpu", "cpu", "bandwidth"], servers)


def measure(chunks: int, minibatches: int) -> dict[str, float]:
    c = cluster()
    raw = {
        "id": "x", "arrival": 0, "epochs": 2, "chunks": chunks, "minibatches": minibatches,
        "tau": 0.01, "grad_mb": 1, "worker": {"gpu": 1, "bandwidth": 1},
        "ps": {"cpu": 1, "bandwidth": 4},
        "utility": {"kind": "sigmoid", "priority": 100, "decay": 0.0, "target": 5},
    }  # fmt: skip
    job = job_from_dict(raw, c, slot_seconds=3600, slots_available=lambda a: T - a)
    ledger = Ledger(c, oracle_bounds([job], c, T, {"x": T}), T + 1)
    ledger.touched[:] = True  # no shared cost curve for untouched slots
    size = search_size(job, c, T)
    util = job.utility.values(np.arange(1, T + 1))
    d_all = np.empty((T, job.work + 1))
    rows = np.empty(T, np.int64)
    picks_w = np.empty((T, 2, job.chunks + 1), np.int64)
    picks_p = np.empty((T, 2, int(job.ps_table()[job.chunks]) + 1), np.int64)
    src = np.empty(T, np.int64)
    c_all = np.empty((T, job.chunks + 1))
    ymax = np.empty(T, np.int64)
    sides = (ledger.worker_side.kernel_view(job.worker), ledger.ps_side.kernel_view(job.ps))
    lb = np.zeros(T)
    cover = np.zeros(job.work + 1)
    idle = np.empty(job.chunks + 1)

    def kernel() -> int:
        state = np.array([-np.inf, -1.0, 0.0, -1.0, 0.0, -1.0, -1.0])
        return int(
            _search(sides[0], sides[1], ledger.touched, 0, job.work, job.ps_table(), util, lb,
                    lb, cover, False, d_all, rows, c_all, ymax, picks_w, picks_p, src, idle,
                    state, 0, T)
        )  # fmt: skip

    kernel()
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        scanned = kernel()
        best = min(best, time.perf_counter() - t0)
    assert scanned == T
    decision = np.inf
    for _ in range(3):
        fresh = Ledger(c, oracle_bounds([job], c, T, {"x": T}), T + 1)
        t0 = time.perf_counter()
        best_schedule(job, fresh, 0, T - 1)
        decision = min(decision, time.perf_counter() - t0)
    return {
        "N": chunks,
        "Y": size.workers,
        "W": job.work,
        "steps": size.steps,
        "seconds": best,
        "ns_per_step": best / size.steps * 1e9,
        "tables_mb": size.megabytes,
        "decision": decision,
    }


def main() -> int:
    m = describe()
    print(f"machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}; T = {T}")
    print(
        f"default budget: {Limits().max_search_steps:.3g} steps, {Limits().max_search_mb:g} MiB\n"
    )
    print("| N | Y | W | bound steps T*Y*(W+1) | search s | ns per bound step | tables MiB "
          "| best_schedule s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for chunks, minibatches in SIZES:
        r = measure(chunks, minibatches)
        cells = (
            f"{r['N']:.0f}",
            f"{r['Y']:.0f}",
            f"{r['W']:.0f}",
            f"{r['steps']:.3g}",
            f"{r['seconds']:.3f}",
            f"{r['ns_per_step']:.2f}",
            f"{r['tables_mb']:.1f}",
            f"{r['decision']:.3f}",
        )
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
