"""A rack going dark: how often its servers' jobs move, and onto what.

What is measured
    The admission controller (in-process, SQLite in a temporary directory, its slot
    clock frozen in slot 0) with the execution plane's daemon side
    (:class:`controller.plane.execution.Execution`) on a fake monotonic clock: the real
    failure detection, :mod:`controller.plane.outages` and
    :func:`pricing.replan.fail_servers`; only the broker and the agents are replaced by
    calls (``Execution.heartbeat`` at each beat's arrival time, ``review_sync`` every
    ``tick_seconds``, 1 s, as the daemon's periodic review does).

    ``--workers`` worker servers (4 GPUs each) and 2 PS servers; ``--jobs`` jobs admitted
    (each plans its workers on several servers). Every agent beats every
    ``heartbeat_seconds`` (5 s) plus a jitter of up to 1 % (the reference agent's loop
    sleeps in 50 ms steps after publishing), each at its own random phase. At
    ``t0`` the first ``--dead`` workers' agents (the rack) fall silent one after the
    other, their silences starting evenly over ``--stagger`` seconds (0: all at once, a
    power cut; 5: within one heartbeat interval, a switch dying port by port, agents
    crashing as the PDU browns out); every other agent beats on. Reviewed until 30 s after
    the last could have failed.

    Per seed: the failure steps (reviews that failed servers: each is one
    ``fail_servers`` re-plan and one plan fan-out), the job moves (``server_failed`` job
    events), jobs moved more than once, moves that put a job on a rack server that fails
    later in the burst (``onto doomed``), and the seconds from the first rack server's
    timeout to its failure (``first delay``) and to the last rack server's failure.

Run with
    ``python -m bench.rack_failure`` (``--seeds 20 --staggers 0,2.5,5,7.5,10``)
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
import random
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import structlog

SPEC: dict[str, Any] = {
    "epochs": 1, "chunks": 2, "minibatches": 10, "tau": 0.05, "grad_mb": 1,
    "worker": {"gpu": 1, "bandwidth": 1}, "ps": {"bandwidth": 1},
    "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
}  # fmt: skip


def cluster(workers: int) -> dict[str, Any]:
    """``workers`` worker servers (4 GPUs) and two PS servers."""
    return {
        "resources": ["gpu", "bandwidth"],
        "servers": [
            *({"name": f"w{i}", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}}
              for i in range(workers)),
            *({"name": f"p{i}", "kind": "ps", "capacity": {"bandwidth": 20}} for i in range(2)),
        ],
    }  # fmt: skip


def run_once(
    tmp: Path, seed: int, workers: int, jobs: int, dead: int, stagger: float
) -> dict[str, Any]:
    """One burst; returns its counts (see the module docstring)."""
    from controller.admission import AdmissionController
    from controller.clock import FakeClock, SlotClock
    from controller.config import from_dict
    from controller.plane.execution import Execution
    from controller.plane.settings import MqttConfig
    from controller.plane.topics import Heartbeat
    from controller.store import Database

    rng = random.Random(seed)
    config = from_dict({"daemon": {"data_dir": str(tmp), "window": 6, "epoch": 0},
                        "cluster": cluster(workers)})  # fmt: skip
    c = AdmissionController(config, Database(config.database_url),
                            SlotClock(FakeClock(1.0), config.slot_seconds, 0.0),
                            log=structlog.wrap_logger(structlog.ReturnLogger()))  # fmt: skip
    c.open()
    try:
        for n in range(jobs):
            asyncio.run(c.submit({"id": f"j{n}", **SPEC}))
        mono = [0.0]
        ex = Execution(c, MqttConfig("localhost"), monotonic=lambda: mono[0])
        ex.load()
        ex.connected()
        h, timeout = ex.mqtt.heartbeat_seconds, ex.mqtt.heartbeat_timeout
        names = list(ex.server_index)
        rack = [f"w{i}" for i in range(dead)]
        t0 = 20.0
        silent_from = {s: t0 + stagger * k / max(dead - 1, 1) for k, s in enumerate(rack)}
        beats = [(rng.uniform(0, h), s) for s in names]
        heapq.heapify(beats)
        end = t0 + stagger + 2 * h + timeout + 30
        tick = config.tick_seconds
        review = tick
        last_beat: dict[str, float] = {}
        failed_at: dict[str, float] = {}
        moves: Counter[str] = Counter()
        steps = onto_doomed = 0
        while review < end:
            while beats and beats[0][0] <= review:
                at, server = heapq.heappop(beats)
                if at >= silent_from.get(server, end):
                    continue
                mono[0] = at
                ex.heartbeat(Heartbeat(server, "a"))
                last_beat[server] = at
                heapq.heappush(beats, (at + h * (1 + rng.uniform(0, 0.01)), server))
            mono[0] = review
            events = ex.review_sync()
            down = [e.detail["server"] for e in events if e.kind == "server_failed"]
            if down:
                steps += 1
                for server in down:
                    failed_at[server] = review
                moved = [
                    e.job_id
                    for e in events
                    if e.job_id and e.detail.get("reason") == "server_failed"
                ]
                moves.update(moved)
                doomed = [ex.server_index[s][1] for s in rack if s not in failed_at]
                for j in moved:
                    if j in c._ledger.job_ids() and doomed:
                        part = c._ledger.schedule(j).after(c.slot + 1)
                        if part.slots and part.workers[:, doomed].any():
                            onto_doomed += 1
            review += tick
        first_timeout = min(last_beat[s] + timeout for s in rack)
        first = min(failed_at[s] for s in rack if s in failed_at)
        last = max(failed_at.get(s, end) for s in rack)
        return {"steps": steps, "moves": sum(moves.values()), "jobs moved": len(moves),
                "moved twice+": sum(1 for n in moves.values() if n > 1),
                "most moves": max(moves.values(), default=0), "onto doomed": onto_doomed,
                "first delay": first - first_timeout, "last delay": last - first_timeout,
                "spread": max(last_beat[s] for s in rack) - min(last_beat[s] for s in rack),
                "healthy failed": sum(1 for s in failed_at if s not in rack)}  # fmt: skip
    finally:
        c.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--dead", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--staggers", default="0,2.5,5,7.5,10")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    keys = ["steps", "moves", "jobs moved", "moved twice+", "most moves", "onto doomed",
            "first delay", "last delay", "spread", "healthy failed"]  # fmt: skip
    print("| stagger s | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for stagger in (float(s) for s in args.staggers.split(",")):
        rows = []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(run_once(Path(tmp), seed, args.workers, args.jobs, args.dead, stagger))
        cells = []
        for key in keys:
            values = [r[key] for r in rows]
            cells.append(f"{statistics.mean(values):.2f} (max {max(values):.4g})")
        print(f"| {stagger:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
