"""One tenant's many active jobs against another tenant's calls, with the execution plane.

What is measured
    ``oasisd`` runs as a subprocess (``tests.servers``: the test cluster of 3 GPU and 2
    PS servers, a window of 24 slots of 3600 s, SQLite) with ``[auth]``, ``[mqtt]`` (a
    Mosquitto of its own on a loopback port, no agents) and two submitters. ``alice``
    submits ``--jobs`` tiny jobs (one worker for one slot, the least of one resource a
    worker may ask, :mod:`bench.tiny_workers`: 1,164 of 2,597 were admitted in a run, and
    every one admitted is in the plans of the current slot), one after
    another. Before and after, ``bob`` sends ``--quotes`` QuoteJob calls of an ordinary
    job, 50 ms apart, while alice keeps submitting tiny jobs (each admission wakes the
    plan publisher). Reported: bob's QuoteJob latency (p50, p90, max, in ms) with alice at
    about 0 active jobs and at ``--jobs``, and alice's rate over the ``--jobs``.

    Every publish round rebuilds every server's plan from the store (in the decision
    thread, which also answers bob) and encodes those that changed (on the event loop):
    a cost in proportion to all active jobs.

Usage
    .venv/bin/python -m bench.tenant_plans [--jobs 3000] [--quotes 40] [--json]

Run from another checkout's directory (``cd OTHER && python -m bench.tenant_plans``) it
measures that checkout's daemon (``tests.servers`` starts the daemon of its own tree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import grpc

from bench.tiny_workers import tiny_ps, tiny_worker
from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from pricing.cluster import cluster_from_dict
from tests.broker import Mosquitto
from tests.servers import CLUSTER_TOML, SMALL_JOB, Daemon, write_config

TOKENS = {"alice": "alice-bench-token", "bob": "bob-bench-token"}
TINY: dict[str, Any] = {
    "epochs": 1, "chunks": 1, "minibatches": 1, "tau": 0.5, "grad_mb": 0.001,
    "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
}  # fmt: skip

_RAW = tomllib.loads(CLUSTER_TOML)["cluster"]
CLUSTER = cluster_from_dict(_RAW["resources"], _RAW["servers"])


class _Tenants:
    """alice's and bob's calls to one daemon."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.AdmissionStub(self.channel)
        self.sent = 0
        self.admitted = 0

    def meta(self, who: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKENS[who]}"),)

    def tiny(self) -> None:
        """One of alice's tiny jobs."""
        self.sent += 1
        worker = tiny_worker(CLUSTER, self.sent)
        spec = {**TINY, "id": f"t{self.sent}", "worker": worker, "ps": tiny_ps(worker)}
        request = pb.SubmitJobRequest(job=spec_to_proto(spec))
        job = self.stub.SubmitJob(request, timeout=120, metadata=self.meta("alice")).job
        self.admitted += job.decision.admitted

    def quotes(self, count: int) -> list[float]:
        """bob's QuoteJob latencies (ms), 50 ms apart, while alice keeps submitting."""
        stop = threading.Event()

        def alice() -> None:
            while not stop.is_set():
                self.tiny()

        thread = threading.Thread(target=alice)
        thread.start()
        time.sleep(0.5)
        spent = []
        try:
            for i in range(count):
                request = pb.QuoteJobRequest(job=spec_to_proto({**SMALL_JOB, "id": f"q{i}"}))
                start = time.perf_counter()
                self.stub.QuoteJob(request, timeout=120, metadata=self.meta("bob"))
                spent.append((time.perf_counter() - start) * 1000)
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join()
        return spent


def _summary(spent: list[float]) -> dict[str, float]:
    ordered = sorted(spent)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max_ms": round(ordered[-1], 1),
    }


def measure(jobs: int, quotes: int) -> dict[str, Any]:
    """One daemon, one broker: bob's quotes with alice at about 0 and ``jobs`` jobs."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        broker = Mosquitto()
        tokens = tmp / "tokens"
        tokens.write_text("".join(f"{n} submitter {hash_token(t)}\n" for n, t in TOKENS.items()))
        extra = f'[auth]\ntokens_file = "{tokens}"\n[mqtt]\nurl = "{broker.url}"\n'
        config = write_config(tmp / "oasisd.toml", tmp / "data", extra=extra)
        daemon = Daemon(config, tmp / "oasisd.log").start(timeout=120)
        try:
            tenants = _Tenants(daemon.address)
            before = _summary(tenants.quotes(quotes))
            start, sent = time.perf_counter(), tenants.sent
            while tenants.sent < jobs:
                tenants.tiny()
            rate = (tenants.sent - sent) / (time.perf_counter() - start)
            after = _summary(tenants.quotes(quotes))
            active = tenants.admitted
            tenants.channel.close()
        finally:
            daemon.stop()
            broker.close()
    return {"jobs": jobs, "submitted": tenants.sent, "admitted": active,
            "alice_per_s": round(rate, 1),
            "bob_quote_before": before, "bob_quote_after": after}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="alice's tiny jobs")
    parser.add_argument("--quotes", type=int, default=40, help="bob's quotes per phase")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = measure(args.jobs, args.quotes)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        b, a = out["bob_quote_before"], out["bob_quote_after"]
        print(f"alice: {out['submitted']} tiny jobs in all, {out['admitted']} admitted; "
              f"{out['alice_per_s']}/s up to {out['jobs']}")  # fmt: skip
        print(f"bob's QuoteJob, alice at ~0 jobs:   p50 {b['p50_ms']} p90 {b['p90_ms']} "
              f"max {b['max_ms']} ms")  # fmt: skip
        print(f"bob's QuoteJob, alice at {out['jobs']} jobs: p50 {a['p50_ms']} p90 "
              f"{a['p90_ms']} max {a['max_ms']} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
