"""Fan-out of live events to watchers (the stored log is in the store)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "EventBus", "taken_with"]


def taken_with(servers: Sequence[str], server: str) -> dict[str, list[str]]:
    """``{"with": the others}`` for an event or log line of ``server``, one of
    ``servers`` taken out in one step (a cordon or failure of several); ``{}`` alone."""
    if len(servers) < 2:
        return {}
    return {"with": [name for name in servers if name != server]}


@dataclass(frozen=True)
class Event:
    """One entry of the event log."""

    sequence: int
    kind: str
    job_id: str
    slot: int
    state: str
    detail: dict[str, Any] = field(default_factory=dict)


class EventBus:
    """Every subscriber gets every published event; a slow one loses the oldest."""

    def __init__(self, backlog: int = 10_000) -> None:
        self._queues: set[asyncio.Queue[Event]] = set()
        self._backlog = backlog

    def subscribe(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue(self._backlog)
        self._queues.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        self._queues.discard(queue)

    def publish(self, event: Event) -> None:
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(event)
