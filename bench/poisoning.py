"""What one job with an absurd priority costs the ordinary jobs of a stream, in replay.

What is measured
    A generated trace (``--servers`` worker + as many PS servers, ``--horizon`` slots,
    ``--jobs`` jobs, seeds FIRST..FIRST+N-1) is replayed by OASiS with estimated bounds;
    then again with one extra 1-worker job (a copy of the job at that position, with
    sigmoid priority 1e6, 1e308 or 1.7e308, decay 0.5, target 5) inserted at position 0
    (the first job the estimate sees) or 10. Reported: how many of the ordinary jobs were
    admitted without and with it, the share lost, and whether the poisoned job was admitted.
    With the shipped prior (the daemon's default) and without any prior.

Methodology
    ``controller.replay.replay``: the daemon's estimate rule (pricing/bound_estimate.py);
    decisions are deterministic.

Run with
    .venv/bin/python -m bench.poisoning [--seeds 3] [--first-seed 1] [--jobs 150]
        [--servers 10] [--horizon 100]
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import numpy as np

from controller.replay import replay
from pricing import trace_from_dict
from pricing.workload import generate_trace

PRIORITIES = (1e6, 1e308, 1.7e308)
POSITIONS = (0, 10)


def _admitted(raw: dict[str, Any]) -> dict[str, bool]:
    return {r.decision.job.id: r.decision.admitted for r in replay(trace_from_dict(raw))}


def measure(seeds: list[int], jobs: int, servers: int, horizon: int) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        raw: dict[str, Any] = generate_trace(
            np.random.default_rng(seed), n_jobs=jobs, n_worker_servers=servers,
            n_ps_servers=servers, horizon=horizon,
        )  # fmt: skip
        for prior in ("default", "none"):
            raw["pricing"] = {"bounds": "estimate", "prior": prior}
            clean = _admitted(raw)
            ordinary = sum(clean.values())
            for priority in PRIORITIES:
                for pos in POSITIONS:
                    poisoned: dict[str, Any] = copy.deepcopy(raw)
                    spec = copy.deepcopy(raw["jobs"][pos])
                    spec.update(id="poison", chunks=1)
                    spec["utility"] = {
                        "kind": "sigmoid", "priority": priority, "decay": 0.5, "target": 5,
                    }  # fmt: skip
                    poisoned["jobs"].insert(pos, spec)
                    got = _admitted(poisoned)
                    kept = sum(got[j] for j in clean)
                    rows.append(
                        {"seed": seed, "prior": prior, "priority": priority, "position": pos,
                         "ordinary": ordinary, "kept": kept,
                         "lost": (ordinary - kept) / ordinary if ordinary else 0.0,
                         "poison_admitted": got["poison"]}
                    )  # fmt: skip
        print(f"  seed {seed}: done", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.poisoning")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=150)
    parser.add_argument("--servers", type=int, default=10)
    parser.add_argument("--horizon", type=int, default=100)
    args = parser.parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    rows = measure(seeds, args.jobs, args.servers, args.horizon)
    print("| prior | seed | priority | position | ordinary admitted | with the job | lost "
          "| it was admitted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['prior']} | {r['seed']} | {r['priority']:g} | {r['position']} | "
            f"{r['ordinary']} | {r['kept']} | {r['lost']:.1%} | {r['poison_admitted']} |"
        )
    for prior in ("default", "none"):
        worst = max(r["lost"] for r in rows if r["prior"] == prior)
        print(f"\nworst share of ordinary admissions lost, {prior} prior: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
