"""What every part of the admission controller shares: the ledger, the window's slot,
the bound estimate and the store, with the few steps each part takes of another.

The controller is one object composed of parts (mixins over :class:`AdmissionState`):
:mod:`.decide` decides and commits, :mod:`.recovery` rebuilds the ledger from the store,
:mod:`.pending` decides waiting jobs again at slot boundaries, :mod:`.lifecycle` moves
jobs through slots and cancels them, :mod:`.reads` answers reads,
and :mod:`.controller` serialises them off the event loop. The abstract methods below are
the only steps one part takes of another.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.orm import Session

from controller.admission.decision_thread import DecisionThread
from controller.admission.id_index import StoredIds
from controller.admission.job_counts import JobCounts
from controller.admission.rewind import REWOUND_HINT, EventMark
from controller.admission.stored_budget import StoredBudget
from controller.admission.views import Cordon, JobView
from controller.admission.writer import GroupWriter, WriteSet
from controller.clock import SlotClock
from controller.config import Config
from controller.errors import NotLeaderError
from controller.events import Event, EventBus
from controller.pins import Pins
from controller.store import Database, EventRow, JobRow, StoreUnavailableError
from controller.store.commit_process import (
    CommitProcess,
    CommitProcessStartError,
    separate_process_ok,
)
from controller.store.decisions import ESTIMATE_KEY
from controller.store.writer_lock import Holder, check_epoch
from pricing import Cluster, Job, Ledger, job_from_dict
from pricing.bound_estimate import BoundEstimate
from pricing.prices import PriceBounds
from pricing.shared_estimate import SharedEstimate

if TYPE_CHECKING:
    from controller.plane.execution import Execution

__all__ = [
    "EPOCH_KEY",
    "ESTIMATE_KEY",
    "SETTINGS_KEY",
    "STORE_ID_KEY",
    "AdmissionState",
    "ReadTurns",
    "parse_job",
]

EPOCH_KEY = "epoch"
"""Meta row with the Unix time of slot 0 when the config sets none: ``{"epoch": t,
"source": why}``, recorded at the first start, floored to a whole slot (:mod:`.recovery`)."""
SETTINGS_KEY = "settings"
"""Meta row with the settings that give stored slots their meaning (``oasis offline
--store`` reads them): ``{"window": T, "slot_seconds": s, "epoch": t}``."""
STORE_ID_KEY = "store_id"
"""Meta row naming this store, ``{"id": 16 hex digits}``, made by its first leader: the
execution plane's plans carry it, so a daemon tells agents that follow another store's
plans (a second daemon on another store under the same broker) from agents that follow
this store's older plans (a store restored from a backup keeps its id)."""


READ_THREADS = 6
"""Threads of the store-read pool (``AdmissionController.read_store``)."""


class ReadTurns:
    """One client's turns at the store-read pool: a semaphore, and how many reads use it
    (to forget it once none does)."""

    def __init__(self, limit: int) -> None:
        self.semaphore = asyncio.Semaphore(limit)
        self.users = 0


def parse_job(spec: Any, cluster: Cluster, slot_seconds: float, window: int, arrival: int) -> Job:
    """``spec`` as the daemon reads a job arriving at ``arrival`` on ``cluster`` (slots of
    ``slot_seconds``), its work within ``window`` slots: a submission's, a pending job's
    at each boundary, and a reload's look at the pending jobs a restart with another
    config would read (:mod:`.limit_checks`)."""
    return job_from_dict(
        spec,
        cluster,
        slot_seconds=slot_seconds,
        slots_available=lambda _a: window,
        arrival=arrival,
        field="job",
        keyed=True,
    )


class AdmissionState(ABC):
    """The controller's shared state; see the module docstring."""

    def __init__(
        self,
        config: Config,
        db: Database,
        slots: SlotClock,
        bus: EventBus | None = None,
        log: Any = None,
        commit_process: bool = False,
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        self.db = db
        # jobs per state for the scrapes and the console, shared, recounted at most every
        # few seconds (.job_counts)
        self.slots = slots
        self.bus = bus or EventBus()
        self.log = log or structlog.get_logger("oasisd")
        self.job_counts = JobCounts(db, log=self.log)
        self.window = config.window
        # the decision thread: every step below runs in it, serialised (.controller)
        self._decisions = DecisionThread(config.limits.max_in_flight)
        # store reads of the API and the console: a pool of their own, so a flood of
        # them queues there, not in the default executor the HA lease's checks use
        self._reads = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="oasis-read")
        self._read_turns: dict[str, ReadTurns] = {}  # per named client (.controller)
        # each server's place in the cluster's order, for the cluster it was made of (.reads)
        self._positions: tuple[Cluster, dict[str, int]] | None = None
        self._draining = False
        self._in_flight = 0  # requests inside _run: queued on the lock or deciding
        self._idle = asyncio.Event()
        # the price bounds: set from the store by open() (.recovery, .bounds)
        self._estimate = SharedEstimate.start(self._fresh_estimate())
        self._estimate_note = ""  # why the stored estimate was last found unusable
        self._pins = Pins()
        self._pins_note: list[str] = []  # the set-aside pins' resources last said (.bounds)
        # a store outage during a write may have cut off a commit that happened: rebuild
        # the ledger from the store before the next decision (_run)
        self._stale = False
        self._rebuild_retry_at = 0.0  # a failed rebuild is not tried again before this
        self._rebuild_error = ""  # (time.monotonic()), and why it failed
        self._stale_rebuild_at = 0.0  # the slot clock's next try at it (time.monotonic())
        self.ledger: Ledger | None = None
        self.slot = 0
        # the slot whose job-state changes are done: the window (self.slot) may move on
        # first, in a decision or the plane's review, and the tick must still run then
        self._ticked_slot = -1
        self.execution: Execution | None = None  # the execution plane, with a broker
        # events of steps taken on the way (pending jobs decided at a boundary), published
        # by the controller once the step returns, even if it failed after them
        self._held_events: list[Event] = []
        self._pending_slot = -1  # the slot whose pending jobs have all been decided
        # job id -> (canonical spec, submitter, future of the answer) of each decision
        # handed to the writer and not committed yet: a retry waits for the first
        self._uncommitted: dict[str, tuple[str, str | None, Any]] = {}
        # ids of the stored jobs, valid for the ledger they were loaded for, loaded in
        # the background after each rebuild (.id_index)
        self._ids = StoredIds(db, self._uncommitted.copy, self.log)
        # bytes of specs each submitter had stored in the last day (.stored_budget)
        self._stored = StoredBudget()
        # called with the ids of each batch of jobs retention deleted (.retention)
        self.prune_hooks: list[Callable[[list[str]], None]] = []
        # stored job rows found not to read back, each logged once (.reads)
        self._unreadable: set[str] = set()
        # cordoned servers -> their cordon (.cordons), as the store holds them at the
        # last rebuild and as this leader changed them since
        self.cordoned: dict[str, Cordon] = {}
        # group commit (.writer, .commit): decisions are committed by a writer thread
        # in batches; a rebuild of the ledger starts a new generation, and write sets
        # of a generation a batch of which failed are not committed. The writer writes
        # each batch itself or (commit_process: the daemon) through a child process
        # (controller.store.commit_process), which its thread starts (_start_committer,
        # else at the first batch) and stops
        self._committer: CommitProcess | None = None
        if commit_process and separate_process_ok(db.url):
            self._committer = CommitProcess(db, self.log)
        committer = self._committer
        self._writer = GroupWriter(
            self._commit_batch,
            self._commit_failed,
            log=self.log,
            on_stop=committer.close if committer is not None else None,
        )
        self._generation = 0
        # the largest job sequence committed, as the writer knows it (None: read it);
        # forgotten at every other write (a pending job admitted takes the next one)
        self._last_sequence: int | None = None
        # high availability (controller/ha): without [ha] this daemon always leads and
        # its writes are not fenced (the writer lock keeps other daemons out)
        self.role = "leader" if config.ha is None else "standby"
        self.fence_epoch: int | None = None  # the epoch every write is fenced with
        self.fence_pid: int | None = None  # the backend holding this leader's lock
        self.leader: Holder | None = None  # the leader as recorded in the store
        self.epoch_seen = 0  # the highest epoch led in or seen recorded (a floor: .follow)
        self.cannot_lead = ""  # a standby: why it could not take over now (controller/ha)
        self.lease_seen = time.monotonic()  # when the lease's holder was last confirmed
        self._seen_event = 0  # the last event sequence the ledger reflects (.follow)
        # that event as a standby read it (None: not read), and why the store was found
        # rewound under the ledger ("": it was not; .rewind)
        self._seen_mark: EventMark | None = None
        self._rewound = ""
        # a standby's resources check (.follow.takeover_problem): at which _seen_event
        # it was last made, and what it found ("": nothing)
        self._resources_checked_at = -1
        self._resources_problem = ""
        self._written_event = 0  # the newest event of the write transaction under way
        self._unfitted = 0  # stored plans a standby left out; a full rebuild at takeover
        self._unfitted_counted = 0.0  # time.monotonic() of its last count in full
        self._outages: tuple[int, int, int, int] | None = None  # (.follow) a change: rebuild
        # where clients are sent while this daemon leads (the daemon fills in its address)
        self.advertise = config.ha.advertise if config.ha is not None else ""

    def _start_committer(self) -> Future[None] | None:
        """Start the commit process in the writer thread, if none runs (at open, a
        standby's too, and at a takeover), so the first answer after it need not wait
        for the child's start-up (about 0.5 s); the future resolves once it is up (or
        failed to start: the writer thread then commits itself). None: no child is used."""
        committer = self._committer
        if committer is None:
            return None

        def start() -> None:
            with contextlib.suppress(CommitProcessStartError):  # logged; the writer writes
                committer.start()

        return self._writer.call(start)

    @property
    def leading(self) -> bool:
        """True if this daemon decides (always, without high availability)."""
        return self.role == "leader"

    def _not_leader(self, why: str = "this oasisd is a standby") -> NotLeaderError:
        if self.cannot_lead:  # if the leader is gone too, the caller must hear it (why:
            why += " that cannot take over (oasis status says why)"  # an operator's)
        if down := self.db.down_reason:  # the leader it names is then its last known one:
            # with PostgreSQL stopped a tenant heard only "the leader is at B" from each
            # node, none leading (the HA audit)
            why += f", and the store is unavailable to it ({down[:200]})"
        return NotLeaderError(self.leader.address if self.leader else "", why)

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A store transaction that writes, fenced: every write but the group-committed
        decisions' (:mod:`.commit`) goes through here, after those (:meth:`_sync_writes`).

        Raises NotLeaderError on a standby; with high availability, the transaction first
        checks, with the ``writer`` row share-locked, that the store's epoch is still
        this leader's (:func:`controller.store.writer_lock.check_epoch`, FencedError if
        not), so a leader that was paused or cut off past its lease never commits."""
        self._sync_writes()
        self._last_sequence = None
        self._written_event = self._seen_event
        with self.db.session() as session:
            self._fence(session)
            yield session
        # committed: its events are this leader's own, reflected in its ledger once the
        # caller applies them (a commit whose fate is unknown leaves the ledger stale
        # and these events unseen: a standby applies them, a leader rebuilds)
        self._seen_event = max(self._seen_event, self._written_event)

    def _note_rewound(self, why: str) -> None:
        """The store was found rewound under the ledger (:mod:`.rewind`), for ``why``:
        said once, and the ledger rebuilt from the store before the next step (or the
        standby's next follow)."""
        if not why:
            return
        if not self._rewound:
            self.log.error("the store was rewound", why=why, seen_event=self._seen_event,
                           role=self.role, hint=REWOUND_HINT)  # fmt: skip
        self._rewound = self._rewound or why
        self._stale = True

    def _fence(self, session: Session) -> None:
        """The checks that open every write transaction (:meth:`_write`)."""
        self._fence_here()
        if self.fence_epoch is not None:
            check_epoch(session, self.fence_epoch, self.fence_pid)

    def _fence_here(self) -> None:
        """The fence's checks that need no store: this daemon leads, and (with high
        availability) confirmed its lease within the lease's length."""
        if not self.leading:
            raise self._not_leader()
        ha = self.config.ha
        if ha is not None and time.monotonic() - self.lease_seen > ha.lease_seconds:
            # paused (SIGSTOP, a stall) past the lease: it may have passed to another
            raise self._not_leader(
                f"this oasisd has not confirmed its lease for over {ha.lease_seconds:g} s"
            )

    def _sync_writes(self) -> None:
        """Wait until every decision handed to the writer is committed, so a write or a
        read of the store that follows sees them all, in decision order.

        Raises StoreUnavailableError if one of this generation failed: the ledger holds
        decisions the store does not, and is rebuilt before the next step."""
        self._writer.drain()
        if self._writer.failed_generation >= self._generation:
            self._stale = True
            raise StoreUnavailableError(
                "a commit of earlier decisions failed; the ledger is rebuilt from the store"
            )

    @property
    def _ledger(self) -> Ledger:
        if self.ledger is None:
            raise RuntimeError("the controller is not open")
        return self.ledger

    def _fresh_estimate(self) -> BoundEstimate:
        """The price-bound estimate before any job: the configured prior and trim, the
        configured servers (the rule replay uses too: :meth:`pricing.Trace.estimate`)."""
        pricing = self.config.pricing
        return BoundEstimate.start(self.cluster, pricing.prior, pricing.trim)

    def _parse(self, spec: Any, arrival: int, fits: bool = True) -> Job:
        """``spec`` as a job arriving at ``arrival``; with ``fits``, its work must fit the
        window (a new job), else only the cluster (a stored one, whose window may be past)."""
        return parse_job(
            spec, self.cluster, self.config.slot_seconds, self.window if fits else 1 << 40,
            arrival,
        )  # fmt: skip

    def _event(
        self, session: Session, now: datetime, kind: str, job_id: str, state: str,
        detail: dict[str, Any],
    ) -> Event:  # fmt: skip
        values = self._event_row(now, kind, job_id, state, detail)
        row = EventRow(**values)
        session.add(row)
        session.flush()
        if row.sequence <= self._seen_event:  # the store's numbering went back: rewound
            self._note_rewound(f"the store numbered a new event {row.sequence}, at or "
                               f"below event {self._seen_event} this daemon applied")  # fmt: skip
        self._written_event = max(self._written_event, row.sequence)  # seen once committed
        return Event(row.sequence, kind, job_id, self.slot, state, values["detail"])

    def _event_row(
        self, now: datetime, kind: str, job_id: str, state: str, detail: dict[str, Any]
    ) -> dict[str, Any]:
        """An event's columns but its sequence (the store numbers events)."""
        if self.fence_epoch is not None:  # high availability: whose decision it was
            detail = {**detail, "epoch": self.fence_epoch}
        return {"at": now, "kind": kind, "job_id": job_id, "slot": self.slot, "state": state,
                "detail": detail}  # fmt: skip

    @staticmethod
    def _allocation_rows(job_id: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """SPEC 6 allocation entries as store rows, one per (slot, server)."""
        merged: dict[tuple[int, str], dict[str, Any]] = {}
        for e in entries:
            key = (e["slot"], e["server"])
            row = merged.setdefault(
                key, {"job_id": job_id, "slot": e["slot"], "server": e["server"],
                      "workers": 0, "ps": 0}
            )  # fmt: skip
            row["workers"] += e.get("workers", 0)
            row["ps"] += e.get("ps", 0)
        return list(merged.values())

    # -- the steps one part takes of another ---------------------------------------------

    @abstractmethod
    def _advance_window(self) -> None:
        """Move the window to the current slot (:mod:`.lifecycle`)."""

    @abstractmethod
    def _window_moved(self) -> None:
        """End the cordons whose end the window reached (:mod:`.cordons`)."""

    @abstractmethod
    def _decide_pending(self) -> None:
        """Decide the pending jobs again at a new slot (:mod:`.pending`)."""

    @abstractmethod
    def _tick_sync(
        self, cursor: tuple[int, int] = (-1, 0)
    ) -> tuple[list[Event], tuple[int, int] | None]:
        """Move the window and a batch of jobs through their states (:mod:`.lifecycle`)."""

    def _window_end(self, arrival: int) -> int:
        """The last slot a job arriving at ``arrival`` may be planned in (SPEC 1:
        ``a + T - 1``), waiting or re-planned alike."""
        return arrival + self.window - 1

    @abstractmethod
    def _tick_all(self) -> None:
        """Every step of the slot tick at once (:mod:`.lifecycle`)."""

    @abstractmethod
    def _rebuild_stale(self) -> int:
        """Rebuild a stale ledger from the store, in the decision thread (:mod:`.recovery`)."""

    @abstractmethod
    def _bounds(self, estimate: SharedEstimate) -> PriceBounds:
        """The price bounds for ``estimate`` (:mod:`.recovery`)."""

    @abstractmethod
    def _commit_batch(self, batch: list[WriteSet]) -> list[Any]:
        """Commit a batch of decisions (:mod:`.commit`, in the writer thread)."""

    @abstractmethod
    def _commit_failed(self, err: BaseException) -> BaseException:
        """After a failed batch (:mod:`.commit`, in the writer thread)."""

    @abstractmethod
    def _step_down(self, why: str) -> None:
        """Stop deciding: a standby from now (:mod:`.follow`)."""

    @abstractmethod
    def _view(self, session: Session, row: JobRow, duplicate: bool = False) -> JobView:
        """A stored job as the API reports it (:mod:`.reads`)."""
