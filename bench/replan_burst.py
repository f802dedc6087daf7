"""One tenant's slow jobs against everyone's calls: how long the decision thread is held
by the reviews of the agents' counts at the start of a slot.

What is measured
    The admission controller in-process (``controller.admission``, SQLite, a fake slot
    clock at slot 0) with the execution plane's daemon side
    (``controller.plane.execution.Execution``, no broker: reports are calls). The
    paper's workload (``pricing.workload``, seeded): ``--servers`` worker + as many PS
    servers, a window of ``--window`` slots; ``--jobs`` of its jobs are submitted by
    one tenant (``alice``) in slot 0 (arrivals dropped). Then every admitted job's agent
    reports it ``--slower`` times slower than planned (eight reports of its first
    mini-batches, as :meth:`Execution.report` takes them), and the reviews run
    (``Execution.review_sync``, one turn of the decision thread each, as the daemon runs
    one a second) until none has anything left to search this slot. Reported: each
    review's wall time (``time.perf_counter``): the longest is how long every other
    tenant's call waited at once; and the jobs re-planned (or found ``behind``).

    ``--limits`` passes ``[limits]`` keys (``replan_steps_per_review=1e10``, the most
    it may be, and ``replan_steps_per_submitter=1e12`` turn the turns off here: every
    re-plan in one turn, as before them; one turn's re-plans take well under 1e10 steps).

Usage
    .venv/bin/python -m bench.replan_burst [--servers 50] [--window 300] [--jobs 300]
        [--slower 4] [--limits KEY=VALUE ...] [--json]
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

import numpy as np
import structlog

from bench.in_process import first_servers, opened_controller
from bench.machine import describe
from controller.plane.execution import Execution
from controller.plane.settings import MqttConfig
from controller.plane.topics import Progress, TaskProgress
from pricing.workload import generate_trace

SEED = 7
REPORTS = 8


def measure(servers: int, window: int, jobs: int, slower: float,
            limits: dict[str, float], data_dir: Path) -> dict[str, Any]:  # fmt: skip
    """See the module docstring."""
    trace: dict[str, Any] = generate_trace(
        np.random.default_rng(SEED), n_jobs=jobs, n_worker_servers=servers,
        n_ps_servers=servers, horizon=window,
    )  # fmt: skip
    c = opened_controller(data_dir, trace, window, {"max_utility": 0, **limits})
    try:
        admitted = []
        for spec in trace["jobs"]:
            view = asyncio.run(c.submit({k: v for k, v in spec.items() if k != "arrival"},
                                        by="alice"))  # fmt: skip
            if view.decision.admitted:
                admitted.append(view.id)
        ex = Execution(c, MqttConfig("localhost"), monotonic=lambda: 0.0)
        ex.load()
        reporters = first_servers(c, admitted)
        for key in admitted:
            sched = c._ledger.schedule(key)
            total = ex.jobs.get(key).total_minibatches
            per_mb = c.config.slot_seconds * sched.work() / total  # planned, seconds
            for i in range(1, REPORTS + 1):
                ex.report(Progress(reporters[key], "a", [TaskProgress(key, float(i),
                                                              i * slower * per_mb)]))  # fmt: skip
        reviews: list[float] = []
        kinds: dict[str, int] = {}
        while (not reviews or ex.review.pending) and len(reviews) < 10_000:
            start = time.perf_counter()
            events = ex.review_sync()
            reviews.append((time.perf_counter() - start) * 1000.0)
            for e in events:
                kinds[e.kind] = kinds.get(e.kind, 0) + 1
    finally:
        c.close()
    return {"machine": describe(), "servers": servers, "window": window, "jobs": jobs,
            "admitted": len(admitted), "slower": slower, "limits": limits,
            "reviews": len(reviews), "review_ms_max": round(max(reviews, default=0.0), 1),
            "review_ms_total": round(sum(reviews), 1), "events": kinds}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", type=int, default=50, help="worker servers (and as many PS)")
    p.add_argument("--window", type=int, default=300, help="slots, T")
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--slower", type=float, default=4.0, help="times slower than planned")
    p.add_argument("--limits", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    limits = {k: float(v) for k, _, v in (item.partition("=") for item in args.limits)}
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # the daemon's logs
    with tempfile.TemporaryDirectory() as d:
        out = measure(args.servers, args.window, args.jobs, args.slower, limits, Path(d))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['admitted']} of {out['jobs']} jobs admitted, reported {args.slower:g}x "
              f"slower; {out['reviews']} reviews: longest {out['review_ms_max']} ms, "
              f"{out['review_ms_total']} ms in all; events {out['events']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
