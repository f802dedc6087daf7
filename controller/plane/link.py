"""The daemon's broker connection: plans and job events out, heartbeats and progress in.

One long-lived task (:meth:`Plane.run`) connects with ``aiomqtt``, reconnects with
exponential backoff when the broker goes away, and on every (re)connection republishes
every server's plan and the job events not yet published. Meanwhile the daemon keeps
deciding: the store is the source of truth, and what the broker missed is sent when it
is back. Plans are published (retained, QoS 1) whenever the store changes (an event on
the controller's bus) or a slot begins, only for servers whose plan changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable

import aiomqtt
import structlog

from controller.errors import DrainingError
from controller.plane.client import client_for
from controller.plane.execution import Execution
from controller.plane.port import AdmissionPort
from controller.plane.settings import MqttConfig
from controller.plane.topics import (
    VERSION,
    Heartbeat,
    JobEvent,
    Plan,
    Progress,
    Topics,
    event_kind,
)
from pricing.errors import SpecError

__all__ = ["Plane", "start_plane"]

_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 10.0


class Plane:
    """The broker link of one daemon; see the module docstring.

    Args:
        controller: the admission controller (its bus wakes the publisher).
        execution: heartbeats, progress and plans.
        mqtt: broker settings.
        broker_up: told ``True``/``False`` as the connection comes and goes (metrics).
    """

    def __init__(
        self,
        controller: AdmissionPort,
        execution: Execution,
        mqtt: MqttConfig,
        broker_up: Callable[[bool], None] | None = None,
    ) -> None:
        self.c = controller
        self.execution = execution
        self.mqtt = mqtt
        self.topics = Topics(mqtt.topic_prefix)
        self.broker_up = broker_up or (lambda _up: None)
        self.log = structlog.get_logger("oasisd")
        self.published: dict[str, Plan] = {}
        self.dirty = asyncio.Event()
        self.connected = False
        self._slot = -1

    # -- the daemon's hooks --------------------------------------------------------------

    def changed(self) -> None:
        """Something in the store changed: publish what differs."""
        self.dirty.set()

    async def review(self) -> None:
        """Periodic: react to heartbeats and progress; notice slot boundaries."""
        if self.c.slots.current_slot() != self._slot:
            self._slot = self.c.slots.current_slot()
            self.dirty.set()
        try:
            events = await self.c._run(self.execution.review_sync)
        except DrainingError:
            return
        if events:
            self.c._publish(events)
            self.dirty.set()

    # -- the connection -----------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff; until cancelled."""
        watcher = asyncio.create_task(self._watch_bus(), name="plane bus")
        delay = _BACKOFF_FIRST
        last_error = ""
        try:
            while True:
                offline = json.dumps({"version": VERSION, "online": False})
                will = aiomqtt.Will(self.topics.status, offline, qos=1, retain=True)
                client = client_for(self.mqtt, f"oasisd-{uuid.uuid4().hex[:12]}", will)
                try:
                    async with client:
                        delay, last_error = _BACKOFF_FIRST, ""
                        await self._session(client)
                except aiomqtt.MqttError as err:
                    if self.connected:
                        self.log.warning("broker connection lost", error=str(err))
                    else:
                        # a new reason (refused password, bad certificate, broker down) is
                        # a warning once; the same reason again on each retry is not
                        level = self.log.info if str(err) == last_error else self.log.warning
                        level("broker unavailable", error=str(err), retry_in=delay)
                    last_error = str(err)
                except Exception:  # a bug or the store: log, and start over after a pause
                    self.log.exception("execution plane failed; reconnecting", retry_in=delay)
                finally:
                    self._set_connected(False)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
        finally:
            watcher.cancel()

    def _set_connected(self, up: bool) -> None:
        if up == self.connected:
            return
        self.connected = up
        if up:
            self.execution.connected()
        else:
            self.execution.disconnected()
        self.broker_up(up)

    async def _watch_bus(self) -> None:
        queue = self.c.bus.subscribe()
        try:
            while True:
                await queue.get()
                self.dirty.set()
        finally:
            self.c.bus.unsubscribe(queue)

    async def _session(self, client: aiomqtt.Client) -> None:
        await client.subscribe(self.topics.all_heartbeats, qos=0)
        await client.subscribe(self.topics.all_progress, qos=1)
        online = json.dumps({"version": VERSION, "online": True})
        await client.publish(self.topics.status, online, qos=1, retain=True)
        self.published = {}  # the broker may have lost its retained plans: send them all
        self._set_connected(True)
        self.log.info("broker connected", host=self.mqtt.host, port=self.mqtt.port)
        self.dirty.set()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive(client))
                group.create_task(self._publish_loop(client))
        except* aiomqtt.MqttError as lost:  # one task saw the connection go: reconnect
            raise lost.exceptions[0] from None

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = str(message.topic)
            payload = message.payload
            if not isinstance(payload, bytes | bytearray | str):
                continue
            try:  # only queued here: the decision thread applies them (Execution._drain)
                if topic.endswith("/heartbeat"):
                    self.execution.heartbeat(Heartbeat.parse(payload))
                elif topic.endswith("/progress"):
                    self.execution.report(Progress.parse(payload))
            except SpecError as err:
                self.log.warning("bad message from an agent", topic=topic, error=str(err))

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            with contextlib.suppress(DrainingError):
                await self.publish_round(client)

    async def publish_round(self, client: aiomqtt.Client) -> int:
        """Publish the plans that changed and the job events not yet published; returns
        the number of plans published."""
        published = dict(self.published)
        plans = await self.c._run(lambda: self.execution.plans_sync(published))
        await asyncio.gather(
            *(client.publish(self.topics.plan(p.server), p.to_bytes(), qos=1, retain=True)
              for p in plans)
        )  # fmt: skip
        for plan in plans:
            self.published[plan.server] = plan
        events = await self.c.stored_events(self.execution.events_published)
        out = []
        for e in events:
            kind = event_kind(e.kind, e.state)
            if kind is None or not e.job_id:
                continue
            message = JobEvent(e.sequence, kind, e.job_id, e.slot, e.state, e.detail)
            out.append(client.publish(self.topics.job_events(e.job_id), message.to_bytes(),
                                      qos=1, retain=True))  # fmt: skip
        await asyncio.gather(*out)
        if events:
            last = events[-1].sequence
            await self.c._run(lambda: self.execution.events_published_to(last))
        if plans:
            self.log.info("plans published", plans=len(plans), epoch=self.execution.epoch,
                          slot=plans[0].current.slot)  # fmt: skip
        return len(plans)


async def start_plane(
    controller: AdmissionPort,
    mqtt: MqttConfig,
    broker_up: Callable[[bool], None] | None = None,
) -> Plane:
    """The execution plane of an opened controller, its state loaded from the store."""
    execution = Execution(controller, mqtt)
    await asyncio.to_thread(execution.load)
    return Plane(controller, execution, mqtt, broker_up)
