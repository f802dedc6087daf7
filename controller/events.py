"""Fan-out of live events to watchers (the stored log is in the store)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pricing.fields import MAX_JOB_KEY_CHARS

__all__ = ["MAX_SHOWN_DETAIL", "Event", "EventBus", "shown_event", "taken_with"]

MAX_SHOWN_DETAIL = 1 << 16
"""Characters of an event's detail, as JSON, sent to a reader (64 Ki): the daemon's own
details are a few hundred."""

_KIND_CHARS = 32  # the events table's kind column, String(32)


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


def shown_event(row: Any) -> Event:
    """A stored event row as the daemon hands it to a reader (a watch stream, the
    console, the broker), its fields bounded: a row edited by hand with a detail of
    20 MB made every ``oasis watch --from`` before it end at it, the message over gRPC's
    limit (``RESOURCE_EXHAUSTED``), for good. A detail that is no JSON object, or over
    :data:`MAX_SHOWN_DETAIL` characters as JSON, is replaced by one saying so; a kind is
    cut to its column's 32 characters, and a job id to the longest job key."""
    detail = row.detail
    note = ""
    if not isinstance(detail, dict):
        note = f"the stored detail is not a JSON object but {type(detail).__name__}"
    else:
        try:
            size = len(json.dumps(detail))
        except (TypeError, ValueError, RecursionError):
            size = -1
        if size < 0:
            note = "the stored detail cannot be shown (the store was edited)"
        elif size > MAX_SHOWN_DETAIL:
            note = (
                f"the stored detail cannot be shown: {size} characters as JSON, over "
                f"{MAX_SHOWN_DETAIL} (the store was edited)"
            )
    kind, job_id = (str(v) for v in (row.kind, row.job_id))
    return Event(
        row.sequence, kind[:_KIND_CHARS], job_id[:MAX_JOB_KEY_CHARS], row.slot, row.state,
        {"unreadable": note} if note else detail,
    )  # fmt: skip


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
