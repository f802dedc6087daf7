"""Retention: finished jobs are deleted from the store ``daemon.keep_days`` after they
ended, with their allocations, progress and events.

Without it the store holds every job ever submitted, and what the daemon does with the
whole history grows with it: the ids it loads at start and after an outage, the job
events the execution plane publishes again (retained) at every broker connection, and
the broker's memory for those. A job counts as ended in the slot it completed (or was
planned to, for a failed job), was cancelled from, or was last decided (rejected,
expired). Jobs that may still hold slots (pending, admitted, running) and rows an edit
left unreadable (their slot reads as None) are never deleted.

Deletion runs at each slot boundary, on the leader, :data:`PRUNE_BATCH` jobs per
decision-thread step, so decisions go on between batches. A deleted job's id is free
again (for any submitter), and a consumer of the plane's job events sees its retained
event cleared. ``oasis offline --store`` and ``oasis calibrate --store`` see only what is
kept. ``keep_days = 0`` (the default) keeps every job."""

from __future__ import annotations

import math

from sqlalchemy import and_, delete, func, or_, select

from controller.admission.decide import DecisionCore
from controller.store import AllocationRow, EventRow, JobRow, ProgressRow

__all__ = ["PRUNE_BATCH", "Retention"]

PRUNE_BATCH = 200
"""Jobs deleted in one transaction (one decision-thread step)."""

_DAY_SECONDS = 86400.0


class Retention(DecisionCore):
    """Delete the finished jobs past ``daemon.keep_days``; see the module docstring."""

    def _prune_cutoff(self) -> int | None:
        """The first slot whose finished jobs are kept (None: keep every job)."""
        keep = self.config.keep_days
        if keep <= 0:
            return None
        slots = math.ceil(keep * _DAY_SECONDS / self.config.slot_seconds - 1e-9)
        cutoff = self.slot - slots
        return cutoff if cutoff > 0 else None

    def _prune_sync(self, limit: int = PRUNE_BATCH) -> list[str]:
        """Delete up to ``limit`` jobs that ended before :meth:`_prune_cutoff`, oldest
        decision first, with their allocations, progress and events; their ids."""
        cutoff = self._prune_cutoff()
        if cutoff is None:
            return []
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
            ids = list(
                session.scalars(
                    select(JobRow.id).where(ended).order_by(JobRow.sequence).limit(limit)
                )
            )
            if not ids:
                return []
            for table in (AllocationRow, ProgressRow):
                session.execute(delete(table).where(table.job_id.in_(ids)))
            session.execute(delete(EventRow).where(EventRow.job_id.in_(ids)))
            session.execute(delete(JobRow).where(JobRow.id.in_(ids)))
        self._stored_ids().difference_update(ids)
        for forget in self.prune_hooks:
            forget(ids)
        self.log.info("finished jobs deleted", jobs=len(ids), ended_before_slot=cutoff,
                      keep_days=self.config.keep_days)  # fmt: skip
        return ids
