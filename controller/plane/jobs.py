"""The jobs the execution plane reacts to: their specs, parsed from the store once, and
the ledger changes that re-plan them, which never leave the ledger and the store apart.

Decision thread (:mod:`controller.plane.execution`), but for :meth:`Jobs.get`, which
the plan builder calls from a thread of its own too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.events import Event
from controller.plane.port import AdmissionPort
from controller.store import REBUILD_SECONDS, JobRow, in_batches
from controller.store.stored import stored_spec
from pricing import Job, Ledger

__all__ = ["ACTIVE", "Jobs"]

ACTIVE = ("admitted", "running")
"""Job states that appear in plans."""


class Jobs:
    """The specs of the jobs the plane reviews, re-plans and plans, each parsed from the
    store once and kept while the job is active (:meth:`forget`).

    Args:
        controller: the opened admission controller.
    """

    def __init__(self, controller: AdmissionPort) -> None:
        self.c = controller
        self.log = structlog.get_logger("oasisd")
        self.cache: dict[str, Job] = {}  # job id -> its parsed spec
        self._cache_lock = threading.Lock()  # get (any thread) against forget

    def get(self, job_id: str, session: Session | None = None, keep: bool = True) -> Job:
        """``job_id``'s spec (read in ``session``, or a session of its own, if not kept);
        KeyError if the store has no such job. ``keep`` False: a spec not kept already is
        parsed and not kept (a read of a job that is not active: a tenant's progress
        reads of its 5,000 rejected jobs kept 5,000 specs, 196 MB, until the next slot
        boundary; the cardinality audit)."""
        job = self.cache.get(job_id)
        if job is None:
            if session is None:
                with self.c.db.session() as s:
                    return self.get(job_id, s, keep)
            row = session.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            job = self.c._parse(stored_spec(row.spec, job_id), arrival=row.arrival_slot)
            if keep:
                with self._cache_lock:
                    self.cache[job_id] = job
        return job

    def load(self, job_ids: list[str], session: Session) -> None:
        """Parse and keep the specs of ``job_ids`` not kept yet, read in one query (a
        caller about to :meth:`get` each of many: one read each took 0.6 s of the
        decision thread for 1,000 jobs' first counts). A spec that does not parse is
        left for :meth:`get` to raise, for its job alone."""
        missing = [j for j in job_ids if j not in self.cache]
        for chunk in in_batches(missing):
            query = select(JobRow.id, JobRow.spec, JobRow.arrival_slot).where(JobRow.id.in_(chunk))
            for job_id, spec, arrival in session.execute(query):
                try:
                    job = self.c._parse(stored_spec(spec, job_id), arrival=arrival)
                except Exception:  # whatever it is, get() raises it for this job alone
                    continue
                with self._cache_lock:
                    self.cache[job_id] = job

    def forget(self, active: set[str]) -> None:
        """Forget the specs of jobs not in ``active``."""
        with self._cache_lock:
            for job_id in [j for j in self.cache if j not in active]:
                del self.cache[job_id]

    def last_slot(self, job: Job) -> int:
        """The last slot ``job`` may be planned in (its window's end)."""
        return self.c._window_end(job.arrival)

    def guarded(self, change: Callable[[], list[Event]]) -> list[Event]:
        """Run ``change`` (which changes the ledger, then commits); if the commit fails,
        rebuild the ledger from the store so the two never disagree."""
        try:
            return change()
        except Exception:
            self.log.exception("re-plan failed; rebuilding the ledger from the store")
            self._resync()
            raise

    def _resync(self) -> None:
        ledger = self.c._ledger
        self.c.ledger = Ledger(self.c.cluster, ledger.bounds, ledger.length, origin=ledger.origin)
        with self.c.db.patient(REBUILD_SECONDS):
            self.c._rebuild()
