"""The pending queue: jobs submitted with a wait that were not admitted at once.

At every slot boundary ``s`` each pending job is decided again, in submission order,
against that slot's prices: its schedule may start at ``s + 1``, but its utility still
counts from its original arrival ``a`` (SPEC 1), so a schedule ending in slot ``t`` is
worth ``f(t - a + 1)`` and waiting costs what it should
(:func:`pricing.best_schedule.best_schedule`'s ``arrival``). The job's price bounds were
observed once, at its submission; a re-decision does not observe it again.

A pending job is admitted (it takes the next place in decision order, the order the
ledger is rebuilt in), stays pending, or expires: when its wait ends (its last slot
``wait_until_slot`` passed without an admission) or when it can no longer pay off even at
the lowest prices (:func:`pricing.best_schedule.payoff_ceiling`). Each job's outcome is
committed before the ledger changes, and ``decided_slot`` records the slot it was decided
in, so a restarted daemon decides it again only at the next boundary.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.admission.decide import DecisionCore
from controller.events import Event
from controller.store import JobRow
from pricing import ADMIT_THRESHOLD, SpecError
from pricing.best_schedule import payoff_ceiling

__all__ = ["PendingQueue"]


class PendingQueue(DecisionCore):
    """Decide the pending jobs again at a slot boundary; see the module docstring."""

    def _decide_pending(self) -> None:
        """Decide every pending job not yet decided in the current slot, in submission
        order; their events are held for the controller to publish."""
        if self._pending_slot == self.slot:  # done in this slot: no query per submission
            return
        self._sync_writes()  # jobs queued by decisions still being committed included
        with self.db.session() as session:
            ids = session.scalars(
                select(JobRow.id)
                .where(JobRow.state == "pending")
                .where((JobRow.decided_slot < self.slot) | JobRow.decided_slot.is_(None))
                .order_by(JobRow.sequence)
            ).all()
        for job_id in ids:
            self._held_events.extend(self._decide_waiting(job_id))
        self._pending_slot = self.slot

    def _decide_waiting(self, job_id: str) -> list[Event]:
        s, first = self.slot, self.slot + 1
        now = datetime.now(UTC)
        with self._write() as session:
            row = session.get(JobRow, job_id)
            if row is None or row.state != "pending":
                return []
            until = s if row.wait_until_slot is None else row.wait_until_slot
            row.decided_slot = s
            if s > until:  # the daemon was down across the end of the wait
                return [self._expire(session, row, now, f"its wait ended in slot {until}")]
            try:
                job = self._parse(json.loads(row.spec), row.arrival_slot)
                self.config.limits.check_job(job, self.cluster, self.window)
            except (SpecError, ValueError) as err:  # the cluster or limits changed since
                return [self._expire(session, row, now, f"no longer valid: {err}")]
            ceiling = payoff_ceiling(job, self._ledger, first, row.arrival_slot)
            if ceiling <= ADMIT_THRESHOLD:
                why = (
                    f"it can no longer pay off: starting in slot {first}, its utility less "
                    f"its work at the lowest prices is {ceiling:.6g}"
                )
                return [self._expire(session, row, now, why)]
            best, view = self._search(job, first, row.arrival_slot, explain=s >= until)
            row.payoff = view.payoff
            row.decision_ms = view.decision_ms
            if not view.admitted:
                if s < until:
                    return []
                row.detail = {"drivers": view.drivers}
                why = f"not admitted by slot {until}, when its wait ended: {view.reason}"
                return [self._expire(session, row, now, why)]
            assert best.schedule is not None
            row.sequence = (session.scalar(select(func.max(JobRow.sequence))) or 0) + 1
            row.state = "admitted"
            row.admitted = True
            row.cost = view.cost
            row.start_slot = int(
                best.schedule.start + np.flatnonzero(best.schedule.worker_counts())[0]
            )
            row.completion_slot = view.completion_slot
            row.jct = view.jct
            row.utility = view.utility
            row.reason = ""
            row.detail = {"drivers": []}
            row.decided_at = now
            session.flush()
            self._insert_allocations(session, job.id, view.allocations)
            waited = s - row.submitted_slot
            detail = {"admitted": True, "payoff": view.payoff, "waited_slots": waited}
            event = self._event(session, now, "decided", job.id, "admitted", detail)
        # committed: only now may the ledger change
        self._ledger.admit(job.id, job.worker, job.ps, best.schedule)
        self.log.info(
            "admitted after waiting", job=job.id, payoff=view.payoff, jct=view.jct,
            waited_slots=waited,
        )  # fmt: skip
        return [event]

    def _expire(self, session: Session, row: JobRow, now: datetime, why: str) -> Event:
        row.state = "expired"
        row.reason = why
        row.decided_at = now
        self.log.info("expired", job=row.id, reason=why)
        return self._event(session, now, "expired", row.id, "expired", {"reason": why})
