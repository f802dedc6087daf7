"""The daemon's queue of incoming MQTT messages (the agents' heartbeats and reports),
bounded per topic.

``aiomqtt`` puts every message the broker delivers into one queue, which the plane's
link takes from (:meth:`controller.plane.link.Plane.take`: the agents' rate, then the
parsing). Its default queue is unbounded, and reading a large message costs the event
loop more than taking it: one agent publishing reports of 250 KB on its own topic as
fast as it could (below the broker's ``max_packet_size`` of the README's set-up) queued
4,800 of them in 20 s, and the daemon grew from 250 MB to 1.3 GB resident; every other
agent's heartbeats waited behind them (15 s late: two healthy servers were failed).

:class:`AgentQueue` keeps arrival order, but takes no more of one topic than
:data:`TOPIC_MESSAGES` messages or :data:`TOPIC_BYTES` bytes at once, and while the
whole queue holds :data:`QUEUE_BYTES`, no second message of a topic: a message of a
topic with none waiting is always taken (a quiet agent's heartbeat gets in whatever a
flooding one sends). What it drops is what the rate limit would drop: an agent's
reports carry running totals and its beats are periodic, so the next one makes up for
it. Each drop is passed to ``dropped(topic)`` (the link counts it as a message over its
agent's rate).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable

import aiomqtt

__all__ = ["QUEUE_BYTES", "TOPIC_BYTES", "TOPIC_MESSAGES", "AgentQueue"]

TOPIC_MESSAGES = 100
"""The most messages of one topic waiting at once (an agent's burst: the link's rate
limit drops the rest of a burst anyway)."""
TOPIC_BYTES = 4 << 20
"""The most payload bytes of one topic waiting at once (sixteen reports at the largest a
daemon parses, :data:`~controller.plane.codec.MAX_AGENT_PAYLOAD_BYTES`: an agent with
thousands of jobs resends them all, in reports of 1,000, when the daemon is back)."""
QUEUE_BYTES = 64 << 20
"""Past this many payload bytes waiting in all, only a message of a topic with none
waiting is taken."""


class AgentQueue(asyncio.Queue[aiomqtt.Message]):
    """A FIFO of incoming messages bounded per topic (see the module docstring); made
    by ``aiomqtt.Client(queue_type=...)`` through :meth:`factory`.

    Attributes:
        dropped: the messages dropped so far.
    """

    dropped: int
    on_drop: Callable[[str], None] | None = None

    @classmethod
    def factory(cls, on_drop: Callable[[str], None]) -> Callable[..., AgentQueue]:
        """A ``queue_type`` for aiomqtt whose queues call ``on_drop(topic)`` for each
        message they drop (on the event loop, as aiomqtt delivers)."""

        def make(maxsize: int = 0) -> AgentQueue:
            queue = cls(maxsize)
            queue.on_drop = on_drop
            return queue

        return make

    def _init(self, maxsize: int) -> None:
        self._items: deque[tuple[str, int, aiomqtt.Message]] = deque()
        self._count: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()
        self._total = 0
        self.dropped = 0

    def _put(self, item: aiomqtt.Message) -> None:
        topic = str(item.topic)
        size = len(item.payload) if isinstance(item.payload, bytes | bytearray | str) else 0
        if self._count[topic] and (
            self._count[topic] >= TOPIC_MESSAGES
            or self._bytes[topic] + size > TOPIC_BYTES
            or self._total + size > QUEUE_BYTES
        ):
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(topic)
            return
        self._items.append((topic, size, item))
        self._count[topic] += 1
        self._bytes[topic] += size
        self._total += size

    def _get(self) -> aiomqtt.Message:
        topic, size, item = self._items.popleft()
        self._count[topic] -= 1
        self._bytes[topic] -= size
        self._total -= size
        if not self._count[topic]:
            del self._count[topic], self._bytes[topic]
        return item

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items
