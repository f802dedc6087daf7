"""One tenant's many running jobs against everyone's calls: how long a review of the
agents' counts holds the decision thread, at every round of reports and when all the
jobs are reported done at once.

What is measured
    The admission controller in-process (``controller.admission``, SQLite with the
    daemon's defaults, a fake slot clock) with the execution plane's daemon side
    (``controller.plane.execution.Execution``; reports are calls, no broker). A cluster
    of 10 worker servers (8 GPUs each) and 10 PS servers, a window of 24 slots; one
    tenant (``alice``) submits ``--jobs`` tiny jobs in slot 0 (one worker, the least a
    worker may ask: :mod:`bench.tiny_workers`; ten mini-batches each). In slot 1 every
    admitted job's agent reports it on pace, ``--rounds`` times (a round of reports, as
    the agents send one every few seconds), then done. After each round one review
    (``Execution.review_sync``: one turn of the decision thread, as the daemon runs one
    a second) is timed with ``time.perf_counter``; after the done reports, reviews run
    until every job is completed. Reported: each review's wall time, in ms.

Usage
    .venv/bin/python -m bench.review_burst [--jobs 1000] [--rounds 3] [--json]

Run from another checkout's directory (``cd OTHER && python -m bench.review_burst``) it
measures that checkout's code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from bench.in_process import first_servers, opened_controller
from bench.machine import describe
from bench.tiny_workers import tiny_ps, tiny_worker
from controller.clock import FakeClock
from controller.plane.execution import Execution
from controller.plane.settings import MqttConfig
from controller.plane.topics import Progress, TaskProgress
from pricing.cluster import cluster_from_dict

MINIBATCHES = 10

CLUSTER: dict[str, Any] = {
    "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
    "servers": [
        *({"name": f"w{i}", "kind": "worker",
           "capacity": {"gpu": 8, "cpu": 64, "mem": 488, "disk": 500, "bandwidth": 40}}
          for i in range(10)),
        *({"name": f"p{i}", "kind": "ps",
           "capacity": {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 100}}
          for i in range(10)),
    ],
}  # fmt: skip


def measure(jobs: int, rounds: int, data_dir: Path) -> dict[str, Any]:
    """See the module docstring."""
    cluster = cluster_from_dict(CLUSTER["resources"], CLUSTER["servers"])
    clock = FakeClock(1.0)
    c = opened_controller(data_dir, CLUSTER, 24, {"max_utility": 0}, clock)
    config = c.config
    try:
        admitted = []
        for i in range(jobs):
            worker = tiny_worker(cluster, i)
            spec = {"id": f"t{i}", "epochs": 1, "chunks": 1, "minibatches": MINIBATCHES,
                    "tau": 0.05, "grad_mb": 0.001, "worker": worker, "ps": tiny_ps(worker),
                    "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5,
                                "target": 3}}  # fmt: skip
            view = asyncio.run(c.submit(spec, by="alice"))
            if view.decision.admitted:
                admitted.append(view.id)
        ex = Execution(c, MqttConfig("localhost"), monotonic=lambda: 0.0)
        ex.load()
        clock.advance(config.slot_seconds)  # slot 1: they run
        ex.review_sync()
        servers = first_servers(c, admitted)
        on_pace: list[float] = []
        for r in range(1, rounds + 1):
            for key in admitted:  # on pace: one mini-batch in 10 worker-seconds
                ex.report(Progress(servers[key], "a", [TaskProgress(key, float(r), 10.0 * r)]))
            on_pace.append(_timed(ex))
        for key in admitted:
            done = TaskProgress(key, float(MINIBATCHES), 10.0 * MINIBATCHES)
            ex.report(Progress(servers[key], "a", [done]))
        finishing: list[float] = []
        completed = 0
        while completed < len(admitted) and len(finishing) < 1000:
            start = time.perf_counter()
            completed += sum(e.kind == "completed" for e in ex.review_sync())
            finishing.append((time.perf_counter() - start) * 1000.0)
    finally:
        c.close()
    return {"machine": describe(), "jobs": jobs, "admitted": len(admitted),
            "on_pace_review_ms": [round(x, 1) for x in on_pace],
            "done_reviews_ms": [round(x, 1) for x in finishing],
            "completed": completed}  # fmt: skip


def _timed(ex: Execution) -> float:
    """One review's wall time, ms."""
    start = time.perf_counter()
    ex.review_sync()
    return (time.perf_counter() - start) * 1000.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3, help="rounds of on-pace reports")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # the daemon's logs
    with tempfile.TemporaryDirectory() as d:
        out = measure(args.jobs, args.rounds, Path(d))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['admitted']} of {out['jobs']} tiny jobs admitted; reviews of a round "
              f"of on-pace reports: {out['on_pace_review_ms']} ms; all reported done: "
              f"{out['completed']} completed, reviews {out['done_reviews_ms']} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
