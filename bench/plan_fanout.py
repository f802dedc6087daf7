"""Plan fan-out at a slot boundary: 1,000 servers' retained plans through a real broker.

What is measured
    An admission controller (the daemon's, in-process, on a SQLite store in a temporary
    directory) over ``--servers`` worker servers and 10 PS servers, with ``--jobs`` jobs
    admitted so plans carry tasks, and its execution plane connected to a Mosquitto
    broker started on a loopback port (``tests.broker.Mosquitto``). The slot clock is a
    fake clock; the benchmark moves it to the next slot boundary and times:

    - ``publish``: :meth:`Plane.publish_round` -- the plans of every server for the new
      current and next slot computed from the store (in the decision thread), a new
      epoch committed, and every plan published retained at QoS 1 with its PUBACK
      received;
    - ``delivered``: from the boundary until a separate subscriber (its own connection,
      subscribed to every plan topic) has received the new plan of every server.

    Goal: every server's plan published within one slot boundary in <= 2 s.

Methodology
    One warm-up boundary is published and discarded (connections, first queries). Then
    ``--rounds`` boundaries are timed with ``time.perf_counter``; the table gives the
    median and the maximum. Broker, benchmark and subscriber share the machine's cores.

Run with
    ``python -m bench.plan_fanout`` (``--servers 1000 --jobs 50 --rounds 5``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiomqtt

from bench.machine import describe
from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.plane.client import client_for
from controller.plane.link import Plane, start_plane
from controller.plane.topics import Plan, Topics
from controller.store import Database
from tests.broker import Mosquitto

SLOT = 3600.0


def config(tmp: Path, servers: int, broker_port: int) -> Any:
    gpu = {"gpu": 8, "cpu": 64, "mem": 488, "disk": 500, "bandwidth": 25}
    ps = {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25}
    return from_dict(
        {
            "daemon": {"data_dir": str(tmp), "window": 24, "slot_seconds": SLOT},
            "mqtt": {"url": f"mqtt://127.0.0.1:{broker_port}", "heartbeat_timeout": 600},
            "cluster": {
                "resources": ["gpu", "cpu", "mem", "disk", "bandwidth"],
                "servers": [
                    *({"name": f"w{i}", "kind": "worker", "capacity": gpu} for i in range(servers)),
                    *({"name": f"p{i}", "kind": "ps", "capacity": ps} for i in range(10)),
                ],
            },
        }
    )


def job(i: int) -> dict[str, Any]:
    return {
        "id": f"j{i}", "epochs": 2, "chunks": 16, "minibatches": 50, "tau": 0.1,
        "grad_mb": 100, "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
        "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
        "utility": {"kind": "sigmoid", "priority": 80, "decay": 0.2, "target": 6},
    }  # fmt: skip


async def run(servers: int, jobs: int, rounds: int) -> dict[str, Any]:
    broker = Mosquitto()
    tmp = Path(tempfile.mkdtemp(prefix="oasis-fanout-"))
    cfg = config(tmp, servers, broker.port)
    clock = FakeClock(0.0)
    controller = AdmissionController(cfg, Database(cfg.database_url), SlotClock(clock, SLOT))
    await asyncio.to_thread(controller.open)
    admitted = 0
    for i in range(jobs):
        view = await controller.submit(job(i))
        admitted += view.decision.admitted
    assert cfg.mqtt is not None
    plane: Plane = await start_plane(controller, cfg.mqtt)
    names = {f"w{i}" for i in range(servers)} | {f"p{i}" for i in range(10)}
    topics = Topics(cfg.mqtt.topic_prefix)
    publish: list[float] = []
    delivered: list[float] = []
    try:
        async with (
            client_for(cfg.mqtt, "fanout-daemon") as client,
            aiomqtt.Client("127.0.0.1", broker.port, identifier="fanout-sub") as sub,
        ):
            await sub.subscribe(topics.all_plans, qos=1)
            for r in range(rounds + 1):
                clock.advance(SLOT)  # the boundary
                slot = controller.slots.current_slot()
                t0 = time.perf_counter()
                sent = await plane.publish_round(client)
                t1 = time.perf_counter()
                seen: set[str] = set()
                async for message in sub.messages:
                    assert isinstance(message.payload, bytes)
                    plan = Plan.parse(message.payload)
                    if plan.current.slot == slot:
                        seen.add(plan.server)
                    if seen == names:
                        break
                t2 = time.perf_counter()
                assert sent == len(names), (sent, len(names))
                if r > 0:  # the first is the warm-up
                    publish.append(t1 - t0)
                    delivered.append(t2 - t0)
    finally:
        controller.close()
        broker.close()
    return {
        "servers": len(names),
        "jobs admitted": admitted,
        "publish median s": round(statistics.median(publish), 3),
        "publish max s": round(max(publish), 3),
        "delivered median s": round(statistics.median(delivered), 3),
        "delivered max s": round(max(delivered), 3),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=1000, help="worker servers")
    parser.add_argument("--jobs", type=int, default=50, help="jobs admitted first")
    parser.add_argument("--rounds", type=int, default=5, help="timed slot boundaries")
    args = parser.parse_args()
    result = asyncio.run(run(args.servers, args.jobs, args.rounds))
    print(json.dumps({"machine": describe(aiomqtt=aiomqtt.__version__), **result}, indent=2))


if __name__ == "__main__":
    main()
