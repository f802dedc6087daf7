"""How the price bounds change OASiS's total utility, against the best baseline.

``python -m bench.price_bounds [--jobs 100,200,300,400] [--seeds 3] [--trims 0.05,0.1,0.2,0.3,0.5]``

For each job count and seed, one trace in the paper's setting (50 + 50 servers, T = 300,
pricing/workload.py) is replayed by OASiS with SPEC 4's oracle bounds and with the
daemon's estimate at each ``trim`` (pricing/bound_estimate.py), and by the Risk-Reward
heuristic and Dorm (the two strongest baselines here). Prints a table of mean total
utility per job count (and ``--json``); the numbers back the choice of the default trim
recorded in bench/RESULTS.md ("Price bounds").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from bench.machine import describe
from controller.replay import replay
from pricing import trace_from_dict
from pricing.baselines import run as run_baseline
from pricing.workload import generate_trace

SERVERS = 50
HORIZON = 300
BASELINES = ("rrh", "dorm")


def _oasis(raw: dict[str, Any]) -> float:
    trace = trace_from_dict(raw)
    return float(sum(r.decision.best.utility or 0.0 for r in replay(trace) if r.decision.admitted))


def _baseline(raw: dict[str, Any], name: str) -> float:
    return float(sum(o.utility or 0.0 for o in run_baseline(trace_from_dict(raw), name)))


def measure(jobs: list[int], seeds: int, trims: list[float]) -> list[dict[str, Any]]:
    """One row per job count and seed: total utility per policy label."""
    rows = []
    for n in jobs:
        for seed in range(seeds):
            raw = generate_trace(
                np.random.default_rng(seed),
                n_jobs=n,
                n_worker_servers=SERVERS,
                n_ps_servers=SERVERS,
                horizon=HORIZON,
            )
            row: dict[str, Any] = {"jobs": n, "seed": seed}
            row["oracle"] = _oasis({**raw, "pricing": {"bounds": "oracle"}})
            for trim in trims:
                row[f"trim {trim:g}"] = _oasis(
                    {**raw, "pricing": {"bounds": "estimate", "trim": trim}}
                )
            for name in BASELINES:
                row[name] = _baseline(raw, name)
            rows.append(row)
            print(f"  {n} jobs, seed {seed}: done", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.price_bounds")
    parser.add_argument("--jobs", default="100,200,300,400")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trims", default="0.05,0.1,0.2,0.3,0.5")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    jobs = [int(x) for x in args.jobs.split(",")]
    trims = [float(x) for x in args.trims.split(",")]
    started = time.perf_counter()
    rows = measure(jobs, args.seeds, trims)
    wall = time.perf_counter() - started
    if args.json:
        json.dump({"machine": describe(), "wall_seconds": wall, "rows": rows}, sys.stdout)
        print()
        return 0
    labels = [k for k in rows[0] if k not in ("jobs", "seed")]
    print(f"mean total utility over {args.seeds} seeds ({describe()}, {wall:.0f} s)")
    print("jobs  " + "  ".join(f"{label:>9}" for label in labels))
    for n in jobs:
        sel = [r for r in rows if r["jobs"] == n]
        means = [np.mean([r[label] for r in sel]) for label in labels]
        print(f"{n:>4}  " + "  ".join(f"{m:>9.0f}" for m in means))
    wins = {
        label: sum(all(r[label] >= r[b] for b in BASELINES) for r in rows)
        for label in labels
        if label not in BASELINES
    }
    print(
        "traces where it beats every baseline: "
        + ", ".join(f"{k} {v}/{len(rows)}" for k, v in wins.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
