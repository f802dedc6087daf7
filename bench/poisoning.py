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

    ``--daemon``: the same streams through a real ``oasisd`` (a subprocess on loopback,
    SQLite store, ``[limits] max_utility = 0`` so the poison is let in; the shipped prior),
    submitted one by one over gRPC. The daemon decides at the current slot, so every job
    arrives in slot 1 (the window ``T`` = ``--horizon``): the stream keeps its order and
    jobs, not its arrival times. The replay of that same compressed trace is run too, and
    the table says whether its decisions equal the daemon's.

Run with
    .venv/bin/python -m bench.poisoning [--seeds 3] [--first-seed 1] [--jobs 150]
        [--servers 10] [--horizon 100] [--daemon]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from controller.replay import replay
from pricing import trace_from_dict
from pricing.workload import generate_trace

PRIORITIES = (1e6, 1e308, 1.7e308)
POSITIONS = (0, 10)


def _admitted(raw: dict[str, Any]) -> dict[str, bool]:
    return {r.decision.job.id: r.decision.admitted for r in replay(trace_from_dict(raw))}


def _daemon_admitted(raw: dict[str, Any], horizon: int) -> dict[str, bool]:
    """Submit ``raw``'s jobs in order to a fresh daemon; each job's admission."""
    import grpc

    from bench.daemon_throughput import write_config
    from controller.convert import spec_to_proto
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc
    from tests.servers import Daemon

    with tempfile.TemporaryDirectory(prefix="oasis-poison-") as tmp:
        work = Path(tmp)
        extra = "\n[limits]\nmax_utility = 0\n"
        config = write_config(
            work / "oasisd.toml", work / "data", "", raw["servers"], time.time(),
            window=horizon, extra=extra,
        )  # fmt: skip
        daemon = Daemon(config, work / "oasisd.log").start(timeout=120)
        try:
            with grpc.insecure_channel(daemon.address) as channel:
                stub = pb_grpc.AdmissionStub(channel)
                out = {}
                for job in raw["jobs"]:
                    spec = {k: v for k, v in job.items() if k != "arrival"}
                    reply = stub.SubmitJob(
                        pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=120
                    )
                    out[spec["id"]] = bool(reply.job.decision.admitted)
        finally:
            daemon.stop()
        return out


def measure_daemon(seeds: list[int], jobs: int, servers: int, horizon: int) -> list[dict[str, Any]]:
    """The poisoned streams through the daemon (see the module docstring)."""
    rows = []
    for seed in seeds:
        raw = _trace(seed, jobs, servers, horizon)
        raw["horizon"] = horizon + 1  # slot 0 now; arrival 1; planned up to slot T
        raw["pricing"] = {"bounds": "estimate", "prior": "default"}
        for job in raw["jobs"]:
            job["arrival"] = 1
        clean = _daemon_admitted(raw, horizon)
        same = clean == _admitted(raw)
        ordinary = sum(clean.values())
        for priority in PRIORITIES:
            for pos in POSITIONS:
                poisoned = _poisoned(raw, priority, pos)
                got = _daemon_admitted(poisoned, horizon)
                same = same and got == _admitted(poisoned)
                kept = sum(got[j] for j in clean)
                rows.append(
                    {"seed": seed, "prior": "default (daemon)", "priority": priority,
                     "position": pos, "ordinary": ordinary, "kept": kept,
                     "lost": (ordinary - kept) / ordinary if ordinary else 0.0,
                     "poison_admitted": got["poison"], "replay_equal": same}
                )  # fmt: skip
        print(f"  seed {seed}: done (replay equal: {same})", file=sys.stderr, flush=True)
    return rows


def _trace(seed: int, jobs: int, servers: int, horizon: int) -> dict[str, Any]:
    return generate_trace(
        np.random.default_rng(seed), n_jobs=jobs, n_worker_servers=servers,
        n_ps_servers=servers, horizon=horizon,
    )  # fmt: skip


def _poisoned(raw: dict[str, Any], priority: float, pos: int) -> dict[str, Any]:
    """``raw`` with a 1-worker copy of job ``pos`` at ``priority`` inserted there."""
    poisoned: dict[str, Any] = copy.deepcopy(raw)
    spec = copy.deepcopy(raw["jobs"][pos])
    spec.update(id="poison", chunks=1)
    spec["utility"] = {"kind": "sigmoid", "priority": priority, "decay": 0.5, "target": 5}
    poisoned["jobs"].insert(pos, spec)
    return poisoned


def measure(seeds: list[int], jobs: int, servers: int, horizon: int) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        raw = _trace(seed, jobs, servers, horizon)
        for prior in ("default", "none"):
            raw["pricing"] = {"bounds": "estimate", "prior": prior}
            clean = _admitted(raw)
            ordinary = sum(clean.values())
            for priority in PRIORITIES:
                for pos in POSITIONS:
                    got = _admitted(_poisoned(raw, priority, pos))
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
    parser.add_argument("--daemon", action="store_true", help="through a real oasisd")
    args = parser.parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    run = measure_daemon if args.daemon else measure
    rows = run(seeds, args.jobs, args.servers, args.horizon)
    print("| prior | seed | priority | position | ordinary admitted | with the job | lost "
          "| it was admitted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['prior']} | {r['seed']} | {r['priority']:g} | {r['position']} | "
            f"{r['ordinary']} | {r['kept']} | {r['lost']:.1%} | {r['poison_admitted']} |"
        )
    for prior in sorted({r["prior"] for r in rows}):
        worst = max(r["lost"] for r in rows if r["prior"] == prior)
        print(f"\nworst share of ordinary admissions lost, {prior} prior: {worst:.1%}")
    if args.daemon:
        print(f"replay decided as the daemon in every run: {all(r['replay_equal'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
