"""The store, watched: whether it answers (the daemon's health follows it) and whether
this daemon still holds its writer lock.

:meth:`StoreWatch.check` runs every second or so (a periodic event of the daemon), its
store calls in a thread and bounded by the store's timeout (``database.py``):

1. ``Database.ping``: the store answers or not. A change is logged and passed to
   ``on_change``, which turns the gRPC health to NOT_SERVING while the store is out of
   reach and back to SERVING after. Then, on PostgreSQL, ``Database.check_writes``: the
   store takes a decision's writes or refuses them (a DBA's ``REVOKE``, a read-only
   database, a moved ``search_path``: :mod:`.refusals`, as the last commit found too).
   A change of :attr:`StoreWatch.writes_refused` is logged and passed to ``on_change``
   as well, which turns the Admission service (the writes) NOT_SERVING meanwhile.
2. The writer lock (``writer_lock.py``): on PostgreSQL it lives as long as its session;
   after a PostgreSQL restart the lock is gone. The watch takes it again if the store
   still records this daemon's epoch (every write is fenced with that epoch:
   ``AdmissionState._write``). If another daemon took it meanwhile (and recorded its own
   epoch, so this one's writes fail from then on), this one must stop deciding:
   :attr:`StoreWatch.lost` says why and ``on_lost`` is called (the daemon stops, exit 1).
   With ``[ha]`` the lock is a lease kept by the election instead
   (``controller/ha/leadership.py``): a daemon that loses it becomes a standby.
3. The ``writer`` row while the lock is held: nobody else can record an epoch then, so
   a row older than this daemon's epoch (or none) means the store was rewound under it
   (a backup restored while it runs). Its writes, fenced with its epoch, would all fail
   and it would stop deciding for good (each call: "a standby: no leader known yet"):
   the watch records this daemon again, above its old epoch, says so, and passes the
   new epoch to ``on_epoch`` (the controller leads on in it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from sqlalchemy.exc import DBAPIError

from controller.store.database import Database, StoreUnavailableError
from controller.store.writer_lock import WriterLock, recorded_holder

__all__ = ["StoreWatch", "WriterLockLostError"]

PROBE_SECONDS = 1.0
"""How often the daemon checks its store."""


class WriterLockLostError(Exception):
    """Another daemon holds the writer lock this one held: this one must stop."""


class StoreWatch:
    """Probes ``db`` and keeps ``lock``; see the module docstring.

    Args:
        db: the store.
        lock: its writer lock, held by this process; None: none to keep.
        on_change: awaited with True (reachable again) or False (out of reach), and
            with :attr:`up` when :attr:`writes_refused` changes.
        on_lost: called once if the lock was taken over by another process.
        on_epoch: called with this daemon's new epoch once the ``writer`` row, found
            rewound under the lock, is recorded again (item 3 of the module docstring).
    """

    def __init__(
        self,
        db: Database,
        lock: WriterLock | None,
        on_change: Callable[[bool], Awaitable[None]],
        on_lost: Callable[[], None],
        log: Any = None,
        on_epoch: Callable[[int], None] | None = None,
    ) -> None:
        self.db = db
        self.lock = lock
        self.on_change = on_change
        self.on_lost = on_lost
        self.on_epoch = on_epoch
        self.log = log or structlog.get_logger("oasisd")
        self.up = True
        self.writes_refused = ""  # why the store refuses this daemon's writes; "" if not
        self.lost = ""
        self._lock_error = ""  # why the lock was last not taken again ("" : it was)

    async def check(self) -> None:
        """Probe once; tell ``on_change`` and ``on_lost`` what changed."""
        if self.lost:
            return
        up, lost = await asyncio.to_thread(self._probe)
        if lost:
            self.lost = lost
            self.log.error("writer lock lost", reason=lost)
            self.on_lost()
            return
        # out of reach, the store's writes are the health's least concern: kept as known
        refused = self.db.refusing if up else self.writes_refused
        if up == self.up and refused == self.writes_refused:
            return
        if up != self.up:
            if up:
                self.log.info("store reachable again")
            else:
                # the probe's SELECT 1 may go through on a pooled connection while the
                # lock's new one is refused (the database's connection limit reached)
                reason = self.db.down_reason or self._lock_error
                self.log.warning("store unreachable", reason=reason)
        if bool(refused) != bool(self.writes_refused):
            if refused:
                self.log.warning("the store refuses writes: admission not serving",
                                 reason=refused)  # fmt: skip
            else:
                self.log.info("the store takes writes again: admission serving")
        self.up, self.writes_refused = up, refused
        await self.on_change(up)

    def _probe(self) -> tuple[bool, str]:
        """(reachable, why the lock is lost or "")."""
        if not self.db.ping():
            return False, ""
        self.db.check_writes()
        if self.lock is None or self.lock.held():
            self._lock_error = ""
            if self.lock is not None:
                self._record_again_if_rewound(self.lock)
            return True, ""
        try:
            if self.lock.try_acquire():
                if self.lock.recorded_mine(self.db):
                    self._lock_error = ""
                    # still this daemon's epoch: its writes (fenced with it) go on
                    self.log.warning("writer lock taken again after its session ended",
                                     epoch=self.lock.epoch)  # fmt: skip
                    return True, ""
                with self.db.session() as session:
                    holder = recorded_holder(session)
                self.lock.release()
                return True, (
                    f"{self.lock.what} was held by another oasisd ({holder or 'unknown'}) "
                    "while this one could not reach it: its ledger may miss that one's "
                    "decisions; stopping"
                )
        except (DBAPIError, StoreUnavailableError, OSError) as err:
            why = _first_line(err)
            if why != self._lock_error:  # said once while it goes on, not every second
                self.log.warning("writer lock not taken again yet", error=why)
            self._lock_error = why
            return False, ""
        holder = self.lock.holder()
        who = str(holder) if holder else "holder unknown"
        return True, (
            f"{self.lock.what} was taken over by another oasisd ({who}) while this one "
            "could not reach it; stopping"
        )

    def _record_again_if_rewound(self, lock: WriterLock) -> None:
        """Item 3 of the module docstring (in the probe's thread)."""
        mine = lock.epoch
        if mine <= 0:
            return
        with self.db.session() as session:
            holder = recorded_holder(session)
        if holder is not None and holder.epoch >= mine:
            return  # this daemon's (or, above it, another's: the fence says so)
        epoch = lock.record(self.db, at_least=mine)
        self.log.error("the store's writer record was rewound under this daemon: "
                       "recorded again", found_epoch=holder.epoch if holder else None,
                       epoch=epoch, previous_epoch=mine,
                       hint="a backup restored while oasisd runs (README: Backups)")  # fmt: skip
        if self.on_epoch is not None:
            self.on_epoch(epoch)


def _first_line(err: BaseException) -> str:
    """What the store said, on one line (a DBAPIError's driver message, without
    SQLAlchemy's statement and "Background on this error" link)."""
    orig = err.orig if isinstance(err, DBAPIError) and err.orig is not None else err
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__
