"""How far the best-schedule search scans for the jobs the daemon rejects, on the workload
of ``bench/daemon_throughput.py`` (issue 16: "a tighter early stop for rejections").

What is measured
    The jobs of :func:`bench.daemon_throughput.workload` (seed 1; 50 + 50 servers,
    T = 300), every one arriving in the first slot, as the benchmark's clients send them
    within one hourly slot, replayed with the daemon's estimated bounds
    (:func:`controller.replay.replay`). For each decision: its thread CPU time (ms) and,
    for a rejection, the slots its search scanned before it could stop
    (``BestSchedule.slots_scanned``).

    ``--bound room`` replaces the per-slot lower bound on the cost of one worker-slot the
    search stops by (``pricing.best_schedule._slot_cost_bounds``: each resource's cheapest
    unit price over the slot's servers, whether or not they have room) with a tighter
    one, computed here in numpy: each resource's cheapest price over the servers with room
    for one more worker (or PS) only, and no bound at all (no schedule) where none has
    room. Both are valid lower bounds, so the decisions are the same; only the scan
    lengths and times may differ.

Command
    ``.venv/bin/python -m bench.rejection_scans [--jobs 3000] [--bound ledger|room]``
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.daemon_throughput import SLOT_SECONDS, WINDOW, workload
from controller.replay import replay
from pricing.trace import trace_from_dict

RESOURCES = ["gpu", "cpu", "mem", "disk", "bandwidth"]


def _room_bound(side: Any, demand: NDArray[np.float64], lo: int, hi: int) -> NDArray[np.float64]:
    """``(hi - lo,)``: per window slot, ``sum_r demand[r] * min`` over the servers of
    ``side`` (a :class:`pricing.ledger.Side`) with room for one unit of ``demand`` of
    their unit price of ``r``; inf where no server has room."""
    used, cap = side.used[lo:hi], side.capacity
    needed = demand > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        units = np.where(needed, (cap[None] - used) / np.where(needed, demand, 1) + 1e-9, np.inf)
        share = np.where(cap[None] > 0, used / cap[None], 1.0)
    room = np.floor(units.min(axis=2)) >= 1  # (S, n)
    least = np.where(room[..., None], share, np.inf).min(axis=1)  # (S, R)
    out = np.full(hi - lo, np.inf)
    ok = np.isfinite(least).all(axis=1)
    out[ok] = np.exp(side.log_l + least[ok] * (side.log_u - side.log_l)) @ demand
    return out


def _room_bounds(job: Any, ledger: Any, lo: int, hi: int) -> NDArray[np.float64]:
    """The tighter bound of ``--bound room`` (module docstring), in place of
    ``_slot_cost_bounds``; a slot with no room gets a bound no schedule reaches."""
    module = importlib.import_module("pricing.best_schedule")
    alpha = _room_bound(ledger.worker_side, job.worker, lo, hi)
    beta = _room_bound(ledger.ps_side, job.ps, lo, hi)
    y = np.arange(1, job.chunks + 1)
    share = float((job.ps_needed(y) / y).min())
    out = (alpha + beta * share) * module._LB_SLACK
    return np.where(np.isfinite(out), out, 1e300)


def run(jobs: int, bound: str) -> dict[str, Any]:
    """Replay the workload (module docstring); the figures, and the decisions' digest."""
    if bound == "room":
        module = importlib.import_module("pricing.best_schedule")
        module._slot_cost_bounds = _room_bounds  # type: ignore[attr-defined]
    servers, specs = workload(1, jobs)
    trace = trace_from_dict({
        "version": 1, "resources": RESOURCES, "servers": servers, "horizon": WINDOW,
        "slot_seconds": SLOT_SECONDS, "pricing": {"bounds": "estimate"},
        "jobs": [{**spec, "arrival": 0} for spec in specs],
    })  # fmt: skip
    ms: dict[bool, list[float]] = {True: [], False: []}
    scanned: list[int] = []
    ends: list[int] = []
    payoffs: list[float | None] = []
    started = time.perf_counter()
    for record in replay(trace, clock=time.thread_time):
        decision = record.decision
        ms[decision.admitted].append(record.decision_ms)
        payoffs.append(decision.best.payoff)
        if not decision.admitted:
            scanned.append(decision.best.slots_scanned)
            if decision.best.jct is not None:  # the end of its best (unprofitable) schedule
                ends.append(decision.best.jct)
    seconds = time.perf_counter() - started
    rejected, admitted = np.array(ms[False]), np.array(ms[True])
    scans = np.array(scanned)
    return {
        "bound": bound,
        "jobs": jobs,
        "admitted": len(admitted),
        "rejected": len(rejected),
        "rejected_ms": {"p50": float(np.median(rejected)), "mean": float(rejected.mean())},
        "admitted_ms": {"p50": float(np.median(admitted)), "mean": float(admitted.mean())},
        "scanned": {
            "p50": float(np.median(scans)),
            "mean": float(scans.mean()),
            "share_all_300": float((scans >= WINDOW).mean()),
        },
        "best_end_jct_p50": float(np.median(ends)) if ends else None,
        "payoffs_digest": hashlib.sha256(repr(payoffs).encode()).hexdigest()[:16],
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--bound", choices=("ledger", "room"), default="ledger")
    args = parser.parse_args(argv)
    out = run(args.jobs, args.bound)
    r, a, s = out["rejected_ms"], out["admitted_ms"], out["scanned"]
    print(f"bound {out['bound']}: {out['admitted']} admitted, {out['rejected']} rejected "
          f"of {out['jobs']} ({out['seconds']:.1f} s)")  # fmt: skip
    print(f"  thread CPU ms a decision: rejected p50 {r['p50']:.3f} mean {r['mean']:.3f}; "
          f"admitted p50 {a['p50']:.3f} mean {a['mean']:.3f}")  # fmt: skip
    print(f"  slots a rejection scanned: p50 {s['p50']:.0f}, mean {s['mean']:.1f}, "
          f"all {WINDOW}: {100 * s['share_all_300']:.1f}%")  # fmt: skip
    print(f"  the best schedule of a rejected job ends, median: jct {out['best_end_jct_p50']}")
    print(f"  payoffs digest {out['payoffs_digest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
