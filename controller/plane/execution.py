"""What really happens, fed back into the plan: the daemon side of the execution plane.

Node agents send heartbeats and progress (:mod:`controller.plane.agent_messages`); this module
keeps them and reacts, always in the admission controller's decision thread (between
two decisions), always committing to the store before the ledger changes hands. It
orchestrates the plane's parts:

- **server silent** for ``heartbeat_timeout`` seconds (after it was heard at least once,
  also before a restart of the daemon: the store keeps the names of the servers ever
  heard, and the progress of active jobs names those that reported), counted only while
  the broker connection was up (:mod:`controller.plane.link_clock`: an outage neither
  counts nor restarts the count), and once the current connection has lasted two of an
  agent's beats (``heartbeat_seconds``; at most ``heartbeat_timeout``), for agents to
  come back after a broker restart: the server is
  down from the next slot on; its jobs are re-placed or re-planned
  (:func:`pricing.replan.fail_servers`: those found silent at one review together,
  none onto a server whose agent missed two beats, :data:`SUSPECT_BEATS`, where room
  allows); a job that can no longer finish becomes
  ``failed``. A heartbeat brings it back from the next slot on
  (:mod:`controller.plane.outages`).
- **done early**, **slower than planned**, **plan ended short**: each job's progress
  against its plan (:mod:`controller.plane.job_review`).
- the agents' sessions (two agents for one server), clocks, stores and devices short
  (:mod:`controller.plane.agent_sessions`); the progress kept and stored
  (:mod:`controller.plane.progress`); the plans published
  (:mod:`controller.plane.plans`).

Plans for the current and the next slot are computed from the store (the source of
truth), after every decision so far is committed: a round begins and ends in the
decision thread (:meth:`Execution.plans_begin`, :meth:`Execution.plans_end`), and the
plans are read, built and encoded between the two in a thread of their own
(:meth:`Execution.plans_build`), so a rebuild of many jobs' plans holds no tenant's call;
once the broker acknowledged them, the round counts as sent (:meth:`Execution.plans_out`).
A decision committed after the build read the store wakes the next round.

Heartbeats and progress arrive on the event loop (:mod:`controller.plane.link`), which
only drops them in an inbox (:meth:`Execution.heartbeat`, :meth:`Execution.report`,
guarded by a lock; reports in a :class:`~controller.plane.intake.ReportInbox`, bounded
per server); the decision thread applies them at the start of each review, so
everything else here is read and changed in that one thread alone (the plans' builder
reads only what it is handed, the store, and the job specs, whose cache is locked).
(What a heartbeat says of its agent is kept on the event loop as it arrives:
:mod:`controller.plane.agent_sessions`.)

A report's entry counts only if its job has workers on the reporting server (the one its
topic names) in the slot the report arrived in, or the one before or after (a report
sent across a boundary, a clock a little off): one store query per review finds them.
Entries for any other job -- unknown, ended long ago, or another server's -- are
dropped there, before they cost a store read each, and counted in one throttled warning.

Progress is written to the store once per review and stays marked changed until a commit
succeeds. Jobs that ended (completed, failed, cancelled) are forgotten once their progress
is stored; a late report of one (still within a slot of its work) is merged with what the
store holds rather than overwriting it (:mod:`controller.plane.progress`).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from controller.admission.state import STORE_ID_KEY
from controller.errors import NotFoundError
from controller.events import Event, shown_event
from controller.logs import Complaints
from controller.plane.agent_messages import Heartbeat, Progress
from controller.plane.agent_sessions import AgentSessions
from controller.plane.intake import Received, ReportInbox
from controller.plane.job_review import JobReview
from controller.plane.jobs import ACTIVE, Jobs
from controller.plane.link_clock import LinkClock, LoopWatch
from controller.plane.outages import Outages
from controller.plane.plan_messages import Plan
from controller.plane.plans import (
    BUMP_SECONDS,
    MAX_FOLLOWED_EPOCH,
    EpochClaims,
    PlanBuilder,
    run_of,
)
from controller.plane.port import AdmissionPort
from controller.plane.progress import (
    MAX_SESSIONS_PER_SERVER,
    JobProgress,
    ProgressView,
    flush,
    load_active,
    progress_view,
    session_key,
    sessions_of,
    with_stored,
)
from controller.plane.sent_plans import counter
from controller.plane.settings import MqttConfig
from controller.plane.taken_plans import TakenPlans
from controller.plane.unknown_jobs import (
    MAX_LOOKED_UP,
    MAX_NAMED,
    UnknownLookups,
    unknown_jobs,
)
from controller.plane.worker_failures import FailuresHeard
from controller.store import CORDONED, AllocationRow, EventRow, JobRow, MetaRow, OutageRow

__all__ = [
    "ACTIVE",
    "BUMP_SECONDS",
    "FLOOD_DROPS",
    "MAX_FOLLOWED_EPOCH",
    "MAX_SESSIONS_PER_SERVER",
    "NO_PLAN_SECONDS",
    "RESTORE_PAGE",
    "Execution",
    "JobProgress",
    "PlanRound",
    "ProgressView",
    "run_of",
]

_PLANE_KEY = "plane"
OVERDUE = -1  # the slot of :meth:`Execution._planned`'s entries for jobs past their plan
# job entries of reports held while the decision thread cannot take them (a store outage
# stops it), over all servers; each server gets its share (controller/plane/intake.py)
_MAX_INBOX = 100_000
_MAX_INBOX_PER_SERVER = 1_000  # ... and at least this many
_COMPLAIN_SECONDS = 10.0
FLOOD_DROPS = 100
"""Agents' messages dropped over their rates between two reviews that make a flood (an
agent's burst): then the broker may be dropping the other agents' heartbeats, and the time
counts half as silence. A few over one agent's rate change nothing: one agent sending
21 a second must not stop failure detection for the whole cluster (the diff review)."""
SUSPECT_BEATS = 2
"""A server up whose agent has been silent longer than this many ``heartbeat_seconds``
when others fail is *suspect*: no job moved off the failed ones is put on it
(:func:`pricing.replan.fail_servers` ``avoid``), since it is likely the rest of their
rack going dark (agents falling silent over a few seconds, so past the timeout at
different reviews). It delays no failure, and takes nothing from a healthy server but
that move: a live agent is heard every interval, so it is quiet longer only if two
beats in a row were lost; its jobs stay, and decisions use it as before. Measured in
``bench/rack_failure.py``."""
NO_PLAN_SECONDS = 10.0
"""An agent beating this long (connected seconds) without following a plan, while this
daemon has published plans, is said (``this server's agent beats but follows no
plan``): a starting agent's first beats may come before its retained plan."""
RESTORE_PAGE = 1000
"""Jobs whose latest event one page of a broker's restore reads (and publishes)."""
# the stored event kinds published on jobs/<id>/events (event_messages.event_kind)
_JOB_EVENT_KINDS = ("decided", "running", "completed", "cancelled", "replanned", "failed")


@dataclass(frozen=True)
class PlanRound:
    """What one round of plans is built from (:meth:`Execution.plans_begin`).

    Attributes:
        slot: the window's current slot: plans hold it and the next.
        epoch: the daemon's plan epoch when the round began; its plans go out under
            ``epoch + 1``.
        failed: failed server -> when it was marked so (monotonic seconds).
        published: server -> the plan last published (only those that differ go out).
        upto: the store's newest event as its plans were read (set by
            :meth:`Execution.plans_build`): its plans hold every plan written up to it
            and none after (:class:`~controller.plane.sent_plans.SentPlans`).
    """

    slot: int
    epoch: int
    failed: dict[str, float]
    published: dict[str, Plan]
    upto: int = 0


class Execution:
    """Heartbeats, progress and the reactions to them; see the module docstring.

    Its parts: :attr:`agents` (:class:`~controller.plane.agent_sessions.AgentSessions`),
    :attr:`outages` (:class:`~controller.plane.outages.Outages`), :attr:`review`
    (:class:`~controller.plane.job_review.JobReview`), :attr:`plans`
    (:class:`~controller.plane.plans.PlanBuilder`) and :attr:`jobs`
    (:class:`~controller.plane.jobs.Jobs`, the job specs they share).

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
        self.loop_watch = LoopWatch(monotonic)  # ticked by the link's event loop
        self._ticked_at = 0.0  # link time of its last tick
        self._reviewed_at = 0.0  # link time of the last review
        self._dropped = 0  # agents' messages dropped over their rate since the last review
        self.last_seen: dict[str, float] = {}  # server -> link time it was last heard
        self.heard: set[str] = set()  # servers ever heard from (kept in the store)
        self._heard_saved = True  # False: ``heard`` (or the ignored sessions) grew since stored
        self.failed: dict[str, float] = {}  # server -> link time declared failed
        self.progress: dict[str, JobProgress] = {}
        # each followed job's failing workers per server, as their agents last said (in
        # memory only: controller.plane.worker_failures)
        self.failures = FailuresHeard()
        self._pruned_slot: int | None = None
        # the inbox: filled on the event loop, emptied in the decision thread (_drain)
        self._inbox_lock = threading.Lock()
        self._beats: dict[str, float] = {}  # server -> link time of its latest beat
        # servers whose agent said it follows a plan (or did not say), since the last
        # review, and since the start (kept in the store; :meth:`following`)
        self._follows: dict[str, int] = {}  # ... -> the highest epoch said (0: not said)
        self.following: set[str] = set()
        self._no_plan_since: dict[str, float] = {}  # server -> link time, beating plan-less
        # servers whose agent follows an older plan than one published for it 10 s before
        # (the link's to say: controller.plane.plan_lag; /metrics counts them)
        self.behind_plan: set[str] = set()
        per_server = max(_MAX_INBOX_PER_SERVER, _MAX_INBOX // max(1, len(self.server_index)))
        self._reports = ReportInbox(per_server)
        self._complain = Complaints(_COMPLAIN_SECONDS, monotonic)
        self._claims = EpochClaims(mqtt, monotonic)  # guarded by the inbox lock
        self.store_id = ""  # this store's (STORE_ID_KEY; read at load): plans carry it
        self.agents = AgentSessions(mqtt, monotonic, self._complain)
        self.jobs = Jobs(controller)
        # the first plan epoch that carried each job to each server, and the epochs the
        # agents follow (controller.plane.taken_plans)
        self.taken = TakenPlans()
        self.outages = Outages(controller, mqtt, self.server_index, self.jobs)
        self.review = JobReview(
            controller, mqtt, self.progress, self.jobs, self.failures, monotonic,
            heard=lambda: self.heard, following=lambda: self.following, taken=self.taken,
        )  # fmt: skip
        self.plans = PlanBuilder(controller, mqtt, self.server_index, self.jobs)
        self.epoch = 0
        self.events_published = 0
        # the latest slot whose plans went out (they hold that slot and the next); the
        # slots whose plans never did are the review's (JobReview.unsent)
        self.planned_slot: int | None = None
        # the ids of ignored report entries waiting to be looked up, per server, taken in
        # turn (controller.plane.unknown_jobs)
        self._lookups = UnknownLookups()
        # told the ids of the jobs agents ran that the store lacks, per server whose agent
        # reported them, at each review that finds some (the plane clears their retained
        # events: controller.plane.unknown_events)
        self.unknown_hooks: list[Callable[[dict[str, list[str]]], None]] = []

    # -- start-up ----------------------------------------------------------------------

    def load(self) -> None:
        """Read failed servers, progress of active jobs and the plan epoch from the store
        (blocking). Ended jobs' progress stays in the store (see :meth:`view_sync`)."""
        self.plans.check_devices()
        self.plans.check_demand()
        now = self.link.now()
        with self.c.db.session() as session:
            failures = select(OutageRow).where(
                OutageRow.up_from.is_(None), OutageRow.cause != CORDONED
            )  # an operator's cordon is no failure: heartbeats do not end it
            for row in session.scalars(failures):
                self.failed[row.server] = now
            for job_id, prog in load_active(session, self.log).items():
                self.progress[job_id] = prog
                # its agents reported before the restart: their silence counts from now,
                # or one that died while the daemon was down would never be noticed
                for key in prog.sessions:
                    server = key.split("/", 1)[0]
                    if server in self.server_index and server not in self.failed:
                        self.last_seen[server] = now
            named = session.get(MetaRow, STORE_ID_KEY)
            sid = named.value.get("id") if named and isinstance(named.value, dict) else None
            # an edit may leave anything: an id the plans carry is short and plain
            ok = isinstance(sid, str) and 0 < len(sid) <= 64 and sid.isascii() and sid.isalnum()
            self.store_id = sid if ok and isinstance(sid, str) else ""
            meta = session.get(MetaRow, _PLANE_KEY)
            newest = int(session.scalar(select(func.max(EventRow.sequence))) or 0)
            stored = meta.value if meta is not None and isinstance(meta.value, dict) else {}
            self.review.sent.load(stored.get("sent_event"), stored.get("job_unsent"), newest,
                                  self.c.slot - self.c.window)  # fmt: skip
            if meta is not None:
                value = meta.value if isinstance(meta.value, dict) else {}
                epoch, events = value.get("epoch", 0), value.get("events", 0)
                if not (isinstance(meta.value, dict) and counter(epoch) and counter(events)):
                    # edited by hand: plans must go out under an epoch above any agents
                    # saw (they ignore older ones); the wall clock's seconds are above
                    # any count of publications, and every job event is published again
                    epoch, events = max(int(time.time()), epoch if counter(epoch) else 0), 0
                    self.log.warning("stored plane state ignored", epoch=epoch,
                                     stored=str(meta.value)[:200])  # fmt: skip
                if events > newest:  # edited by hand: it would skip every event up to it
                    self.log.warning("stored plane state's events past the newest event",
                                     events=events, newest=newest)  # fmt: skip
                    events = newest
                self.epoch, self.events_published = epoch, events
                planned = self.review.find_unsent(value.get("planned"), value.get("unsent"))
                if planned is not None:
                    self.planned_slot = planned
                heard = value.get("heard", [])
                if isinstance(heard, list):  # an edited store: names it does not know go
                    self.heard = {s for s in heard if s in self.server_index}
                # stored by an older daemon without it: every agent heard counts as one
                # that followed a plan (as that daemon took them)
                following = value.get("following", sorted(self.heard))
                if isinstance(following, list):
                    self.following = {s for s in following if s in self.server_index}
                self.agents.restore_ignored(value.get("ignored", []))
                self._moved_link(value.get("link"))
            if meta is None or stored.get("link") != self.link_name:
                self._heard_saved = False  # the link recorded at the next review
            # heard from before the restart: their silence counts from now, or an agent
            # (a PS's, say, that reports no progress) that died meanwhile goes unnoticed
            for server in self.heard - set(self.failed):
                self.last_seen.setdefault(server, now)

    @property
    def link_name(self) -> str:
        """The broker and topic prefix the agents are heard on, ``host:port/prefix``
        (stored with the plane's state, no credentials)."""
        return f"{self.mqtt.host}:{self.mqtt.port}/{self.mqtt.topic_prefix}"

    def _moved_link(self, stored: object) -> None:
        """At the load: if the agents were heard on another broker or topic prefix
        (``stored``, the link recorded; None in a store older than the record), forget
        who was heard. Their agents follow their own ``--broker`` and ``--topic-prefix``,
        so after an edit of ``[mqtt]`` and a restart none is heard until moved too, and
        every server heard before was declared failed at once after
        ``heartbeat_timeout``: every tenant's admitted job failed for good, within
        seconds. Now they are servers never heard (``oasis status``: AGENTS NOT HEARD),
        watched again once heard on the new link."""
        if not isinstance(stored, str) or stored == self.link_name:
            return
        self.log.warning(
            "[mqtt] broker or topic_prefix changed since the agents were heard: none is "
            "declared failed for silence until heard again; move each agent (oasis agent "
            "--broker, --topic-prefix), or the jobs planned on its server fail at their "
            "plan's end (agents_never_heard)",
            was=stored[:300], now=self.link_name, servers=len(self.heard),
        )  # fmt: skip
        self.heard = set()
        self.following = set()  # none heard follows a plan either
        self.last_seen.clear()  # the progress loaded set some: those agents are away too

    # -- what agents say (event loop: into the inbox only) -------------------------------

    def connected(self) -> None:
        """The broker connection is up: silence counts again."""
        with self._inbox_lock:
            self.link.up()

    def disconnected(self) -> None:
        """The broker connection is down: nobody can be heard, so nobody is failed."""
        with self._inbox_lock:
            self.link.down()

    def loop_tick(self) -> None:
        """The event loop's watch ticked (event loop): the time it did not run, if any
        (:class:`~controller.plane.link_clock.LoopWatch`), counts as no one's silence."""
        with self._inbox_lock:
            late = self.loop_watch.tick()
            now = self.link.now()
            if late > 0:  # not before the last tick: the link may have been down
                self.link.rewind_to(max(now - late, self._ticked_at))
            self._ticked_at = self.link.now()
        if late > 0:
            self.log.warning("the daemon did not run: that time is no agent's silence",
                             seconds=round(late, 1))  # fmt: skip

    def crowded(self) -> None:
        """An agent's message was dropped over its rate (event loop). Many between two
        reviews (:data:`FLOOD_DROPS`): a flood, and the broker may be dropping other
        agents' messages too, so that time counts half as anyone's silence (see
        :meth:`review_sync`)."""
        with self._inbox_lock:
            self._dropped += 1

    def heartbeat(self, beat: Heartbeat) -> bool:
        """Queue a heartbeat (timed now) for the decision thread; True if its agent
        follows a plan of an epoch above this daemon's (see :meth:`plans_sync`). What it
        says of its agent is kept now (:class:`~controller.plane.agent_sessions.AgentSessions`)."""
        if beat.server not in self.server_index:
            return False
        offset = None if beat.sent_at is None else beat.sent_at - self.c.slots.clock.now()
        if self.agents.heard(beat, offset, self.store_id):
            self._heard_saved = False  # an ignored session: stored at the next review
        with self._inbox_lock:
            self._beats[beat.server] = self.link.now()
            if beat.epoch != 0:  # follows a plan (or does not say)
                said = beat.epoch or 0
                self._follows[beat.server] = max(said, self._follows.get(beat.server, 0))
                self._no_plan_since.pop(beat.server, None)
            else:
                self._no_plan(beat.server)
            return self._claims.heard(beat.epoch or 0, beat.server, self.epoch)

    def following_no_plan(self) -> list[str]:
        """The servers whose agent has beaten following no plan for
        :data:`NO_PLAN_SECONDS` or more, to its latest beat, while this daemon has
        published plans (any thread: ``/metrics``)."""
        with self._inbox_lock:
            now = self.link.now()
            if self.epoch <= 0:
                return []
            return sorted(s for s, at in self._no_plan_since.items() if now - at >= NO_PLAN_SECONDS)

    def _no_plan(self, server: str) -> None:
        """``server``'s agent beats following no plan (event loop, the inbox lock held):
        said once it has for :data:`NO_PLAN_SECONDS` of connected time while this daemon
        has published plans (a starting agent beats once or twice before its retained
        plan comes)."""
        now = self.link.now()
        since = self._no_plan_since.setdefault(server, now)
        if self.epoch > 0 and now - since >= NO_PLAN_SECONDS:
            self._complain(server, "no_plan", "this server's agent beats but follows no "
                           "plan: it has received none (can its broker user read its plan's "
                           "topic? the ACL); jobs planned on it do not run, and fail at "
                           "their plan's end", seconds=round(now - since, 1))  # fmt: skip

    def report(self, progress: Progress) -> None:
        """Queue a progress report (timed now, in the current slot) for the decision
        thread. ``progress.server`` must be the server whose topic it came on. The
        second of two agents beating for the server at once is not counted."""
        if progress.server in self.server_index:
            if self.agents.ignores(progress):
                return
            with self._inbox_lock:
                at = self.link.now()
            self._reports.put(Received(at, self.c.slots.current_slot(), progress))

    def _drain(self) -> None:
        """Apply what the inbox holds (decision thread)."""
        with self._inbox_lock:
            beats, self._beats = self._beats, {}
            follows, self._follows = self._follows, {}
        for server, at in beats.items():
            self._seen(server, at)
        if not follows.keys() <= self.following:
            self.following |= follows.keys()
            self._heard_saved = False
        for server, epoch in follows.items():
            if epoch:
                self.taken.follows(server, epoch)
        reports = self._reports.take()
        try:
            planned, runs = self._planned(reports)
        except Exception:  # the store: nothing applied, so nothing lost
            self._reports.put_back(reports)
            raise
        heard_at = self.monotonic()  # of the failures said: within a review of arriving
        ignored: Counter[str] = Counter()
        unplanned: dict[str, set[str]] = {}  # server -> ids of its ignored entries (some)
        crowded: Counter[str] = Counter()
        other_run: Counter[str] = Counter()
        backwards: Counter[str] = Counter()  # entries below their session's earlier counts
        backwards_job: dict[str, str] = {}  # server -> the first such entry's job
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
                    some = unplanned.setdefault(progress.server, set())
                    if len(some) < MAX_LOOKED_UP:
                        some.add(task.job)
                    continue
                if task.run and runs.get(task.job, "") not in ("", task.run):
                    # counts of another admission of this id (a store restored from a
                    # backup, a job deleted by retention): not this job's work
                    other_run[progress.server] += 1
                    continue
                prog = self.progress.get(task.job)
                if prog is None:  # new, or ended and forgotten: the store may hold more
                    prog = self.progress[task.job] = JobProgress(partial=True)
                if key not in prog.sessions and sessions_of(prog, progress.server) >= (
                    MAX_SESSIONS_PER_SERVER
                ):
                    crowded[progress.server] += 1
                    continue
                if not prog.take(key, task.minibatches, task.worker_seconds):
                    # below the session's earlier counts: stale, and so its failures
                    backwards[progress.server] += 1
                    backwards_job.setdefault(progress.server, task.job)
                else:
                    self.failures.heard(task.job, progress.server, task.failures,
                                        task.last_failure, heard_at)  # fmt: skip
                self.review.pending.add(task.job)
        for server, entries in ignored.items():
            self._complain(server, "unplanned", "report entries ignored: jobs not planned on "
                           "this server now", entries=entries)  # fmt: skip
        self._name_unknown(unplanned)
        for server, entries in other_run.items():
            self._complain(server, "run", "report entries ignored: counts of an earlier job "
                           "of the same id", entries=entries)  # fmt: skip
        for server, entries in backwards.items():
            self._complain(server, "backwards", "report entries below their agent session's "
                           "earlier counts: the higher ones kept (a stale or out-of-order "
                           "report, or an agent counting wrong)", entries=entries,
                           job=backwards_job[server])  # fmt: skip
        for server, entries in self._reports.take_dropped().items():
            self._complain(server, "inbox", "report entries dropped: this server's reports "
                           "came faster than the daemon took them in, and the latest "
                           "counts it keeps per job were full", entries=entries,
                           limit=self._reports.max_entries)  # fmt: skip
        for server, entries in crowded.items():
            self._complain(server, "sessions", "report entries dropped: too many agent "
                           "sessions for a job", entries=entries,
                           limit=MAX_SESSIONS_PER_SERVER)  # fmt: skip

    def _name_unknown(self, unplanned: dict[str, set[str]]) -> None:
        """Warn, per server, of the jobs its agent ran that the store does not know
        (:mod:`controller.plane.unknown_jobs`): a store restored from a backup made before
        they were admitted; and tell :attr:`unknown_hooks` of them (the plane clears
        their retained events). ``unplanned``'s ids join their server's queue; at most
        :data:`~controller.plane.unknown_jobs.MAX_LOOKED_UP` of the queued are looked up,
        taken from the servers in turn, so no server's agent keeps another's ids from
        their turn. A store that cannot be read skips both (the ids taken are dropped:
        the agents' next reports queue them again)."""
        for server, ids in unplanned.items():
            self._lookups.add(server, sorted(ids))
        taken = self._lookups.take()
        if not taken:
            return
        try:
            with self.c.db.session() as session:
                unknown = set(unknown_jobs(session, {job for _, job in taken}))
        except Exception as err:  # the store: the reports are applied, the warning waits
            self.log.debug("unknown jobs not looked up", error=str(err)[:200])
            return
        found: dict[str, list[str]] = {}
        for server, job in taken:
            if job in unknown:
                found.setdefault(server, []).append(job)
        for hook in self.unknown_hooks if found else ():
            hook(found)
        for server, jobs in found.items():
            named = sorted(jobs)
            self._complain(
                server, "unknown", "agents ran jobs this store does not know (a store "
                "restored from a backup made before they were admitted?): their plans "
                "are withdrawn and their workers stop; tell their tenants to submit "
                "them again", jobs=named[:MAX_NAMED], count=len(named),
            )  # fmt: skip

    def _planned(self, reports: list[Received]) -> tuple[set[tuple[str, str, int]], dict[str, str]]:
        """``(job, server, slot)`` with workers, for the servers of ``reports`` and the
        slots around their arrival: what their entries may count for; and ``(job,
        server, OVERDUE)`` for the jobs past their plan short of their work on the
        servers that ran their workers, whose late counts still count (two queries).
        Also each of those jobs' run (:func:`~controller.plane.plans.run_of`)."""
        if not reports:
            return set(), {}
        servers = {r.progress.server for r in reports}
        lo = min(r.slot for r in reports) - 1
        hi = max(r.slot for r in reports) + 1
        overdue = self.review.overdue
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
                    AllocationRow.job_id.in_(sorted(overdue)),
                    AllocationRow.server.in_(servers), AllocationRow.workers > 0)
            ).all() if overdue else []  # fmt: skip
        runs = {r.job_id: run_of(r.decided_at) for r in (*rows, *late)}
        return {(r.job_id, r.server, int(r.slot)) for r in rows} | {
            (r.job_id, r.server, OVERDUE) for r in late
        }, runs

    def agent_ages(self) -> dict[str, float]:
        """Each server's seconds since its agent was last heard (a beat or a report
        applied by a review, or a beat still in the inbox), on the link clock the
        failure rule times silence on (connected seconds); ``inf``: never heard (one
        heard before a restart counts from the load, :meth:`load`). Every server of the
        cluster; from any thread: ``/metrics`` and ``ListServers`` give it. A server
        failed at the load, heard before the restart, counts from the load too.

        The inbox's beats count: while the store is unavailable or refuses writes no
        review runs, and every agent, beating all along, read as silent (``oasis
        status``: ``AGENTS NOT HEARD on N servers up ... (jobs there do not run)``),
        sending the operator after the agents rather than the store."""
        with self._inbox_lock:  # the link clock's lock
            now = self.link.now()
            waiting = dict(self._beats)  # not yet applied: no review since they came
        seen = dict(self.last_seen)  # changed in the decision thread: a copy, read once
        for server, beat in waiting.items():
            seen[server] = max(beat, seen.get(server, beat))
        # a server found failed at the load was heard before the restart (its outage is
        # stored): counted from the load, as the others heard before; it read "never"
        for server, failed_at in dict(self.failed).items():
            if server not in seen and server in self.heard:
                seen[server] = failed_at
        return {
            server: math.inf if (at := seen.get(server)) is None else max(now - at, 0.0)
            for server in self.server_index
        }

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
        # connected long enough for every live agent to reconnect and beat (or resend);
        # and the event loop awake: one that has not ticked since the process woke has
        # not read the beats waiting in the socket, nor taken the stop off the clock
        grace = min(2 * self.mqtt.heartbeat_seconds, self.mqtt.heartbeat_timeout)
        settled = up_for is not None and up_for >= grace and self.loop_watch.awake()
        if up_for is not None:  # connected: who fell silent, who is back
            timeout = self.mqtt.heartbeat_timeout
            window = min(self.mqtt.heartbeat_seconds, timeout / 2)
            silent, nearly, overdue = [], False, 0.0
            suspects: list[str] = []  # missed two beats: no moved job goes there
            for server, seen in self.last_seen.items():
                if server not in self.failed:
                    quiet = now - seen
                    if settled and quiet > timeout:
                        silent.append(server)
                        overdue = max(overdue, quiet - timeout)
                        continue
                    if settled and quiet > timeout - window:
                        nearly = True  # missed its beats too: about to be silent as long
                    if quiet > SUSPECT_BEATS * self.mqtt.heartbeat_seconds:
                        suspects.append(server)
                elif seen > self.failed[server]:
                    events += self.outages.recover_sync(server)
                    del self.failed[server]
            # together: no job is moved onto another of them. A server about to pass the
            # timeout too (a rack that lost power: its agents' last beats some seconds
            # apart) is waited for, at most one heartbeat interval past the timeout
            # the rest of a rack going dark, silent for less long: up, but no job moved
            # off these goes onto them (:data:`SUSPECT_BEATS`)
            if silent and not (nearly and overdue < window):
                events += self.outages.fail_together_sync(silent, avoid=suspects)
                for server in silent:
                    self.failed[server] = now
                    self.agents.fell_silent(server)
        events += self.review.pending_sync()
        if settled and not flooded:  # a job's last counts may be among the dropped
            events += self.review.overdue_sync()
        flush(self.progress, self.c._write)
        if not self._heard_saved:
            with self.c._write() as session:
                self._save_meta(session)
            self._heard_saved = True
        if self._pruned_slot != self.c.slot:
            self._prune()
            self._pruned_slot = self.c.slot
        return events

    def unfinished(self, job_id: str, session: Session) -> bool:
        """Whether agents reported progress for ``job_id`` short of its work (decision
        thread; asked by the slot clock): :meth:`JobReview.unfinished
        <controller.plane.job_review.JobReview.unfinished>`."""
        return self.review.unfinished(job_id, session)

    def _prune(self) -> None:
        """Forget the jobs that are no longer admitted or running, once their progress is
        stored: memory grows with the active jobs only, not with the daemon's history."""
        with self.c.db.session() as session:
            active = set(session.scalars(select(JobRow.id).where(JobRow.state.in_(ACTIVE))))
        for job_id in [j for j, p in self.progress.items() if j not in active and not p.dirty]:
            del self.progress[job_id]
        self.jobs.forget(active)
        self.review.forget(active)
        self.failures.forget(active)
        self.taken.forget(active)

    # -- plans (decision thread) --------------------------------------------------------

    def plans_sync(self, published: dict[str, Plan]) -> list[Plan]:
        """Plans of every server for the current and next slot that differ from
        ``published`` (all of them if it is empty), under one new epoch (persisted first);
        ``[]`` if nothing changed. :meth:`plans_begin`, :meth:`plans_build`,
        :meth:`plans_end` and (the plans taken as published) :meth:`plans_out` in one
        call (decision thread): the link builds in a thread of its own, between the
        first two and the others, so a rebuild of many jobs' plans does not hold the
        decision thread, and publishes between the last two
        (``controller.plane.link.Plane.publish_round``)."""
        begun, plans = self.plans_build(self.plans_begin(published))
        self.plans_end(begun, plans)
        if plans:
            self.plans_out(begun, plans)
        return plans

    def plans_begin(self, published: dict[str, Plan]) -> PlanRound:
        """What a round of plans is built from (decision thread): the window moved to the
        current slot, every decision so far committed (and, with high availability, this
        daemon still the leader: NotLeaderError or FencedError if not), the failed
        servers, and the epoch the plans go out above.

        Agents ignore a plan of an epoch below the one they follow. One that follows an
        epoch above this daemon's (its heartbeat says so) followed another daemon: one
        on another store, or on this store before it was restored from a backup or
        replaced by a new one. Then every plan goes out again, above that epoch: else
        the agents would ignore this daemon's plans for as many rounds, while their
        servers' jobs, reported by nobody, completed with their plans."""
        self.c._advance_window()
        with self._inbox_lock:
            ahead, by, due = self._claims.take()
        if ahead > self.epoch and due:
            self.log.warning(
                "agents follow plans of another daemon or store: plans go out again above "
                "their epoch (a daemon on another store, or another daemon publishing under "
                "this topic prefix)", followed=ahead, server=by, epoch=self.epoch,
            )  # fmt: skip
            self.epoch, published = ahead, {}
            self._claims.bumped()
        with self.c._write():  # decisions committed, this leader fenced: nothing written
            pass
        return PlanRound(self.c.slot, self.epoch, dict(self.failed), dict(published))

    def plans_build(self, begun: PlanRound) -> tuple[PlanRound, list[Plan]]:
        """``begun`` with the newest event its plans hold (:attr:`PlanRound.upto`), and
        its plans that differ from those it was given as published, under its epoch + 1,
        read from the store (any thread) in one snapshot: the newest event and the plans
        read as of one moment. Read before the snapshot (when the round began), a plan
        written in between was in the round but counted as written after it, and its
        job failed ``plan_not_sent`` if nobody reported on it (the plane audit)."""
        with self.c.db.snapshot() as session:
            upto = int(session.scalar(select(func.max(EventRow.sequence))) or 0)
            plans = self.plans.build(
                session, begun.slot, begun.epoch + 1, self.store_id, begun.failed
            )
        changed = [p for p in plans if not p.same_content(begun.published.get(p.server))]
        return dataclasses.replace(begun, upto=upto), changed

    def plans_end(self, begun: PlanRound, plans: list[Plan]) -> None:
        """Take the epoch of ``plans``, built for ``begun``, and store it (decision
        thread; nothing to store if there are none). Rounds run one at a time, and a
        round cut short (a reconnection) never reaches here, so the epoch is still the
        one ``begun`` saw. Called also without plans: a step of the decision thread
        checks that this daemon still leads (NotLeaderError), before the round's job
        events go out. Its slots count as sent once its plans are published
        (:meth:`plans_out`)."""
        if plans:
            with self.c._write() as session:
                self.epoch = begun.epoch + 1
                self._save_meta(session)

    def plans_out(self, begun: PlanRound, plans: list[Plan] | None = None) -> None:
        """The plans of round ``begun`` went out: the broker acknowledged every one
        (decision thread). Its slot and the next count as sent (:attr:`planned_slot`,
        :meth:`JobReview.plans_sent <controller.plane.job_review.JobReview.plans_sent>`),
        and so do the plans written before it began, from its slot on
        (:meth:`SentPlans.went_out <controller.plane.sent_plans.SentPlans.went_out>`);
        stored. Before, they counted as sent once the epoch was taken, before the plans
        were published: a broker lost in the middle of a round left a job admitted just
        before it counted as sent (and completed with its whole utility, no agent having
        had its plan) if the broker was out until past its plan's slots. ``plans``: the
        round's, the first epoch that carried each job to each server
        (:mod:`controller.plane.taken_plans`)."""
        self.taken.carried(plans or ())
        with self.c._write() as session:
            self.planned_slot = begun.slot
            self.review.plans_sent(begun.slot)
            self.review.sent.went_out(session, begun.upto, begun.slot)
            self._save_meta(session)

    def _save_meta(self, session: Session) -> None:
        value = {"epoch": self.epoch, "events": self.events_published,
                 "heard": sorted(self.heard), "following": sorted(self.following),
                 "link": self.link_name,
                 "planned": self.planned_slot,
                 "unsent": [list(run) for run in self.review.unsent],
                 "ignored": list(self.agents.ignored_sessions),
                 **self.review.sent.stored()}  # fmt: skip
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
            return [shown_event(r) for r in rows]

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
            # the specs of active jobs only are kept: a read names any stored job
            job = self.jobs.get(job_id, session, keep=row.state in ACTIVE)
            state, completion = row.state, row.completion_slot
            planned_ws = float(
                sum(a.workers for a in session.scalars(
                    select(AllocationRow).where(AllocationRow.job_id == job_id)))
            ) * self.slot_seconds  # fmt: skip
            prog = with_stored(session, job_id, self.progress.get(job_id))
        failures = tuple(self.failures.of(job_id, self.monotonic()))
        return progress_view(job_id, job, state, completion, planned_ws, prog, self.slot_seconds,
                             failures)  # fmt: skip
