"""The daemon's broker connection: plans and job events out, heartbeats and progress in.

One long-lived task (:meth:`Plane.run`) connects with ``aiomqtt``, reconnects with
exponential backoff when the broker goes away, and on every (re)connection republishes
every server's plan and the job events not yet published. Meanwhile the daemon keeps
deciding: the store is the source of truth, and what the broker missed is sent when it
is back. Plans are published (retained, QoS 1) whenever the store changes (an event on
the controller's bus) or a slot begins, only for servers whose plan changed. While the
store is unavailable, plans wait (they are built from it, under an epoch stored first)
on the same connection: the agents' messages still come in.

A broker may come back without its retained messages (no persistence, or a new one), so
on every connection the plans of all servers and the latest event of every job are
published again (:meth:`Plane.restore_job_events`). The link survives what one message
can do: an event it cannot publish (an id that cannot name a topic) is logged and
skipped and the event counter moves on; an agent's message that is too large, does not
parse or names another server than its topic is logged (at most once per
:data:`_COMPLAIN_SECONDS` per server and reason) and dropped. On a clean stop it
publishes ``online: false`` before it disconnects (the will covers only a vanished one).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import aiomqtt
import structlog

from controller.errors import DrainingError
from controller.events import Event
from controller.limits import RateLimiter
from controller.logs import Complaints
from controller.plane.agent_messages import Heartbeat, Progress, Status
from controller.plane.agent_queue import AgentQueue
from controller.plane.client import Stopping, client_for, publish_all
from controller.plane.event_messages import UNRETAINED, JobEvent, event_kind
from controller.plane.execution import Execution, PlanRound
from controller.plane.link_clock import LOOP_TICK_SECONDS
from controller.plane.plan_lag import PlanLag
from controller.plane.plan_messages import Plan
from controller.plane.port import AdmissionPort
from controller.plane.settings import MqttConfig
from controller.plane.topics import Topics, job_level
from controller.plane.unknown_events import UnknownJobEvents
from controller.plane.unknown_jobs import MAX_LOOKED_UP, MAX_NAMED, unknown_jobs
from controller.store import StoreUnavailableError
from controller.threads import in_daemon_thread
from pricing.errors import SpecError

__all__ = ["Plane", "start_plane"]

_BACKOFF_FIRST = 0.2
_BACKOFF_MAX = 10.0
_STABLE_SECONDS = 30.0
"""A connection that lasted this long resets the back-off; one the broker drops sooner
(a message over its ``max_packet_size``, a bad ACL) backs off further each time, rather
than reconnecting five times a second for good."""
_COMPLAIN_SECONDS = 10.0  # the same complaint about one server, at most this often
AGENT_MESSAGES_PER_SECOND = 20.0
AGENT_MESSAGE_BURST = 100.0
"""What one server's agent may send, heartbeats and progress together: a token bucket
per server, checked before a message is parsed (on the event loop every tenant's calls
use). An agent sends about two a second (a report a second, a heartbeat every
``heartbeat_seconds``), and a burst when the daemon comes back; one that flooded its
topic with 12,000 reports a second slowed every tenant's calls fivefold. Past the rate a
message is dropped, and logged (at most every 10 s per server); reports carry running
totals, so the next one makes up for a dropped one."""
_RESTORE_BATCH = 1000  # job events read and published at a time when restoring
_MAX_TO_CLEAR = 100_000  # deleted jobs whose retained events wait for a connection
_GOODBYE_SECONDS = 2.0  # at most this long for "online: false" at a clean stop
STORE_RETRY_SECONDS = 1.0
"""While the store is unavailable (a PostgreSQL restart, a store refusing writes), a
round of plans is tried again this often, on the same broker connection: agents' beats
and reports still come in, and the broker reads as connected, which it is. Before, the
round's error ended the connection (logged as a failure of the plane, with its
traceback) and it was made again, five to ten times a minute while the store was out,
and ``oasis status`` and ``oasis_broker_up`` said the broker was disconnected."""
PUBLISH_PACE = 4.0
"""After a round whose plans took ``t`` seconds to build and encode, the next round waits
``PUBLISH_PACE * t`` (at most :data:`MAX_PUBLISH_PAUSE`): rebuilding every server's plan
costs in proportion to all active jobs, and rounds ran back to back while jobs were
submitted. One tenant holding 3,000 tiny admitted jobs and submitting more kept the
decision thread 83% busy rebuilding plans (they were built there then), and another
tenant's quote went from 6 to 122 ms (median; the cardinality audit). Paced, plans take
at most ``1 / (1 + PUBLISH_PACE)`` of the interpreter while rounds cost under half a
second; a round that is cheap (a few ms, as on most clusters) delays the next by as
little."""
MAX_PUBLISH_PAUSE = 2.0
"""The longest pause between rounds, seconds: a round also carries cancels, re-plans
after a failure, a slot boundary's plans and every job event, and one build slowed by
the store (or 10,000 servers' plans, 1.3-1.6 s) must not hold them back for four times
as long."""


def publish_pause(cost: float) -> float:
    """Seconds to wait after a round whose plans took ``cost`` seconds to build and
    encode (:data:`PUBLISH_PACE`, :data:`MAX_PUBLISH_PAUSE`)."""
    return min(PUBLISH_PACE * max(cost, 0.0), MAX_PUBLISH_PAUSE)


@dataclass
class _Restore:
    """A restore under way (:meth:`Plane.restore_job_events`): the latest event of each
    job up to event ``upto``, the jobs after id ``after`` still to come; ``jobs``
    published so far."""

    upto: int
    after: str = ""
    jobs: int = 0


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
        self._lag = PlanLag()  # agents following an older plan than their server's
        self._parts: dict[str, int] = {}  # parts each server's last plan went in
        self.plans_seconds = 0.0  # the last round's plans: built and encoded (PUBLISH_PACE)
        self.dirty = asyncio.Event()
        self.connected = False
        self.stopping = Stopping()  # asked by the daemon's stop (PlaneRunner.stop)
        self._slot = -1
        self._restore: _Restore | None = None  # the latest event of every job, republished
        self._complain = Complaints(_COMPLAIN_SECONDS)
        self._rate = RateLimiter(AGENT_MESSAGES_PER_SECOND, AGENT_MESSAGE_BURST)
        # jobs retention deleted: their retained events are cleared at the next round
        self._to_clear: collections.deque[str] = collections.deque()
        # jobs agents ran that the store lacks (a restored store): their retained events
        # are cleared too (controller.plane.unknown_events)
        self._unknown = UnknownJobEvents()
        self._loop: asyncio.AbstractEventLoop | None = None
        controller.prune_hooks.append(self.deleted)
        execution.unknown_hooks.append(self.unknown)

    def deleted(self, job_ids: list[str]) -> None:
        """Jobs retention deleted (called in the decision thread): clear their retained
        events, so the broker does not keep every job ever decided. At most
        :data:`_MAX_TO_CLEAR` wait for a connection; past it, the rest stay retained."""
        room = _MAX_TO_CLEAR - len(self._to_clear)
        self._to_clear.extend(job_ids[: max(room, 0)])
        if len(job_ids) > room:
            self._complain("?", "clear", "retained events of deleted jobs left on the broker",
                           jobs=len(job_ids) - max(room, 0))  # fmt: skip
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.dirty.set)

    def unknown(self, by_server: dict[str, list[str]]) -> None:
        """Jobs agents ran that the store lacks, per server whose agent reported them
        (called in the decision thread): clear their retained events at the next round
        (:mod:`controller.plane.unknown_events`)."""
        if self._unknown.add(by_server) and self._loop is not None:
            self._loop.call_soon_threadsafe(self.dirty.set)

    def _still_unknown(self, job_ids: list[str]) -> list[str]:
        """Those of ``job_ids`` the store lacks now (blocking; the decision thread)."""
        gone: list[str] = []
        with self.c.db.session() as session:
            for i in range(0, len(job_ids), MAX_LOOKED_UP):
                gone += unknown_jobs(session, job_ids[i : i + MAX_LOOKED_UP])
        return gone

    async def _clear_unknown(self, client: aiomqtt.Client) -> None:
        """Clear the retained events of the queued unknown jobs the store still lacks
        (asked now, in the decision thread: a job of the same id stored since has its
        event published after this clear)."""
        try:
            gone = await self.c._run(partial(self._unknown.take, self._still_unknown))
        except DrainingError:
            raise
        except Exception as err:  # the store: the agents' next reports queue them again
            self.log.debug("unknown jobs not looked up", error=str(err)[:200])
            return
        await self._clear_events(client, gone)
        if gone:
            self.log.info("retained events of jobs this store does not know cleared",
                          jobs=gone[:MAX_NAMED], count=len(gone))  # fmt: skip

    async def _clear_events(self, client: aiomqtt.Client, job_ids: list[str]) -> None:
        """Clear the retained events of ``job_ids``: an empty retained message clears a
        topic's retained one (a key stored before the check names no topic: skipped)."""
        topics = []
        for job in job_ids:
            with contextlib.suppress(ValueError):
                topics.append(self.topics.job_events(job_level(job)))
        await publish_all(client, ((t, b"", True) for t in topics))

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
        self._loop = asyncio.get_running_loop()
        watcher = asyncio.create_task(self._watch_bus(), name="plane bus")
        ticker = asyncio.create_task(self._watch_loop(), name="plane loop watch")
        delay = _BACKOFF_FIRST
        last_error = ""
        connected_at: float | None = None
        try:
            while True:
                self.stopping.check()
                offline = Status(online=False).to_bytes()
                will = aiomqtt.Will(self.topics.status, offline, qos=1, retain=True)
                client = client_for(self.mqtt, f"oasisd-{uuid.uuid4().hex[:12]}", will,
                                    AgentQueue.factory(self._queue_dropped))  # fmt: skip
                try:
                    async with client:
                        last_error, connected_at = "", time.monotonic()
                        try:
                            await self._session(client)
                        except asyncio.CancelledError:  # a clean stop: say so, retained
                            await self._goodbye(client, offline)
                            raise
                except aiomqtt.MqttError as err:
                    if self.connected:
                        self.log.warning("broker connection lost", error=str(err))
                    else:
                        # a new reason (refused password, bad certificate, broker down) is
                        # a warning once; the same reason again on each retry is not
                        level = self.log.info if str(err) == last_error else self.log.warning
                        level("broker unavailable", error=str(err), retry_in=delay)
                    last_error = str(err)
                except Exception:  # a bug: log, and start over after a pause
                    self.log.exception("execution plane failed; reconnecting", retry_in=delay)
                finally:
                    self._set_connected(False)
                if connected_at is not None and time.monotonic() - connected_at >= _STABLE_SECONDS:
                    delay = _BACKOFF_FIRST  # a connection that held: retry at once
                connected_at = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
        finally:
            watcher.cancel()
            ticker.cancel()

    async def _goodbye(self, client: aiomqtt.Client, offline: bytes) -> None:
        """Publish ``online: false`` (retained) and wait for the broker's ack, briefly.
        A broker that does not answer in time (frozen) is said as such: a timeout's own
        text is empty, and the line said ``"error": ""``."""
        try:
            async with asyncio.timeout(_GOODBYE_SECONDS):
                await client.publish(self.topics.status, offline, qos=1, retain=True)
            self.log.info("broker told: offline")
        except TimeoutError:
            why = f"the broker did not answer within {_GOODBYE_SECONDS:g} s"
            self.log.warning("could not publish the offline status", error=why)
        except aiomqtt.MqttError as err:
            self.log.warning("could not publish the offline status", error=str(err))

    def _set_connected(self, up: bool) -> None:
        if up == self.connected:
            return
        self.connected = up
        if up:
            self.execution.connected()
        else:
            self.execution.disconnected()
        self.broker_up(up)

    async def _watch_loop(self) -> None:
        """Tick the execution's loop watch (:class:`~.link_clock.LoopWatch`)."""
        while True:
            await asyncio.sleep(LOOP_TICK_SECONDS)
            self.execution.loop_tick()

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
        online = Status(online=True, servers=list(self.execution.server_index))
        await client.publish(self.topics.status, online.to_bytes(), qos=1, retain=True)
        self.published = {}  # the broker may have lost its retained plans: send them all
        self._lag.forget()
        self.execution.behind_plan.clear()
        self._restore = _Restore(self.execution.events_published)  # ... and job events
        self._set_connected(True)
        self.log.info("broker connected", host=self.mqtt.host, port=self.mqtt.port)
        self.dirty.set()
        self.stopping.check()  # else the task group would run on, never cancelled
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive(client))
                group.create_task(self._publish_loop(client))
        except* aiomqtt.MqttError as lost:  # one task saw the connection go: reconnect
            raise lost.exceptions[0] from None

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            topic = str(message.topic)
            try:
                self.take(topic, message.payload, retained=bool(message.retain))
            except Exception as err:  # a bug: this message is lost, never the link
                self._complain("?", "bug", "message not handled", topic=topic[:200],
                               error=repr(err)[:200])  # fmt: skip

    def _queue_dropped(self, topic: str) -> None:
        """A message dropped before it was read: its topic had too many waiting
        (:class:`~controller.plane.agent_queue.AgentQueue`), as when its agent floods;
        counted as one over the agent's rate (event loop)."""
        found = self.topics.agent_of(topic)
        self.execution.crowded()
        self._complain(found[0] if found else "?", "queue", "messages from an agent dropped "
                       "unread: too many of its topic waiting (in a flood, silence counts "
                       "half meanwhile)", topic=topic[:200])  # fmt: skip

    def take(self, topic: str, payload: object, retained: bool = False) -> bool:
        """Queue an agent's message for the decision thread (Execution._drain); True if
        queued. The sender is the server named by the topic: a payload naming another
        server, one over the size limit or one that does not parse is logged and dropped.
        So is a ``retained`` one: the broker hands it out again at every subscription, so
        one retained heartbeat of an agent long dead brought its server back (from
        failed) after every reconnection of the daemon. A progress report's entries
        that do not parse are logged and left out; its other entries count."""
        found = self.topics.agent_of(topic)
        if found is None or found[0] not in self.execution.server_index:
            self._complain("?", "unknown", "message on no known server's topic", topic=topic[:200])
            return False
        server, what = found
        if not isinstance(payload, bytes | bytearray | str):
            return False
        if retained:
            self._complain(server, "retained", "retained message from an agent ignored "
                           "(agents must publish without retain)", topic=topic)  # fmt: skip
            return False
        if self._rate.take(server) > 0:  # before it is parsed: parsing is the cost
            self.execution.crowded()
            self._complain(server, "flood", "messages from an agent dropped: over its rate "
                           "(in a flood, silence counts half meanwhile)",
                           rate=AGENT_MESSAGES_PER_SECOND, burst=AGENT_MESSAGE_BURST)  # fmt: skip
            return False
        try:
            parsed = Heartbeat.parse(payload) if what == "heartbeat" else Progress.parse(payload)
        except SpecError as err:
            self._complain(server, "bad", "bad message from an agent", topic=topic,
                           error=str(err)[:300])  # fmt: skip
            return False
        if parsed.server != server:
            self._complain(server, "forged", "message names another server than its topic",
                           topic=topic, named=parsed.server[:200])  # fmt: skip
            return False
        if isinstance(parsed, Heartbeat):
            if self.execution.heartbeat(parsed):  # it follows another daemon's plans
                self.changed()
            self._check_plan_taken(parsed)
        else:
            if parsed.refused:
                self._complain(server, "entries", "report entries dropped: bad counts",
                               entries=len(parsed.refused), error=parsed.refused[0])  # fmt: skip
            if parsed.ignored:
                self._complain(server, "fields", "report fields ignored: bad worker failures",
                               fields=len(parsed.ignored), error=parsed.ignored[0])  # fmt: skip
            self.execution.report(parsed)
        return True

    def _check_plan_taken(self, beat: Heartbeat) -> None:
        """Say (at most every 10 s per server) when ``beat``'s agent still follows an
        older plan than one published for its server :data:`~controller.plane.plan_lag.
        LAG_SECONDS` ago (event loop): it refused it or never received it, and the jobs
        that plan put there do not run (:mod:`controller.plane.plan_lag`). An agent
        following no plan at all is the execution's to say."""
        behind = self._lag.behind(beat.server, beat.epoch, time.monotonic()) if beat.epoch else None
        if behind is None:
            self.execution.behind_plan.discard(beat.server)
        else:
            self.execution.behind_plan.add(beat.server)
            epoch, ago = behind
            self._complain(beat.server, "old_plan", "this server's agent follows an older "
                           "plan than the one published for it: it refused the newer one "
                           "(an agent older than the daemon; its log says 'bad plan') or "
                           "cannot read it (the broker's ACL); the jobs it places there do "
                           "not run", follows=beat.epoch, published=epoch,
                           published_seconds_ago=round(ago, 1))  # fmt: skip

    async def _publish_loop(self, client: aiomqtt.Client) -> None:
        waiting = False  # the last round found the store unavailable
        while True:
            self.stopping.check()
            await self.dirty.wait()
            self.dirty.clear()
            try:
                with contextlib.suppress(DrainingError):
                    await self.publish_round(client)
            except StoreUnavailableError as err:  # an outage: said once, tried again
                if not waiting:
                    self.log.warning("plans wait: the store is unavailable (the broker "
                                     "connection stays up)", retry_in=STORE_RETRY_SECONDS,
                                     error=(str(err).splitlines() or [""])[0][:300])  # fmt: skip
                waiting = True
                self.dirty.set()
                await asyncio.sleep(STORE_RETRY_SECONDS)
                continue
            if waiting:
                self.log.info("plans go out again: the store is back")
                waiting = False
            if self.plans_seconds > 0:
                await asyncio.sleep(publish_pause(self.plans_seconds))

    async def publish_round(self, client: aiomqtt.Client) -> int:
        """Publish the plans that changed and the job events not yet published, then go
        on with the restore (:meth:`restore_job_events`) while nothing else waits;
        returns the number of plans published."""
        published = dict(self.published)
        begun = await self.c._run(lambda: self.execution.plans_begin(published))
        # built and encoded in a thread: every active job's plans, and the decision
        # thread and the event loop answer other calls meanwhile (a daemon thread: a
        # build no longer wanted does not hold a stopping daemon's exit)
        prepared = in_daemon_thread(self._prepare, begun, name="plans")
        begun, plans, messages, parts, self.plans_seconds = await prepared
        # the epoch taken, and (with high availability) still the leader: a standby
        # publishes neither plans nor job events, however long the build took
        await self.c._run(lambda: self.execution.plans_end(begun, plans))
        await publish_all(client, ((topic, payload, True) for topic, payload in messages))
        if plans:  # acknowledged: they count as sent (a broker lost meanwhile: they do not)
            await self.c._run(lambda: self.execution.plans_out(begun, plans))
        for plan in plans:  # said when it changes: every publish said it (604 lines while
            # one tenant's 3,000 small jobs went in, at warning: the observability audit)
            count, before = parts[plan.server], self._parts.get(plan.server, 1)
            if count != before:
                self.log.info("plan published in parts" if count > 1 else "plan published whole",
                              server=plan.server, epoch=plan.epoch, parts=count,
                              max_plan_bytes=self.mqtt.max_plan_bytes)  # fmt: skip
        self._parts |= parts  # once published: a round cut short clears again next time
        published_at = time.monotonic()
        for plan in plans:
            self.published[plan.server] = plan
            self._lag.published(plan.server, plan.epoch, published_at)
        if self._to_clear:
            clear = [self._to_clear.popleft() for _ in range(len(self._to_clear))]
            await self._clear_events(client, clear)
        if self._unknown:
            await self._clear_unknown(client)
        while True:  # a page at a time: after a long outage (or [mqtt] added to an old
            # store) the events not yet published may be the whole history
            after = self.execution.events_published
            events = await self.c.stored_events(after, limit=_RESTORE_BATCH)
            await self._publish_events(client, events)
            if events:
                last = events[-1].sequence
                await self.c._run(partial(self.execution.events_published_to, last))
            if len(events) < _RESTORE_BATCH:
                break
        if plans:
            self.log.info("plans published", plans=len(plans), epoch=self.execution.epoch,
                          slot=plans[0].current.slot)  # fmt: skip
        if self._restore is not None:
            await self.restore_job_events(client)
        return len(plans)

    def _prepare(
        self, begun: PlanRound
    ) -> tuple[PlanRound, list[Plan], list[tuple[str, bytes]], dict[str, int], float]:
        """Round ``begun`` as built, its plans that changed, their messages, the parts
        each went in, and how long it took (seconds): :meth:`Execution.plans_build
        <controller.plane.execution.Execution.plans_build>`, then :meth:`_plan_messages`
        (a thread of its own)."""
        started = time.perf_counter()
        begun, plans = self.execution.plans_build(begun)
        messages: list[tuple[str, bytes]] = []
        parts: dict[str, int] = {}
        for plan in plans:
            plan_messages, parts[plan.server] = self._plan_messages(plan)
            messages += plan_messages
        return begun, plans, messages, parts, time.perf_counter() - started

    def _plan_messages(self, plan: Plan) -> tuple[list[tuple[str, bytes]], int]:
        """The ``(topic, payload)`` messages of ``plan`` and how many parts it went in:
        itself, or its parts if it is over ``mqtt.max_plan_bytes`` (each at most that),
        and an empty retained message for each part topic this process's previous plan
        of the server used and this one does not. (Parts a daemon published before a
        restart or a takeover may stay retained: an agent ignores them, as their epoch
        is older than its plan's.) A plan that cannot be split within
        :data:`~controller.plane.plan_messages.MAX_PLAN_PARTS` parts is logged and left out:
        one server's agent keeps its last plan, every other server gets its own."""
        whole = plan.to_bytes()  # encoded once: a boundary encodes one per server
        if len(whole) <= self.mqtt.max_plan_bytes:
            out = [(self.topics.plan(plan.server), whole)]
        else:
            try:
                parts = plan.split(self.mqtt.max_plan_bytes)
            except ValueError as err:
                self.log.error("plan not published: too large", server=plan.server,
                               epoch=plan.epoch, error=str(err))  # fmt: skip
                return [], self._parts.get(plan.server, 1)
            out = [(self.topics.plan(p.server, p.part), p.to_bytes()) for p in parts]
        count = len(out)
        before = self._parts.get(plan.server, 1)
        out += [(self.topics.plan(plan.server, i), b"") for i in range(count, before)]
        return out, count

    async def restore_job_events(self, client: aiomqtt.Client) -> int:
        """Publish again (retained) the latest event of every job published before this
        connection: what a broker that lost its state no longer holds. A page of jobs
        (:data:`~controller.plane.execution.RESTORE_PAGE`) at a time, in id order, at
        least one page a call (a daemon always deciding still gets to the end), then
        until the restore is done or a plan or a new event is waiting (``dirty``): the
        next round publishes
        those first and the restore goes on after them. Before, the whole history was
        published first, and with 20,000 jobs in the store a job admitted as the broker
        came back had its plan published only 5.5 s later, now 0.35 s
        (``bench/plane_restore.py``).

        A job with an event newer than the restore's start is left out: the new events
        publish it, and one of its older events published after it would replace it
        as the retained one. Rounds run one after the other, so an event stored after a
        page is read is published after the page. Returns how many were published in
        this call."""
        restore, sent = self._restore, 0
        while restore is not None:
            sequences, last = await asyncio.to_thread(
                self.execution.latest_job_events_sync, restore.upto, restore.after
            )
            read = self.execution.events_sync
            events = await asyncio.to_thread(read, sequences) if sequences else []
            events = [e for e in events if event_kind(e.kind, e.state) != UNRETAINED]
            await self._publish_events(client, events)
            sent += len(events)
            restore.jobs += len(events)
            if last is None:
                if restore.jobs:
                    self.log.info("job events restored", jobs=restore.jobs, upto=restore.upto)
                self._restore = restore = None
            else:
                restore.after = last
                if self.dirty.is_set():
                    break
        return sent

    async def _publish_events(self, client: aiomqtt.Client, events: Sequence[Event]) -> None:
        """Publish job events (QoS 1; retained but for a rejection, :data:`UNRETAINED`);
        one that cannot be published is logged and skipped, never retried: the counter
        moves past it."""
        encoded: list[tuple[str, bytes, bool]] = []
        sent: list[JobEvent] = []  # the message of each of encoded
        for e in events:
            kind = event_kind(e.kind, e.state)
            if kind is None or not e.job_id:
                continue
            try:
                topic = self.topics.job_events(job_level(e.job_id))
            except ValueError as err:
                self._complain("?", "event", "job event not published", sequence=e.sequence,
                               error=str(err))  # fmt: skip
                continue
            message = JobEvent(e.sequence, kind, e.job_id, e.slot, e.state, e.detail)
            try:
                payload = message.to_bytes()
            except Exception as err:  # it cannot be encoded: skip it
                self._event_skipped(message, err)
                continue
            encoded.append((topic, payload, message.kind != UNRETAINED))
            sent.append(message)
        # paho refuses one: skip it (a lost connection raises: reconnect, publish it then)
        await publish_all(client, encoded, lambda i, err: self._event_skipped(sent[i], err))

    def _event_skipped(self, message: JobEvent, err: Exception) -> None:
        self._complain("?", "event", "job event not published", sequence=message.sequence,
                       error=str(err)[:200])  # fmt: skip


async def start_plane(
    controller: AdmissionPort,
    mqtt: MqttConfig,
    broker_up: Callable[[bool], None] | None = None,
) -> Plane:
    """The execution plane of an opened controller, its state loaded from the store."""
    execution = Execution(controller, mqtt)
    await asyncio.to_thread(execution.load)
    return Plane(controller, execution, mqtt, broker_up)
