"""The stored jobs' ids (:class:`~.job_ids.JobIds`), loaded off the decision thread.

Every submission asks whether its id is stored already (:meth:`StoredIds.maybe_stored`).
The answer comes from the ids kept in memory, which are valid for one ledger: they are
read from the store again whenever the ledger is (re)built from it (at start, after a
store outage, at a takeover). That read takes 0.75 s with 10^6 jobs kept (SQLite), so it
runs in a thread of its own, started right after the rebuild (:meth:`StoredIds.start`),
and nothing waits for it: until it is installed, :meth:`StoredIds.maybe_stored` says
"maybe" for every id, and the caller reads the store for that id (a primary-key lookup,
as before these ids were kept), which is correct by itself. Read lazily in the decision
thread instead, it held the first submission after a start or an outage, and every
tenant's calls queued behind it, for those 0.75 s; read before the daemon served, it
made start-up 3 to 4 s longer (1.6 s to 4.8-5.5 s).

Why the installed ids miss no stored id (a miss is taken as certain). The load reads
the ids committed when its query runs (its snapshot, after :meth:`StoredIds.start`).
Every other id the decision thread stores was handed to the writer:

- before the start and not committed then: it is in the decision thread's uncommitted
  map at the start (``committing``), read into the load's ids then (the start runs in
  the decision thread between two steps, or at start-up before any, so a step's add
  and its entry in that map are both done); one committed by then is in the snapshot;
- after the start: :meth:`StoredIds.add` records it with the load, and the ids recorded
  are added to the load's when it is installed.

Only the decision thread installs a load, reads or changes the installed ids (the loader
thread builds its :class:`JobIds` and hands it over through a future), so none of this
needs a lock. Ids retention deletes while a load runs (:meth:`StoredIds.forget`) may be
in its snapshot and stay in the installed ids: a false "maybe", which a read of the
store settles, as for a digest that matches another id's. A commit that fails leaves
its id in too, the same way. A load is tied to the ledger it was started for: if the
ledger is rebuilt again meanwhile (another outage), the load is dropped when it ends,
unused, and one for the new ledger started. A load that fails (the store is down) is
logged, and started again at the next rebuild, or by the first lookup at least
:data:`RETRY_SECONDS` later; until then every lookup reads the store. A ledger replaced
without a rebuild through :meth:`~.recovery.Recovery._reload` (the execution plane's
re-plan after a failed commit) has its load started by its first lookup.

The load reads in one statement and one short read transaction: on SQLite (WAL) a
reader blocks no writer; on PostgreSQL it takes only the table's ACCESS SHARE lock,
which conflicts with no insert, update or delete (only ACCESS EXCLUSIVE: DDL, VACUUM
FULL, would wait for it). Its statement may take
:data:`~controller.store.REBUILD_SECONDS` on PostgreSQL, as a rebuild's may.

A standby never decides, so it loads nothing: its ledger follows the leader's events
and no lookup is made; at a takeover the ids are dropped (they missed the other leader's
jobs) and a load for the ledger it leads with is started.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy import select

from controller.admission.job_ids import JobIds
from controller.store import REBUILD_SECONDS, Database, JobRow

__all__ = ["RETRY_SECONDS", "StoredIds"]

RETRY_SECONDS = 10.0
"""After a load failed, lookups read the store for this long before one starts another
(each lookup then costs a primary-key read, as it does while any load runs)."""


class _Load:
    """A load in flight: the ledger it is for, its future (the ids read), and the ids
    the decision thread stored since it started (in order, repeats allowed)."""

    __slots__ = ("added", "future", "ledger")

    def __init__(self, ledger: object, future: Future[JobIds], added: list[str]) -> None:
        self.ledger = ledger
        self.future = future
        self.added = added


class StoredIds:
    """The stored jobs' ids for the current ledger, loaded in the background; see the
    module docstring. Every method but :meth:`close` is for the decision thread.

    Args:
        db: the store.
        committing: the ids of the decisions handed to the writer and not committed yet
            (called in the decision thread; read while the writer may change it).
        log: a structlog logger.
    """

    def __init__(self, db: Database, committing: Callable[[], Iterable[str]], log: Any) -> None:
        self._db = db
        self._committing = committing
        self.log = log
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="oasis-ids")
        self._ids: JobIds | None = None  # installed, for the ledger _ids_for
        self._ids_for: object | None = None
        self._load: _Load | None = None
        self._failed_at = -RETRY_SECONDS  # time.monotonic() of the last failed load

    def start(self, ledger: object) -> None:
        """Load the ids for ``ledger`` (just rebuilt) in the background, unless they are
        installed or loading already; the ids of an earlier ledger are dropped."""
        if self._ids_for is ledger or (self._load is not None and self._load.ledger is ledger):
            return
        self._ids = self._ids_for = None
        added = list(self._committing())  # before the query runs: see the module docstring
        self._load = _Load(ledger, self._loader.submit(self._read), added)

    def discard(self) -> None:
        """Drop the ids and any load in flight (a takeover: a standby's ids missed the
        other leader's jobs); the next :meth:`start` or lookup loads them again."""
        self._ids = self._ids_for = self._load = None

    def maybe_stored(self, job_id: str, ledger: object) -> bool:
        """False if ``job_id`` is certainly neither stored nor handed to the writer; True
        if it may be (a read of the store settles it), which is every id until the
        ids for ``ledger`` are installed."""
        ids = self._current(ledger)
        return ids is None or job_id in ids

    def add(self, job_id: str) -> None:
        """``job_id`` is handed to the writer (to be stored)."""
        if self._ids is not None:
            self._ids.add(job_id)
        if self._load is not None:
            self._load.added.append(job_id)

    def forget(self, job_ids: Iterable[str]) -> None:
        """``job_ids`` were deleted from the store (retention). During a load they may
        stay in its snapshot: a false "maybe", never a false "no"."""
        if self._ids is not None:
            self._ids.difference_update(job_ids)

    def wait(self, ledger: object, timeout: float | None = None) -> JobIds | None:
        """Wait for the load for ``ledger`` and install it (starting one if none runs);
        the ids then, None if it failed. Blocks the decision thread: for tests and
        benchmarks."""
        if self._current(ledger) is None and self._load is None:
            self.start(ledger)  # after a failed load: at once
        load = self._load
        if load is not None:
            try:
                load.future.exception(timeout)
            except TimeoutError:
                return None
        return self._current(ledger)

    def close(self) -> None:
        """Stop the loader thread, waiting for a load that runs (from any thread)."""
        self._loader.shutdown(wait=True, cancel_futures=True)

    # -- inside ---------------------------------------------------------------------------

    def _current(self, ledger: object) -> JobIds | None:
        """The installed ids for ``ledger``: a finished load for it installed first, a
        stale one dropped, a new one started if none is installed or running."""
        if self._ids_for is not ledger:
            self._ids = self._ids_for = None
        load = self._load
        if load is not None and load.ledger is not ledger:
            self._load = load = None  # a rebuild since it started: its ids are stale
        if load is not None and load.future.done():
            self._load = None
            self._install(load, ledger)
        retry = time.monotonic() - self._failed_at >= RETRY_SECONDS
        if self._ids is None and self._load is None and retry:
            self.start(ledger)
        return self._ids

    def _install(self, load: _Load, ledger: object) -> None:
        """Install the ids ``load`` read for ``ledger``, with those stored since it
        started; log a failed load instead."""
        try:
            ids = load.future.result()
        except Exception as err:  # the store is down: lookups read it meanwhile
            self._failed_at = time.monotonic()
            self.log.warning("stored job ids not loaded; each submission reads the store "
                             "for its id until they are", error=str(err) or repr(err),
                             retry_seconds=RETRY_SECONDS)  # fmt: skip
            return
        for job_id in load.added:
            ids.add(job_id)
        self._ids, self._ids_for = ids, ledger

    def _read(self) -> JobIds:
        """Every stored job's id (in the loader thread). Through the connection, not the
        ORM: 0.75 s for 10^6 ids against 0.98 s (2.8 s with ``yield_per``)."""
        started = time.perf_counter()
        with self._db.patient(REBUILD_SECONDS), self._db.session() as session:
            ids = JobIds(session.connection().execute(select(JobRow.id)).scalars())
        self.log.info("stored job ids loaded", jobs=ids.nbytes // 8,
                      seconds=round(time.perf_counter() - started, 3))  # fmt: skip
        return ids
