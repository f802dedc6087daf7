"""What the daemon keeps of the agents behind the heartbeats: their sessions (and two
agents for one server), the store whose plans each follows, its clock, and its workers
short of devices.

An agent names a *session* in its heartbeats and reports (a restarted agent starts a
new one). Two sessions of one server beating at once are two agents for that server:
only the first one's progress counts, the second's never does (:meth:`AgentSessions.ignores`),
and the store keeps which it is (:class:`~controller.plane.execution.Execution` saves
:attr:`AgentSessions.ignored_sessions` with the plane's state).

This runs on the event loop, as each heartbeat or report arrives
(:meth:`controller.plane.execution.Execution.heartbeat` and ``report``), before the
message goes into the inbox; not in the decision thread as the rest of the plane. The
exceptions: the stored list of ignored sessions is taken at start-up
(:meth:`AgentSessions.restore_ignored`) and read by the decision thread when it stores the
plane's state, and a server declared failed there stops counting as following another
store (:meth:`AgentSessions.fell_silent`). ``/metrics`` reads the counts
(:mod:`controller.metrics`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import structlog

from controller.logs import Complaints
from controller.plane.agent_messages import Heartbeat, Progress
from controller.plane.progress import session_key
from controller.plane.settings import MqttConfig
from pricing.durations import format_duration

__all__ = [
    "CLOCK_BACK_SECONDS",
    "CLOCK_LINES",
    "CLOCK_LINES_SECONDS",
    "CLOCK_OFF_SECONDS",
    "MAX_IGNORED_PER_SERVER",
    "MAX_IGNORED_SESSIONS",
    "AgentSessions",
]

MAX_IGNORED_SESSIONS = 256
"""Agent sessions whose reports never count (the second of two that beat at once) the
plane remembers in all; past it, the oldest of the server that has the most go."""
MAX_IGNORED_PER_SERVER = 8
"""... and of one server, the newest. Bounded per server so that one agent cannot push
another server's out: an agent beating with ever new sessions beside its own (a bug, or a
forger on its own topic) has each ignored, and with one bound over all servers its
sessions pushed out another server's ignored twin within minutes, whose whole cumulative
count then counted for that server's jobs (other tenants', completed early)."""
_MAX_SESSIONS_WATCHED = 4
"""Agent sessions per server whose beats are remembered to tell two agents at once."""
CLOCK_OFF_SECONDS = 10.0
"""An agent whose clock is off the daemon's by more than this (its heartbeat's
``sent_at`` against the daemon's clock at receipt) is logged: it switches to the next
slot's plan that much early or late, so jobs on its server lose that time, or overlap
with the next slot's. A beat's delivery takes milliseconds, not seconds."""
CLOCK_BACK_SECONDS = 5.0
"""... and logged again once it is back within this."""
CLOCK_LINES = 3
CLOCK_LINES_SECONDS = 60.0
"""A server's clock lines (off, back) are at most :data:`CLOCK_LINES` in this many
seconds; a crossing past them is said, with how many there were, once the window has
room. Before, every crossing was a line: an agent whose beats alternated between 30 s
ahead and in step (a clock stepped back and forth, or a forger on its own topic) wrote
one a beat, 20 a second at its rate, where every other complaint about an agent is said
at most every 10 s."""


class AgentSessions:
    """The agents' sessions, stores, clocks and device shortages, per server; see the
    module docstring.

    Args:
        mqtt: the broker settings (``heartbeat_seconds``, ``heartbeat_timeout``).
        monotonic: the clock beats are timed with, seconds.
        complain: the plane's throttled warnings, per server and reason.
    """

    def __init__(
        self, mqtt: MqttConfig, monotonic: Callable[[], float], complain: Complaints
    ) -> None:
        self.mqtt = mqtt
        self.monotonic = monotonic
        self.log = structlog.get_logger("oasisd")
        self._complain = complain
        # server -> its agent's clock minus this daemon's, seconds (latest beat saying)
        self.clock_offsets: dict[str, float] = {}
        # server -> the store whose plans its agent follows, when not this one's
        self.foreign: dict[str, str] = {}
        # server -> {agent session: [first beat, latest beat]} (monotonic), the latest few
        self._sessions: dict[str, dict[str, list[float]]] = {}
        self.twins: dict[str, tuple[str, str]] = {}  # server -> two sessions beating at once
        # "server/session" of the second of two agents that beat at once: its reports
        # never count (stored: a restart would count its whole cumulative count again)
        self.ignored_sessions: dict[str, None] = {}
        self.ignored_alone: dict[str, str] = {}  # server -> its only beating, ignored session
        self.devices_short: dict[str, int] = {}  # server -> its workers short of devices
        self.entries_left_out: dict[str, int] = {}  # server -> its plan's entries left out
        self._clock_off: set[str] = set()  # servers whose clock is off, not yet back
        self._clock_said_off: set[str] = set()  # ... as the latest clock line said
        self._clock_lines: dict[str, deque[float]] = {}  # server -> their times
        self._clock_crossings: dict[str, int] = {}  # server -> crossings since its line

    def restore_ignored(self, stored: Any) -> None:
        """Take the ignored sessions the store kept (start-up), within the bounds they
        are kept in (:meth:`_ignore`); in an edited store, entries that do not read are
        dropped, and a value that is not a list is not taken."""
        if isinstance(stored, list):
            self.ignored_sessions = {}
            for key in stored[-MAX_IGNORED_SESSIONS:]:
                if isinstance(key, str) and len(key) <= 512:
                    self._ignore(key)

    def _ignore(self, key: str) -> None:
        """Add ``key`` (``"server/session"``) to :attr:`ignored_sessions`: at most
        :data:`MAX_IGNORED_PER_SERVER` of its server (its oldest go), and at most
        :data:`MAX_IGNORED_SESSIONS` in all (the oldest of the server that has the most
        go), so one server's agent can push out only its own."""
        self.ignored_sessions[key] = None
        server = _server_of(key)
        mine = [k for k in self.ignored_sessions if _server_of(k) == server]
        for old in mine[:-MAX_IGNORED_PER_SERVER]:
            del self.ignored_sessions[old]
        while len(self.ignored_sessions) > MAX_IGNORED_SESSIONS:
            counts = Counter(map(_server_of, self.ignored_sessions))
            most = max(counts.values())
            del self.ignored_sessions[
                next(k for k in self.ignored_sessions if counts[_server_of(k)] == most)
            ]

    def heard(self, beat: Heartbeat, clock_offset: float | None, store_id: str) -> bool:
        """Take what a heartbeat of a known server says (event loop): its agent's clock
        offset (seconds, its agent's minus this daemon's; None if the beat does not say),
        the store whose plans it follows (``store_id``: this daemon's, "" if unknown),
        its session and its workers short of devices. True if the ignored sessions grew
        (they are to be stored)."""
        if clock_offset is not None:
            self._check_clock(beat.server, clock_offset)
        if beat.store and store_id and beat.store != store_id:
            # plans of another store's daemon: a store replaced (its daemon gone: this
            # one moves above them, as it must), or a second daemon on another store
            # under this broker and prefix (then the two take turns driving the agents,
            # which only an operator can end): said, and counted on /metrics (audit)
            self.foreign[beat.server] = beat.store
            self._complain(beat.server, "foreign",
                           "this server's agent follows the plans of a daemon on another "
                           "store: if that daemon still runs under this broker and topic "
                           "prefix, the two take turns driving the agents; stop one, or "
                           "give one another [mqtt] topic_prefix",
                           store=beat.store, this_store=store_id)  # fmt: skip
        else:
            self.foreign.pop(beat.server, None)
        grew = self._twins(beat)
        self._devices_short(beat)
        self._entries_left_out(beat)
        return grew

    def ignores(self, progress: Progress) -> bool:
        """Whether a report (of a known server) is of the second of two agents beating
        for its server at once, whose progress never counts (event loop); said."""
        if session_key(progress.server, progress.session) in self.ignored_sessions:
            self._complain(progress.server, "twin", "progress of the second of two "
                           "agents that beat for one server at once ignored",
                           session=progress.session)  # fmt: skip
            return True
        return False

    def fell_silent(self, server: str) -> None:
        """``server`` was declared failed (decision thread): it follows nothing now, so
        its agent's last store is not counted (the second review)."""
        self.foreign.pop(server, None)

    def _devices_short(self, beat: Heartbeat) -> None:
        """Keep and say what an agent reports of workers short of devices (event loop):
        sharing a GPU others hold, or without one (fractional demands that fragmented a
        server's GPUs, fewer ids than its capacity, a worker given up on). Before, only
        the agent's own log said so."""
        if beat.devices_short:
            self.devices_short[beat.server] = beat.devices_short
            self._complain(beat.server, "devices",
                           "workers share GPUs others hold, or run without the ones they "
                           "need (the agent's log says why)",
                           workers=beat.devices_short)  # fmt: skip
        elif beat.server in self.devices_short:  # 0 once seen: an alert on it resolves
            self.devices_short[beat.server] = 0

    def _entries_left_out(self, beat: Heartbeat) -> None:
        """Keep and say what an agent reports of entries of its plan it left out as bad
        (event loop): their jobs do not run on its server. An agent older than this
        daemon (or newer) that reads an entry otherwise is the likely cause; before,
        only the agent's own log said so."""
        if beat.entries_left_out:
            self.entries_left_out[beat.server] = beat.entries_left_out
            self._complain(beat.server, "entries",
                           "the agent left entries of its plan out as bad: their jobs do "
                           "not run on its server (the agent's log says why; are the "
                           "agent and the daemon of one version?)",
                           entries=beat.entries_left_out)  # fmt: skip
        elif beat.server in self.entries_left_out:  # 0 once seen: an alert on it resolves
            self.entries_left_out[beat.server] = 0

    def _twins(self, beat: Heartbeat) -> bool:
        """Say when two agent sessions of one server beat at once (event loop): each
        heard more than a beat interval after the other's first beat. A restarted agent
        is not: its old session falls silent before the new one starts. Two at once are
        two agents for one server (a unit copied to another machine, a typo in
        ``--node``): both run the server's workers, and the job's progress was counted
        from both (the audit: two jobs completed a slot or two early). Only the first
        session's reports count; the second's never do, even once the first has
        stopped (its counts are cumulative over the time both ran: the review saw them
        added in full), and the store keeps which it is. Only the operator can end it;
        said at most every 10 s while it lasts, and counted on ``/metrics`` until
        either falls silent. True if the ignored sessions grew."""
        now = self.monotonic()
        sessions = self._sessions.setdefault(beat.server, {})
        times = sessions.setdefault(beat.session, [now, now])
        times[1] = now
        if len(sessions) > _MAX_SESSIONS_WATCHED:  # the quietest goes (bounded per server)
            del sessions[min(sessions, key=lambda k: sessions[k][1])]
        margin = self.mqtt.heartbeat_seconds
        for other, (first, last) in sessions.items():
            if other != beat.session and last > times[0] + margin and now > first + margin:
                if now - last > self.mqtt.heartbeat_timeout:
                    continue  # the other fell silent since: gone
                older, newer = ((other, beat.session) if first <= times[0]
                                else (beat.session, other))  # fmt: skip
                if session_key(beat.server, older) in self.ignored_sessions:
                    # one already ignored never becomes the counted one (the re-audit: a
                    # real agent restarted beside an ignored twin was itself ignored)
                    older, newer = newer, older
                self.twins[beat.server] = (older, newer)
                key = session_key(beat.server, newer)
                grew = key not in self.ignored_sessions
                if grew:
                    self._ignore(key)
                self._complain(beat.server, "twins",
                               "two agents beat for one server at once: both run its "
                               "workers; only the first one's progress counts, the "
                               "second's never does: stop the second (if you stop the "
                               "first, restart the second: a new session counts from "
                               "then on)", counted=older, ignored=newer)  # fmt: skip
                return grew
        for server, pair in list(self.twins.items()):  # over once either is silent
            known = self._sessions.get(server, {})
            if any(x not in known or now - known[x][1] > self.mqtt.heartbeat_timeout
                   for x in pair):  # fmt: skip
                del self.twins[server]
        if session_key(beat.server, beat.session) in self.ignored_sessions and not any(
            other != beat.session and session_key(beat.server, other) not in self.ignored_sessions
            and now - last <= self.mqtt.heartbeat_timeout
            for other, (_first, last) in sessions.items()
        ):  # fmt: skip
            self.ignored_alone[beat.server] = beat.session
            self._complain(beat.server, "ignored_alone",
                           "the only agent beating for this server is one whose progress is "
                           "ignored (the second of two that beat at once): restart it, and "
                           "a new session counts", session=beat.session)  # fmt: skip
        else:
            self.ignored_alone.pop(beat.server, None)
        return False

    def _check_clock(self, server: str, offset: float) -> None:
        """Keep ``server``'s clock offset (seconds, its agent's minus this daemon's) and
        log when it goes past :data:`CLOCK_OFF_SECONDS` and when it comes back within
        :data:`CLOCK_BACK_SECONDS` (event loop): at most :data:`CLOCK_LINES` lines of a
        server in :data:`CLOCK_LINES_SECONDS`; a state held back is said at the first
        beat after, with the ``crossings`` since the line before."""
        self.clock_offsets[server] = offset
        off = server in self._clock_off
        if (abs(offset) > CLOCK_OFF_SECONDS) if not off else (abs(offset) < CLOCK_BACK_SECONDS):
            off = not off
            if off:
                self._clock_off.add(server)
            else:
                self._clock_off.discard(server)
            self._clock_crossings[server] = self._clock_crossings.get(server, 0) + 1
        if off == (server in self._clock_said_off):
            return  # said already (or in step from the start)
        lines = self._clock_lines.setdefault(server, deque())
        now = self.monotonic()
        while lines and now - lines[0] >= CLOCK_LINES_SECONDS:
            lines.popleft()
        if len(lines) >= CLOCK_LINES:
            return  # flapping: said once the window has room
        lines.append(now)
        crossings = self._clock_crossings.pop(server, 0)
        held = {"crossings": crossings} if crossings > 1 else {}
        if off:
            self._clock_said_off.add(server)
            self.log.warning(
                "an agent's clock is off the daemon's: it follows each slot's plan "
                f"{_how_far(offset)} {'early' if offset > 0 else 'late'}; keep the head "
                "node and the servers on one time source (NTP)",
                server=server, offset_seconds=round(offset, 1), **held,
            )  # fmt: skip
        else:
            self._clock_said_off.discard(server)
            # + 0.0: -0.04 rounds to -0.0, which the line printed as "-0.0"
            self.log.info("an agent's clock is back in step with the daemon's", server=server,
                          offset_seconds=round(offset, 1) + 0.0, **held)  # fmt: skip


def _how_far(offset: float) -> str:
    """``|offset|`` seconds for the log's text: ``30.0 s``; past a day in days and hours
    (``3d4h``), past a million days to 4 digits (``1.157e+295d``): a forged heartbeat's
    ``sent_at`` of ``1e300`` wrote its 301 digits in the line."""
    seconds = abs(offset)
    return f"{seconds:.1f} s" if seconds < 86400 else format_duration(seconds)


def _server_of(key: str) -> str:
    """The server of a ``"server/session"`` key (a server's name holds no ``/``)."""
    return key.split("/", 1)[0]
