"""Store reads of the API run in a pool of their own, at most READS_PER_CLIENT of one
named client at once: one tenant's backlog of costly reads (pages of 60,000 allocations,
0.6 s each, 10 a second) queued every tenant's GetJob behind it (p90 6.8 ms -> 28 s)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from controller.admission.controller import READS_PER_CLIENT
from controller.clock import FakeClock
from tests.test_pending import controller


def test_one_clients_reads_wait_for_its_own_not_for_everyones(tmp_path: Path) -> None:
    c = controller(tmp_path, FakeClock(1_000_000.0))
    lock = threading.Lock()
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    order: list[str] = []

    def slow(client: str, seconds: float) -> str:
        with lock:
            running[client] = running.get(client, 0) + 1
            most[client] = max(most.get(client, 0), running[client])
            order.append(f"{client} starts")
        time.sleep(seconds)
        with lock:
            running[client] -= 1
            order.append(f"{client} ends")
        return client

    async def scene() -> None:
        flood = [
            asyncio.create_task(c.read_store(slow, "mallory", 0.2, client="mallory"))
            for _ in range(12)
        ]
        await asyncio.sleep(0.05)  # mallory's first reads are running, the rest queued
        assert await c.read_store(slow, "alice", 0.0, client="alice") == "alice"
        assert set(await asyncio.gather(*flood)) == {"mallory"}

    try:
        asyncio.run(scene())
    finally:
        c.close()
    assert most["mallory"] == READS_PER_CLIENT
    # alice's read ran while mallory's were still queued: not after all twelve
    starts = [i for i, what in enumerate(order) if what == "mallory starts"]
    assert order.index("alice ends") < starts[2 * READS_PER_CLIENT]
    assert not c._read_turns  # forgotten once done
