"""The pending queue: jobs submitted with a wait that were not admitted at once.

At every slot boundary ``s`` the pending jobs are decided again, the least recently
decided first, then in submission order, before any newcomer, against that slot's prices,
within a budget of search steps per submitter (``limits.pending_steps_per_submitter``;
see "The budget" below). A job's schedule may start at ``s + 1``, but its utility still
counts from its original arrival ``a`` (SPEC 1), so a schedule ending in slot ``t`` is
worth ``f(t - a + 1)`` and waiting costs what it should
(:func:`pricing.best_schedule.best_schedule`'s ``arrival``), and it must still end by
``a + T - 1``. The job's price bounds were
observed once, at its submission; a re-decision does not observe it again.

A pending job is admitted (it takes the next place in decision order, the order the
ledger is rebuilt in), stays pending, or expires: when its wait ends (its last slot
``wait_until_slot`` passed without an admission), when it can no longer finish by
``a + T - 1``, or when it can no longer pay off even at the lowest prices
(:func:`pricing.best_schedule.payoff_ceiling`). Each job's outcome is committed before
the ledger changes, and ``decided_slot`` records the slot it was decided in, so a
restarted daemon decides it again only at the next boundary.

The budget: the whole pass runs in one step of the decision thread, so every other
tenant's submit, quote and cancel waits for it. Each search is charged its bound
(:func:`controller.limits.search_size`, what ``limits.max_search_steps`` caps); a
submitter's jobs are searched in order until the next would take its steps past
``limits.pending_steps_per_submitter`` (its first search always runs, so a budget below
one job's bound still moves the queue). That job and the submitter's later ones are left
as they are, ``decided_slot`` unchanged, which puts them first at the next boundary (the
order is by ``decided_slot``): a rotation, so no job starves. Expiries that need no
search (a wait that ended, a job no longer valid or that can no longer pay off) are not
charged. One submitter's queue thus holds a boundary for at most about its budget.
All submitters' queues together are held to ``limits.pending_steps_per_boundary`` the
same way (the boundary's first search always runs; the jobs not reached stay as they
are and go first at the next boundary), so many submitters' queues hold a boundary no
longer than a few; ``max_pending`` still bounds the expiries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.admission.decide import DecisionCore
from controller.events import Event
from controller.limits import search_size
from controller.store import JobRow
from controller.store.decisions import last_job_sequence
from controller.store.stored import stored_spec
from pricing import ADMIT_THRESHOLD, SpecError
from pricing.best_schedule import payoff_ceiling
from pricing.errors import OasisError

__all__ = ["PendingQueue"]


class _Budget:
    """The search steps each submitter's pending jobs, and all of them together, may take
    at one boundary (``steps`` and ``total``)."""

    def __init__(self, steps: float, total: float = math.inf) -> None:
        self.steps = steps
        self.total = total
        self._used: dict[str | None, float] = {}  # math.inf: over, no more this boundary
        self._spent = 0.0  # all submitters together; math.inf: the boundary's is over

    def take(self, submitter: str | None, steps: float) -> bool:
        """Charge ``steps`` to ``submitter`` if they fit its budget and the boundary's
        (the first search of each always does); False if not, and the submitter (or,
        past the boundary's, everyone) is spent for this boundary."""
        used = self._used.get(submitter, 0.0)
        if self._spent and self._spent + steps > self.total:
            self._spent = math.inf
            return False
        if used and used + steps > self.steps:
            self._used[submitter] = math.inf
            return False
        self._used[submitter] = used + steps
        self._spent += steps
        return True

    def spent(self, submitter: str | None) -> bool:
        """Whether ``submitter``'s budget, or the boundary's, ran out at this boundary."""
        return self._spent == math.inf or self._used.get(submitter, 0.0) == math.inf

    @property
    def full(self) -> bool:
        """Whether the boundary's budget ran out."""
        return self._spent == math.inf

    def over(self) -> list[str]:
        """The submitters whose budget ran out (``"-"``: the one without a name)."""
        return sorted("-" if by is None else by for by, used in self._used.items()
                      if used == math.inf)  # fmt: skip


class PendingQueue(DecisionCore):
    """Decide the pending jobs again at a slot boundary; see the module docstring."""

    def _decide_pending(self) -> None:
        """Decide the pending jobs not yet decided in the current slot, the least recently
        decided first, then in submission order, each submitter's within its budget of
        search steps (module docstring); their events are held for the controller to
        publish. The jobs over budget are left for the next boundary."""
        if self._pending_slot == self.slot:  # done in this slot: no query per submission
            return
        self._sync_writes()  # jobs queued by decisions still being committed included
        with self.db.session() as session:
            rows = session.execute(
                select(JobRow.id, JobRow.submitter, JobRow.wait_until_slot)
                .where(JobRow.state == "pending")
                .where((JobRow.decided_slot < self.slot) | JobRow.decided_slot.is_(None))
                .order_by(func.coalesce(JobRow.decided_slot, -1), JobRow.sequence)
            ).all()
        limits = self.config.limits
        budget = _Budget(limits.pending_steps_per_submitter, limits.pending_steps_per_boundary)
        left = 0
        for job_id, submitter, until in rows:
            events = None
            ended = until is not None and until < self.slot  # expires with no search
            if ended or not budget.spent(submitter):
                try:
                    events = self._decide_waiting(job_id, partial(budget.take, submitter))
                except (OasisError, ValueError, TypeError, ArithmeticError) as err:
                    events = self._expire_unreadable(job_id, err)
            if events is None:
                left += 1
            else:
                self._held_events.extend(events)
        if left:
            self.log.info(
                "pending jobs left for the next boundary", jobs=left,
                submitters=budget.over(), budget=budget.steps,
                boundary_budget_spent=budget.full, boundary_budget=budget.total,
            )  # fmt: skip
        self._pending_slot = self.slot

    def _decide_waiting(self, job_id: str, afford: Callable[[float], bool]) -> list[Event] | None:
        """Decide one pending job again: its events, or None when its search is over its
        submitter's budget (``afford(steps)`` False): then nothing is written."""
        s, first = self.slot, self.slot + 1
        now = datetime.now(UTC)
        with self._write() as session:
            row = session.get(JobRow, job_id)
            if row is None or row.state != "pending":
                return []
            until = s if row.wait_until_slot is None else row.wait_until_slot
            if s > until:  # the daemon was down, or the job over budget, in its last slot
                return [self._expire(session, row, now, f"its wait ended in slot {until}")]
            bad = _unreadable_slots(row, s)
            if bad:  # an edit: the job cannot be decided, and only it is affected
                return [self._expire(session, row, now, f"no longer valid: {bad}")]
            try:
                job = self._parse(stored_spec(row.spec, row.id), row.arrival_slot)
                self.config.limits.check_job(job, self.cluster, self.window, row.submitter)
            except (SpecError, ValueError) as err:  # the cluster or limits changed since
                return [self._expire(session, row, now, f"no longer valid: {err}")]
            end = self._window_end(row.arrival_slot)
            if first + job.min_slots - 1 > end:
                why = (
                    f"it can no longer finish by slot {end}, the end of its window: it "
                    f"needs {job.min_slots} slots from slot {first}"
                )
                return [self._expire(session, row, now, why)]
            ceiling = payoff_ceiling(job, self._ledger, first, row.arrival_slot)
            if ceiling <= ADMIT_THRESHOLD:
                why = (
                    f"it can no longer pay off: starting in slot {first}, its utility less "
                    f"its work at the lowest prices is {ceiling:.6g}"
                )
                return [self._expire(session, row, now, why)]
            if not afford(search_size(job, self.cluster, self.window).steps):
                return None  # left as it was: first at the next boundary
            row.decided_slot = s
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
            row.sequence = last_job_sequence(session) + 1
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

    def _expire_unreadable(self, job_id: str, err: Exception) -> list[Event]:
        """Expire pending job ``job_id``, whose decision failed on what the store holds
        for it (``err``; a row edited by hand): it alone, so the other pending jobs and the
        slot clock go on. A store that cannot be written is an outage, raised as ever."""
        self.log.error("a pending job cannot be decided: expired", job=job_id,
                       error=f"{type(err).__name__}: {str(err)[:300]}")  # fmt: skip
        with self._write() as session:
            row = session.get(JobRow, job_id)
            if row is None or row.state != "pending":
                return []
            why = f"no longer valid: its stored row cannot be decided ({type(err).__name__})"
            return [self._expire(session, row, datetime.now(UTC), why)]

    def _expire(self, session: Session, row: JobRow, now: datetime, why: str) -> Event:
        row.decided_slot = self.slot
        row.state = "expired"
        row.reason = why
        row.decided_at = now
        self.log.info("expired", job=row.id, reason=why)
        return self._event(session, now, "expired", row.id, "expired", {"reason": why})


def _unreadable_slots(row: JobRow, slot: int) -> str:
    """What makes pending ``row``'s slots unusable at slot ``slot`` ("" if nothing): a
    submission slot that is not an integer from 0 to ``slot``, or an arrival that is not
    an integer from there to ``slot + 1``. The daemon writes neither; an edit can."""
    submitted, arrival = row.submitted_slot, row.arrival_slot
    if not (isinstance(submitted, int) and 0 <= submitted <= slot):
        return f"submitted_slot: must be an integer from 0 to {slot}, got {str(submitted)[:24]}"
    if not (isinstance(arrival, int) and submitted <= arrival <= slot + 1):
        return (f"arrival_slot: must be an integer from {submitted} to {slot + 1}, "
                f"got {str(arrival)[:24]}")  # fmt: skip
    return ""
