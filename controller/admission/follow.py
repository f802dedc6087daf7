"""Following the leader (high availability): a standby keeps its ledger current by
applying what the leader committed, event by event, instead of rebuilding it.

Every change of the ledger is committed with an event (``decide``, ``pending``,
``lifecycle``, ``moves``, the execution plane), in one writer's order, so a standby reads
the events after the last one it applied (:meth:`Follow._follow_sync`, every
``[ha] follow_seconds``) and applies each:

- ``decided`` with state ``admitted``: the job's stored plan is admitted (a newcomer goes
  last in the ledger's order, as on the leader, which keeps the prices bit for bit);
- ``cancelled``: its slots from the event's ``from_slot`` on are released;
- ``replanned``, ``failed`` and a plane's ``completed`` (with detail): the job's plan is
  set to the stored one, keeping its place (:meth:`pricing.Ledger.replace`);
- ``bounds`` (an operator reset or pinned the price bounds): the estimate and pins are
  read again, as after every ``decided``, and the ledger repriced;
- other events change no allocation.

Reading a plan as it is stored now, possibly a later state than the event's, is safe:
each step sets the job to what the store holds, so applying an event again, or after a
later one, changes nothing. A change of the servers' outages (a server failed or came
back) rebuilds the ledger in full, as at start-up (rare). The bound estimate is read with
the events. On takeover the new leader applies only what it has not seen yet
(:meth:`Follow._take_over_sync`), after its epoch bump, so nothing the old leader
committed is missed: the bump waits for any write transaction the old leader still has
open (:func:`controller.store.writer_lock.check_epoch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from controller.admission.recovery import Recovery, _Misfit, outage_mark
from controller.admission.rewind import EventMark, mark_at, rewound
from controller.admission.stored_budget import StoredBudget
from controller.errors import SlotGridChangedError
from controller.events import Event
from controller.store import EventRow
from controller.store.commit_process import START_SECONDS
from controller.store.database import newer_revision
from controller.store.writer_lock import Holder, clock_offset, recorded_holder, this_process
from pricing.errors import CapacityError

__all__ = [
    "FOLLOW_BATCH",
    "MAX_CLOCK_SKEW_SECONDS",
    "RECOUNT_SECONDS",
    "Follow",
    "HaStatus",
    "max_clock_skew",
]

FOLLOW_BATCH = 2000
"""Events applied per read; a standby far behind catches up over several reads."""
_RESYNC = {"replanned", "failed"}
MAX_CLOCK_SKEW_SECONDS = 1.0
"""The skew from the last leader's clock a standby may lead with at least; with slots
longer than 100 s, a hundredth of a slot (:func:`max_clock_skew`)."""
RECOUNT_SECONDS = 60.0
"""A standby refusing to take over counts the plans that do not fit it again at most
this often (a rebuild of its ledger)."""


def max_clock_skew(slot_seconds: float) -> float:
    """The most seconds a standby's clock may be off the last leader's for it to take
    over: a hundredth of a slot, at least :data:`MAX_CLOCK_SKEW_SECONDS` (36 s with the
    default hour-long slots). Clocks kept by NTP are milliseconds apart."""
    return max(MAX_CLOCK_SKEW_SECONDS, slot_seconds / 100)


@dataclass(frozen=True)
class HaStatus:
    """A daemon's place in high availability (``oasis status``, the metrics).

    Attributes:
        role: ``"leader"`` or ``"standby"``.
        epoch: the leadership epoch: this leader's, or the leader's last seen (0: none).
        lease_age: seconds since the lease was last confirmed (a leader: its lock probe;
            a standby: its last read of the leader's record).
        leader: the leader's advertised address ("" if unknown).
        applied: the last event sequence the ledger reflects.
    """

    role: str
    epoch: int
    lease_age: float
    leader: str
    applied: int


class Follow(Recovery):
    """A standby's incremental apply and a takeover; see the module docstring."""

    def ha_status(self) -> HaStatus:
        """This daemon's role, epoch and lease age (from any thread)."""
        leader = self.leader
        epoch = self.fence_epoch if self.leading and self.fence_epoch else 0
        return HaStatus(
            role=self.role,
            epoch=epoch or (leader.epoch if leader else self.epoch_seen),
            lease_age=max(0.0, time.monotonic() - self.lease_seen),
            leader=leader.address if leader else "",
            applied=self._seen_event,
        )

    def _follow_sync(self) -> list[Event]:
        """Apply what was committed since the last event applied (at most
        :data:`FOLLOW_BATCH` events); returns them, for the event bus. A ledger left
        stale by a failed commit (a leader that just stepped down) is rebuilt in full."""
        self._advance_window()
        if self._stale:
            self._rebuild_stale()
            return []
        with self.db.session() as session:
            rows = session.scalars(
                select(EventRow)
                .where(EventRow.sequence > self._seen_event)
                .order_by(EventRow.sequence)
                .limit(FOLLOW_BATCH)
            ).all()
            outages = outage_mark(session)
            holder = recorded_holder(session)
            estimate = self._followed_estimate(session, rows)  # None: unmoved
            pins = self._stored_pins(session)
            # after the read, in its session: the store read now is at least as new as
            # the events read (on PostgreSQL each statement sees what was committed
            # before it; SQLite's read holds one snapshot). Checked before the read, in a
            # session of its own, a restore between the two went unseen, and the events
            # the leader numbered past this standby's last after it were applied onto the
            # old ledger for good (test_pg_restore, a standby stopped between the two)
            self._note_rewound(rewound(session, self._seen_event, self._seen_mark))
            mark = self._seen_mark
            if not self._rewound and (mark is None or mark.sequence != self._seen_event):
                # the event a start-up or a rebuild counted on from, as stored now
                self._seen_mark = mark_at(session, self._seen_event)
        if self._stale:  # rewound: the events read are in the rebuild
            self._rebuild_stale()
            return []
        self._saw_leader(holder)
        events = [Event(r.sequence, r.kind, r.job_id, r.slot, r.state, r.detail) for r in rows]
        if self._outages is not None and outages != self._outages:
            # a server failed or recovered: rebuild in full; the events read are in it
            self._seen_event, self._seen_mark = self._last_event(), None
            self._reload()  # which records the mark it rebuilt at
            return events
        self._outages = outages
        repriced = False  # a decision moved the estimate, or an operator the bounds
        for event in events:
            repriced |= event.kind in ("decided", "bounds")
            self._apply(event.kind, event.job_id, event.state, event.detail)
            self._seen_event = event.sequence
        if rows:
            self._seen_mark = EventMark.of(rows[-1])
        if repriced:
            assert estimate is not None  # read for the decisions and bounds events
            self._estimate, self._pins = estimate, pins
            self._ledger.set_bounds(self._bounds(estimate))
        return events

    def _saw_leader(self, holder: Holder | None) -> None:
        if holder is not None and (self.leader is None or holder.epoch != self.leader.epoch):
            self.log.info("leader", epoch=holder.epoch, address=holder.address,
                          host=holder.host, pid=holder.pid)  # fmt: skip
        self.leader = None if self._itself(holder) else holder
        if holder is not None:
            self.epoch_seen = max(self.epoch_seen, holder.epoch)
        self.lease_seen = time.monotonic()

    def _apply(self, kind: str, job_id: str, state: str, detail: dict[str, Any]) -> None:
        """One event's change of the ledger (see the module docstring)."""
        ledger = self._ledger
        if not job_id:
            return
        if kind == "cancelled":
            first = detail.get("from_slot") if isinstance(detail, dict) else None
            if job_id in ledger and isinstance(first, int):
                ledger.release(job_id, max(first, ledger.origin))
        elif (
            (kind == "decided" and state == "admitted")
            or kind in _RESYNC
            or (kind == "completed" and detail)
        ):
            self._resync(job_id)

    def _resync(self, job_id: str) -> None:
        """Make the job's plan in the ledger the one stored (see the module docstring)."""
        ledger = self._ledger
        plans = self._stored_plans(ledger.origin, job_id)
        found = self._stored_schedule(job_id, plans[job_id]) if job_id in plans else None
        if isinstance(found, _Misfit):
            self._unfitted += 1  # the configuration differs from the leader's
            self.log.warning("plan that no longer fits left out", job=job_id, why=found.why)
            found = None
        if job_id in ledger:
            ledger.release(job_id, ledger.schedule(job_id).start)
        if found is None:
            return
        job, schedule = found
        try:
            ledger.admit(job_id, job.worker, job.ps, schedule)
        except CapacityError as err:  # this standby's servers are smaller than the leader's
            self._unfitted += 1  # left out; a takeover rebuilds in full and refits it
            self.log.warning("plan that no longer fits left out", job=job_id,
                             why=f"over this standby's configured capacity: {err}")  # fmt: skip

    def _take_over_sync(self, epoch: int, lock_pid: int | None) -> int:
        """Lead in ``epoch`` (just recorded in the store) with the writer lock held by
        backend ``lock_pid``: apply what is not applied yet, record the servers and
        settings; returns the events applied. On failure this daemon stays a standby."""
        self._writer.drain()  # a commit of this daemon's last lead, if any, is over
        if self._stale:
            self._generation += 1  # rebuilt below; what failed before stays failed
        leader = self.leader
        self.lead(epoch, lock_pid)
        self._ids.discard()  # they missed the other leader's jobs: loaded again below
        self._start_committer()
        try:
            with self._write() as session:
                # the stored plans are slot numbers of the leader's slot grid: with another,
                # this node cannot lead this store (as it could not start on it)
                self._check_setup(session)
                differences = self._setup_differences(session)
                self._record_setup(session)
            if differences:  # this node decides by its own config from now on: say so
                self.log.warning("taking over with a config other than the last leader's",
                                 epoch=epoch, differences=differences[:20])  # fmt: skip
            applied = 0
            if self._unfitted or self._stale:
                # plans this standby left out (refit them as at start-up), or a ledger
                # that may miss a commit whose answer was lost: rebuild in full
                self._seen_event, self._seen_mark = self._last_event(), None
                self._reload()
                if self._rewound:  # found by the takeover's own writes: rebuilt just now
                    self.log.warning("ledger rebuilt from the rewound store",
                                     newest_event=self._seen_event, why=self._rewound)  # fmt: skip
                    self._rewound = ""
            else:
                while batch := self._follow_sync():
                    applied += len(batch)
                    if len(batch) < FOLLOW_BATCH:
                        break
            self._stale = False
            self._pending_slot = -1
            self._ticked_slot = -1
            self._stored = StoredBudget()  # what any leader stored, from the store
            self._restore_stored_budget()
            self._ids.start(self._ledger)  # in the background (a rebuild above started it)
        except BaseException:
            self.role = "standby"
            self.leader = leader  # not this node: clients are not sent back to it
            # a refit may have moved plans in the ledger that the store did not take:
            # rebuilt from the store at the next follow (before: the next takeover
            # followed on from this ledger, and held them as if committed)
            self._stale = True
            raise
        return applied

    def takeover_problem(self) -> str:
        """Why this standby cannot lead the store as it is ("" if it can): a newer oasis
        migrated it (:func:`~controller.store.database.newer_revision`), its slot grid
        is not that of the stored plans, or it lacks resources they demand (checked
        again once an event was applied since), its clock is too far from the last leader's
        (:meth:`_clock_problem`), or its servers or window would move plans another node
        admitted (:meth:`_moves_problem`). Reads the store only, so the election asks
        before it takes the lock and records an epoch."""
        try:
            with self.db.session() as session:
                newer = newer_revision(session.connection())
                if newer is not None:
                    return (
                        f"the store is at schema revision {newer[:64]!r}, which this oasis "
                        "does not know: a newer oasis migrated it. This node does not lead "
                        "it; upgrade it and restart it (README: Upgrades)"
                    )
                self._check_slot_grid(session)
                # the resources check reads every live job's spec (0.5 s at 50,000) and
                # the election asks every retry_seconds: made again only once an event
                # was applied since (the first review); skipped, a standby missing a
                # resource took the lock, failed, let it go, again and again (the second)
                if self._resources_checked_at != self._seen_event:
                    self._resources_problem = ""
                    try:
                        self._check_resources(session)
                    except SlotGridChangedError as err:
                        self._resources_problem = str(err)
                    self._resources_checked_at = self._seen_event
                if self._resources_problem:
                    return self._resources_problem
                holder = recorded_holder(session)
                differences = self._setup_differences(session) if self._unfitted else []
                mine = clock_offset(session, self.slots.clock.now)
        except SlotGridChangedError as err:
            return str(err)
        return self._clock_problem(holder, mine) or self._moves_problem(holder, differences)

    def _clock_problem(self, holder: Holder | None, mine: tuple[float, float] | None) -> str:
        """Why this node's clock must not number the slots after the last leader's ("" if
        it may): their skew, each measured against PostgreSQL's clock (:func:`clock_offset`),
        is over :func:`max_clock_skew`. Each node numbers slots by its own clock: one
        behind would let jobs arrive and a cancelled job's slots go that much early, one
        ahead would start and complete jobs early, and with a slot or more of skew the
        stored plans would move."""
        if holder is None or holder.clock_offset is None or mine is None:
            return ""  # no leader yet, one that recorded none (an older oasis), or SQLite
        offset, uncertainty = mine
        skew = offset - holder.clock_offset
        limit = max_clock_skew(self.config.slot_seconds)
        if abs(skew) - uncertainty <= limit:
            return ""
        where = "ahead of" if skew > 0 else "behind"
        leader = holder.address or holder.host or "unknown"
        return (
            f"this node's clock is {abs(skew):.3g} s {where} the clock of the node that led "
            f"last ({leader}), each measured against PostgreSQL's (at most {limit:g} s with "
            f"{self.config.slot_seconds:g} s slots): it would number the slots otherwise. "
            "Set the head nodes' clocks right (NTP: chronyc tracking, timedatectl)"
        )

    def _moves_problem(self, holder: Holder | None, differences: list[str]) -> str:
        """Why this standby's config would move plans the node that led last admitted
        ("" if it would not): stored plans that do not fit its servers or window, which a
        takeover would re-plan or fail (``config_changed``). A config forgotten on one
        node must not re-plan every tenant's jobs at a failover. The node that led last
        (the same ``advertise`` address), restarted with a changed config, applies it,
        as a single daemon's restart does: that is how a config change is rolled out."""
        if not self._unfitted:
            return ""
        if holder is not None and holder.address and holder.address == self.advertise:
            return ""
        if not differences:  # the leader's config: it would refit them alike (an outage)
            return ""
        now = time.monotonic()
        if now - self._unfitted_counted >= RECOUNT_SECONDS:
            # the count grows as plans are left out while following, never shrinks as
            # their jobs end: counted again from the store, in full
            self._decisions.call(self._reload).result(START_SECONDS)
            self._unfitted_counted = now
            if not self._unfitted:
                return ""
        leader = holder.address if holder is not None and holder.address else "unknown"
        return (
            f"{self._unfitted} stored plans do not fit this node's servers or window "
            f"(this config differs from the one the node that led last, {leader}, recorded: "
            f"{'; '.join(differences[:5])}); taking over would "
            "re-plan or fail them. Give this node that node's [cluster] and window, or, to "
            "change them, restart that node with the new config: the node that led last "
            "applies its own config when it takes over again"
        )

    def lead(self, epoch: int, lock_pid: int | None) -> None:
        """Lead from now in ``epoch``, fencing every write with it and ``lock_pid``."""
        self.role, self.fence_epoch, self.fence_pid = "leader", epoch, lock_pid
        self.epoch_seen = max(self.epoch_seen, epoch)
        self.lease_seen = time.monotonic()
        self.leader = this_process(epoch, self.advertise)

    def lead_again(self, epoch: int) -> None:
        """Without ``[ha]``: lead on in ``epoch``, recorded again by the store's watch over
        a ``writer`` row a restore rewound (:mod:`controller.store.watch`); a daemon its
        fence stepped down meanwhile decides again. With ``[ha]``, the election does."""
        if self.config.ha is None and self.fence_epoch is not None:
            self.lead(epoch, self.fence_pid)

    def _step_down(self, why: str) -> None:
        """Stop deciding: a standby from now (the ledger stays: all of it is committed)."""
        if self.role != "standby":
            self.log.warning("stepping down: now a standby", reason=why, epoch=self.fence_epoch)
        self.role = "standby"
        if self._itself(self.leader):
            self.leader = None

    def _itself(self, holder: Holder | None) -> bool:
        """True if ``holder`` is this node (its ``advertise`` address) while it does not
        lead: a standby names no leader then, rather than itself. Before, a leader that
        lost its lease with PostgreSQL down refused writes with `this oasisd is a standby:
        the leader is at` its own address, and `oasis status` listed it as its own
        leader (the HA audit)."""
        return (
            not self.leading
            and holder is not None
            and bool(holder.address)
            and holder.address == self.advertise
        )
