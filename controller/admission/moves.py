"""Moved plans: a job re-placed, re-planned or stranded after a server failed (the
execution plane) or the configuration shrank under it (:mod:`.recovery`), written to the
store with its event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import delete, insert
from sqlalchemy.orm import Session

from controller.admission.state import AdmissionState
from controller.events import Event
from controller.failed_reasons import failed_reason
from controller.replay import allocations as allocation_entries
from controller.store import AllocationRow, JobRow
from pricing import Job
from pricing.best_schedule import BestSchedule
from pricing.schedule import Schedule

__all__ = ["PLANNED_WORK", "Moves"]

PLANNED_WORK = "planned_work"
"""The key, in a job row's ``detail``, of the worker-slots its plan holds from the
window's first slot on, written when a re-plan holds more than the job's work: a server
failure adds back the work lost in its slot, a job behind its plan asks for what its
measured pace needs. A rebuild reads any more than the larger of the two as a hand
edit (:meth:`controller.admission.recovery.Recovery._unreadable_plan`)."""


class Moves(AdmissionState):
    """Store a job's new plan and say why; see the module docstring."""

    def _write_schedule(
        self, session: Session, job: Job, row: JobRow, schedule: Schedule, from_slot: int
    ) -> None:
        """Store ``schedule`` (the job's whole plan) from ``from_slot`` on as the job's
        allocations, and the most it holds from the window's first slot on if that is
        over the job's work (:data:`PLANNED_WORK`)."""
        session.execute(delete(AllocationRow).where(
            AllocationRow.job_id == job.id, AllocationRow.slot >= from_slot))  # fmt: skip
        held = schedule.after(self._ledger.origin).work()
        detail = row.detail if isinstance(row.detail, dict) else {}
        if held > job.work:
            row.detail = {**detail, PLANNED_WORK: held}  # a new dict: the ORM sees it
        elif PLANNED_WORK in detail:
            row.detail = {k: v for k, v in detail.items() if k != PLANNED_WORK}
        future = schedule.after(from_slot)
        if future.slots and (future.workers.any() or future.ps.any()):
            entries = allocation_entries(future, self.cluster)
            session.execute(insert(AllocationRow), self._allocation_rows(job.id, entries))
        if schedule.slots and schedule.workers.any():
            if row.state == "admitted":
                row.start_slot = schedule.start + int(np.flatnonzero(schedule.worker_counts())[0])
            row.completion_slot = schedule.end
            row.jct = schedule.end - job.arrival + 1
            row.utility = float(job.utility.values(row.jct))

    def _record_move(
        self,
        session: Session,
        now: datetime,
        job: Job,
        how: str,
        from_slot: int,
        detail: dict[str, Any],
        best: BestSchedule | None = None,
    ) -> Event:
        """Store the job's plan as the ledger now holds it from ``from_slot`` on, and its
        event: ``replanned`` (``how``: ``"replaced"`` or ``"replanned"``) or, for
        ``"stranded"``, ``failed`` (the job keeps only its past slots)."""
        row = session.get(JobRow, job.id)
        assert row is not None
        ledger = self._ledger
        if job.id in ledger:
            schedule = ledger.schedule(job.id)
        else:
            n_w, n_p = len(self.cluster.worker_names), len(self.cluster.ps_names)
            schedule = Schedule(
                from_slot, np.zeros((0, n_w), np.int32), np.zeros((0, n_p), np.int32)
            )
        planned = row.jct, row.utility
        self._write_schedule(session, job, row, schedule, from_slot)
        detail = {**detail, "how": how, "from_slot": from_slot}
        if how == "stranded":
            row.state = "failed"
            kept = schedule.slots and schedule.workers.any()
            row.completion_slot = schedule.end if kept else None
            # its jct and utility stay those it was planned to (the README's `planned`),
            # not those of the slots it ran: "planned: completion in slot 168, jct 1" was
            # said of a job planned to complete in slot 178
            row.jct, row.utility = planned
            row.reason = failed_reason(detail)
            return self._event(session, now, "failed", job.id, "failed", detail)
        if best is not None:
            detail["payoff"] = best.payoff
        return self._event(session, now, "replanned", job.id, row.state, detail)
