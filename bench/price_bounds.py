"""How the price bounds change OASiS's total utility, against the baselines and the
certified upper bound.

What is measured
    For each job count and seed, one trace in the paper's setting (50 + 50 servers,
    T = 300, pricing/workload.py) is replayed by OASiS with SPEC 4's oracle bounds, with
    the daemon's estimate (pricing/bound_estimate.py) at each ``trim`` starting from the
    shipped prior, and with the estimate at the default trim without a prior; and by the
    Risk-Reward heuristic (RRH), RRH without preemption (``rrh-np``) and Dorm. Per trace
    also the certified upper bound ``sum_i f_i(fastest completion on an empty cluster)``
    and the paper's ``sum_i f_i(ceil(W_i / N_i))`` (pricing/quality.py).

Methodology
    ``generate_trace(numpy.random.default_rng(seed), ...)`` with seeds FIRST..FIRST+N-1;
    every policy replays the same jobs. Utilities are deterministic; times do not matter.

Run with
    .venv/bin/python -m bench.price_bounds [--jobs 300,400] [--seeds 3] [--first-seed 1]
        [--trims 0.2,0.3,0.4] [--json]
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
from pricing.bound_estimate import DEFAULT_TRIM
from pricing.quality import certified_bound, dmin_bound
from pricing.workload import generate_trace

SERVERS = 50
HORIZON = 300
BASELINES = ("rrh", "rrh-np", "dorm")


def _oasis(raw: dict[str, Any], pricing: dict[str, Any]) -> float:
    trace = trace_from_dict({**raw, "pricing": pricing})
    return float(sum(r.decision.best.utility or 0.0 for r in replay(trace) if r.decision.admitted))


def measure(jobs: list[int], seeds: list[int], trims: list[float]) -> list[dict[str, Any]]:
    """One row per job count and seed: total utility per policy label, and the bounds."""
    rows = []
    for n in jobs:
        for seed in seeds:
            raw = generate_trace(
                np.random.default_rng(seed), n_jobs=n, n_worker_servers=SERVERS,
                n_ps_servers=SERVERS, horizon=HORIZON,
            )  # fmt: skip
            oracle = trace_from_dict({**raw, "pricing": {"bounds": "oracle"}})
            row: dict[str, Any] = {"jobs": n, "seed": seed}
            row["bound"] = certified_bound(oracle)
            row["sum f(d_min)"] = dmin_bound(oracle)
            row["oracle"] = _oasis(raw, {"bounds": "oracle"})
            for trim in trims:
                row[f"trim {trim:g}"] = _oasis(raw, {"bounds": "estimate", "trim": trim})
            row["no prior"] = _oasis(raw, {"bounds": "estimate", "prior": "none"})
            for name in BASELINES:
                row[name] = float(sum(o.utility or 0.0 for o in run_baseline(oracle, name)))
            rows.append(row)
            print(f"  {n} jobs, seed {seed}: done", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.price_bounds")
    parser.add_argument("--jobs", default="300,400")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--trims", default="0.2,0.3,0.4")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    jobs = [int(x) for x in args.jobs.split(",")]
    trims = [float(x) for x in args.trims.split(",")]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()
    rows = measure(jobs, seeds, trims)
    wall = time.perf_counter() - started
    if args.json:
        json.dump({"machine": describe(), "wall_seconds": wall, "rows": rows}, sys.stdout)
        print()
        return 0
    labels = [k for k in rows[0] if k not in ("jobs", "seed")]
    print(f"total utility per trace ({describe()}, {wall:.0f} s)")
    print("jobs seed " + "  ".join(f"{label:>12}" for label in labels))
    for r in rows:
        print(f"{r['jobs']:>4} {r['seed']:>4} " + "  ".join(f"{r[k]:>12.1f}" for k in labels))
    default = f"trim {DEFAULT_TRIM:g}"
    if default in rows[0]:
        print(f"\nOASiS ({default}, shipped prior) per trace:")
        for r in rows:
            print(
                f"  {r['jobs']} jobs seed {r['seed']}: {r[default] / r['rrh']:.3f}x RRH, "
                f"{r[default] / r['rrh-np']:.3f}x RRH w/o preemption, "
                f"{r[default] / r['bound']:.3f} of the bound, "
                f"{r[default] / r['sum f(d_min)']:.3f} of sum f(d_min)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
