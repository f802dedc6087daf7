"""One tenant's flood of inflated jobs against another tenant's admissions, in the daemon.

What is measured
    ``oasisd`` runs as a subprocess (``tests.servers``: the test cluster, a window of 24
    slots of 3600 s, SQLite) with ``[auth]`` and two submitters. ``alice`` submits
    ``--ordinary`` ordinary jobs (priority 50-100, ``tests.test_bounds_daemon``'s
    ``ordinary_jobs``, seeded); ``bob`` submits ``--flood`` one-worker jobs worth
    ``--priority`` (1e9, the default ``limits.max_utility``) and cancels each at once, so
    they hold no capacity: all they can do is move the price bounds. Per seed, three
    fresh daemons:

    - ``clean``: alice's jobs alone;
    - ``after``: bob's whole flood, then alice's jobs;
    - ``mixed``: bob's flood spread evenly among alice's jobs.

    Reported: alice's admissions in each, and ``after`` and ``mixed`` as a share of
    ``clean`` (issue 11's goal for a poisoned stream: at least 0.9).

Usage
    .venv/bin/python -m bench.tenant_flood [--seeds 7,8,9] [--flood 150] [--json]

Run from another checkout's directory (``cd OTHER && python -m bench.tenant_flood``) it
measures that checkout's daemon (``tests.servers`` starts the daemon of its own tree).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpc

from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import Daemon, write_config
from tests.test_bounds_daemon import ordinary_jobs, poison

TOKENS = {"alice": "alice-bench-token", "bob": "bob-bench-token"}


def _run(order: list[tuple[str, dict[str, Any]]], tmp: Path) -> int:
    """Submit ``order`` (``(who, spec)``; bob's are cancelled at once) to a fresh daemon:
    alice's admissions."""
    tokens = tmp / "tokens"
    tokens.write_text("".join(f"{n} submitter {hash_token(t)}\n" for n, t in TOKENS.items()))
    config = write_config(
        tmp / "oasisd.toml", tmp / "data", extra=f'[auth]\ntokens_file = "{tokens}"\n'
    )
    daemon = Daemon(config, tmp / "oasisd.log").start(timeout=120)
    admitted = 0
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.AdmissionStub(channel)
            for who, spec in order:
                meta = (("authorization", f"Bearer {TOKENS[who]}"),)
                request = pb.SubmitJobRequest(job=spec_to_proto(spec))
                decision = stub.SubmitJob(request, timeout=60, metadata=meta).job.decision
                if who == "alice":
                    admitted += decision.admitted
                else:
                    stub.CancelJob(pb.CancelJobRequest(id=spec["id"]), timeout=60, metadata=meta)
    finally:
        daemon.stop()
    return admitted


def measure(seed: int, ordinary: int, flood: int, priority: float) -> dict[str, Any]:
    """The three runs of one seed (see the module docstring)."""
    alice = [("alice", j) for j in ordinary_jobs(ordinary, seed=seed, prefix=f"a{seed}-")]
    bob = [("bob", {**poison(priority), "id": f"b{seed}-{i}"}) for i in range(flood)]
    mixed: list[tuple[str, dict[str, Any]]] = []
    per = flood / max(1, ordinary)
    for i, job in enumerate(alice):
        mixed += [*bob[round(i * per) : round((i + 1) * per)], job]
    out: dict[str, Any] = {"seed": seed}
    for name, order in (("clean", alice), ("after", bob + alice), ("mixed", mixed)):
        with tempfile.TemporaryDirectory() as tmp:
            out[name] = _run(order, Path(tmp))
    clean = out["clean"] or 1
    out["after_share"] = out["after"] / clean
    out["mixed_share"] = out["mixed"] / clean
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="7,8,9")
    parser.add_argument("--ordinary", type=int, default=40)
    parser.add_argument("--flood", type=int, default=150)
    parser.add_argument("--priority", type=float, default=1e9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows.append(measure(seed, args.ordinary, args.flood, args.priority))
        if not args.json:
            r = rows[-1]
            print(
                f"seed {seed}: alice admitted {r['clean']} alone, {r['after']} after bob's "
                f"flood ({r['after_share']:.2f}), {r['mixed']} amid it ({r['mixed_share']:.2f})",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
