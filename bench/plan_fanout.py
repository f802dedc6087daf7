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
    - ``delivered``: from the boundary until a separate subscriber (its own connection
      and process, as agents have: subscribed at QoS 1, as agents are, to every plan
      topic) has received the new plan of every server. It reads each plan's server
      and slot with ``json.loads`` alone: 10,000 agents parse their own plans each on
      its own server, one process parsing all of them measured itself. Times are
      ``time.monotonic()`` in both processes (one clock on Linux). Until 2026-11-30
      the subscriber shared the publisher's process and event loop and parsed each
      plan whole (``Plan.parse``): its work then counted against the publisher.

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
import multiprocessing
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiomqtt

from bench.machine import describe
from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.plane.client import client_for
from controller.plane.link import Plane, start_plane
from controller.plane.topics import Topics
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


def subscribe(port: int, prefix: str, names: list[str], out: Connection) -> None:
    """A subscriber's process: say ``"ready"`` once subscribed to the plans of the
    servers ``names``, then ``(slot, t)``, ``t`` its ``time.monotonic()``, once it has
    the plan of each of them for ``slot``."""

    async def follow() -> None:
        topics = Topics(prefix)
        seen: dict[int, set[str]] = {}
        servers = len(names)
        ident = f"fanout-sub-{names[0]}"
        async with aiomqtt.Client("127.0.0.1", port, identifier=ident) as sub:
            for at in range(0, servers, 1000):  # a SUBSCRIBE of 1,000 topics at a time
                share = names[at : at + 1000]
                await sub.subscribe([(topics.plan(n), 1) for n in share])
            out.send("ready")
            async for message in sub.messages:
                assert isinstance(message.payload, bytes)
                plan = json.loads(message.payload)
                slot = plan["current"]["slot"]
                got = seen.setdefault(slot, set())
                got.add(plan["server"])
                if len(got) == servers:
                    out.send((slot, time.monotonic()))

    asyncio.run(follow())


async def run(servers: int, jobs: int, rounds: int, processes: int) -> dict[str, Any]:
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
    publish: list[float] = []
    delivered: list[float] = []
    spawn = multiprocessing.get_context("spawn")
    pipes, subscribers = [], []
    ordered = sorted(names)
    for k in range(processes):
        theirs, ours = spawn.Pipe(duplex=False)
        share = ordered[k::processes]
        process = spawn.Process(
            target=subscribe, args=(broker.port, cfg.mqtt.topic_prefix, share, ours)
        )
        process.start()
        pipes.append(theirs)
        subscribers.append(process)

    async def said(pipe: Connection, slot: int | None, within: float) -> float:
        while True:
            if not await asyncio.to_thread(pipe.poll, within):
                raise RuntimeError(f"a subscriber: nothing of slot {slot} within {within} s")
            got = pipe.recv()
            if slot is None or got[0] == slot:
                return 0.0 if slot is None else float(got[1])

    try:
        for pipe in pipes:
            await said(pipe, None, 60)  # "ready"
        async with client_for(cfg.mqtt, "fanout-daemon") as client:
            for r in range(rounds + 1):
                clock.advance(SLOT)  # the boundary
                slot = controller.slots.current_slot()
                t0 = time.monotonic()
                sent = await plane.publish_round(client)
                t1 = time.monotonic()
                assert sent == len(names), (sent, len(names))
                t2 = max([await said(pipe, slot, 120) for pipe in pipes])
                if r > 0:  # the first is the warm-up
                    publish.append(t1 - t0)
                    delivered.append(t2 - t0)
    finally:
        for process in subscribers:
            process.terminate()
            process.join(10)
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
        "subscriber processes": processes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=1000, help="worker servers")
    parser.add_argument("--jobs", type=int, default=50, help="jobs admitted first")
    parser.add_argument("--rounds", type=int, default=5, help="timed slot boundaries")
    parser.add_argument("--subscribers", type=int, default=1,
                        help="subscriber processes, each following a share of servers")  # fmt: skip
    args = parser.parse_args()
    result = asyncio.run(run(args.servers, args.jobs, args.rounds, args.subscribers))
    print(json.dumps({"machine": describe(aiomqtt=aiomqtt.__version__), **result}, indent=2))


if __name__ == "__main__":
    main()
