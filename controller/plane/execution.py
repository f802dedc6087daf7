"""What really happens, fed back into the plan: the daemon side of the execution plane.

Node agents send heartbeats and progress (:mod:`controller.plane.topics`); this module
keeps them and reacts, always in the admission controller's decision thread (between
two decisions), always committing to the store before the ledger changes hands:

- **done early**: a job whose reported mini-batches reach ``E * N * M`` completes in
  the current slot; its slots from the next one on are released and prices fall.
- **server silent** for ``heartbeat_timeout`` seconds (after it was heard at least once,
  also before a restart of the daemon: the store keeps the names of the servers ever
  heard, and the progress of active jobs names those that reported), counted only while
  the broker connection was up (:mod:`controller.plane.link_clock`: an outage neither
  counts nor restarts the count), and once the current connection has lasted two of an
  agent's beats (``heartbeat_seconds``; at most ``heartbeat_timeout``), for agents to
  come back after a broker restart: the server is
  down from the next slot on; its jobs are re-placed or re-planned
  (:func:`pricing.replan.fail_server`); a job that can no longer finish becomes
  ``failed``. A heartbeat brings it back from the next slot on.
- **slower than planned**: the job's mini-batch time is re-estimated
  (:mod:`pricing.runtime_estimate`); when even the optimistic end of the predictive
  interval needs more time than the plan holds, the remaining work is re-planned, and
  the new plan is taken if its payoff is positive (else the job is reported ``behind``).
- **plan ended short**: a running job whose plan has ended while its agents reported
  less than its work stays ``running`` (the slot clock asks :meth:`Execution.unfinished`);
  it completes when they report the rest, and becomes ``failed`` (``plan_ended``) if
  they have not within ``heartbeat_timeout`` seconds of the slot boundary. A job nobody
  reported on completes with its plan, as without the plane.

Plans for the current and the next slot are computed from the store (the source of
truth), in the same thread, so store, ledger and plans agree at every publication.

Heartbeats and progress arrive on the event loop (:mod:`controller.plane.link`), which
only drops them in an inbox (:meth:`Execution.heartbeat`, :meth:`Execution.report`,
guarded by a lock; reports in a :class:`~controller.plane.intake.ReportInbox`, bounded
per server); the decision thread applies them at the start of each review, so
everything else here is read and changed in that one thread alone.

A report's entry counts only if its job has workers on the reporting server (the one its
topic names) in the slot the report arrived in, or the one before or after (a report
sent across a boundary, a clock a little off): one store query per review finds them.
Entries for any other job -- unknown, ended long ago, or another server's -- are
dropped there, before they cost a store read each, and counted in one throttled warning.

Progress is written to the store once per review and stays marked changed until a commit
succeeds. Jobs that ended (completed, failed, cancelled) are forgotten once their progress
is stored; a late report of one (still within a slot of its work) is merged with what the
store holds rather than overwriting it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import structlog
from sqlalchemy import Text, cast, delete, func, or_, select, update
from sqlalchemy.orm import Session

from controller.admission.state import STORE_ID_KEY
from controller.clock import slots_for
from controller.errors import NotFoundError
from controller.events import Event
from controller.logs import Complaints
from controller.plane.devices import MAX_DEVICES
from controller.plane.intake import Received, ReportInbox
from controller.plane.link_clock import LinkClock
from controller.plane.port import AdmissionPort
from controller.plane.settings import MqttConfig
from controller.plane.topics import Heartbeat, Plan, Progress, SlotPlan, Task
from controller.store import (
    CORDONED,
    REBUILD_SECONDS,
    AllocationRow,
    EventRow,
    JobRow,
    MetaRow,
    OutageRow,
    ProgressRow,
    StoreUnavailableError,
)
from controller.store.stored import stored_spec
from pricing import ADMIT_THRESHOLD, Job, Ledger
from pricing.best_schedule import BestSchedule
from pricing.durations import format_duration
from pricing.errors import SpecError
from pricing.replan import fail_server, release_rest, replan_remaining
from pricing.runtime_estimate import Interval, RuntimePrior, fit

__all__ = ["ACTIVE", "Execution", "JobProgress", "ProgressView"]

ACTIVE = ("admitted", "running")
"""Job states that appear in plans."""
_PLANE_KEY = "plane"
OVERDUE = -1  # the slot of :meth:`Execution._planned`'s entries for jobs past their plan
_MAX_SAMPLES = 400
MAX_STORED_SESSIONS = 1 << 16
"""Sessions read from a job's stored progress at most (its agents' on its servers are far
fewer; an edited row's are left out)."""
MAX_PROGRESS_BYTES = 8 << 20
"""A stored progress row's JSON read at most, in characters (the bytes of the ASCII the
daemon writes; a row is a few KB to a few hundred; an edited row of 70 MB took the daemon
from 0.38 to 1.1 GB at start-up): a larger one is not read, and its job's progress
starts again from its agents' reports."""
MAX_SESSIONS_PER_SERVER = 64
"""Agent sessions of one server whose counts a job keeps (a restarted agent starts a
new one); entries of more are dropped. Each entry sums the job's sessions and its
stored row holds them all, so without a bound an agent with a new session id in every
report (a bug, or a forger on its own topic) slowed every review for every tenant."""
_MIN_SAMPLES = 4
_LEVEL = 0.9
# job entries of reports held while the decision thread cannot take them (a store outage
# stops it), over all servers; each server gets its share (controller/plane/intake.py)
_MAX_INBOX = 100_000
_MAX_INBOX_PER_SERVER = 1_000  # ... and at least this many
MAX_IGNORED_SESSIONS = 256
"""Agent sessions whose reports never count (the second of two that beat at once) the
plane remembers, the newest."""
_MAX_SESSIONS_WATCHED = 4
"""Agent sessions per server whose beats are remembered to tell two agents at once."""
_COMPLAIN_SECONDS = 10.0
FLOOD_DROPS = 100
"""Agents' messages dropped over their rates between two reviews that make a flood (an
agent's burst): then the broker may be dropping the other agents' heartbeats, and the time
counts half as silence. A few over one agent's rate change nothing: one agent sending
21 a second must not stop failure detection for the whole cluster (the diff review)."""
BUMP_SECONDS = 60.0
"""At most one move of the epoch above the agents' (see :meth:`Execution.plans_sync`)
per this many seconds: two daemons publishing under one topic prefix (a misconfiguration)
would otherwise move above each other at every round, each sending every plan again."""
MAX_EPOCH_STEP = 1 << 40
"""The furthest above this daemon's epoch a heartbeat's may move it (a trillion rounds: no
store restored from a backup is that far behind; a hostile claim moves it only so far)."""
MAX_FOLLOWED_EPOCH = 1 << 52
"""The highest epoch an agent's heartbeat may move this daemon's to (see
:meth:`Execution.plans_sync`): plan epochs are at most 2**53, so a hostile agent's claim
leaves room for 2**52 more rounds."""
CLOCK_OFF_SECONDS = 10.0
"""An agent whose clock is off the daemon's by more than this (its heartbeat's
``sent_at`` against the daemon's clock at receipt) is logged: it switches to the next
slot's plan that much early or late, so jobs on its server lose that time, or overlap
with the next slot's. A beat's delivery takes milliseconds, not seconds."""
CLOCK_BACK_SECONDS = 5.0
"""... and logged again once it is back within this."""
RESTORE_PAGE = 1000
"""Jobs whose latest event one page of a broker's restore reads (and publishes)."""
# the stored event kinds published on jobs/<id>/events (topics.event_kind)
_JOB_EVENT_KINDS = ("decided", "running", "completed", "cancelled", "replanned", "failed")


@dataclass
class JobProgress:
    """A job's reported progress.

    Attributes:
        sessions: ``"server/session" -> [minibatches, worker_seconds]``, cumulative.
        samples: ``[(minibatches, worker_seconds), ...]``: the job's totals after each
            report, the data the runtime estimate is fitted to.
        dirty: changed since last written to the store (cleared by a commit only).
        partial: built from reports alone, without the job's stored progress (a job
            forgotten when it ended, then reported again): merged with the stored row
            before it is written, so sessions only the store knows are kept.
    """

    sessions: dict[str, list[float]] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)
    dirty: bool = False
    partial: bool = False

    def totals(self) -> tuple[float, float]:
        """``(minibatches, worker_seconds)`` over every session."""
        return _totals(self.sessions)


def _totals(sessions: dict[str, list[float]]) -> tuple[float, float]:
    return sum(v[0] for v in sessions.values()), sum(v[1] for v in sessions.values())


def session_key(server: str, session: str) -> str:
    """``"server/session"``: one agent session of a server, as :class:`JobProgress`
    keys its counts and the plane names the sessions it ignores."""
    return f"{server}/{session}"


def _sessions_of(prog: JobProgress, server: str) -> int:
    """The sessions of ``server`` whose counts ``prog`` holds."""
    prefix = f"{server}/"
    return sum(1 for key in prog.sessions if key.startswith(prefix))


MAX_UNSENT_RUNS = 16
"""Runs of slots whose plans never went out that the plane keeps (the newest): a job
planned in one still waits for its agents' counts (:meth:`Execution.unfinished`)."""


def _joined_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` of slots ``(first, last)`` in order, those that overlap or meet made one
    (a daemon restarted again and again with the broker down adds the same slots)."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _counter(value: Any) -> bool:
    """Whether a stored plan epoch or event count is an integer in ``[0, 2**53]`` (an
    edit's 10**29 overflowed every query of the events after it: the plane reconnected
    every second)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 53


def _pair(value: Any) -> tuple[float, float] | None:
    """A stored ``[minibatches, worker_seconds]``, or None if it does not read as two
    finite numbers >= 0."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    try:
        a, b = float(value[0]), float(value[1])
    except (TypeError, ValueError, OverflowError):
        return None
    return (a, b) if math.isfinite(a) and math.isfinite(b) and min(a, b) >= 0 else None


def _stored(row: ProgressRow) -> tuple[JobProgress, int]:
    """A stored row's progress and how many of its entries did not read (an edit: they
    are left out, as are sessions past :data:`MAX_STORED_SESSIONS` and all but the last
    ``_MAX_SAMPLES`` samples), so a row edited by hand never fails a review or a read."""
    per_server = row.per_server if isinstance(row.per_server, dict) else {}
    points = row.samples.get("points", []) if isinstance(row.samples, dict) else []
    points = points if isinstance(points, list) else []
    sessions = {
        key: list(pair)
        for key, value in list(per_server.items())[:MAX_STORED_SESSIONS]
        if isinstance(key, str) and (pair := _pair(value)) is not None
    }
    samples = [p for p in map(_pair, points[-_MAX_SAMPLES:]) if p is not None]
    bad = (
        len(per_server) - len(sessions) + min(len(points), _MAX_SAMPLES) - len(samples)
        + (not isinstance(row.per_server, dict)) + (not isinstance(row.samples, dict))
    )  # fmt: skip
    return JobProgress(sessions, samples), bad


def _progress_row(session: Session, job_id: str) -> ProgressRow | None:
    """``job_id``'s stored progress, None if none or larger than
    :data:`MAX_PROGRESS_BYTES` (an edit: its JSON is not read)."""
    within = _progress_bytes() <= MAX_PROGRESS_BYTES
    return session.scalar(select(ProgressRow).where(ProgressRow.job_id == job_id, within))


def _progress_bytes() -> Any:
    """The size of a progress row's JSON in characters, as SQL (``length`` of its text
    on both stores)."""
    return func.coalesce(func.length(cast(ProgressRow.per_server, Text)), 0) + func.coalesce(
        func.length(cast(ProgressRow.samples, Text)), 0
    )


def _merged(
    prog: JobProgress, row: ProgressRow
) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """A partial entry's sessions and samples merged with the job's stored progress."""
    stored = _stored(row)[0]
    sessions = stored.sessions
    for key, (mb, ws) in prog.sessions.items():
        old = sessions.get(key, [0.0, 0.0])
        # counts are cumulative per session: the larger one is the later one
        sessions[key] = [max(old[0], mb), max(old[1], ws)]
    # the partial entry's own samples are totals over a subset of the sessions, not the
    # job's: only the merged totals are a valid new sample
    samples = stored.samples
    totals = _totals(sessions)
    if not samples or samples[-1] != totals:
        samples.append(totals)
    return sessions, samples[-_MAX_SAMPLES:]


@dataclass(frozen=True)
class ProgressView:
    """A job's progress and runtime estimate as the API reports it.

    Attributes:
        job_id: the job.
        state: its state.
        minibatches_done, minibatches_total: reported and needed mini-batches.
        worker_seconds: worker-seconds reported so far.
        reports: samples the estimate is fitted to.
        planned_minibatch_seconds: the plan's time of one mini-batch on one worker.
        minibatch_seconds: its posterior estimate and credible interval, seconds.
        total_worker_seconds: predicted worker-seconds for the whole job, with the
            predictive interval.
        planned_worker_seconds: worker-seconds the plan holds in all (slots x length).
        completion_slot: the planned last slot.
    """

    job_id: str
    state: str
    minibatches_done: float
    minibatches_total: int
    worker_seconds: float
    reports: int
    planned_minibatch_seconds: float
    minibatch_seconds: Interval
    total_worker_seconds: Interval
    planned_worker_seconds: float
    completion_slot: int | None


def run_of(decided_at: Any) -> str:
    """A job's ``run`` in plans and reports (:class:`~controller.plane.topics.Task`): the
    time it was admitted, to the microsecond (UTC, as the store keeps it). Every head node
    of one store gives the same; an id used again gets another. "" if it does not read."""
    if not isinstance(decided_at, datetime):
        return ""
    at: datetime = decided_at
    if at.tzinfo is not None:  # PostgreSQL gives it in the session's time zone (PGTZ,
        at = at.astimezone(UTC)  # options): the same run whatever it is
    return at.strftime("%Y%m%dT%H%M%S.%f")  # naive: UTC, as SQLite keeps it


class Execution:
    """Heartbeats, progress and the reactions to them; see the module docstring.

    Args:
        controller: the opened admission controller.
        mqtt: the broker settings (timeouts).
        monotonic: the clock heartbeats are timed with, seconds.
    """

    def __init__(
        self,
        controller: AdmissionPort,
        mqtt: MqttConfig,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.c = controller
        self.mqtt = mqtt
        self.monotonic = monotonic
        self.log = structlog.get_logger("oasisd")
        self.slot_seconds = controller.config.slot_seconds
        self.server_index: dict[str, tuple[str, int]] = {}
        for kind, names in (("worker", controller.cluster.worker_names),
                            ("ps", controller.cluster.ps_names)):  # fmt: skip
            for i, name in enumerate(names):
                self.server_index[name] = (kind, i)
        self.link = LinkClock(monotonic)  # silence is timed on it: connected seconds
        self._reviewed_at = 0.0  # link time of the last review
        self._dropped = 0  # agents' messages dropped over their rate since the last review
        # the highest epoch an agent follows above this daemon's (its heartbeats), and
        # that agent's server: plans of another daemon's store, which hide this one's
        self._ahead: tuple[int, str] = (0, "")
        self._ahead_since: float | None = None  # monotonic time of the first such claim
        self._bumped_at: float | None = None  # monotonic time of the last such move
        self.last_seen: dict[str, float] = {}  # server -> link time it was last heard
        self.heard: set[str] = set()  # servers ever heard from (kept in the store)
        self._heard_saved = True  # False: ``heard`` grew since it was last stored
        self.failed: dict[str, float] = {}  # server -> link time declared failed
        self.progress: dict[str, JobProgress] = {}
        self.pending: set[str] = set()
        # jobs reported done in a slot before their arrival: never completed there (a jct
        # under 1 slot, a utility no schedule earns), kept pending until they arrive
        self._early: set[str] = set()
        self.reviewed: dict[str, int] = {}  # job -> slot of its last slow-job re-plan try
        self.stalled: set[str] = set()  # jobs reported behind for want of any progress
        self._jobs: dict[str, Job] = {}
        self._pruned_slot: int | None = None
        self.overdue: set[str] = set()  # running past their plan, short of their work
        # the inbox: filled on the event loop, emptied in the decision thread (_drain)
        self._inbox_lock = threading.Lock()
        self._beats: dict[str, float] = {}  # server -> link time of its latest beat
        per_server = max(_MAX_INBOX_PER_SERVER, _MAX_INBOX // max(1, len(self.server_index)))
        self._reports = ReportInbox(per_server)
        self._complain = Complaints(_COMPLAIN_SECONDS, monotonic)
        # server -> its agent's clock minus this daemon's, seconds (latest beat saying)
        self.clock_offsets: dict[str, float] = {}
        self.store_id = ""  # this store's (STORE_ID_KEY; read at load): plans carry it
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
        self._clock_off: set[str] = set()  # servers logged as off, not yet back
        self.epoch = 0
        self.events_published = 0
        # the latest slot whose plans went out (they hold that slot and the next), and
        # the slots whose plans never did because this daemon was down: (first, last)
        self.planned_slot: int | None = None
        self.unsent: list[tuple[int, int]] = []

    # -- start-up ----------------------------------------------------------------------

    def load(self) -> None:
        """Read failed servers, progress of active jobs and the plan epoch from the store
        (blocking). Ended jobs' progress stays in the store (see :meth:`view_sync`)."""
        self._check_devices()
        now = self.link.now()
        with self.c.db.session() as session:
            failures = select(OutageRow).where(
                OutageRow.up_from.is_(None), OutageRow.cause != CORDONED
            )  # an operator's cordon is no failure: heartbeats do not end it
            for row in session.scalars(failures):
                self.failed[row.server] = now
            active = (
                select(ProgressRow)
                .join(JobRow, JobRow.id == ProgressRow.job_id)
                .where(JobRow.state.in_(ACTIVE))
            )
            size = _progress_bytes()
            oversized = active.with_only_columns(ProgressRow.job_id, size).where(
                size > MAX_PROGRESS_BYTES
            )
            for job_id, chars in session.execute(oversized):  # edited by hand: not read
                self.log.warning("stored progress ignored", job=job_id,
                                 why=f"{chars} bytes, over {MAX_PROGRESS_BYTES}")  # fmt: skip
            active = active.where(size <= MAX_PROGRESS_BYTES)
            for prow in session.scalars(active):
                self.progress[prow.job_id], bad = _stored(prow)
                if bad:  # edited by hand: its agents send again what they sent since
                    self.log.warning("stored progress entries ignored", job=prow.job_id,
                                     entries=bad)  # fmt: skip
                # its agents reported before the restart: their silence counts from now,
                # or one that died while the daemon was down would never be noticed
                for key in self.progress[prow.job_id].sessions:
                    server = key.split("/", 1)[0]
                    if server in self.server_index and server not in self.failed:
                        self.last_seen[server] = now
            named = session.get(MetaRow, STORE_ID_KEY)
            sid = named.value.get("id") if named and isinstance(named.value, dict) else None
            # an edit may leave anything: an id the plans carry is short and plain
            ok = isinstance(sid, str) and 0 < len(sid) <= 64 and sid.isascii() and sid.isalnum()
            self.store_id = sid if ok and isinstance(sid, str) else ""
            meta = session.get(MetaRow, _PLANE_KEY)
            if meta is not None:
                value = meta.value if isinstance(meta.value, dict) else {}
                epoch, events = value.get("epoch", 0), value.get("events", 0)
                if not (isinstance(meta.value, dict) and _counter(epoch) and _counter(events)):
                    # edited by hand: plans must go out under an epoch above any agents
                    # saw (they ignore older ones); the wall clock's seconds are above
                    # any count of publications, and every job event is published again
                    epoch, events = max(int(time.time()), epoch if _counter(epoch) else 0), 0
                    self.log.warning("stored plane state ignored", epoch=epoch,
                                     stored=str(meta.value)[:200])  # fmt: skip
                newest = int(session.scalar(select(func.max(EventRow.sequence))) or 0)
                if events > newest:  # edited by hand: it would skip every event up to it
                    self.log.warning("stored plane state's events past the newest event",
                                     events=events, newest=newest)  # fmt: skip
                    events = newest
                self.epoch, self.events_published = epoch, events
                self._find_unsent(value.get("planned"), value.get("unsent"))
                heard = value.get("heard", [])
                if isinstance(heard, list):  # an edited store: names it does not know go
                    self.heard = {s for s in heard if s in self.server_index}
                ignored = value.get("ignored", [])
                if isinstance(ignored, list):
                    self.ignored_sessions = dict.fromkeys(
                        k for k in ignored[-MAX_IGNORED_SESSIONS:]
                        if isinstance(k, str) and len(k) <= 512
                    )  # fmt: skip
            # heard from before the restart: their silence counts from now, or an agent
            # (a PS's, say, that reports no progress) that died meanwhile goes unnoticed
            for server in self.heard - set(self.failed):
                self.last_seen.setdefault(server, now)

    # -- what agents say (event loop: into the inbox only) -------------------------------

    def connected(self) -> None:
        """The broker connection is up: silence counts again."""
        with self._inbox_lock:
            self.link.up()

    def disconnected(self) -> None:
        """The broker connection is down: nobody can be heard, so nobody is failed."""
        with self._inbox_lock:
            self.link.down()

    def crowded(self) -> None:
        """An agent's message was dropped over its rate (event loop). Many between two
        reviews (:data:`FLOOD_DROPS`): a flood, and the broker may be dropping other
        agents' messages too, so that time counts half as anyone's silence (see
        :meth:`review_sync`)."""
        with self._inbox_lock:
            self._dropped += 1

    def heartbeat(self, beat: Heartbeat) -> bool:
        """Queue a heartbeat (timed now) for the decision thread; True if its agent
        follows a plan of an epoch above this daemon's (see :meth:`plans_sync`)."""
        if beat.server not in self.server_index:
            return False
        if beat.sent_at is not None:
            self._check_clock(beat.server, beat.sent_at - self.c.slots.clock.now())
        if beat.store and self.store_id and beat.store != self.store_id:
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
                           store=beat.store, this_store=self.store_id)  # fmt: skip
        else:
            self.foreign.pop(beat.server, None)
        self._twins(beat)
        self._devices_short(beat)
        with self._inbox_lock:
            self._beats[beat.server] = self.link.now()
            if not self.epoch < beat.epoch <= min(MAX_FOLLOWED_EPOCH, self.epoch + MAX_EPOCH_STEP):
                return False
            if beat.epoch > self._ahead[0]:
                self._ahead = (beat.epoch, beat.server)
            if self._ahead_since is None:
                self._ahead_since = self.monotonic()
            return self._bump_due()

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

    def _twins(self, beat: Heartbeat) -> None:
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
        either falls silent."""
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
                if key not in self.ignored_sessions:
                    self.ignored_sessions[key] = None
                    while len(self.ignored_sessions) > MAX_IGNORED_SESSIONS:
                        del self.ignored_sessions[next(iter(self.ignored_sessions))]
                    self._heard_saved = False  # stored at the next review
                self._complain(beat.server, "twins",
                               "two agents beat for one server at once: both run its "
                               "workers; only the first one's progress counts, the "
                               "second's never does: stop the second (if you stop the "
                               "first, restart the second: a new session counts from "
                               "then on)", counted=older, ignored=newer)  # fmt: skip
                return
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

    def _check_clock(self, server: str, offset: float) -> None:
        """Keep ``server``'s clock offset (seconds, its agent's minus this daemon's) and
        log when it goes past :data:`CLOCK_OFF_SECONDS` and when it comes back within
        :data:`CLOCK_BACK_SECONDS` (event loop)."""
        self.clock_offsets[server] = offset
        if abs(offset) > CLOCK_OFF_SECONDS and server not in self._clock_off:
            self._clock_off.add(server)
            self.log.warning(
                "an agent's clock is off the daemon's: it follows each slot's plan "
                f"{abs(offset):.1f} s {'early' if offset > 0 else 'late'}; keep the head "
                "node and the servers on one time source (NTP)",
                server=server, offset_seconds=round(offset, 1),
            )  # fmt: skip
        elif abs(offset) < CLOCK_BACK_SECONDS and server in self._clock_off:
            self._clock_off.discard(server)
            self.log.info("an agent's clock is back in step with the daemon's", server=server,
                          offset_seconds=round(offset, 1))  # fmt: skip

    def report(self, progress: Progress) -> None:
        """Queue a progress report (timed now, in the current slot) for the decision
        thread. ``progress.server`` must be the server whose topic it came on. The
        second of two agents beating for the server at once is not counted."""
        if progress.server in self.server_index:
            if session_key(progress.server, progress.session) in self.ignored_sessions:
                self._complain(progress.server, "twin", "progress of the second of two "
                               "agents that beat for one server at once ignored",
                               session=progress.session)  # fmt: skip
                return
            with self._inbox_lock:
                at = self.link.now()
            self._reports.put(Received(at, self.c.slots.current_slot(), progress))

    def _drain(self) -> None:
        """Apply what the inbox holds (decision thread)."""
        with self._inbox_lock:
            beats, self._beats = self._beats, {}
        for server, at in beats.items():
            self._seen(server, at)
        reports = self._reports.take()
        try:
            planned, runs = self._planned(reports)
        except Exception:  # the store: nothing applied, so nothing lost
            self._reports.put_back(reports)
            raise
        ignored: Counter[str] = Counter()
        crowded: Counter[str] = Counter()
        other_run: Counter[str] = Counter()
        for received in reports:
            progress = received.progress
            self._seen(progress.server, received.at)
            key = session_key(progress.server, progress.session)
            around = (received.slot - 1, received.slot, received.slot + 1)
            for task in progress.jobs:
                if not any((task.job, progress.server, s) in planned for s in around) and (
                    (task.job, progress.server, OVERDUE) not in planned
                ):
                    ignored[progress.server] += 1
                    continue
                if task.run and runs.get(task.job, "") not in ("", task.run):
                    # counts of another admission of this id (a store restored from a
                    # backup, a job deleted by retention): not this job's work
                    other_run[progress.server] += 1
                    continue
                prog = self.progress.get(task.job)
                if prog is None:  # new, or ended and forgotten: the store may hold more
                    prog = self.progress[task.job] = JobProgress(partial=True)
                if key not in prog.sessions and _sessions_of(prog, progress.server) >= (
                    MAX_SESSIONS_PER_SERVER
                ):
                    crowded[progress.server] += 1
                    continue
                prog.sessions[key] = [task.minibatches, task.worker_seconds]
                prog.samples.append(prog.totals())
                del prog.samples[:-_MAX_SAMPLES]
                prog.dirty = True
                self.pending.add(task.job)
        for server, entries in ignored.items():
            self._complain(server, "unplanned", "report entries ignored: jobs not planned on "
                           "this server now", entries=entries)  # fmt: skip
        for server, entries in other_run.items():
            self._complain(server, "run", "report entries ignored: counts of an earlier job "
                           "of the same id", entries=entries)  # fmt: skip
        for server, entries in crowded.items():
            self._complain(server, "sessions", "report entries dropped: too many agent "
                           "sessions for a job", entries=entries,
                           limit=MAX_SESSIONS_PER_SERVER)  # fmt: skip

    def _planned(self, reports: list[Received]) -> tuple[set[tuple[str, str, int]], dict[str, str]]:
        """``(job, server, slot)`` with workers, for the servers of ``reports`` and the
        slots around their arrival: what their entries may count for; and ``(job,
        server, OVERDUE)`` for the jobs past their plan short of their work on the
        servers that ran their workers, whose late counts still count (two queries).
        Also each of those jobs' run (:func:`run_of`)."""
        if not reports:
            return set(), {}
        servers = {r.progress.server for r in reports}
        lo = min(r.slot for r in reports) - 1
        hi = max(r.slot for r in reports) + 1
        with self.c.db.session() as session:
            rows = session.execute(
                select(AllocationRow.job_id, AllocationRow.server, AllocationRow.slot,
                       JobRow.decided_at)
                .join(JobRow, JobRow.id == AllocationRow.job_id).where(
                    AllocationRow.slot >= lo, AllocationRow.slot <= hi,
                    AllocationRow.server.in_(servers), AllocationRow.workers > 0)
            ).all()  # fmt: skip
            late = session.execute(
                select(AllocationRow.job_id, AllocationRow.server, JobRow.decided_at)
                .join(JobRow, JobRow.id == AllocationRow.job_id).distinct().where(
                    AllocationRow.job_id.in_(sorted(self.overdue)),
                    AllocationRow.server.in_(servers), AllocationRow.workers > 0)
            ).all() if self.overdue else []  # fmt: skip
        runs = {r.job_id: run_of(r.decided_at) for r in (*rows, *late)}
        return {(r.job_id, r.server, int(r.slot)) for r in rows} | {
            (r.job_id, r.server, OVERDUE) for r in late
        }, runs

    def _seen(self, server: str, at: float) -> None:
        # a beat and a report drained together may come in either order
        self.last_seen[server] = max(at, self.last_seen.get(server, at))
        if server not in self.heard:
            self.heard.add(server)
            self._heard_saved = False

    # -- reactions (decision thread) ------------------------------------------------------

    def review_sync(self) -> list[Event]:
        """Failures, recoveries, early completions and slow jobs; then persist progress
        and, once a slot, forget the jobs that ended."""
        self.c._advance_window()
        self._drain()
        events: list[Event] = []
        with self._inbox_lock:
            # one agent's flood is not the others' silence: its time counts half (so a
            # flood delays failure detection, at most twofold, but never stops it; a
            # trickle over one agent's rate changes nothing)
            flooded = self._dropped >= FLOOD_DROPS
            if flooded:
                self.link.rewind_to(self._reviewed_at + (self.link.now() - self._reviewed_at) / 2)
            self._dropped = 0
            now, up_for = self.link.now(), self.link.up_for()
            self._reviewed_at = now
        # connected long enough for every live agent to reconnect and beat (or resend)
        grace = min(2 * self.mqtt.heartbeat_seconds, self.mqtt.heartbeat_timeout)
        settled = up_for is not None and up_for >= grace
        if up_for is not None:  # connected: who fell silent, who is back
            for server, seen in self.last_seen.items():
                if server not in self.failed:
                    if settled and now - seen > self.mqtt.heartbeat_timeout:
                        events += self._fail_sync(server)
                        self.failed[server] = now
                        # it follows nothing now: its agent's last store is not counted
                        self.foreign.pop(server, None)  # (the second review)
                elif seen > self.failed[server]:
                    events += self._recover_sync(server)
                    del self.failed[server]
        for job_id in sorted(self.pending):
            try:
                events += self._review_job_sync(job_id)
            except StoreUnavailableError:
                # kept pending: reviewed again once the store is back, even if its agents
                # have nothing new to report (those of a job that is done never do)
                raise
            except Exception:
                self.pending.discard(job_id)  # a bug would fail the same way every review
                raise
            if job_id in self._early:
                self._early.discard(job_id)  # reviewed again (its agents may say no more)
            else:
                self.pending.discard(job_id)
        if settled and not flooded:  # a job's last counts may be among the dropped
            events += self._overdue_sync()
        self._flush_progress()
        if not self._heard_saved:
            with self.c._write() as session:
                self._save_meta(session)
            self._heard_saved = True
        if self._pruned_slot != self.c.slot:
            self._prune()
            self._pruned_slot = self.c.slot
        return events

    def _find_unsent(self, planned: Any, stored: Any) -> None:
        """Note the runs of slots whose plans never went out (:attr:`unsent`): those
        stored (a restart soon after another keeps them) that a job may still be running
        from, and the slots after the latest whose plans did (``planned``; they held the
        next slot too) and before the current one. The daemon was down meanwhile."""
        oldest = self.c.slot - self.c.window  # no job planned before it still runs
        if isinstance(stored, list):  # an edited store: what does not read is dropped
            for run in stored[-MAX_UNSENT_RUNS:]:
                pair: list[Any] = run if isinstance(run, list) and len(run) == 2 else [-1, -1]
                first, last = pair
                if _counter(first) and _counter(last) and oldest <= last and first <= last:
                    self.unsent.append((int(first), int(last)))
        if not _counter(planned):
            return
        assert isinstance(planned, int)
        self.planned_slot = planned
        first, last = planned + 2, self.c.slot - 1
        if first <= last:
            self.unsent = _joined_runs([*self.unsent, (first, last)])[-MAX_UNSENT_RUNS:]
            self.log.warning("plans of slots no agent was sent (oasisd was down): a job "
                             "planned in them completes only as its agents report",
                             first_slot=first, last_slot=last)  # fmt: skip

    def _planned_unsent(self, job_id: str, session: Session) -> list[tuple[int, int]]:
        """The runs of :attr:`unsent` in which ``job_id`` had workers planned (one
        query; none without such runs)."""
        if not self.unsent:
            return []
        slots = set(session.scalars(
            select(AllocationRow.slot).where(
                AllocationRow.job_id == job_id, AllocationRow.workers > 0,
                or_(*(AllocationRow.slot.between(a, b) for a, b in self.unsent)),
            )
        ))  # fmt: skip
        return [(a, b) for a, b in self.unsent if any(a <= s <= b for s in slots)]

    def unfinished(self, job_id: str, session: Session) -> bool:
        """Whether agents reported progress for ``job_id`` short of its ``E * N * M``
        mini-batches (decision thread). The slot clock asks this of running jobs whose
        plan has ended; one that is short is remembered for :meth:`_overdue_sync`. A job
        nobody reported on is not short, its plan being all the daemon knows, unless
        that plan had slots whose plans never went out (:attr:`unsent`): it did not run
        then (the time audit found such jobs completed with their whole utility)."""
        short, _ = self._shortfall(job_id, session)
        if short:
            self.overdue.add(job_id)
        return short

    def _shortfall(self, job_id: str, session: Session) -> tuple[bool, list[tuple[int, int]]]:
        """Whether ``job_id`` is short of its work (:meth:`unfinished`), and, for one
        nobody reported on, the runs of :attr:`unsent` that make it so."""
        prog = self.progress.get(job_id)
        if prog is None:
            unsent = self._planned_unsent(job_id, session)
            return bool(unsent), unsent
        return prog.totals()[0] < self._job(job_id, session).total_minibatches - 1e-9, []

    def _overdue_sync(self) -> list[Event]:
        """Fail the jobs left running past their plan short of their work, once their
        agents had ``heartbeat_timeout`` seconds after the plan's end to report the rest
        (called only with the broker connection up for two of their beats: agents resend
        their counts when the daemon comes back, so a job finished while the daemon was
        down or cut off completes rather than fails)."""
        if not self.overdue:
            return []
        s = self.c.slot
        since_boundary = self.slot_seconds - self.c.slots.seconds_to_next_slot()
        now = datetime.now(UTC)
        events: list[Event] = []
        with self.c._write() as session:
            for job_id in sorted(self.overdue):
                row = session.get(JobRow, job_id)
                if row is None or row.state != "running" or row.completion_slot is None:
                    self.overdue.discard(job_id)  # completed by its last report, or ended
                    continue
                since_plan_end = (s - row.completion_slot - 1) * self.slot_seconds + since_boundary
                if since_plan_end <= self.mqtt.heartbeat_timeout:
                    continue
                short, unsent = self._shortfall(job_id, session)
                if not short:
                    self.overdue.discard(job_id)
                    continue
                job = self._job(job_id, session)
                prog = self.progress.get(job_id)
                done = prog.totals()[0] if prog is not None else 0.0
                row.state = "failed"
                detail = {"reason": "plan_ended", "minibatches": done,
                          "of": job.total_minibatches,
                          "completion_slot": row.completion_slot}  # fmt: skip
                if unsent:  # no agent ever reported it, and slots of its plan never went out
                    detail.update(reason="plan_not_sent",
                                  not_sent_slots=[list(run) for run in unsent])  # fmt: skip
                events.append(self.c._event(session, now, "failed", job_id, "failed", detail))
                self.log.warning("job failed: its plan ended before its work", job=job_id,
                                 **detail)  # fmt: skip
        # only once the commit went through: a store outage leaves them to the next review
        for e in events:
            self.overdue.discard(e.job_id)
        return events

    def _job(self, job_id: str, session: Session | None = None) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            if session is None:
                with self.c.db.session() as s:
                    return self._job(job_id, s)
            row = session.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            job = self.c._parse(stored_spec(row.spec, job_id), arrival=row.arrival_slot)
            self._jobs[job_id] = job
        return job

    def _last_slot(self, job: Job) -> int:
        return self.c._window_end(job.arrival)

    def _guarded(self, change: Callable[[], list[Event]]) -> list[Event]:
        """Run ``change`` (which changes the ledger, then commits); if the commit fails,
        rebuild the ledger from the store so the two never disagree."""
        try:
            return change()
        except Exception:
            self.log.exception("re-plan failed; rebuilding the ledger from the store")
            self._resync()
            raise

    def _resync(self) -> None:
        ledger = self.c._ledger
        self.c.ledger = Ledger(self.c.cluster, ledger.bounds, ledger.length, origin=ledger.origin)
        with self.c.db.patient(REBUILD_SECONDS):
            self.c._rebuild()

    def _fail_sync(self, server: str) -> list[Event]:
        kind, index = self.server_index[server]
        s = self.c.slot
        from_slot = s + 1
        ledger = self.c._ledger
        if ledger.is_down(kind, index):
            # cordoned: its jobs moved off already; the failure is recorded, so the
            # server stays out after an uncordon until its agent is heard again
            return self._fail_cordoned_sync(server, from_slot) if self._out(server) else []
        with self.c.db.session() as session:  # only the jobs the failure moves
            jobs = {j: self._job(j, session) for j in ledger.holding(kind, index, from_slot)}
        before = {j: ledger.schedule(j) for j in jobs}
        remaining: dict[str, int] = {}
        for j, sched in before.items():
            lost = sched.after(s).before(from_slot)  # the current slot, on the failed server
            counts = lost.workers if kind == "worker" else lost.ps
            lost_work = int(counts[:, index].sum()) if (kind == "worker" and lost.slots) else 0
            remaining[j] = sched.after(from_slot).work() + lost_work

        def change() -> list[Event]:
            outcome = fail_server(ledger, jobs, kind, index, from_slot, remaining,
                                  {j: self._last_slot(job) for j, job in jobs.items()})  # fmt: skip
            now = datetime.now(UTC)
            events: list[Event] = []
            with self.c._write() as session:
                session.add(OutageRow(server=server, down_from=from_slot, up_from=None,
                                      detected_at=now))  # fmt: skip
                moved = outcome.moves()
                for j, how in moved.items():
                    detail: dict[str, Any] = {"reason": "server_failed", "server": server}
                    best = outcome.replanned.get(j)
                    events.append(
                        self.c._record_move(session, now, jobs[j], how, from_slot, detail, best)
                    )
                events.append(self.c._event(session, now, "server_failed", "", "",
                                            {"server": server, "from_slot": from_slot,
                                             "jobs": list(moved)}))  # fmt: skip
            self.log.warning("server failed", server=server, from_slot=from_slot,
                             replaced=outcome.replaced, replanned=list(outcome.replanned),
                             stranded=outcome.stranded)  # fmt: skip
            return events

        return self._guarded(change)

    def _fail_cordoned_sync(self, server: str, from_slot: int) -> list[Event]:
        """A cordoned server's agent fell silent: recorded, nothing moves."""
        now = datetime.now(UTC)
        with self.c._write() as session:
            session.add(OutageRow(server=server, down_from=from_slot, up_from=None,
                                  detected_at=now))  # fmt: skip
            event = self.c._event(session, now, "server_failed", "", "",
                                  {"server": server, "from_slot": from_slot, "jobs": [],
                                   "cordoned": True})  # fmt: skip
        self.log.warning("server failed", server=server, from_slot=from_slot, cordoned=True)
        return [event]

    def _recover_sync(self, server: str) -> list[Event]:
        """The agent of failed ``server`` is heard again: it is back from the next slot,
        unless cordoned, or flapping (``[mqtt] flap_failures`` failures within
        ``flap_seconds``): then it is held out for ``flap_seconds`` more by a cordon with an
        end (:mod:`controller.admission.cordons`, by ``oasisd``), which an operator's
        ``oasis uncordon`` ends sooner."""
        kind, index = self.server_index[server]
        from_slot = self.c.slot + 1
        now = datetime.now(UTC)
        cordon = self.c.cordoned.get(server)
        cordoned = cordon is not None and cordon.started(self.c.slot)  # out: its cordon
        planned = cordon is not None and not cordoned  # a cordon ahead: kept
        with self.c._write() as session:
            session.execute(update(OutageRow).where(
                OutageRow.server == server, OutageRow.up_from.is_(None),
                OutageRow.cause != CORDONED,
            ).values(up_from=from_slot))  # fmt: skip
            flaps = 0 if cordoned else self._recent_failures(session, server, now)
            detail: dict[str, Any] = {"server": server, "from_slot": from_slot}
            if cordoned:
                detail["cordoned"] = True
            event = self.c._event(session, now, "server_recovered", "", "", detail)
        events = [event]
        if flaps and not planned:
            events += self._hold_out(server, flaps)
            # the failure's block has no end: the hold-out's own slots take its place
            # (the interleaving audit: blocked for good, where a rebuild held the
            # hold-out's slots alone)
            self.c._ledger.unblock(kind, index, from_slot)
            self.c._block_cordon(server)
        elif not cordoned or (cordon is not None and cordon.until is not None):
            # the failure's block goes; a cordon keeps its own slots (one planned, or in
            # force up to its end; one without an end keeps the server out as it is).
            # One cordon per server: a flapping server with one planned is not held out
            # as well (logged)
            self.c._ledger.unblock(kind, index, from_slot)
            self.c._block_cordon(server)
        self.log.info("server back", server=server, from_slot=from_slot, cordoned=cordoned,
                      held_out=bool(flaps) and not planned, planned_cordon=planned,
                      flapping=bool(flaps))  # fmt: skip
        return events

    def _out(self, server: str) -> bool:
        """Whether ``server`` is cordoned from the next slot on (not only planned)."""
        cordon = self.c.cordoned.get(server)
        return cordon is not None and cordon.started(self.c.slot)

    def _recent_failures(self, session: Any, server: str, now: datetime) -> int:
        """The failures of ``server`` detected within ``flap_seconds`` before ``now`` if
        they are at least ``flap_failures`` (0 if not, or if that rule is off)."""
        least = self.mqtt.flap_failures
        if least <= 0:
            return 0
        since = now - timedelta(seconds=self.mqtt.flap_seconds)
        count = session.scalar(select(func.count(OutageRow.id)).where(
            OutageRow.server == server, OutageRow.cause != CORDONED,
            OutageRow.detected_at >= since))  # fmt: skip
        return int(count or 0) if (count or 0) >= least else 0

    def _hold_out(self, server: str, flaps: int) -> list[Event]:
        """Keep flapping ``server`` out for ``flap_seconds``, as a cordon with an end (its
        jobs moved off at its failure, so nothing moves); returns the cordon's events."""
        until = self.c.slot + 1 + max(slots_for(self.mqtt.flap_seconds, self.slot_seconds), 1)
        span = format_duration(self.mqtt.flap_seconds)
        reason = f"flapping: its agent fell silent {flaps} times within {span}"
        _view, events = self.c._cordon_sync(server, reason, "oasisd", force=True, until=until)
        self.log.warning("flapping server held out", server=server, failures=flaps,
                         until_slot=until)  # fmt: skip
        return events

    def _review_job_sync(self, job_id: str) -> list[Event]:
        prog = self.progress.get(job_id)
        if prog is None:
            return []
        with self.c.db.session() as session:
            row = session.get(JobRow, job_id)
            if row is None or row.state not in ACTIVE:
                return []
            state = row.state
            job = self._job(job_id, session)
        done, spent = prog.totals()
        total = job.total_minibatches
        if done >= total - 1e-9:
            if self.c.slot < job.arrival:  # reported done before it arrived: a report
                self._early.add(job_id)  # of the slot ahead; completes once it arrives
                return []
            return self._complete_sync(job, done)
        s = self.c.slot
        if done <= 0.0 and job_id not in self.stalled:
            stalled = self._stalled_sync(job, state, spent)
            if stalled:
                return stalled
        if len(prog.samples) < _MIN_SAMPLES or self.reviewed.get(job_id) == s:
            return []
        if job_id not in self.c._ledger:
            return []
        planned_mb = job.minibatch_slots * self.slot_seconds
        xs = np.array([p[0] for p in prog.samples])
        post = fit(xs, np.array([p[1] for p in prog.samples]), RuntimePrior(planned_mb))
        need = post.seconds_at(total, _LEVEL)
        sched = self.c._ledger.schedule(job_id)
        now_workers = int(sched.after(s).before(s + 1).workers.sum())
        in_slot = now_workers * self.c.slots.seconds_to_next_slot()
        held = sched.after(s + 1).work() * self.slot_seconds + in_slot
        if need.low <= spent + held:  # the plan may still suffice
            return []
        self.reviewed[job_id] = s
        slots_needed = (need.mean - spent - in_slot) / self.slot_seconds
        # the search's limits refuse any amount past them; this keeps ceil() finite
        work = max(1, math.ceil(slots_needed - 1e-9)) if slots_needed < 2.0**53 else 2**53
        ledger = self.c._ledger
        estimate = post.minibatch_seconds(_LEVEL)
        detail: dict[str, Any] = {"reason": "slow", "minibatch_seconds": estimate.mean,
                                  "planned_minibatch_seconds": planned_mb,
                                  "work": work}  # fmt: skip
        why = self._replan_refused(job, work, s + 1)
        if why:  # not searched: the job is behind, with the reason
            best = BestSchedule(None, None, None, None, None, slots_scanned=0)
            detail["why"] = why
        else:
            best, whole = replan_remaining(ledger, job, work, s + 1, self._last_slot(job))
        now = datetime.now(UTC)
        if best.schedule is None or best.payoff is None or best.payoff <= ADMIT_THRESHOLD:
            detail["payoff"] = best.payoff
            with self.c._write() as session:
                event = self.c._event(session, now, "behind", job_id, state, detail)
            self.log.info("job behind its plan", job=job_id, **detail)
            return [event]

        def change() -> list[Event]:
            ledger.replace(job_id, whole)
            detail["payoff"] = best.payoff
            with self.c._write() as session:
                row = session.get(JobRow, job_id)
                assert row is not None
                self.c._write_schedule(session, job, row, whole, s + 1)
                detail["completion_slot"] = row.completion_slot
                event = self.c._event(session, now, "replanned", job_id, row.state, detail)
            self.log.info("slow job re-planned", job=job_id, **detail)
            return [event]

        return self._guarded(change)

    def _stalled_sync(self, job: Job, state: str, spent: float) -> list[Event]:
        """A ``behind`` event (reason ``no_progress``), once, for a job whose workers
        have spent half its planned worker-seconds without one mini-batch reported. The
        pace fit reads worker-seconds without mini-batches as start-up time, so a job
        whose workers do nothing (hung, or not printing counts) was reported only when
        its plan ended (the audit of jobs that do not follow their plan)."""
        planned = job.work * self.slot_seconds
        if spent < 0.5 * planned:
            return []
        detail = {"reason": "no_progress", "worker_seconds": spent,
                  "planned_worker_seconds": planned}  # fmt: skip
        with self.c._write() as session:
            said = session.scalars(select(EventRow.detail).where(
                EventRow.job_id == job.id, EventRow.kind == "behind")).all()  # fmt: skip
            if any(isinstance(d, dict) and d.get("reason") == "no_progress" for d in said):
                event = None  # said before a restart or a takeover: once per job
            else:
                event = self.c._event(session, datetime.now(UTC), "behind", job.id, state,
                                      detail)  # fmt: skip
        self.stalled.add(job.id)  # once committed: a store outage loses nothing
        if event is None:
            return []
        self.log.warning("job without progress: its workers report no mini-batch",
                         job=job.id, **detail)  # fmt: skip
        return [event]

    def _replan_refused(self, job: Job, work: int, first_slot: int) -> str:
        """Why a re-plan of ``work`` worker-slots of ``job`` from ``first_slot`` is not
        searched (empty: it is): its search would be over the limits every submission is
        held to (``[limits]``, :meth:`controller.limits.Limits.check_search`). A report
        far behind the plan (a slow or misreporting agent, a tau far too small) asks for
        any amount of work, and that search runs in the decision thread, where every
        tenant's calls wait for it."""
        slots = max(1, min(self._last_slot(job), self.c._ledger.end - 1) - first_slot + 1)
        try:
            self.c.config.limits.check_search(replace(job, work=work), self.c.cluster, slots)
        except SpecError as err:
            return f"its re-plan is not searched: {err}"
        return ""

    def _complete_sync(self, job: Job, done: float) -> list[Event]:
        s = self.c.slot
        now = datetime.now(UTC)

        def change() -> list[Event]:
            released = release_rest(self.c._ledger, job.id, s + 1)
            with self.c._write() as session:
                row = session.get(JobRow, job.id)
                assert row is not None
                session.execute(delete(AllocationRow).where(
                    AllocationRow.job_id == job.id, AllocationRow.slot >= s + 1))  # fmt: skip
                row.state = "completed"
                row.completion_slot = s
                row.jct = s - job.arrival + 1
                row.utility = float(job.utility.values(row.jct))
                detail = {"early": True, "released_worker_slots": released, "minibatches": done}
                event = self.c._event(session, now, "completed", job.id, "completed", detail)
            self.log.info("job done early", job=job.id, slot=s, released=released)
            return [event]

        return self._guarded(change)

    def _flush_progress(self) -> None:
        """Write the changed progress. Entries stay dirty until the commit succeeds, so a
        store outage delays what agents reported but loses none of it."""
        dirty = {j: p for j, p in self.progress.items() if p.dirty}
        if not dirty:
            return
        now = datetime.now(UTC)
        written: dict[str, tuple[dict[str, list[float]], list[tuple[float, float]]]] = {}
        with self.c._write() as session:
            known = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(list(dirty)))))
            for job_id, prog in dirty.items():
                if job_id not in known:  # progress for a job this daemon never saw
                    continue
                sessions, samples = prog.sessions, prog.samples
                if prog.partial and (row := _progress_row(session, job_id)) is not None:
                    sessions, samples = _merged(prog, row)
                mb, ws = _totals(sessions)
                values = {"minibatches": mb, "worker_seconds": ws, "per_server": sessions,
                          "samples": {"points": [list(p) for p in samples]},
                          "updated_at": now}  # fmt: skip
                stmt = update(ProgressRow).where(ProgressRow.job_id == job_id).values(**values)
                if session.connection().execute(stmt).rowcount == 0:
                    session.add(ProgressRow(job_id=job_id, **values))
                written[job_id] = (sessions, samples)
        for job_id, prog in dirty.items():  # committed
            if job_id not in written:
                del self.progress[job_id]  # nothing to keep it for
                continue
            prog.sessions, prog.samples = written[job_id]
            prog.dirty = prog.partial = False

    def _prune(self) -> None:
        """Forget the jobs that are no longer admitted or running, once their progress is
        stored: memory grows with the active jobs only, not with the daemon's history."""
        with self.c.db.session() as session:
            active = set(session.scalars(select(JobRow.id).where(JobRow.state.in_(ACTIVE))))
        for job_id in [j for j, p in self.progress.items() if j not in active and not p.dirty]:
            del self.progress[job_id]
        for cache in (self._jobs, self.reviewed):
            for job_id in [j for j in cache if j not in active]:
                del cache[job_id]
        self.stalled &= active

    # -- plans (decision thread) --------------------------------------------------------

    def _bump_due(self) -> bool:
        """Whether the epoch moves above the agents' at the next round (the inbox lock
        held): a beat's claim was heard an agent's beat ago (so every agent has said which
        epoch it follows: the first claim heard may be a lagging agent's), and the last
        move was :data:`BUMP_SECONDS` ago."""
        now = self.monotonic()
        heard = (
            self._ahead_since is not None and now - self._ahead_since >= self.mqtt.heartbeat_seconds
        )
        paused = self._bumped_at is not None and now - self._bumped_at < BUMP_SECONDS
        return heard and not paused

    def plans_sync(self, published: dict[str, Plan]) -> list[Plan]:
        """Plans of every server for the current and next slot that differ from
        ``published`` (all of them if it is empty), under one new epoch (persisted first);
        ``[]`` if nothing changed.

        Agents ignore a plan of an epoch below the one they follow. One that follows an
        epoch above this daemon's (its heartbeat says so) followed another daemon: one
        on another store, or on this store before it was restored from a backup or
        replaced by a new one. Then every plan goes out again, above that epoch: else
        the agents would ignore this daemon's plans for as many rounds, while their
        servers' jobs, reported by nobody, completed with their plans."""
        self.c._advance_window()
        with self._inbox_lock:
            (ahead, by) = self._ahead
            due = self._bump_due()
            if due:  # else it stays for the first round it is due at
                self._ahead, self._ahead_since = (0, ""), None
        if ahead > self.epoch and due:
            self.log.warning(
                "agents follow plans of another daemon or store: plans go out again above "
                "their epoch (a daemon on another store, or another daemon publishing under "
                "this topic prefix)", followed=ahead, server=by, epoch=self.epoch,
            )  # fmt: skip
            self.epoch, published, self._bumped_at = ahead, {}, self.monotonic()
        s = self.c.slot
        tasks: dict[tuple[str, int], list[Task]] = {}
        with self.c._write() as session:
            rows = session.execute(
                select(AllocationRow.job_id, AllocationRow.slot, AllocationRow.server,
                       AllocationRow.workers, AllocationRow.ps, JobRow.decided_at)
                .join(JobRow, JobRow.id == AllocationRow.job_id)
                .where(AllocationRow.slot.in_((s, s + 1)), JobRow.state.in_(ACTIVE))
                .order_by(JobRow.sequence)
            ).all()  # fmt: skip
            device = self._device_resource()
            for r in rows:
                job = self._job(r.job_id, session)
                demand = 0.0
                if device is not None:
                    per = job.worker if self.server_index[r.server][0] == "worker" else job.ps
                    demand = float(per[device])
                task = Task(r.job_id, r.workers, r.ps, job.minibatch_slots * self.slot_seconds,
                            job.total_minibatches, run_of(r.decided_at), demand)  # fmt: skip
                tasks.setdefault((r.server, r.slot), []).append(task)
            epoch0 = self.c.slots.epoch
            plans: list[Plan] = []
            for server, (kind, index) in self.server_index.items():
                plan = Plan(
                    server=server,
                    kind=kind,
                    store=self.store_id,
                    epoch=self.epoch + 1,
                    slot_seconds=self.slot_seconds,
                    heartbeat_seconds=self.mqtt.heartbeat_seconds,
                    down=server in self.failed,
                    current=SlotPlan(s, epoch0 + s * self.slot_seconds, tasks.get((server, s), [])),
                    next=SlotPlan(
                        s + 1, epoch0 + (s + 1) * self.slot_seconds, tasks.get((server, s + 1), [])
                    ),
                    devices=self._devices(kind, index, device),
                )
                if not plan.same_content(published.get(server)):
                    plans.append(plan)
            if plans:
                self.epoch += 1
                self.planned_slot = s
                self._save_meta(session)
        return plans

    def _check_devices(self) -> None:
        """Warn of a device resource that the cluster does not have while one of its
        resources looks like it (``GPU`` against the default ``gpu``: agents would hand
        out no devices, and every worker would see every GPU), and of servers whose
        device capacity is not whole (the fraction counts as a device of its own)."""
        device = self._device_resource()
        name = self.mqtt.device_resource
        if device is None:
            alike = [r for r in self.c.cluster.resources if "gpu" in r.lower()]
            if name and alike:
                self.log.warning(
                    f"[mqtt] device_resource {name!r} is not a resource of the cluster: "
                    "agents give workers no devices of their own, and each sees every GPU; "
                    f"set device_resource = {alike[0]!r}", resources=list(alike),
                )  # fmt: skip
            return
        odd = [server for _kind, _i, server, capacity in self.c.cluster.servers()
               if not float(capacity[device]).is_integer()]  # fmt: skip
        if odd:
            self.log.warning(
                "servers whose capacity of the device resource is not whole: agents count "
                "the fraction as a device of its own, which the workers placed on it share",
                resource=name, servers=odd,
            )  # fmt: skip

    def _device_resource(self) -> int | None:
        """The index of ``[mqtt] device_resource`` among the cluster's resources; None if
        the cluster has no such resource (plans then give no devices)."""
        resources = self.c.cluster.resources
        name = self.mqtt.device_resource
        return resources.index(name) if name in resources else None

    def _devices(self, kind: str, index: int, device: int | None) -> int | None:
        """A server's devices for its plan: its capacity of the device resource, a
        fraction rounded up (a server of half a GPU has one, which its workers share;
        rounded down, a worker placed there got none: the audit), at most
        :data:`~controller.plane.devices.MAX_DEVICES`; None without one."""
        if device is None:
            return None
        cluster = self.c.cluster
        capacity = (cluster.worker_capacity if kind == "worker" else cluster.ps_capacity)[index]
        return min(MAX_DEVICES, math.ceil(float(capacity[device]) - 1e-9))

    def _save_meta(self, session: Session) -> None:
        value = {"epoch": self.epoch, "events": self.events_published,
                 "heard": sorted(self.heard), "planned": self.planned_slot,
                 "unsent": [list(run) for run in self.unsent],
                 "ignored": list(self.ignored_sessions)}  # fmt: skip
        stmt = update(MetaRow).where(MetaRow.key == _PLANE_KEY).values(value=value)
        if session.connection().execute(stmt).rowcount == 0:
            session.add(MetaRow(key=_PLANE_KEY, value=value))

    def latest_job_events_sync(
        self, upto: int, after: str = "", limit: int = 0
    ) -> tuple[list[int], str | None]:
        """A page of the job events a broker that lost its state should hold again: the
        sequence of the latest job event of each of the next ``limit`` jobs whose ids
        sort after ``after`` (ascending), and the page's last id (None: no job after
        the page). A job whose latest event is past ``upto`` (not published before) is
        left out. ``limit`` 0: :data:`RESTORE_PAGE`. Reads the store only (any thread)."""
        limit = limit or RESTORE_PAGE
        with self.c.db.session() as session:
            rows = session.execute(
                select(EventRow.job_id, func.max(EventRow.sequence))
                .where(EventRow.job_id > after, EventRow.kind.in_(_JOB_EVENT_KINDS))
                .group_by(EventRow.job_id)
                .order_by(EventRow.job_id)
                .limit(limit)
            ).all()  # fmt: skip
        sequences = sorted(int(s) for _, s in rows if int(s) <= upto)
        return sequences, (str(rows[-1][0]) if len(rows) == limit else None)

    def events_sync(self, sequences: list[int]) -> list[Event]:
        """The stored events of ``sequences``, in order. Reads the store only (any thread)."""
        with self.c.db.session() as session:
            rows = session.scalars(
                select(EventRow).where(EventRow.sequence.in_(sequences)).order_by(EventRow.sequence)
            )
            return [Event(r.sequence, r.kind, r.job_id, r.slot, r.state, r.detail) for r in rows]

    def events_published_to(self, sequence: int) -> None:
        """Remember (in the store) that job events up to ``sequence`` were published."""
        self.events_published = max(self.events_published, sequence)
        with self.c._write() as session:
            self._save_meta(session)

    # -- reads ----------------------------------------------------------------------------

    async def view(self, job_id: str, client: str = "") -> ProgressView:
        """:meth:`view_sync` in the decision thread, in ``client``'s turn (the caller's,
        held to ``limits.max_in_flight`` like its other calls there; ``""``: the
        daemon's own); NotFoundError if no such job."""
        try:
            return await self.c._run(lambda: self.view_sync(job_id), client)
        except KeyError:
            raise NotFoundError(f"no job {job_id!r}") from None

    def view_sync(self, job_id: str) -> ProgressView:
        """The job's progress and runtime estimate; KeyError if no such job."""
        self._drain()  # the latest reports; written at the next review
        with self.c.db.session() as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            job = self._job(job_id, session)
            state, completion = row.state, row.completion_slot
            planned_ws = float(
                sum(a.workers for a in session.scalars(
                    select(AllocationRow).where(AllocationRow.job_id == job_id)))
            ) * self.slot_seconds  # fmt: skip
            prog = self.progress.get(job_id)
            if prog is None or prog.partial:  # an ended job's progress is in the store
                stored = _progress_row(session, job_id)
                if stored is not None:
                    prog = (
                        _stored(stored)[0] if prog is None else JobProgress(*_merged(prog, stored))
                    )
        if prog is None:
            prog = JobProgress()
        done, spent = prog.totals()
        planned_mb = job.minibatch_slots * self.slot_seconds
        total = job.total_minibatches
        xs = np.array([p[0] for p in prog.samples])
        ys = np.array([p[1] for p in prog.samples])
        post = fit(xs, ys, RuntimePrior(planned_mb))
        return ProgressView(
            job_id=job_id,
            state=state,
            # each server's count is capped at the whole, their sum too (the audit saw
            # "436 of 432 (100.9%)": workers run on until the job's completion is heard)
            minibatches_done=min(done, float(total)),
            minibatches_total=total,
            worker_seconds=spent,
            reports=len(prog.samples),
            planned_minibatch_seconds=planned_mb,
            minibatch_seconds=post.minibatch_seconds(_LEVEL),
            total_worker_seconds=post.seconds_at(total, _LEVEL),
            planned_worker_seconds=planned_ws,
            completion_slot=completion,
        )
