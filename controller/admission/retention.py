"""Retention: finished jobs are deleted from the store ``daemon.keep_days`` after they
ended, with their allocations, progress and events.

Without it the store holds every job ever submitted, and what the daemon does with the
whole history grows with it: the ids it loads at start and after an outage, the job
events the execution plane publishes again (retained) at every broker connection, and
the broker's memory for those. A job counts as ended in the slot it completed (or was
planned to, for a failed job), was cancelled from, or was last decided (rejected,
expired). Jobs that may still hold slots (pending, admitted, running) and rows an edit
left unreadable (their slot reads as None) are never deleted.

Deletion runs at each slot boundary, on the leader, in decision-thread steps, so
decisions go on between them: a pass walks the jobs in decision order, each step reading
at most :data:`PRUNE_SCAN` of them from where the last stopped and deleting at most
:data:`PRUNE_BATCH`, so a step costs the same in a store of 10^4 jobs or of 10^6 (one
query that picked the oldest ended jobs sorted all of them at every step: 0.05 s a
batch at 10^5 jobs, 0.5 s at 10^6); a pass that finds nothing to delete costs about a
tenth of that in all, in steps of about 10 ms. A ``sequence`` an edit left unreadable
ends a pass where a step meets it. A deleted job's id is free again (for its submitter:
:mod:`controller.job_keys`), and a consumer of the plane's job events sees its retained
event cleared.

The servers' history goes the same way, after the jobs' (:meth:`Retention._prune_servers_sync`):
an outage (a failure or a cordon) that ended before the cutoff, once it is also past the
ledger's window and past ``MAX_FLAP_SECONDS`` (7 days, the longest ``[mqtt] flap_seconds``
that counts failures), and the events of no job (``server_failed``,
``server_recovered``, ``server_cordoned``, ``server_uncordoned``, ``bounds``) of slots
before the cutoff. Before, they were kept for ever: one row and two events per failure. ``oasis
offline --store`` and ``oasis calibrate --store`` see only what is kept. ``keep_days =
0`` (the default) keeps every job. How far the deletions reach is recorded in the store
(:mod:`controller.store.retention_mark`), so that ``oasis offline --store`` compares no
stretch whose neighbours are gone without saying so.

A deletion never takes the store's newest event without a newer one in its place: a
transaction that deleted it writes a ``history_deleted`` event of no job (what was
deleted: ``jobs`` or ``events``, and ``ended_before_slot``), numbered past it. Before, a
quiet store (nothing happened for ``keep_days``) lost its newest events, and the daemon
read the store as rewound under it (:mod:`.rewind`): an error in the journal and a
needless rebuild of the ledger; on SQLite, whose event numbers follow the highest one
kept, the next event took a deleted one's number again. The event is in the store's log
(a standby reads it and passes over it, as every event of no job); it is not sent to
live event streams."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, and_, delete, func, or_, select
from sqlalchemy.orm import Session

from controller.admission.decide import DecisionCore
from controller.clock import slots_for
from controller.plane.settings import MAX_FLAP_SECONDS
from controller.store import AllocationRow, EventRow, JobRow, OutageRow, ProgressRow
from controller.store.retention_mark import mark_deleted_before

__all__ = ["PRUNE_BATCH", "PRUNE_SERVER_STEPS", "Retention"]

PRUNE_BATCH = 200
"""Jobs deleted in one transaction (one decision-thread step) at most."""
PRUNE_SERVER_STEPS = 100
"""Steps of the servers' history in one pass at most (``PRUNE_BATCH`` rows of each kind)."""
PRUNE_SCAN = 10_000
"""Jobs one step looks through at most, in decision order, for those to delete."""

_DAY_SECONDS = 86400.0


class Retention(DecisionCore):
    """Delete the finished jobs past ``daemon.keep_days``; see the module docstring."""

    def _prune_cutoff(self) -> int | None:
        """The first slot whose finished jobs are kept (None: keep every job)."""
        keep = self.config.keep_days
        if keep <= 0:
            return None
        cutoff = self.slot - slots_for(keep * _DAY_SECONDS, self.config.slot_seconds)
        return cutoff if cutoff > 0 else None

    def _prune_sync(self, limit: int = PRUNE_BATCH, after: int = 0) -> tuple[list[str], int | None]:
        """One step of a pass: read up to :data:`PRUNE_SCAN` jobs in decision order from
        sequence ``after`` on, and delete the first ``limit`` of them that ended before
        :meth:`_prune_cutoff`, with their allocations, progress and events. Returns their
        ids and the sequence the next step goes on after (None: the pass is over)."""
        cutoff = self._prune_cutoff()
        if cutoff is None:
            return [], None
        ended = or_(
            and_(
                JobRow.state.in_(("completed", "failed")),
                func.coalesce(JobRow.completion_slot, JobRow.decided_slot, JobRow.submitted_slot)
                < cutoff,
            ),
            and_(JobRow.state == "cancelled", JobRow.cancelled_slot < cutoff),
            and_(
                JobRow.state.in_(("rejected", "expired")),
                func.coalesce(JobRow.decided_slot, JobRow.submitted_slot) < cutoff,
            ),
        )
        with self._write() as session:
            # the step's stretch: the next PRUNE_SCAN jobs in decision order, bounded by
            # the unique index on sequence whatever the history holds; the jobs to delete
            # are picked in it by the store, so a stretch with none costs no rows read
            # out (a pass over 10^5 jobs, none to delete: 50 steps, 0.41 s in all when
            # each stretch's rows were read out, 10 steps and 0.10 s now)
            upper = session.scalar(
                select(JobRow.sequence).where(JobRow.sequence > after)
                .order_by(JobRow.sequence).offset(PRUNE_SCAN - 1).limit(1)
            )  # fmt: skip
            stretch = JobRow.sequence > after
            if isinstance(upper, int):
                stretch = and_(stretch, JobRow.sequence <= upper)
            found = session.execute(
                select(JobRow.id, JobRow.sequence).where(stretch, ended)
                .order_by(JobRow.sequence).limit(limit)
            ).all()  # fmt: skip
            ids = [job_id for job_id, _ in found]
            readable = [seq for _, seq in found if isinstance(seq, int)]
            if len(found) == limit:  # more may follow in the stretch: go on after these
                following = max(readable) if readable and max(readable) > after else None
            else:  # an edit may leave a sequence that does not read: the pass ends there
                following = upper if isinstance(upper, int) else None
            if not ids:
                return [], following
            for table in (AllocationRow, ProgressRow):
                session.execute(delete(table).where(table.job_id.in_(ids)))
            newest = _newest_event(session)
            if newest is not None and newest.job_id in ids:
                self._number_on(session, {"jobs": len(ids), "ended_before_slot": cutoff})
            session.execute(delete(EventRow).where(EventRow.job_id.in_(ids)))
            session.execute(delete(JobRow).where(JobRow.id.in_(ids)))
            mark_deleted_before(session, cutoff)
        self._ids.forget(ids)
        for forget in self.prune_hooks:
            forget(ids)
        self.log.info("finished jobs deleted", jobs=len(ids), ended_before_slot=cutoff,
                      keep_days=self.config.keep_days)  # fmt: skip
        return ids, following

    def _number_on(self, session: Session, detail: dict[str, Any]) -> None:
        """In a transaction about to delete the store's newest event: write a
        ``history_deleted`` event first (of no job; ``detail``: what is deleted), numbered
        past it, so the store's newest event number never goes back (module docstring).
        Written before the deletion: SQLite numbers a new row past the highest one left."""
        self._event(session, datetime.now(UTC), "history_deleted", "", "", detail)

    def _prune_servers_sync(self, limit: int = PRUNE_BATCH) -> int:
        """One step: delete up to ``limit`` ended outage rows and up to ``limit`` events
        of no job past the cutoff (module docstring); returns how many rows in all."""
        cutoff = self._prune_cutoff()
        if cutoff is None:
            return 0
        ended = min(cutoff, self._ledger.origin)
        since = datetime.now(UTC) - timedelta(seconds=MAX_FLAP_SECONDS)
        with self._write() as session:
            outages = list(session.scalars(
                select(OutageRow.id).where(OutageRow.up_from < ended,
                                           OutageRow.detected_at < since)
                .order_by(OutageRow.id).limit(limit)
            ))  # fmt: skip
            if outages:
                session.execute(delete(OutageRow).where(OutageRow.id.in_(outages)))
            events = list(session.scalars(
                select(EventRow.sequence).where(EventRow.job_id == "", EventRow.slot < cutoff)
                .order_by(EventRow.sequence).limit(limit)
            ))  # fmt: skip
            if events:
                newest = _newest_event(session)
                if newest is not None and newest.sequence in events:
                    self._number_on(session, {"events": len(events), "ended_before_slot": cutoff})
                session.execute(delete(EventRow).where(EventRow.sequence.in_(events)))
            if outages:
                mark_deleted_before(session, ended)
        if outages or events:
            self.log.info("servers' history deleted", outages=len(outages), events=len(events),
                          ended_before_slot=cutoff, keep_days=self.config.keep_days)  # fmt: skip
        return len(outages) + len(events)


def _newest_event(session: Session) -> Row[int, str] | None:
    """The store's newest event: its number and job (None: there is none)."""
    newest = select(EventRow.sequence, EventRow.job_id).order_by(EventRow.sequence.desc())
    return session.execute(newest.limit(1)).first()
