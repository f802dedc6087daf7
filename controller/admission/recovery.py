"""Recovery: migrate the store at start-up and rebuild the ledger from its allocations in
decision order, which reproduces the prices bit for bit (also after a store outage, and
when the execution plane re-plans)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import secrets
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from controller.admission.bounds import BoundControl
from controller.admission.cordons import MAX_REASON, ledger_until
from controller.admission.moves import PLANNED_WORK, Moves
from controller.admission.restart_checks import (
    epoch_row,
    recorded_settings,
    resources_problem,
    settings_epoch,
    slot_grid_problem,
    when,
)
from controller.admission.state import EPOCH_KEY, SETTINGS_KEY, STORE_ID_KEY
from controller.admission.stored_budget import stored_day
from controller.admission.views import STATES, Cordon
from controller.clock import first_epoch
from controller.errors import ResourcesRemovedError, SlotGridChangedError, StoreEditedError
from controller.store import (
    CORDONED,
    REBUILD_SECONDS,
    AllocationRow,
    EventRow,
    JobRow,
    MetaRow,
    OutageRow,
    ServerRow,
    StoreUnavailableError,
    in_batches,
    migrate,
)
from controller.store.commit_process import START_SECONDS
from controller.store.stored import count_problem, stored_spec, utc
from controller.store.urls import shown
from controller.store.writer_lock import recorded_holder
from pricing import Job, Ledger, OasisError, SpecError
from pricing.best_schedule import BestSchedule, warm_up
from pricing.errors import CapacityError
from pricing.fields import is_integer, is_number
from pricing.replan import refit
from pricing.schedule import Schedule

__all__ = ["PLAN_SPAN", "Recovery", "outage_mark"]

MAX_EVENT_SEQUENCE = 1 << 62
"""Events are numbered far below this; a stored one at or above it is an edit's, near the
largest number a store can give (2**63 - 1, past which SQLite numbers new rows at random
and PostgreSQL's sequence fails every write)."""

REBUILD_RETRY_SECONDS = 1.0
"""After a ledger's rebuild failed, calls fail at once for this long (the store's own
:data:`~controller.store.database.RETRY_SECONDS` after it was found out of reach)."""

PLAN_SPAN = 1 << 18
"""Slots past the window's first slot that no stored plan reaches (a window of this many
slots is 30 years of hourly slots; a longer configured window raises it): a stored
allocation further out is read as a broken row, not as a plan to refit, whose arrays
would be that long."""


HOLDING_NONE = frozenset(STATES) - {"admitted", "running"}
"""The job states that hold no slot after the current one (their future allocation rows
are deleted when a job enters them; a job that entered one during the current slot keeps
that slot's rows: :func:`released_from`)."""


def released_from(row: Any, first: int) -> int:
    """The first slot of the window (which starts at ``first``, the current slot) whose
    stored allocations a job in a state of :data:`HOLDING_NONE` no longer holds.

    A cancel releases from the slot after the one it came in (``cancelled_slot``), an
    early completion and a failure that strands a job after their ``completion_slot``:
    a job that ended during the current slot keeps what it held in it, in the live
    ledger and in the store, and a rebuild in that slot holds it too. Any other state,
    or a slot that does not read back, holds nothing. Only the current slot is ever
    held this way (``first + 1`` at most): the columns can be edited.

    ``row``: with ``state``, ``cancelled_slot`` and ``completion_slot`` (a job row)."""
    if row.state == "cancelled":
        end = row.cancelled_slot
    elif row.state in ("completed", "failed") and is_integer(row.completion_slot):
        end = row.completion_slot + 1
    else:
        end = None
    return first + 1 if is_integer(end) and end > first else first


def outage_mark(session: Session) -> tuple[int, int, int, int]:
    """What changes when a server fails or recovers, or is cordoned or uncordoned: (outage
    rows, newest id, ended, sum of their ends); the last moves when an uncordon ends a
    cordon with an end sooner. A standby rebuilds its ledger when it moves (outages
    change no event it applies)."""
    row = session.execute(
        select(
            func.count(OutageRow.id),
            func.max(OutageRow.id),
            func.count(OutageRow.up_from),
            func.sum(OutageRow.up_from),
        )
    ).one()
    count, newest, ended, ends = (int(v or 0) for v in row)
    return count, newest, ended, ends


@dataclass(frozen=True)
class _Misfit:
    """A stored plan that no longer fits: what it wanted from ``start`` on, and why.

    Attributes:
        job_id: the job.
        job: the job parsed against the configured cluster; None if it no longer parses.
        start: absolute slot of ``workers[0]``.
        workers: ``(S,)`` int64, workers per slot as stored (on any server).
        ps: ``(S,)`` int64, parameter servers per slot as stored.
        why: the reason, for the log and the event.
    """

    job_id: str
    job: Job | None
    start: int
    workers: NDArray[np.int64]
    ps: NDArray[np.int64]
    why: str


class Recovery(Moves, BoundControl):
    """Start-up and ledger rebuilds; see the module docstring."""

    def open(self) -> None:
        """Migrate the store, record the servers and rebuild the ledger (blocking)."""
        # the commit process starts meanwhile (a standby's too: a takeover need not wait
        # for it); the daemon serves once it is up, so no first answer waits for it
        starting = self._start_committer()
        revision = migrate(self.db, self.log)
        warm_up()
        with self._write() if self.leading else self.db.session() as session:
            self.slots.epoch = self._epoch(session)
            self._check_setup(session)
            if self.leading:  # a standby writes nothing; it records these at takeover
                self._record_setup(session)
            else:
                self.leader = recorded_holder(session)
                differences = self._setup_differences(session)
                if differences:
                    self.log.warning(
                        "this standby's config differs from the one the leader recorded: it "
                        "does not take over while stored plans do not fit its servers or "
                        "window; the rest applies at its takeover",
                        differences=differences[:20],
                    )  # fmt: skip
        self.slot = self.slots.current_slot()
        self._seen_event = self._last_event()  # first: later ones are applied again, harmlessly
        if self._seen_event >= MAX_EVENT_SEQUENCE:
            raise StoreEditedError(
                f"its events table holds sequence {self._seen_event}, an edit's (events are "
                f"numbered in order from 1): near 2**63 - 1, the largest, SQLite numbers "
                f"new events at random (the execution plane would skip them) and "
                f"PostgreSQL fails every write. Delete that row, or give it the next "
                f"number after the others"
            )
        rebuilt = self._reload()
        if self.leading:
            self._restore_stored_budget()
        if self.config.mqtt is None and self.leading:
            self._tick_all()
        # else the first tick() runs once the execution plane is attached and has loaded
        # the progress it needs to tell which ended plans left their work unfinished
        if starting is not None:
            with contextlib.suppress(TimeoutError):  # then the writer thread commits
                starting.result(timeout=START_SECONDS)
        self.log.info(
            "store ready",
            revision=revision,
            store=shown(self.db.engine.url),
            slot=self.slot,
            jobs_in_window=rebuilt,
        )

    def _restore_stored_budget(self) -> None:
        """Count what each submitter had stored in the day before this daemon led
        (:mod:`.stored_budget`), if ``limits.max_stored_mb_per_day`` is set."""
        if self.config.limits.max_stored_mb_per_day <= 0:
            return
        started = time.monotonic()
        now = self.slots.clock.now()
        with self.db.session() as session:
            hours, counted = stored_day(session, now)
        self._stored.restore(hours, now)
        self.log.info("stored specs of the last day counted", jobs=counted,
                      submitters=self._stored.submitters(),
                      seconds=round(time.monotonic() - started, 3))  # fmt: skip

    def _epoch(self, session: Session) -> float:
        """The Unix time of slot 0: the config's ``epoch`` if it sets one, else the one
        recorded in the store at the first start (recorded now if there is none: the
        start floored to a whole slot, :func:`controller.clock.first_epoch`). A store
        that holds jobs but no recorded epoch was started with slot 0 at the Unix epoch
        (the old default), so that is what it records then."""
        if not self.config.epoch_from_store:
            return self.config.epoch
        broken: SpecError | None = None  # an edited epoch row: the settings row's, if any
        try:
            recorded = epoch_row(session)
            if recorded is not None:
                return recorded
        except SpecError as err:
            broken = err
        recorded = settings_epoch(session)
        if recorded is not None:
            # a leader whose config sets the epoch records it only with its settings: a
            # standby without one takes the leader's (it refused to start, in a loop),
            # and so does a leader whose config no longer sets it (or whose epoch row
            # was deleted): slot 0 at the Unix epoch completed every stored job
            if broken is None:
                self.log.info("slot 0 read from the store's settings", epoch=recorded)
            else:
                self.log.warning("slot 0 read from the store's settings: its epoch row does "
                                 "not read", epoch=recorded, why=str(broken))  # fmt: skip
            if self.leading:
                why = f"the store's meta row {SETTINGS_KEY!r}"
                session.merge(MetaRow(key=EPOCH_KEY, value={"epoch": recorded, "source": why}))
            return recorded
        if broken is not None:
            raise broken
        if not self.leading:
            raise StoreUnavailableError(
                "slot 0 is not recorded in the store yet: a standby reads it from there, "
                "so the first daemon must start (and lead) first"
            )
        now = self.slots.clock.now()
        if session.scalar(select(JobRow.id).limit(1)) is not None:
            self._check_unix_epoch(session)
            epoch, why = 0.0, "jobs stored before slot 0 was recorded: the Unix epoch"
        else:
            epoch = first_epoch(now, self.slots.slot_seconds)
            why = "the daemon's first start, floored to a whole slot"
        session.add(MetaRow(key=EPOCH_KEY, value={"epoch": epoch, "source": why}))
        self.log.info("slot 0 recorded", epoch=epoch, source=why, started=now)
        return epoch

    def _check_unix_epoch(self, session: Session) -> None:
        """Refuse to take the Unix epoch as slot 0 of a store whose newest job says
        otherwise: a store that records no slot 0 (no ``epoch`` or ``settings`` meta row)
        was started before the daemon recorded one, when slot 0 was the Unix epoch, or
        its rows were deleted by hand; then its jobs, read as planned in 1970, would all
        be completed at once and their capacity sold again.

        Raises:
            SlotGridChangedError: the newest job was submitted more than two slots away
                from where slot 0 at the Unix epoch puts it; the message gives the slot 0
                its time implies.
        """
        row = session.execute(
            select(JobRow.decided_at, JobRow.submitted_slot, JobRow.decided_slot)
            .where(JobRow.state != "pending")  # decided again, its decided_at not moved
            .order_by(JobRow.sequence.desc())
        ).first()  # fmt: skip
        if row is None or not isinstance(row.decided_at, datetime):
            return
        # the slot decided_at falls in: a job admitted after waiting (or expired) was
        # decided slots after it was submitted (the review: slot 0 given 7 slots late)
        slot = row.decided_slot if is_integer(row.decided_slot) else row.submitted_slot
        if not is_integer(slot):
            return
        length = self.slots.slot_seconds
        at = utc(row.decided_at)
        implied = at.timestamp() - slot * length
        if abs(implied) <= 2 * length:
            return
        start = math.floor(implied / length) * length
        raise SlotGridChangedError(
            f"it records no slot 0 (its meta rows {EPOCH_KEY!r} and {SETTINGS_KEY!r} are "
            f"missing or unreadable), and its newest job, decided at "
            f"{when(at.timestamp())} in slot {slot}, puts slot 0 "
            f"near {when(implied)}, not at the Unix epoch: started so, every stored job "
            f"would be read as planned in 1970 and completed at once. Set daemon.epoch to "
            f"the store's slot 0 (epoch = {start:.0f} is {when(start)}), or restore the rows"
        )

    def _check_setup(self, session: Session) -> None:
        """Refuse a config the store's jobs were not planned with: another slot grid
        (:meth:`_check_slot_grid`), or resources they demand gone
        (:meth:`_check_resources`)."""
        self._check_slot_grid(session)
        self._check_resources(session)

    def _check_resources(self, session: Session) -> None:
        """Refuse ``[cluster] resources`` without one that a live job's spec names
        (:func:`.restart_checks.resources_problem`).

        Raises:
            ResourcesRemovedError: naming the resources, how many jobs and a few of them.
        """
        problem = resources_problem(session, self.cluster.resources)
        if problem is not None:
            raise ResourcesRemovedError(problem)

    def _check_slot_grid(self, session: Session) -> None:
        """Refuse a slot length or slot 0 other than those of the stored jobs' plans
        (:func:`.restart_checks.slot_grid_problem`).

        Raises:
            SlotGridChangedError: naming the key, both values and what to do.
        """
        problem = slot_grid_problem(session, self.config.slot_seconds, self.slots.epoch)
        if problem is not None:
            raise SlotGridChangedError(problem)

    def _setup_differences(self, session: Session) -> list[str]:
        """How this config's servers, window and slot grid differ from those recorded by
        the daemon that last led the store (:meth:`_record_setup`), in words; [] if they
        do not, or if nothing readable is recorded. Both head nodes need the same."""
        out: list[str] = []
        recorded = recorded_settings(session)
        mine = {"window": self.window, "slot_seconds": self.config.slot_seconds,
                "epoch": self.slots.epoch}  # fmt: skip
        for key, value in mine.items():
            theirs = _recorded_number(recorded.get(key))
            if theirs is not None and abs(theirs - value) > 1e-9 * max(1, abs(value)):
                out.append(f"{key}: {value:g} here, {theirs:g} recorded")
        for table, here in self._config_marks().items():
            theirs = recorded.get(table)
            if not isinstance(theirs, dict) or theirs == here:
                continue  # an older leader recorded none
            for key in sorted(here.keys() | theirs.keys()):
                if here.get(key) != theirs.get(key):
                    out.append(f"{table}.{key}: {str(here.get(key))[:80]} here, "
                               f"{str(theirs.get(key))[:80]} recorded")  # fmt: skip
        stored = {r.name: (r.kind, r.capacity) for r in session.scalars(select(ServerRow))}
        if not stored:
            return out
        configured = self.cluster.capacities()
        for name in sorted(configured.keys() | stored.keys()):
            if name not in stored:
                out.append(f"server {name}: configured here, not recorded")
            elif name not in configured:
                out.append(f"server {name[:64]}: recorded, not configured here")
            elif configured[name] != stored[name]:
                out.append(f"server {name}: {configured[name]} here, {stored[name]} recorded")
        return out

    def _record_setup(self, session: Session) -> None:
        """Record the configured servers and the settings that give stored slots their
        meaning (a leader's, at start and at takeover)."""
        self._sync_servers(session)
        if session.get(MetaRow, STORE_ID_KEY) is None:
            session.add(MetaRow(key=STORE_ID_KEY, value={"id": secrets.token_hex(8)}))
        settings = {
            "window": self.window,
            "slot_seconds": self.config.slot_seconds,
            "epoch": self.slots.epoch,
            **self._config_marks(),
        }
        session.merge(MetaRow(key=SETTINGS_KEY, value=settings))

    def _record_config_sync(self) -> None:
        """Record this leader's config marks again (:meth:`_config_marks`), the rest of
        the recorded settings kept: after a reload changed its tokens or limits, a
        standby that takes over or starts compares with these, not the ones of before."""
        with self._write() as session:
            recorded = recorded_settings(session)
            session.merge(MetaRow(key=SETTINGS_KEY, value={**recorded, **self._config_marks()}))

    def _config_marks(self) -> dict[str, dict[str, Any]]:
        """What of the config, besides the servers and the slot grid, changes how a
        leader decides: ``[pricing]``, ``[limits]``, ``[auth]``'s tokens and the default
        wait, recorded with the settings so a takeover by a node configured otherwise
        says so (:meth:`_setup_differences`). Priors, explicit bounds and tokens as
        digests (a token's hash is no secret, but need not be copied around)."""
        pricing, config = self.config.pricing, self.config
        bounds = pricing.bounds.to_dict(self.cluster) if pricing.bounds is not None else None
        tokens = sorted(
            f"{digest} {caller.name} {caller.role.value}"
            for digest, caller in (config.tokens or {}).items()
        )
        return {
            "pricing": {
                "bounds": pricing.mode if bounds is None else f"explicit {_digest(bounds)}",
                "trim": pricing.trim,
                "l_margin": pricing.l_margin,
                "u_margin": pricing.u_margin,
                "prior": _digest(pricing.prior.to_dict()) if pricing.prior else "none",
            },
            "limits": json.loads(json.dumps(asdict(config.limits), default=str)),
            "auth": {
                "tokens": f"{len(tokens)} ({_digest(tokens)})" if config.tokens else "off",
                "wait_seconds": config.wait_seconds,
            },
        }

    def _last_event(self) -> int:
        """The newest event's sequence in the store (0: none)."""
        with self.db.session() as session:
            return int(session.scalar(select(func.max(EventRow.sequence))) or 0)

    def _reload(self) -> int:
        """Read the bound estimate and rebuild the ledger from the store (blocking);
        returns the jobs rebuilt. Nothing changes if the store fails meanwhile. A leader
        then starts loading the stored ids for the new ledger, in the background
        (:mod:`.id_index`: nothing waits for it); a standby needs none."""
        with self.db.session() as session:
            estimate = self._stored_estimate(session)
            pins = self._stored_pins(session)
            # before the rebuild: a cordon or failure committed meanwhile moves the mark,
            # and a standby's next follow rebuilds again (before, the mark was first
            # read at that follow, and such a change was never applied: the HA audit)
            outages = outage_mark(session)
        previous, previous_pins = self.ledger, self._pins
        self._pins = pins
        bounds = self._bounds(estimate)
        self.ledger = Ledger(self.cluster, bounds, self.window + 1, origin=self.slot)
        try:
            rebuilt = self._rebuild()
        except BaseException:
            self.ledger, self._pins = previous, previous_pins
            raise
        self._estimate = estimate
        self._outages = outages
        if self.leading:
            self._ids.start(self.ledger)
        return rebuilt

    def _rebuild_stale(self) -> int:
        """Rebuild a ledger that may hold decisions the store does not (a commit failed
        or its fate is unknown): once the writer is idle, in a new generation (what was
        queued on the old ledger and failed stays failed), under
        :meth:`~controller.store.Database.patient`; returns the jobs rebuilt. Raises
        StoreUnavailableError if the store fails meanwhile: still stale then, and the
        calls of the next :data:`REBUILD_RETRY_SECONDS` fail at once with the same
        error, instead of each waiting for a rebuild that fails again (a table locked
        in psql failed each after the store's timeout, one tenant's call after another)."""
        wait = self._rebuild_retry_at - time.monotonic()
        if wait > 0:
            raise StoreUnavailableError(
                f"{self._rebuild_error}; the ledger's rebuild is tried again in {wait:.1f} s"
            )
        self._writer.drain()  # nothing of the old ledger is committed after the rebuild
        self._generation += 1
        seen = self._last_event()  # before the rebuild: later ones are applied again
        rewound = self._rewound
        if rewound and self.leading:
            self._ids.discard()  # they hold the jobs the store lost: loaded again
        try:
            with self.db.patient(REBUILD_SECONDS):
                rebuilt = self._reload()
        except StoreUnavailableError as err:
            self._rebuild_retry_at = time.monotonic() + REBUILD_RETRY_SECONDS
            self._rebuild_error = str(err)
            raise
        self._stale = False
        if rewound:  # counted on from the store's newest event, below the ledger's last
            self._seen_event, self._seen_mark, self._last_sequence = seen, None, None
            self._rewound = ""
            self.log.warning("ledger rebuilt from the rewound store", jobs=rebuilt,
                             newest_event=seen, why=rewound)  # fmt: skip
            return rebuilt
        self._seen_event = max(self._seen_event, seen)
        self.log.info("ledger rebuilt from the store after an outage", jobs=rebuilt)
        return rebuilt

    def _sync_servers(self, session: Session) -> None:
        session.execute(delete(ServerRow))
        for pos, (name, (kind, capacity)) in enumerate(self.cluster.capacities().items()):
            session.add(ServerRow(name=name, kind=kind, position=pos, capacity=capacity))

    def _rebuild(self) -> int:
        """Admit every stored allocation from the window's first slot on, in decision order.

        A plan that no longer fits (the configuration shrank under it: a server smaller or
        gone, a shorter window, a spec the cluster can no longer run) is refitted after
        the others, so jobs whose plans still fit keep them unchanged (:meth:`_refit`).
        A standby leaves such plans out and rebuilds in full when it takes over."""
        ledger = self._ledger
        if self.leading:
            self._drop_idle_allocations(ledger.origin)
        by_job = self._stored_plans(ledger.origin)
        # the outages first: a plan on a server down in its slots (a store restored in
        # part from a backup) is then a misfit, refitted, instead of a LedgerError
        self._block_failed_servers(ledger)
        misfits = []
        for job_id, allocs in by_job.items():
            misfit = self._place(job_id, allocs)
            if misfit is not None and allocs[0].state in HOLDING_NONE:
                # the slot an ended job held last: there is nothing of it to move
                self.log.warning("the last slot of an ended job no longer fits; left out",
                                 job=job_id, state=allocs[0].state, why=misfit.why)  # fmt: skip
            elif misfit is not None:
                misfits.append(misfit)
        self._unfitted = 0 if self.leading else len(misfits)
        if misfits and self.leading:
            self._refit(misfits)
            # the refitted jobs were admitted after the others: put back in decision
            # order, as the next rebuild admits them, so that it gives these amounts bit
            # for bit (the interleaving audit: they differed in the last bits)
            self._ledger.reorder(list(by_job))
        elif misfits:
            self.log.warning("plans that no longer fit left out until this standby leads",
                             jobs=len(misfits))  # fmt: skip
        return len(by_job)

    def _drop_idle_allocations(self, first: int) -> None:
        """Delete the allocations from slot ``first`` on of jobs in a state that holds no
        capacity (:data:`HOLDING_NONE`; the daemon deletes them when a job enters one, an
        edit can leave or add them), so the store shows what the ledger holds, and log
        which jobs had them. The current slot's rows of a job that ended in it stay: it
        held them (:func:`released_from`).

        The jobs are found from the allocation rows of the window (the slot index: as
        many as the plans ahead hold), then looked up by id: a query that went through
        every job in those states read the whole history (1.4 s at start and at each
        rebuild after an outage, with 10^6 jobs in a SQLite store)."""
        with self._write() as session:
            # no DISTINCT: SQLite would then scan every allocation row for it
            holding = list(dict.fromkeys(session.scalars(
                select(AllocationRow.job_id).where(AllocationRow.slot >= first))))  # fmt: skip
            ended: list[Any] = []
            for batch in in_batches(holding):
                ended += session.execute(
                    select(JobRow.id, JobRow.state, JobRow.sequence, JobRow.cancelled_slot,
                           JobRow.completion_slot)
                    .where(JobRow.id.in_(batch), JobRow.state.in_(HOLDING_NONE))
                ).all()  # fmt: skip
            ended.sort(key=lambda j: (j.sequence is not None, j.sequence or 0))  # as SQLite
            by_end: dict[int, list[str]] = {}  # the first slot each holds nothing in
            for job in ended:
                by_end.setdefault(released_from(job, first), []).append(job.id)
            had: set[str] = set()
            for end, ids in by_end.items():
                for batch in in_batches(ids):
                    beyond = (AllocationRow.job_id.in_(batch), AllocationRow.slot >= end)
                    had.update(session.scalars(select(AllocationRow.job_id).where(*beyond)))
                    session.execute(delete(AllocationRow).where(*beyond))
            idle = [job for job in ended if job.id in had]
        if idle:
            self.log.warning(
                "allocations of jobs that hold no capacity deleted (an edit?)", jobs=len(idle),
                first_slot=first, first=[f"{j.id[:64]} ({j.state})" for j in idle[:10]],
            )  # fmt: skip

    def _stored_plans(self, first: int, job_id: str | None = None) -> dict[str, list[Any]]:
        """The stored allocations from slot ``first`` on (of one job, or all), grouped by
        job in decision order: ``{job id: [rows (id, state, spec, arrival_slot, slot,
        server, workers, ps, cancelled_slot, completion_slot) in slot order]}``. Only
        what jobs hold: rows of a job in a state that holds none (:data:`HOLDING_NONE`:
        cancelled, completed, ...; the daemon deletes their future rows, an edit can
        leave them) are left out and logged, so an edit never takes capacity from
        everyone for nothing, except the current slot's of a job that ended in it
        (:func:`released_from`), which it held until it ended. A state that
        is not one of :data:`~controller.admission.views.STATES` keeps its rows: over
        holding too much, the daemon errs on the side of never selling a slot twice."""
        query = (
            select(JobRow.id, JobRow.state, JobRow.spec, JobRow.arrival_slot, AllocationRow.slot,
                   AllocationRow.server, AllocationRow.workers, AllocationRow.ps,
                   JobRow.cancelled_slot, JobRow.completion_slot)
            .join(AllocationRow, AllocationRow.job_id == JobRow.id)
            .where(AllocationRow.slot >= first)
            .order_by(JobRow.sequence, AllocationRow.slot)
        )  # fmt: skip
        if job_id is not None:
            query = query.where(JobRow.id == job_id)
        with self.db.session() as session:
            rows = session.execute(query).all()
        by_job: dict[str, list[Any]] = {}
        idle: dict[str, str] = {}
        unknown: dict[str, str] = {}
        for row in rows:
            if row.state in HOLDING_NONE and row.slot >= released_from(row, first):
                idle[row.id] = row.state
            else:
                by_job.setdefault(row.id, []).append(row)
                if row.state not in STATES:
                    unknown[row.id] = str(row.state)
        if unknown and job_id is None:
            # kept, and said: before, such a job held its slots with no line in the log,
            # left out of `oasis status` and the job counts, and no one could cancel it
            self.log.warning(
                "jobs in a state oasis does not know keep their plans (an edit?): they hold "
                "their slots, and no one can cancel them until the state is mended",
                jobs=len(unknown), first=[f"{j[:64]} ({s[:32]!r})" for j, s in
                                          list(unknown.items())[:10]],
                hint="set each one's jobs.state to admitted (or cancelled, to free its slots), "
                "with the daemon stopped",
            )  # fmt: skip
        if idle:
            self.log.warning(
                "allocations of jobs that hold no capacity are left out (an edit?)",
                jobs=len(idle), first=[f"{j[:64]} ({s})" for j, s in list(idle.items())[:10]],
            )  # fmt: skip
        return by_job

    def _place(self, job_id: str, allocs: list[Any]) -> _Misfit | None:
        """Admit one job's stored allocations (rows of :meth:`_stored_plans`) into the
        ledger; the misfit instead if they no longer fit the configuration."""
        found = self._stored_schedule(job_id, allocs)
        if isinstance(found, _Misfit):
            return found
        job, schedule = found
        down = self._down_in(schedule)
        if down:
            return self._misfit(job_id, job, allocs, down)
        try:
            self._ledger.admit(job_id, job.worker, job.ps, schedule)
            return None
        except CapacityError as err:
            return self._misfit(job_id, job, allocs, f"over the configured capacity: {err}")

    def _down_in(self, schedule: Schedule) -> str:
        """Where ``schedule`` has units on a server recorded down (an outage of the
        execution plane), in words; "" if nowhere."""
        ledger, cluster = self._ledger, self.cluster
        lo = schedule.start - ledger.origin
        sides = ((schedule.workers, ledger.worker_side, cluster.worker_names),
                 (schedule.ps, ledger.ps_side, cluster.ps_names))  # fmt: skip
        for counts, side, names in sides:
            hit = (counts > 0) & side.blocked[lo : lo + schedule.slots]
            if hit.any():
                t, server = (int(i) for i in np.argwhere(hit)[0])
                slot = schedule.start + t
                return f"server {names[server]} is down in slot {slot} (a recorded outage)"
        return ""

    def _stored_schedule(self, job_id: str, allocs: list[Any]) -> tuple[Job, Schedule] | _Misfit:
        """One job's stored allocations (rows of :meth:`_stored_plans`) as the job and its
        schedule on the configured servers; the misfit if they no longer fit them (a
        misfit without a job if its spec or a row does not read back:
        :meth:`_unreadable_plan`)."""
        w_index = {n: i for i, n in enumerate(self.cluster.worker_names)}
        p_index = {n: i for i, n in enumerate(self.cluster.ps_names)}
        try:
            spec = stored_spec(allocs[0].spec, job_id)
            job = self._parse(spec, allocs[0].arrival_slot, fits=False)
        except SpecError as err:
            return self._misfit(job_id, None, allocs, str(err))
        bad = self._unreadable_plan(job_id, job, allocs)
        if bad:
            return self._misfit(job_id, None, allocs, f"the stored plan of job {job_id!r}: {bad}")
        start, stop = allocs[0].slot, allocs[-1].slot + 1
        gone = sorted({a.server for a in allocs} - w_index.keys() - p_index.keys())
        if gone:
            return self._misfit(
                job_id, job, allocs, f"server {', '.join(gone)} no longer configured"
            )
        for a in allocs:  # the config changed a server's kind under its units
            if (a.ps and a.server in w_index) or (a.workers and a.server in p_index):
                kind = "worker" if a.server in w_index else "ps"
                return self._misfit(
                    job_id, job, allocs, f"server {a.server} is now a {kind} server"
                )
        if stop > self._ledger.end:
            why = f"planned past the window's last slot {self._ledger.end - 1}"
            return self._misfit(job_id, job, allocs, why)
        workers = np.zeros((stop - start, len(w_index)), np.int32)
        ps = np.zeros((stop - start, len(p_index)), np.int32)
        for a in allocs:
            if a.server in w_index:
                workers[a.slot - start, w_index[a.server]] = a.workers
            else:
                ps[a.slot - start, p_index[a.server]] = a.ps
        return job, Schedule(start, workers, ps)

    def _unreadable_plan(self, job_id: str, job: Job, allocs: list[Any]) -> str:
        """What makes a job's stored allocation rows unusable as a plan ("" if nothing):
        a count that is not an integer from 0 to the job's chunks, a slot more than
        :data:`PLAN_SPAN` slots (or the window, if longer) past the window's first or
        before the job's arrival, a slot with more workers in all than chunks or more
        parameter servers than its workers need, or more worker-slots in all than the
        job's work and than its last re-plan held (:data:`.moves.PLANNED_WORK`: the
        interleaving audit found a restart in the slot of a server failure failing the
        job it re-planned). The daemon never writes such rows; a hand edit or a
        half-restored backup can, and a plan that took more than its job needs would
        take it from every job rebuilt after it."""
        first = self._ledger.origin
        span = max(PLAN_SPAN, self.window + 1)
        per_slot: dict[int, list[int]] = {}
        for a in allocs:
            where = f"allocation at slot {str(a.slot)[:24]} on {str(a.server)[:64]}"
            if not is_integer(a.slot):
                return f"{where}: the slot is not an integer"
            if a.slot >= first + span:
                return f"{where}: more than {span} slots past the window's first slot {first}"
            if a.slot < job.arrival:
                return f"{where}: before the job's arrival in slot {job.arrival}"
            for name, value in (("workers", a.workers), ("ps", a.ps)):
                if problem := count_problem(name, value, job.chunks):
                    return f"{where}: {problem}"
            counts = per_slot.setdefault(a.slot, [0, 0])
            counts[0] += a.workers
            counts[1] += a.ps
        for slot, (workers, ps) in per_slot.items():
            if workers > job.chunks:
                return f"slot {slot}: {workers} workers, over the job's {job.chunks} chunks"
            need = int(job.ps_needed(np.int64(workers)))
            if ps > need:
                return (f"slot {slot}: {ps} parameter servers, over the {need} its "
                        f"{workers} workers need")  # fmt: skip
        total = sum(workers for workers, _ in per_slot.values())
        if total > job.work and total > self._planned_work(job_id):
            return f"{total} worker-slots from slot {first} on, over the job's work of {job.work}"
        return ""

    def _planned_work(self, job_id: str) -> int:
        """The worker-slots the daemon's last re-plan of ``job_id`` held from its slot on,
        if over the job's work (:data:`.moves.PLANNED_WORK`); 0 if none is recorded. Read
        only for a plan over its job's work, rarely."""
        with self.db.session() as session:
            detail = session.scalar(select(JobRow.detail).where(JobRow.id == job_id))
        value = detail.get(PLANNED_WORK) if isinstance(detail, dict) else None
        return value if is_integer(value) else 0

    @staticmethod
    def _misfit(job_id: str, job: Job | None, allocs: list[Any], why: str) -> _Misfit:
        if job is None:  # stranded as it is: what it wanted is not used (nor trusted)
            empty = np.zeros(0, np.int64)
            return _Misfit(job_id, None, 0, empty, empty, why)
        start, stop = allocs[0].slot, allocs[-1].slot + 1
        wanted_w = np.zeros(stop - start, np.int64)
        wanted_p = np.zeros(stop - start, np.int64)
        for a in allocs:
            wanted_w[a.slot - start] += a.workers
            wanted_p[a.slot - start] += a.ps
        return _Misfit(job_id, job, start, wanted_w, wanted_p, why)

    def _refit(self, misfits: list[_Misfit]) -> None:
        """Re-place, re-plan or fail (in decision order) the jobs whose stored plans no
        longer fit, as after a server failure: each with a logged reason and an event."""
        ledger = self._ledger
        first = ledger.origin
        now = datetime.now(UTC)
        # the searches first, the writes after, in one short transaction: a leader's
        # sessions end once idle in a transaction past the lease (``[ha]``), and a
        # takeover's refit of 4 plans (2.2 s with its kernels' first compile) outlived a
        # 2 s lease, failed, and was started again from scratch under the next epoch
        moves: list[tuple[_Misfit, str, BestSchedule | None, dict[str, Any]]] = []
        for m in misfits:
            detail: dict[str, Any] = {"reason": "config_changed", "why": m.why[:500]}
            if m.job is None:  # the spec no longer fits the cluster at all
                moves.append((m, "stranded", None, detail))
                continue
            work = min(int(m.workers.sum()), m.job.work)
            last = self._window_end(m.job.arrival)
            refused = self._refit_refused(m.job, work, last)
            if refused:  # re-placed in the same slots, else stranded: no search
                work = 0
                detail["why"] = f"{m.why[:300]}; {refused}"[:500]
            try:
                how, best = refit(ledger, m.job, m.start, m.workers, m.ps, work, last)
            except OasisError as err:  # a bug here must not stop the daemon starting
                self.log.exception("refit failed; the job fails", job=m.job_id)
                if m.job_id in ledger:
                    ledger.release(m.job_id, first)
                how, best = "stranded", None
                detail["why"] = f"{m.why[:400]}; refit failed: {err}"[:500]
            moves.append((m, how, best, detail))
        with self._write() as session:
            for m, how, best, detail in moves:
                if m.job is None:
                    row = session.get(JobRow, m.job_id)
                    assert row is not None
                    session.execute(delete(AllocationRow).where(
                        AllocationRow.job_id == m.job_id, AllocationRow.slot >= first))  # fmt: skip
                    row.state = "failed"
                    detail.update(how="stranded", from_slot=first)
                    self._event(session, now, "failed", m.job_id, "failed", detail)
                else:
                    self._record_move(session, now, m.job, how, first, detail, best)
        for m, how, _, _ in moves:
            self.log.warning("plan refitted to the configuration", job=m.job_id, how=how,
                             why=m.why, from_slot=first)  # fmt: skip

    def _refit_refused(self, job: Job, work: int, last: int) -> str:
        """Why the re-plan of a refitted job is not searched ("" if it is): a search over
        the limits every submission is held to (``[limits]``), which a stored spec edited
        by hand can ask for, would hold the start-up (and at a takeover, the decisions)."""
        slots = max(1, min(last, self._ledger.end - 1) - max(self._ledger.origin, job.arrival) + 1)
        try:
            self.config.limits.check_search(replace(job, work=max(work, 1)), self.cluster, slots)
        except SpecError as err:
            return f"its re-plan is not searched: {err}"
        return ""

    def _block_failed_servers(self, ledger: Ledger) -> None:
        """Take servers declared failed (the execution plane) or cordoned (an operator,
        :mod:`.cordons`) out of their slots again."""
        with self.db.session() as session:  # not those that ended before the window
            outages = session.scalars(select(OutageRow).where(
                OutageRow.up_from.is_(None) | (OutageRow.up_from > ledger.origin)
            ).order_by(OutageRow.id)).all()  # fmt: skip
        cordoned: dict[str, Cordon] = {}
        for o in outages:
            if not is_integer(o.down_from) or not (o.up_from is None or is_integer(o.up_from)):
                self.log.warning(
                    "an outage row that does not read back is left out", row=o.id,
                    server=str(o.server)[:64], down_from=str(o.down_from)[:24],
                    up_from=str(o.up_from)[:24],
                )  # fmt: skip
                continue
            if o.up_from is not None and o.up_from <= max(ledger.origin, o.down_from):
                continue  # ended before the window, or a cordon cancelled before it began
            if o.server in self.cluster.worker_names:
                kind, index = "worker", self.cluster.worker_names.index(o.server)
            elif o.server in self.cluster.ps_names:
                kind, index = "ps", self.cluster.ps_names.index(o.server)
            else:
                continue
            if o.cause != CORDONED:
                # A recovered server may hold new jobs from up_from on: block only the outage.
                ledger.block(kind, index, o.down_from, o.up_from)
                continue
            reason, by = str(o.reason or "")[:MAX_REASON], str(o.by or "")[:200]
            cordon = Cordon(o.down_from, reason, by, o.up_from)
            # a planned one without an end is not down yet (its server is in service)
            ledger.block(kind, index, o.down_from, ledger_until(cordon, ledger.origin))
            if not cordon.ended(ledger.origin):  # an uncordon ends it at the next boundary
                cordoned.setdefault(o.server, cordon)
        self.cordoned = cordoned


def _digest(value: Any) -> str:
    """A short digest of a JSON value, to tell two configs' tables apart in a log."""
    text = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(text).hexdigest()[:12]


def _recorded_number(value: Any) -> float | None:
    """A number of the recorded settings as a float; None if it is none, or past
    float64 (an edit's ``"window": 1e400`` written as an integer, which JSON keeps:
    before, OverflowError out of every takeover, so no standby could lead)."""
    if not is_number(value):
        return None
    try:
        return float(value)
    except OverflowError:
        return None
