"""The one place an MQTT client is made: credentials, TLS and timeouts from the config."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import structlog

from controller.plane.settings import MqttConfig

__all__ = [
    "IN_FLIGHT",
    "MAX_QUEUED_TOPICS",
    "PUBLISH_WINDOW",
    "LatestPerTopic",
    "Stopping",
    "client_for",
    "keepalive_seconds",
    "publish_all",
]


IN_FLIGHT = 32
"""aiomqtt calls one client has in flight at most (a QoS 1 publish until its PUBACK, a
subscription): aiomqtt scans its pending calls at every new one, so each costs time
linear in how many are in flight. Many messages at once go through :func:`publish_all`."""

PUBLISH_WINDOW = 64
"""QoS 1 publishes :func:`publish_all` has awaiting their PUBACK at most. Each PUBACK
sends the next at once: a first version that waited for half the window to drain
stalled at each half (10,000 publishes to a loopback Mosquitto: 7.7 s, the process
idle most of it, against 1.2 s; likely the broker's PUBACKs held by Nagle's algorithm
until the publisher's delayed ACK)."""


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
        # no limit of paho's: it scanned every message in flight at each PUBACK to send
        # the next one queued; aiomqtt's calls (below) and publish_all's window bound them
        max_inflight_messages=0,
        # the rest wait their turn: a slot boundary's plans for 10,000 servers published
        # all at once cost time quadratic in them
        max_concurrent_outgoing_calls=IN_FLIGHT,
        timeout=10.0,
        queue_type=queue_type,
    )
    # aiomqtt warns past this many pending calls; publish_all's window counts among them
    client.pending_calls_threshold = 2 * IN_FLIGHT + PUBLISH_WINDOW
    return client


class _Window:
    """The PUBACKs :func:`publish_all` awaits: stands in aiomqtt's pending publishes for
    each of their message ids, and is :meth:`set` (by aiomqtt's ``on_publish``) once
    per PUBACK; wakes the publisher waiting in :meth:`until` once at most its ``low``
    are left."""

    def __init__(self) -> None:
        self.open = 0
        self.low = 0  # what the publisher waiting in until() waits for
        self.waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self.open -= 1
        waiter = self.waiter
        if waiter is not None and self.open <= self.low and not waiter.done():
            waiter.set_result(None)

    async def until(self, low: int, timeout: float) -> None:
        """Wait until at most ``low`` PUBACKs are awaited; MqttError if none comes for
        ``timeout`` seconds (as aiomqtt says of one publish)."""
        while self.open > low:
            self.low = low
            self.waiter = asyncio.get_running_loop().create_future()
            before = self.open
            try:
                async with asyncio.timeout(timeout):
                    await self.waiter
            except TimeoutError:
                if self.open == before:
                    raise aiomqtt.MqttError("Operation timed out") from None
            finally:
                self.waiter = None


async def publish_all(
    client: aiomqtt.Client,
    messages: Iterable[tuple[str, bytes, bool]],
    skip: Callable[[int, Exception], None] | None = None,
) -> None:
    """Publish each ``(topic, payload, retain)`` at QoS 1, in order, and return once the
    broker has acknowledged them all; at most :data:`PUBLISH_WINDOW` await their PUBACK
    at a time.

    aiomqtt's ``publish`` awaits each message's PUBACK in a call of its own (its
    semaphore, an event, a ``wait_for`` task, a scan of its pending calls): at a slot
    boundary of 10,000 servers that was most of the daemon's time in the fan-out. Here
    one window stands for them all in aiomqtt's pending publishes (its ``on_publish``
    pops and sets it, as it does its own events). paho's refusal of one message
    (``ValueError``: a topic or payload it cannot send) goes to ``skip(index, error)``,
    or is raised without it; a refused send (a lost connection) raises
    :class:`aiomqtt.MqttCodeError`, and no PUBACK for ``client.timeout`` seconds
    :class:`aiomqtt.MqttError`, as aiomqtt's ``publish`` does."""
    inner: paho.Client = client._client
    pending: dict[int, Any] = client._pending_publishes
    timeout = float(client.timeout)
    window = _Window()
    mids: list[int] = []
    try:
        for index, (topic, payload, retain) in enumerate(messages):
            if window.open >= PUBLISH_WINDOW:
                await window.until(PUBLISH_WINDOW - 1, timeout)
            try:
                info = inner.publish(topic, payload, 1, retain)
            except ValueError as err:
                if skip is None:
                    raise
                skip(index, err)
                continue
            if info.rc != paho.MQTT_ERR_SUCCESS:
                raise aiomqtt.MqttCodeError(info.rc, "Could not publish message")
            if info.is_published():  # acknowledged already: never, at QoS 1, but cheap
                continue
            pending[info.mid] = window
            window.open += 1
            mids.append(info.mid)
        await window.until(0, timeout)
    finally:  # cut short: leave no entry of ours behind for a later message id
        for mid in mids:
            if pending.get(mid) is window:
                del pending[mid]
