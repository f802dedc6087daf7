"""The slot clock's side of the controller: move the window, move jobs through their
states (pending -> admitted -> running -> completed) and cancel jobs."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from controller.admission.state import AdmissionState
from controller.admission.views import LIVE_STATES, JobView
from controller.errors import NotFoundError, PreconditionError
from controller.events import Event
from controller.limits import check_job_key
from controller.store import AllocationRow, EventRow, JobRow

__all__ = ["TICK_BATCH", "Lifecycle", "TickCursor"]

TICK_BATCH = 200
"""The most jobs one step of the slot tick moves (:meth:`Lifecycle._tick_sync`): about
60 ms; the others' calls go in between steps."""

TickCursor = tuple[int, int]
"""Where the slot tick goes on: ``(slot, decision sequence of the last job walked)``."""


class Lifecycle(AdmissionState):
    """Slot ticks and cancellation; see the module docstring."""

    def _cancel_sync(
        self, job_id: str, owner: str | None = None, by: str | None = None
    ) -> tuple[JobView, int, list[Event]]:
        """Cancel ``job_id``; with ``owner`` set, only if that submitter submitted it
        (another's reads as missing, as :meth:`get` says). ``by``: who asked, recorded
        in the event."""
        check_job_key(job_id, "id")
        self._advance_window()
        release_from = self.slot + 1
        now = datetime.now(UTC)
        with self._write() as session:
            row = session.get(JobRow, job_id)
            if row is None or (owner is not None and row.submitter != owner):
                raise NotFoundError(f"no job {job_id!r}")
            if row.state == "cancelled":
                # a retried cancel (its answer lost) gets the first answer again
                return self._view(session, row), self._released(session, job_id), []
            if row.state not in LIVE_STATES:
                raise PreconditionError(f"job {job_id!r} is {row.state}; only pending, admitted "
                                        "or running jobs can be cancelled")  # fmt: skip
            arrival = row.arrival_slot  # None or far out: an edit's (its plan from now on)
            if isinstance(arrival, int) and arrival < 1 << 53:
                release_from = max(release_from, arrival)
            released = int(session.scalar(
                select(func.coalesce(func.sum(AllocationRow.workers), 0)).where(
                    AllocationRow.job_id == job_id, AllocationRow.slot >= release_from)
            ) or 0)  # fmt: skip
            session.execute(delete(AllocationRow).where(
                AllocationRow.job_id == job_id, AllocationRow.slot >= release_from))  # fmt: skip
            last = session.scalar(select(func.max(AllocationRow.slot)).where(
                AllocationRow.job_id == job_id, AllocationRow.workers > 0))  # fmt: skip
            row.state = "cancelled"
            row.cancelled_slot = release_from
            row.completion_slot = last
            event = self._event(
                session,
                now,
                "cancelled",
                job_id,
                "cancelled",
                {"released_worker_slots": released, "from_slot": release_from}
                | ({"by": by} if by else {}),
            )
            view = self._view(session, row)
        if job_id in self._ledger:
            self._ledger.release(job_id, release_from)
        self.log.info("cancelled", job=job_id, from_slot=release_from, released=released, by=by)
        return view, released, [event]

    @staticmethod
    def _released(session: Session, job_id: str) -> int:
        """The worker-slots the job's (first) cancellation released, from its event."""
        detail = session.scalar(select(EventRow.detail).where(
            EventRow.job_id == job_id, EventRow.kind == "cancelled"
        ).order_by(EventRow.sequence).limit(1))  # fmt: skip
        value = (detail or {}).get("released_worker_slots", 0)
        return int(value) if isinstance(value, int) else 0

    def _advance_window(self) -> None:
        slot = self.slots.current_slot()
        if slot > self.slot:
            self.slot = slot
            self._ledger.advance(slot)
            self._window_moved()

    def _tick_sync(self, cursor: TickCursor = (-1, 0)) -> tuple[list[Event], TickCursor | None]:
        """Move the window to the current slot, decide the pending jobs again, and move
        at most :data:`TICK_BATCH` jobs through their states; returns their events and
        where the next step goes on (``(slot, sequence)``: the running jobs past their
        plan are walked in decision order, since those whose agents are still reporting
        stay running), or None once every job of the slot has moved, when the slot
        counts as ticked. One step of many tiny jobs held every tenant's calls for
        seconds (0.3 ms a job) at the slot where they started or ended."""
        self._advance_window()
        self._decide_pending()
        s = self.slot
        after = cursor[1] if cursor[0] == s else 0  # a new slot: from the start again
        now = datetime.now(UTC)
        events: list[Event] = []
        with self._write() as session:
            starting = session.scalars(
                select(JobRow).where(JobRow.state == "admitted", JobRow.start_slot <= s)
                .order_by(JobRow.sequence).limit(TICK_BATCH)
            ).all()  # fmt: skip
            for row in starting:
                row.state = "running"
                events.append(self._event(session, now, "running", row.id, "running", {}))
            room = TICK_BATCH - len(starting)
            ended: list[JobRow] = []
            if room > 0:
                ended = list(
                    session.scalars(
                        select(JobRow)
                        .where(JobRow.state == "running", JobRow.completion_slot < s)
                        .where(JobRow.sequence > after)
                        .order_by(JobRow.sequence).limit(room)
                    ).all()
                )  # fmt: skip
            # With the execution plane, a job whose agents reported less than its work
            # stays running past its plan: it completes when they report the rest, or
            # fails if they do not (Execution.review_sync).
            unfinished = self.execution.unfinished if self.execution is not None else None
            done = [r for r in ended if unfinished is None or not unfinished(r.id, session)]
            for row in done:
                row.state = "completed"
                events.append(self._event(session, now, "completed", row.id, "completed", {}))
        if events:
            self.log.info("slot", slot=s, started=len(starting), completed=len(done))
        if len(starting) + len(ended) < TICK_BATCH:
            self._ticked_slot = s
            return events, None
        return events, (s, ended[-1].sequence if ended else after)

    def _tick_all(self) -> None:
        """Every step of :meth:`_tick_sync` at once (at start, before any call)."""
        cursor: TickCursor | None = (-1, 0)
        while cursor is not None:
            _, cursor = self._tick_sync(cursor)
