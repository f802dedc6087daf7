"""The decision core: parse a spec, search its best schedule at current prices (Alg. 1),
commit the decision to the store, then apply it to the ledger."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from controller.admission.commit import Committed, DecisionRows, Deferred, GroupCommit
from controller.admission.stored_budget import over_budget
from controller.admission.views import DecisionView, JobView, canonical_spec
from controller.errors import ConflictError, QueueFullError, StoredBudgetError
from controller.events import Event
from controller.job_keys import keyed_spec
from controller.jobspec import check_job_worth, past_times, spec_differences
from controller.replay import allocations as allocation_entries
from controller.store import AllocationRow, JobRow
from pricing import ADMIT_THRESHOLD, Job, SpecError
from pricing.best_schedule import BestSchedule, best_schedule, payoff_ceiling
from pricing.bound_estimate import units_note
from pricing.durations import format_duration
from pricing.errors import check_all
from pricing.explain import explain as explain_decision
from pricing.prices import PriceBounds
from pricing.shared_estimate import SharedEstimate

__all__ = ["DecisionCore"]

_DIFFERENCES_SHOWN = 4
"""The fields a conflicting spec's message names at most (the rest are counted)."""


def _as_answer(answer: tuple[JobView, list[Event]]) -> tuple[JobView, list[Event]]:
    return answer


def _as_duplicate(answer: tuple[JobView, list[Event]]) -> tuple[JobView, list[Event]]:
    """A retried submission's answer: the first's, marked a duplicate, with no events."""
    return replace(answer[0], duplicate=True), []


class DecisionCore(GroupCommit):
    """Decide, commit, apply; see the module docstring."""

    def _decide(
        self, spec: dict[str, Any], by: str | None = None
    ) -> tuple[Job, BestSchedule, DecisionView, SharedEstimate]:
        """Compute a decision at the current slot; the ledger's bounds include the job,
        taken into its submitter ``by``'s estimate (:mod:`pricing.shared_estimate`).

        The caller restores the previous bounds if it does not commit."""
        self._advance_window()
        arrival = self.slot + 1
        job = self._parse(spec, arrival)
        check_all(  # independent: a job both worthless and too large hears of both
            lambda: check_job_worth(job, spec, slot_seconds=self.config.slot_seconds),
            lambda: self.config.limits.check_job(job, self.cluster, self.window, by),
        )
        estimate = self._estimate
        if self.config.pricing.mode == "estimate":
            estimate = self._estimate.observe(job, by)
            self._ledger.set_bounds(self._bounds(estimate))
        best, view = self._search(job, arrival, arrival)
        if not view.admitted:
            note = past_times(spec, arrival, self.slots.times)
            if self.config.pricing.mode == "estimate":
                note += units_note(estimate.fresh, job)
            if note:
                view = replace(view, reason=view.reason + note)
        return job, best, view, estimate

    def _search(
        self, job: Job, first: int, arrival: int, explain: bool = True
    ) -> tuple[BestSchedule, DecisionView]:
        """The best schedule of ``job`` in slots ``first .. arrival + T - 1`` (SPEC 1: a job
        arriving at ``a`` may be planned up to ``a + T - 1``, so ``jct <= T`` even after a
        wait), its utility counted from ``arrival`` (earlier than ``first`` for a job that
        waited), at the ledger's prices; a rejection is explained unless ``explain`` is
        False."""
        ledger = self._ledger
        started = time.perf_counter()
        last = self._window_end(arrival)
        best = best_schedule(job, ledger, first, last, arrival)
        admitted = best.payoff is not None and best.payoff > ADMIT_THRESHOLD
        reason = ""
        drivers: list[dict[str, Any]] = []
        if not admitted and explain:
            reason, found = explain_decision(best, job, ledger, first, last, arrival)
            drivers = [d.__dict__ for d in found]
        ms = (time.perf_counter() - started) * 1000.0
        view = DecisionView(
            admitted=admitted,
            payoff=best.payoff,
            cost=best.cost if admitted else None,
            completion_slot=best.completion_slot if admitted else None,
            jct=best.jct if admitted else None,
            utility=best.utility if admitted else None,
            arrival_slot=arrival,
            work=job.work,
            allocations=allocation_entries(best.schedule, self.cluster) if admitted else [],
            reason=reason,
            drivers=drivers,
            decision_ms=ms,
        )
        return best, view

    def _restore_bounds(self, previous: PriceBounds) -> None:
        """Undo the bound change of a decision that is not committed."""
        if self._ledger.bounds is not previous:
            self._ledger.set_bounds(previous)

    def _quote_sync(
        self, spec: dict[str, Any], by: str | None = None, owner: str | None = None
    ) -> tuple[DecisionView, JobView | None]:
        """The decision a submission of ``spec`` would get now, nothing committed; and
        the caller's stored job if its id is one with this spec (a submission returns
        that job's decision instead). An id a submission would conflict with is the same
        ConflictError here. ``spec``'s id is the caller's; the job's key is made from it
        and ``by`` (:func:`controller.job_keys.keyed_spec`).

        At a slot boundary the jobs already waiting are decided first, as for a
        submission (their decisions are the slot clock's, made a moment early; the quote
        itself writes nothing): before, a quote in the moment before the clock's tick
        was priced without the pending jobs that boundary admits, and said ``admitted``
        of a job the same submission a moment later found no room for. While the store
        refuses writes (its disk full, a DBA's refusal: ``Database.refusing``) the
        quote is priced without them, as before (reads and quotes go on)."""
        spec = keyed_spec(spec, by)
        self._advance_window()
        if not self.db.refusing:
            self._decide_pending()
        existing = self._quoted_job(spec, owner)
        previous = self._ledger.bounds
        try:
            return self._decide(spec, by)[2], existing
        finally:
            self._restore_bounds(previous)

    def _quoted_job(self, spec: dict[str, Any], owner: str | None) -> JobView | None:
        """The stored job whose id ``spec`` has, checked as a submission would be
        (:meth:`_check_duplicate`); None for a new id."""
        job_id = spec.get("id") if isinstance(spec, dict) else None
        if not isinstance(job_id, str) or not self._ids.maybe_stored(job_id, self._ledger):
            return None
        if job_id in self._uncommitted:
            self._sync_writes()  # its decision, as it will be read
        with self.db.session() as session:
            row = session.get(JobRow, job_id)
            if row is None:  # deleted (retention) meanwhile: the id is free
                return None
            self._check_duplicate(job_id, row.spec, row.submitter, canonical_spec(spec), owner)
            return self._view(session, row)

    def _submit_sync(
        self,
        spec: dict[str, Any],
        by: str | None,
        owner: str | None,
        wait_seconds: float | None = None,
    ) -> tuple[JobView, list[Event]] | Deferred[tuple[JobView, list[Event]]]:
        """Decide ``spec`` and apply it to the ledger; its commit is queued (:mod:`.commit`),
        so this returns a :class:`~controller.admission.commit.Deferred` answer (or, for a
        job stored already, its first decision at once). The job is stored under the key
        made from ``spec``'s id and ``by`` (:func:`controller.job_keys.keyed_spec`)."""
        spec = keyed_spec(spec, by)
        job_id = spec["id"]
        wait = self._wait(wait_seconds)
        canonical = canonical_spec(spec)
        # a new id needs no read of the store, once the stored ids are loaded (.id_index)
        if self._ids.maybe_stored(job_id, self._ledger):
            first = self._uncommitted.get(job_id)
            if first is not None:  # decided, its commit under way: answer as it is
                self._check_duplicate(job_id, first[0], first[1], canonical, owner)
                return Deferred(first[2], _as_duplicate)
            with self.db.session() as session:
                existing = session.get(JobRow, job_id)
                if existing is not None:
                    self._check_duplicate(
                        job_id, existing.spec, existing.submitter, canonical, owner
                    )
                    return self._view(session, existing, duplicate=True), []
            if job_id in self._ledger:  # admitted, committed, and gone from the store
                self._note_rewound(f"job {job_id!r} of this daemon's ledger is gone from the store")
                self._rebuild_stale()  # decided on the store as it is (.rewind)
        # what a submitter may have stored in a day (.stored_budget): checked before the
        # decision, counted once its write is queued
        stored_at, size = self.slots.clock.now(), len(canonical.encode())
        limit = self.config.limits.max_stored_mb_per_day
        over = over_budget(self._stored.used(by, stored_at), size, limit)
        if over:
            raise StoredBudgetError(over)
        # at a slot boundary the jobs already waiting are decided before a newcomer
        self._advance_window()
        self._decide_pending()
        previous = self._ledger.bounds
        try:
            job, best, view, estimate = self._decide(spec, by)
            wait_until = None
            if not view.admitted and wait > 0:
                wait_until, view = self._queue(job, view, wait, by)
            rows = self._decision_rows(job, best, view, canonical, estimate, by, wait_until)
            if view.admitted:  # first: if it raises, nothing of the decision is kept
                assert best.schedule is not None
                self._ledger.admit(job.id, job.worker, job.ps, best.schedule)
        except BaseException:
            self._restore_bounds(previous)
            raise
        self._estimate = estimate
        self._ids.add(job.id)
        submitted_slot = self.slot

        def finish(done: Committed) -> tuple[JobView, list[Event]]:
            """The answer, once committed (in the writer thread): the job as a read of
            the store would give it, built from the decision (no re-read)."""
            answer = JobView(
                id=job.id,
                spec=json.loads(canonical),
                state=rows.job["state"],
                decision=view,
                submitted_slot=submitted_slot,
                sequence=done.sequence,
                wait_until_slot=wait_until,
            )
            return answer, [done.event]

        def logged() -> None:
            self.log.info(
                "decided", job=job.id, admitted=view.admitted, payoff=view.payoff,
                cost=view.cost, jct=view.jct, arrival=view.arrival_slot,
                ms=round(view.decision_ms, 3), pending_until=wait_until,
                slots_scanned=best.slots_scanned, slots_priced=best.slots_priced,
                **({} if view.admitted else {"reason": view.reason[:300]}),
            )  # fmt: skip

        future = self._queue_write(rows, finish, logged)
        self._stored.add(by, stored_at, size)
        entry = (canonical, by, future)
        self._uncommitted[job.id] = entry
        future.add_done_callback(lambda _f: self._forget_uncommitted(job.id, entry))
        return Deferred(future, _as_answer)

    def _forget_uncommitted(self, job_id: str, entry: Any) -> None:
        if self._uncommitted.get(job_id) is entry:
            del self._uncommitted[job_id]

    def _check_duplicate(
        self,
        job_id: str,
        stored_spec: str,
        submitter: str | None,
        canonical: str,
        owner: str | None,
    ) -> None:
        """A stored (or committing) job's id submitted again: the same submitter and spec
        (as the daemon reads them: ``"chunks": 8.0`` is 8, ``"120m"`` is ``"2h"``) get its
        first decision; anything else is a conflict, which names the fields that differ
        (another submitter's spec is not shown)."""
        if owner is not None and submitter != owner:
            raise ConflictError(f"job id {job_id!r} is taken by another submitter")
        if stored_spec == canonical:
            return
        try:
            there, here = json.loads(stored_spec), json.loads(canonical)
        except (TypeError, ValueError, RecursionError):  # a row edited by hand
            there = here = None
        if not (isinstance(there, dict) and isinstance(here, dict)):
            raise ConflictError(f"job {job_id!r} exists with another spec")
        differences = spec_differences(
            there, here, slot_seconds=self.config.slot_seconds, times=self.slots.times
        )
        if differences:
            shown = "; ".join(differences[:_DIFFERENCES_SHOWN])
            more = len(differences) - _DIFFERENCES_SHOWN
            shown += f"; and {more} more" if more > 0 else ""
            raise ConflictError(
                f"job {job_id!r} exists with another spec ({shown}): give this job another id"
            )

    def _decision_rows(
        self,
        job: Job,
        best: BestSchedule,
        view: DecisionView,
        canonical: str,
        estimate: SharedEstimate,
        submitter: str | None = None,
        wait_until: int | None = None,
    ) -> DecisionRows:
        """The rows that store the decision; with ``wait_until`` set, a job not admitted
        is pending."""
        now = datetime.now(UTC)
        waiting = "rejected" if wait_until is None else "pending"
        state = "admitted" if view.admitted else waiting
        start = None
        if view.admitted and best.schedule is not None:
            start = int(best.schedule.start + np.flatnonzero(best.schedule.worker_counts())[0])
        job_row = {
            "id": job.id,
            "spec": canonical,
            "state": state,
            "submitted_slot": self.slot,
            "arrival_slot": view.arrival_slot,
            "work": view.work,
            "admitted": view.admitted,
            "payoff": view.payoff,
            "cost": view.cost,
            "start_slot": start,
            "completion_slot": view.completion_slot,
            "jct": view.jct,
            "utility": view.utility,
            "reason": view.reason,
            "detail": {"drivers": view.drivers},
            "decision_ms": view.decision_ms,
            "decided_at": now,
            "cancelled_slot": None,
            "submitter": submitter,
            "wait_until_slot": wait_until,
            "decided_slot": self.slot,
        }
        allocations = self._allocation_rows(job.id, view.allocations) if view.admitted else []
        value = estimate if self.config.pricing.mode == "estimate" else None
        detail = {"admitted": view.admitted, "payoff": view.payoff}
        event = self._event_row(now, "decided", job.id, state, detail)
        return DecisionRows(job_row, allocations, value, event)

    def _wait(self, asked: float | None) -> float:
        """The wait of a submission, seconds: ``asked``, or the configured default."""
        wait = self.config.wait_seconds if asked is None else asked
        longest = self.config.limits.max_wait_seconds
        if not math.isfinite(wait) or wait < 0:
            raise SpecError.one("wait_seconds", f"must be a finite number >= 0, got {wait!r}")
        if wait > longest:
            raise SpecError.one(
                "wait_seconds", f"{format_duration(wait)} ({wait:g} s) exceeds "
                f"limits.max_wait_seconds = {format_duration(longest)} ({longest:g} s)"
            )  # fmt: skip
        return wait

    def _queue(
        self, job: Job, view: DecisionView, wait: float, by: str | None
    ) -> tuple[int | None, DecisionView]:
        """Whether a job not admitted now may wait: the last slot it may be admitted at,
        or None (rejected, with the reason why waiting cannot help added to the view's).
        Raises QueueFullError when the submitter's (or everyone's) queue is full."""
        until = self.slots.slot_at(self.slots.clock.now() + wait)
        why = ""
        if until <= self.slot:
            why = f"the wait of {wait:g} s ends before the next slot boundary"
        elif self.slot + 1 + job.min_slots > self._window_end(job.arrival):
            why = (
                f"it needs {job.min_slots} slots, so after waiting a slot it could not end "
                f"by slot {self._window_end(job.arrival)}, the end of its window"
            )
        elif payoff_ceiling(job, self._ledger, self.slot + 2, job.arrival) <= ADMIT_THRESHOLD:
            why = "it cannot pay off after waiting even at the lowest prices"
        if why:
            return None, replace(view, reason=f"{view.reason}; not queued: {why}")
        limits = self.config.limits
        self._sync_writes()  # the pending jobs of decisions still being committed count
        with self.db.session() as session:
            pending = select(func.count()).select_from(JobRow).where(JobRow.state == "pending")
            everyone = int(session.scalar(pending) or 0)
            mine = pending.where(
                JobRow.submitter == by if by is not None else JobRow.submitter.is_(None)
            )
            own = int(session.scalar(mine) or 0)
        if own >= limits.max_pending_per_submitter:
            raise QueueFullError(
                f"not admitted now, and {own} of this submitter's jobs "
                f"{'is' if own == 1 else 'are'} pending already "
                f"(limits.max_pending_per_submitter = {limits.max_pending_per_submitter}); "
                f"submit it again later: {view.reason}"
            )
        if everyone >= limits.max_pending:
            raise QueueFullError(
                f"not admitted now, and {everyone} {'job is' if everyone == 1 else 'jobs are'} "
                f"pending already (limits.max_pending = {limits.max_pending}); submit it "
                f"again later: {view.reason}"
            )
        return until, view

    def _insert_allocations(
        self, session: Session, job_id: str, entries: list[dict[str, Any]]
    ) -> None:
        # one executemany, not an ORM object per row
        session.execute(insert(AllocationRow), self._allocation_rows(job_id, entries))
