"""The one place an MQTT client is made: credentials, TLS and timeouts from the config."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import aiomqtt
import structlog

from controller.plane.settings import MqttConfig

__all__ = [
    "IN_FLIGHT",
    "MAX_QUEUED_TOPICS",
    "LatestPerTopic",
    "Stopping",
    "client_for",
    "for_each",
    "keepalive_seconds",
]

_T = TypeVar("_T")

IN_FLIGHT = 32
"""Calls one client has in flight at most (a QoS 1 publish until its PUBACK, a
subscription): aiomqtt scans its pending calls at every new one, and paho its queued
messages at every PUBACK, so each costs time linear in how many are in flight."""


class Stopping:
    """Whether a stop was asked of a task that talks to the broker, for its loops to see
    even when the cancel that came with it was lost.

    aiomqtt waits for each of the broker's acknowledgements (CONNACK, SUBACK, PUBACK) in
    ``asyncio.wait_for``, which on Python 3.11 returns the acknowledgement and drops the
    cancel when both come in the same turn of the event loop (3.12's raises). The task
    then ran on as if never cancelled: the daemon's stop waited out its 5 s for the
    broker link (2 to 5 of 8 stops that came as the link connected, measured), and an agent
    could miss its SIGTERM for good, its workers left running when the service manager
    killed it. ``Task.cancelling()`` cannot tell: 3.11's task groups leave it counted
    after a child's error (a lost connection), when nothing was cancelled.

    Whoever stops the task calls :meth:`ask`, then cancels it; its loops call
    :meth:`check` where they begin a turn (never in an ``except CancelledError``)."""

    def __init__(self) -> None:
        self.asked = False

    def ask(self) -> None:
        """The stop is asked (the task is cancelled next, by the caller)."""
        self.asked = True

    def check(self) -> None:
        """Raise CancelledError if the stop was asked."""
        if self.asked:
            raise asyncio.CancelledError


def keepalive_seconds(heartbeat_timeout: float) -> int:
    """The MQTT keepalive of a connection (whole seconds, at least 1): a quarter of
    ``heartbeat_timeout``. paho pings a broker silent for a keepalive and gives the
    connection up when another keepalive passes without an answer, so a broker that stops
    answering but keeps the connection open (frozen: SIGSTOP, a paused VM, a full disk)
    is noticed within half of ``heartbeat_timeout`` of its last word. A server's silence
    counts only while the connection is up (:mod:`controller.plane.link_clock`); with the
    keepalive at ``heartbeat_timeout`` (as before) a frozen broker was noticed only after
    up to twice that, every agent's heartbeats stopped reaching the daemon meanwhile, and
    every server was declared failed, each admitted job that no longer fit the cluster
    with it (the stall audit: a broker frozen 30 s failed all four running jobs)."""
    return max(1, int(heartbeat_timeout / 4))


MAX_QUEUED_TOPICS = 300
"""The most topics a :class:`LatestPerTopic` queue holds a message of: an agent's plan,
its status and its plan's parts (256 at most) fit."""


class LatestPerTopic(asyncio.Queue[aiomqtt.Message]):
    """An incoming-message queue (``aiomqtt.Client(queue_type=...)``) that holds the
    latest message of each topic only, of at most :data:`MAX_QUEUED_TOPICS` topics
    (a message of another topic past them is dropped, and counted in ``dropped``): for
    subscribers of retained state, where a newer message of a topic says all an older
    one did (an agent's plan, its parts, the daemon's status). Before, the agent's queue
    was unbounded: plans of 16 MiB on its topic, published faster than it parsed them
    (2.6 s each), piled up in its memory without bound (the audit of what arrives on the
    plan topic)."""

    dropped: int

    def _init(self, maxsize: int) -> None:
        self._latest: OrderedDict[str, aiomqtt.Message] = OrderedDict()
        self.dropped = 0

    def _put(self, item: aiomqtt.Message) -> None:
        topic = str(item.topic)
        if topic in self._latest:
            del self._latest[topic]  # superseded; the newer one queues last
        elif len(self._latest) >= MAX_QUEUED_TOPICS:
            self.dropped += 1
            if self.dropped & (self.dropped - 1) == 0:  # the 1st, 2nd, 4th, ...: bounded
                structlog.get_logger("oasis-mqtt").warning(
                    "incoming messages dropped: more topics waiting than a subscriber of "
                    "retained state has", topic=topic[:200], dropped=self.dropped,
                    topics=MAX_QUEUED_TOPICS,
                )  # fmt: skip
            return
        self._latest[topic] = item

    def _get(self) -> aiomqtt.Message:
        return self._latest.popitem(last=False)[1]

    def qsize(self) -> int:
        return len(self._latest)

    def empty(self) -> bool:
        return not self._latest


def client_for(
    mqtt: MqttConfig,
    identifier: str,
    will: aiomqtt.Will | None = None,
    queue_type: Any = None,
) -> aiomqtt.Client:
    """An ``aiomqtt`` client for the configured broker (TLS and credentials included);
    ``queue_type``: its incoming messages' queue (:class:`LatestPerTopic`), aiomqtt's
    unbounded FIFO if None."""
    tls = aiomqtt.TLSParameters(ca_certs=mqtt.tls_ca or None) if mqtt.tls else None
    client = aiomqtt.Client(
        mqtt.host,
        mqtt.port,
        username=mqtt.username or None,
        password=mqtt.password or None,
        identifier=identifier,
        will=will,
        tls_params=tls,
        keepalive=keepalive_seconds(mqtt.heartbeat_timeout),
        max_inflight_messages=200,
        # the rest wait their turn: a slot boundary's plans for 10,000 servers published
        # all at once cost time quadratic in them
        max_concurrent_outgoing_calls=IN_FLIGHT,
        timeout=10.0,
        queue_type=queue_type,
    )
    # a slot boundary publishes every server's plan: up to IN_FLIGHT pending is expected
    client.pending_calls_threshold = 2 * IN_FLIGHT
    return client


async def for_each(items: Iterable[_T], call: Callable[[_T], Awaitable[None]]) -> None:
    """``await call(item)`` for every item, :data:`IN_FLIGHT` at a time: as many workers,
    each taking the next item, rather than a task per item queued on the client's
    semaphore (a slot boundary at 10,000 servers made 10,000 tasks, their timers and
    wake-ups). After an error no further call starts; the first error is raised once
    the calls under way have ended."""
    it = iter(items)
    failed: list[BaseException] = []

    async def worker() -> None:
        for item in it:  # shared: each item is taken by one worker
            if failed:
                return
            try:
                await call(item)
            except BaseException as err:  # raised below, after the calls under way
                failed.append(err)
                return

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    if failed:
        raise failed[0]
