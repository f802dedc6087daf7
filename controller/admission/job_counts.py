"""Jobs per state, counted in the store and shared by every reader for a bounded time.

The Prometheus scrape (``oasis_jobs``, ``oasis_payoff``) and the console's overview show
how many stored jobs are in each state. Counting them reads every job's index entry: with
a long history (10^6 jobs kept, ``keep_days = 0``) one count takes about 0.1 s on SQLite,
and the console's tabs ask again at every event. So a count is reused by all readers
until it is :attr:`StateCounts.max_age` seconds old, ``max(MIN_AGE_SECONDS,
AGE_PER_COUNT_SECOND x the count's own duration)``: whatever the history and however many
readers, the recounts of one kind (all jobs, or one submitter's) take at most
``1 / AGE_PER_COUNT_SECOND`` of a core, and their answer is at most that old. Every
daemon counts for itself from the store (a standby too: it reads, it does not decide), so
every change of state -- decisions, slot ticks, cancels, agents' reports, retention's
deletes -- shows within that age, whoever made it.

The payoffs summed are the stored ones that are finite numbers. One an edit made
something else (text, which SQLite keeps in any column and its ``sum`` counts as 0;
NaN or infinity, which PostgreSQL keeps and which would make the sum NaN or infinite)
is left out of the sum, and the job is logged once by id and column
(``stored payoff is not a number; left out of oasis_payoff``): before, ``payoff =
'lots'`` was counted as 0, silently.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    and_,
    case,
    func,
    not_,
    null,
    select,
    type_coerce,
    union_all,
)

from controller.admission.views import STATES
from controller.store import Database, JobRow

__all__ = ["AGE_PER_COUNT_SECOND", "EARNING_STATES", "MIN_AGE_SECONDS", "JobCounts", "StateCounts"]

MIN_AGE_SECONDS = 2.0
"""Seconds a count is reused at least, however quick it was: a burst of readers (the
tabs refreshing at an event, a scrape) shares one count."""
AGE_PER_COUNT_SECOND = 50.0
"""Seconds a count is reused per second it took: recounting costs at most 1/50 (2 %) of a
core per kind of count, whatever the history."""
EARNING_STATES = ("admitted", "running", "completed", "cancelled", "failed")
"""The states of an admitted job, whose payoffs are summed (the others' were never earned:
``pending``, ``rejected``, ``expired``)."""


@dataclass(frozen=True)
class StateCounts:
    """One count of the stored jobs, of all submitters or of one.

    Attributes:
        jobs: jobs per state, every state of :data:`~controller.admission.views.STATES`.
        payoff: the sum of the payoffs decided for the jobs of each of
            :data:`EARNING_STATES` (all submitters' count only; empty for one submitter's).
        counted_at: Unix time (seconds) when the count began.
        seconds: wall seconds the count took.
        max_age: seconds after ``counted_at`` this count is reused for, at most.
        started: ``time.monotonic()`` when the count began (the age's reference).
    """

    jobs: dict[str, int]
    payoff: dict[str, float]
    counted_at: float
    seconds: float
    max_age: float
    started: float = field(repr=False)


LOGGED_PAYOFFS = 100
"""Jobs whose stored payoff is not a number named in the log at most, in a process's
life (a store full of them does not flood the log); one is named once."""
_FINITE = (-sys.float_info.max, sys.float_info.max)


def _payoff_a_number() -> ColumnElement[bool]:
    """Whether a job's stored payoff is a finite number (SQL): text sorts after every
    number in SQLite, NaN after every number in PostgreSQL, and infinities lie outside
    the bounds."""
    return JobRow.payoff.between(*_FINITE)


class JobCounts:
    """The stored jobs per state, recounted at most every :attr:`StateCounts.max_age`.

    Thread-safe: the metrics thread and the store-read pool call :meth:`read`; readers of
    the same stale count wait for one recount and share it.

    Args:
        db: the store.
        clock: monotonic seconds (a test's fake clock).
        log: where a stored payoff that is not a number is named (None: not logged).
    """

    def __init__(
        self, db: Database, clock: Callable[[], float] = time.monotonic, log: Any = None
    ) -> None:
        self.db = db
        self.clock = clock
        self.log = log
        self._named: set[str] = set()  # jobs logged for their payoff (LOGGED_PAYOFFS)
        self._guard = threading.Lock()
        self._locks: dict[str | None, threading.Lock] = {}
        self._counts: dict[str | None, StateCounts] = {}

    def read(self, owner: str | None = None) -> StateCounts:
        """The jobs per state of submitter ``owner`` (None: all jobs, with the payoffs),
        counted at most :attr:`StateCounts.max_age` seconds ago. A failing store raises
        (SQLAlchemy's error) and leaves the last count in place for the next reader."""
        with self._guard:
            lock = self._locks.setdefault(owner, threading.Lock())
        with lock:
            last = self._counts.get(owner)
            if last is not None and self.clock() - last.started < last.max_age:
                return last
            fresh = self._count(owner)
            self._counts[owner] = fresh
            return fresh

    def age(self, counts: StateCounts) -> float:
        """Seconds since ``counts`` was counted."""
        return max(0.0, self.clock() - counts.started)

    def _count(self, owner: str | None) -> StateCounts:
        started, wall, t0 = self.clock(), time.time(), time.perf_counter()
        jobs = dict.fromkeys(STATES, 0)
        payoff = dict.fromkeys(EARNING_STATES, 0.0)
        with self.db.session() as session:
            if owner is None:
                # one statement (one snapshot, PostgreSQL included): the counts from the
                # (state, sequence) index alone, the payoffs from the admitted jobs' rows
                # only (1/10 of the history in bench.history_scale, 0.4 s -> 0.15 s at 10^6);
                # a payoff that is not a finite number is left out, and counted as bad
                number = _payoff_a_number()
                counted = select(JobRow.state, func.count(), null(), null())
                earned = (
                    select(
                        JobRow.state,
                        null(),
                        func.coalesce(func.sum(case((number, JobRow.payoff))), 0.0),
                        func.count(case((and_(JobRow.payoff.is_not(None), not_(number)), 1))),
                    )
                    .where(JobRow.state.in_(EARNING_STATES))
                    .group_by(JobRow.state)
                )
                rows: list[Any] = list(
                    session.execute(union_all(counted.group_by(JobRow.state), earned))
                )
                bad = 0
                for state, n, total, unread in rows:
                    if n is not None:
                        jobs[state] = int(n)
                    elif state in payoff:
                        payoff[state] = float(total or 0.0)
                        bad += int(unread or 0)
                if bad:
                    self._name_bad_payoffs(session)
            else:
                query = (
                    select(JobRow.state, func.count())
                    .where(JobRow.submitter == owner)
                    .group_by(JobRow.state)
                )
                jobs.update({state: int(n) for state, n in session.execute(query)})
                payoff = {}
        seconds = time.perf_counter() - t0
        max_age = max(MIN_AGE_SECONDS, AGE_PER_COUNT_SECOND * seconds)
        return StateCounts(jobs, payoff, wall, seconds, max_age, started)

    def _name_bad_payoffs(self, session: Any) -> None:
        """Log the jobs of the earning states whose stored payoff is not a finite number,
        each once (:data:`LOGGED_PAYOFFS` at most): it was left out of the sum."""
        if self.log is None or len(self._named) >= LOGGED_PAYOFFS:
            return
        query = (
            select(JobRow.id, JobRow.state, type_coerce(JobRow.payoff, String))
            .where(JobRow.state.in_(EARNING_STATES), JobRow.payoff.is_not(None))
            .where(not_(_payoff_a_number()))
            .order_by(JobRow.sequence)
            .limit(LOGGED_PAYOFFS)
        )
        for job_id, state, value in session.execute(query):
            if job_id in self._named or len(self._named) >= LOGGED_PAYOFFS:
                continue
            self._named.add(job_id)
            self.log.warning(
                "stored payoff is not a number; left out of oasis_payoff",
                job=str(job_id)[:128], state=state, column="jobs.payoff",
                value=repr(value)[:40],
                hint="set jobs.payoff to the job's payoff (a number), or NULL",
            )  # fmt: skip
