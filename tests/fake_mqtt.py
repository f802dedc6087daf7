"""A stand-in for the aiomqtt client the daemon's link publishes through, for unit tests
that record what the link sends without a broker.

The link publishes one message at a time with aiomqtt's ``publish``, and many (plans,
job events) with :func:`controller.plane.client.publish_all`, which goes to paho's
``publish`` and aiomqtt's pending publishes directly. :class:`FakeMqtt` has both: every
message is recorded in :attr:`FakeMqtt.sent`, in the order published, and acknowledged
(its pending entry set, as aiomqtt's ``on_publish`` does) in a task of its own, after
the test's hook ``before`` if one is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import paho.mqtt.client as paho

__all__ = ["FakeMqtt"]

Hook = Callable[[str, bytes, int, bool], Awaitable[None]]


class _Info:
    """What paho's ``publish`` returns: a message id, not yet acknowledged."""

    def __init__(self, mid: int) -> None:
        self.mid = mid
        self.rc = paho.MQTT_ERR_SUCCESS

    def is_published(self) -> bool:
        return False


class _Paho:
    def __init__(self, owner: FakeMqtt) -> None:
        self.owner = owner
        self.mid = 0

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> _Info:
        owner = self.owner
        owner.sent.append((topic, payload))
        self.mid += 1
        mid = self.mid
        task = asyncio.get_running_loop().create_task(owner.ack(mid, topic, payload, qos, retain))
        owner.tasks.add(task)  # held until done: a task only the loop refers to may be lost
        task.add_done_callback(owner.tasks.discard)
        return _Info(mid)


class FakeMqtt:
    """Records what is published (:attr:`sent`: ``(topic, payload)``), awaiting
    ``before(topic, payload, qos, retain)`` for each message before it counts as
    acknowledged."""

    def __init__(self, before: Hook | None = None) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.timeout = 10.0
        self.before = before
        self._pending_publishes: dict[int, Any] = {}
        self._client = _Paho(self)
        self.tasks: set[asyncio.Task[None]] = set()

    async def publish(
        self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False, **_: object
    ) -> None:
        """aiomqtt's ``publish``: returns once acknowledged."""
        if self.before is not None:
            await self.before(topic, payload, qos, retain)
        self.sent.append((topic, payload))

    async def ack(self, mid: int, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        if self.before is not None:
            await self.before(topic, payload, qos, retain)
        pending = self._pending_publishes.pop(mid, None)
        if pending is not None:
            pending.set()
