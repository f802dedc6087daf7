"""Plans while a broker that lost its state gets every job's latest event back.

What is measured
    An admission controller (the daemon's, in-process, on a SQLite store in a temporary
    directory) over 100 worker and 10 PS servers whose store holds ``--history`` jobs'
    events, all published before (a long history: the store keeps every job unless
    ``keep_days`` is set). Its execution plane connects to a fresh Mosquitto broker
    (started on a loopback port, in memory: it holds no retained message), so the
    plane republishes the latest event of every job (``Plane.restore_job_events``).
    Right after the connection a job is submitted and admitted, and a subscriber (its
    own connection) times, from the connection:

    - ``plan s``: until the new job's plan arrives (what its servers' agents need to
      start it);
    - ``event s``: until the new job's ``decided`` event arrives;
    - ``restored s``: until every job's retained event has arrived.

    The history's events are written to the store directly (one ``cancelled`` event of
    an ended job each), not decided: the benchmark measures the plane, not decisions.
    (Until 2026-11-30 they were rejections, which are no longer retained nor restored.)

Run with
    ``python -m bench.plane_restore`` (``--history 100000``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomqtt
from sqlalchemy import func, insert, select

from bench.machine import describe
from bench.plan_fanout import config, job
from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.plane.link import start_plane
from controller.plane.topics import Plan, Topics
from controller.store import Database
from controller.store.models import EventRow
from tests.broker import Mosquitto

SLOT = 3600.0
_CHUNK = 10_000


def write_history(controller: AdmissionController, jobs: int) -> int:
    """``jobs`` cancelled jobs' ``cancelled`` events in the store; returns the last sequence."""
    now = datetime.now(UTC)
    with controller.db.session() as session:
        for lo in range(0, jobs, _CHUNK):
            rows = [
                {"at": now, "kind": "cancelled", "job_id": f"h{i}", "slot": 0, "state": "cancelled"}
                for i in range(lo, min(jobs, lo + _CHUNK))
            ]
            session.execute(insert(EventRow), rows)
    with controller.db.session() as session:
        return int(session.scalar(select(func.max(EventRow.sequence))) or 0)


async def run(history: int, servers: int) -> dict[str, Any]:
    broker = Mosquitto()
    tmp = Path(tempfile.mkdtemp(prefix="oasis-restore-"))
    cfg = config(tmp, servers, broker.port)
    controller = AdmissionController(
        cfg, Database(cfg.database_url), SlotClock(FakeClock(0.0), SLOT)
    )
    await asyncio.to_thread(controller.open)
    assert cfg.mqtt is not None
    topics = Topics(cfg.mqtt.topic_prefix)
    last = await asyncio.to_thread(write_history, controller, history)
    plane = await start_plane(controller, cfg.mqtt)
    plane.execution.events_published = last  # published before the broker lost them
    times: dict[str, float] = {}
    try:
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="restore-sub") as sub:
            await sub.subscribe(topics.all_plans, qos=1)
            await sub.subscribe(topics.job_events("+"), qos=1)
            runner = asyncio.create_task(plane.run())
            while not plane.connected:
                await asyncio.sleep(0.001)
            t0 = time.perf_counter()
            view = await controller.submit(job(0))
            assert view.decision.admitted, view.decision
            probe_event = topics.job_events("j0")
            history_events = f"{topics.root}/jobs/h"
            restored = 0
            async for message in sub.messages:
                topic = str(message.topic)
                if topic == probe_event:
                    times.setdefault("event s", time.perf_counter() - t0)
                elif topic.startswith(history_events):
                    restored += 1
                    if restored == history:
                        times["restored s"] = time.perf_counter() - t0
                elif isinstance(message.payload, bytes) and "plan s" not in times:
                    plan = Plan.parse(message.payload)
                    if any("j0" in str(part) for part in (plan.current, plan.next)):
                        times["plan s"] = time.perf_counter() - t0
                if len(times) == 3:
                    break
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
    finally:
        controller.close()
        broker.close()
    return {"history jobs": history, "servers": servers + 10,
            **{k: round(v, 3) for k, v in sorted(times.items())}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=100_000, help="jobs in the store")
    parser.add_argument("--servers", type=int, default=100, help="worker servers")
    args = parser.parse_args()
    result = asyncio.run(run(args.history, args.servers))
    print(json.dumps({"machine": describe(aiomqtt=aiomqtt.__version__), **result}, indent=2))


if __name__ == "__main__":
    main()
