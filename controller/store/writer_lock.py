"""One writer per store: a lock the daemon holds for its whole life.

Two daemons deciding against one store would each price against a ledger that misses the
other's jobs, and together fill servers past capacity. So the daemon takes this lock
before it migrates or reads anything, and a second one exits at start naming the first.

- **SQLite:** ``flock`` on ``<database file>.lock``, next to the database (a local file
  system: ``flock`` does not reach across NFS). The file holds one JSON line naming the
  holder: ``{"host", "pid", "since", "epoch"}``.
- **PostgreSQL:** a session advisory lock (``pg_try_advisory_lock(LOCK_KEY)``) on a
  connection of its own, kept open in autocommit (so it never holds a transaction open).
  The holder is found through ``pg_locks`` and ``pg_stat_activity``: the session's
  ``application_name`` is ``oasisd PID@HOST`` and ``backend_start`` is when it connected,
  just before taking the lock.

Either is released by the kernel or by PostgreSQL when the process or its session ends,
``kill -9`` included: no stale lock to clean up after a crash. A PostgreSQL restart ends
the session too; :meth:`WriterLock.held` notices and the daemon takes the lock again
(``controller/store/watch.py``) -- or stops, if another daemon took it meanwhile.

``epoch`` counts acquisitions: each holder records the previous epoch + 1 in the ``meta``
row ``writer`` (:meth:`WriterLock.record`, once the schema exists). High availability
(``controller/ha``) fences writes with it (:func:`check_epoch`): a writer that lost the
lock holds a smaller epoch than the one that took over. :meth:`WriterLock.try_acquire`
never raises for "held elsewhere", so an election can call it in a loop;
:meth:`WriterLock.acquire` raises :class:`StoreLockedError` naming the holder, for
start-up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

from sqlalchemy import Connection, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from controller.store.database import Database
from controller.store.models import EventRow, MetaRow
from controller.store.urls import shown
from pricing.fields import is_integer

__all__ = [
    "LOCK_KEY",
    "MAX_EPOCH",
    "FencedError",
    "FileWriterLock",
    "Holder",
    "PostgresWriterLock",
    "StoreLockedError",
    "WriterLock",
    "check_epoch",
    "clock_offset",
    "is_epoch",
    "recorded_holder",
    "writer_lock",
]

LOCK_KEY = 0x6F61_7369_7772_6974
"""The advisory lock's key ("oasiwrit"); the migration lock is another (``database.py``)."""
RECORD_KEY = "writer"
"""The ``meta`` row holding the current holder and its epoch."""
_RECORD_BYTES = 4096  # a holder line is ~150 bytes; more is not ours


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a store's writer lock.

    Attributes:
        host: the holder's host name.
        pid: its process id; None if unknown.
        since: when it took the lock (UTC); None if unknown.
        epoch: the acquisition count when it took the lock; 0 if unknown.
        address: where clients reach it (``[ha] advertise``); "" if unknown.
        clock_offset: its slot clock minus PostgreSQL's, seconds, when it took the lock
            (:func:`clock_offset`); None if unknown (SQLite, an older oasis).
    """

    host: str
    pid: int | None
    since: datetime | None
    epoch: int = 0
    address: str = ""
    clock_offset: float | None = None

    def __str__(self) -> str:
        pid = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        since = f"since {self.since:%Y-%m-%dT%H:%M:%SZ}" if self.since else "since unknown"
        return f"host {self.host or 'unknown'}, {pid}, {since}"

    def to_dict(self) -> dict[str, Any]:
        since = self.since.isoformat() if self.since else None
        out: dict[str, Any] = {
            "host": self.host,
            "pid": self.pid,
            "since": since,
            "epoch": self.epoch,
        }
        if self.address:
            out["address"] = self.address
        if self.clock_offset is not None:
            out["clock_offset"] = self.clock_offset
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Holder | None:
        """The holder in ``raw`` (a lock file's or the store's record: untrusted), or
        None if it is not one."""
        if not isinstance(raw, dict):
            return None
        host, pid, since, epoch = (raw.get(k) for k in ("host", "pid", "since", "epoch"))
        if not isinstance(host, str) or not is_epoch(epoch):
            return None
        try:
            at = datetime.fromisoformat(since) if isinstance(since, str) else None
        except ValueError:
            at = None
        pid = pid if is_integer(pid) else None
        address = raw.get("address", "")
        given = raw.get("clock_offset")
        offset = float(given) if isinstance(given, int | float) and not isinstance(
            given, bool) and math.isfinite(given) else None  # fmt: skip
        address = address[:255] if isinstance(address, str) else ""
        return cls(host[:255], pid, at, epoch, address, offset)


def clock_offset(session: Session, now: Callable[[], float]) -> tuple[float, float] | None:
    """``now()`` (a node's slot clock, Unix seconds) minus PostgreSQL's clock, seconds,
    and half the round trip it was measured in (its uncertainty); None on SQLite. Two
    head nodes' offsets, each against the same server, differ by their clocks' skew,
    whatever the server's own clock says."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    before = now()
    store = session.scalar(text("SELECT extract(epoch FROM clock_timestamp())"))
    after = now()
    return (before + after) / 2 - float(store), abs(after - before) / 2


def _newest_event_epoch(session: Session) -> int:
    """The epoch of the newest event (events are committed in epoch order), 0 if none
    says one: the epoch to count on from when the ``writer`` row is gone (deleted by
    hand), or the next leader's epoch restarts at 1, below the events' (the HA audit)."""
    detail = session.scalar(select(EventRow.detail).order_by(EventRow.sequence.desc()).limit(1))
    if isinstance(detail, str):
        with contextlib.suppress(ValueError, RecursionError):
            detail = json.loads(detail)
    epoch = detail.get("epoch") if isinstance(detail, dict) else None
    return epoch if is_epoch(epoch) else 0


MAX_EPOCH = 1 << 62
"""Epochs count leaderships, one at a time, far below this; a stored one at or above it is
an edit's. Taken as one, the next leader's epoch passed 2**63 - 1, which no reply carries
(``int64``): every ``GetLeadership`` failed (``oasis status``: no node leads)."""


def is_epoch(value: Any) -> TypeGuard[int]:
    """Whether a stored ``epoch`` (the ``writer`` row's, an event's) reads as one: an
    integer from 0 up to :data:`MAX_EPOCH`, exclusive."""
    return is_integer(value) and 0 <= value < MAX_EPOCH


def this_process(epoch: int = 0, address: str = "") -> Holder:
    """This process as a holder, from now."""
    return Holder(socket.gethostname(), os.getpid(), datetime.now(UTC), epoch, address)


class FencedError(Exception):
    """A write of a leader whose epoch has passed: another daemon leads now.

    Attributes:
        holder: the holder recorded in the store now (None: unknown).
        mine: the epoch this daemon led in.
        why: the reason given ("": the store's epoch is another).
    """

    def __init__(self, mine: int, holder: Holder | None, why: str = "") -> None:
        now = holder.epoch if holder else "unknown"
        reason = why or f"the store is in epoch {now}"
        super().__init__(f"fenced: this daemon led in epoch {mine}; {reason}")
        self.holder = holder
        self.mine = mine
        self.why = why


_META = MetaRow.metadata.tables[MetaRow.__tablename__]
# built once and run on the session's connection (Core): the fence runs in every batch
_HOLDER = select(_META.c.value).where(_META.c.key == RECORD_KEY)
_HOLDER_SHARED = _HOLDER.with_for_update(read=True)
_HOLDER_AND_LEASE = text(
    "SELECT m.value, EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' "
    "AND l.granted AND l.pid = :pid AND l.objsubid = 1 AND l.classid::bigint = :hi "
    "AND l.objid::bigint = :lo) FROM meta m WHERE m.key = :key FOR SHARE OF m"
)


def recorded_holder(session: Session, lock: bool = False) -> Holder | None:
    """The holder recorded in the store's ``meta`` row ``writer``; with ``lock``, the row
    is read ``FOR SHARE`` (PostgreSQL): an epoch bump waits for this transaction to end."""
    query = _HOLDER_SHARED if lock else _HOLDER
    return Holder.from_dict(session.connection().scalar(query))


def check_epoch(session: Session, epoch: int, lock_pid: int | None = None) -> None:
    """The fence: raise :class:`FencedError` unless the store's epoch is still ``epoch``
    and (with ``lock_pid``, PostgreSQL) the backend ``lock_pid`` still holds the writer
    lock. Run first in a write transaction; the row stays share-locked until it ends, so
    a new leader's bump (:meth:`WriterLock.record`) comes after the whole transaction, or
    the transaction sees the new epoch (or the lock gone) and fails."""
    if lock_pid is None:
        holder = recorded_holder(session, lock=True)
        if holder is None or holder.epoch != epoch:
            raise FencedError(epoch, holder)
        return
    row = (
        session.connection()
        .execute(
            _HOLDER_AND_LEASE,
            {
                "pid": lock_pid,
                "hi": LOCK_KEY >> 32,
                "lo": LOCK_KEY & 0xFFFF_FFFF,
                "key": RECORD_KEY,
            },
        )
        .first()
    )
    raw = row[0] if row is not None else None
    holder = Holder.from_dict(json.loads(raw) if isinstance(raw, str) else raw)
    if holder is None or holder.epoch != epoch:
        raise FencedError(epoch, holder)
    if not row or not row[1]:
        raise FencedError(epoch, holder, "this daemon's lease (its lock session) ended")


class StoreLockedError(Exception):
    """Another process holds the store's writer lock.

    Attributes:
        holder: who, as far as it can be told (None: unknown).
        what: the store, as the message names it.
    """

    def __init__(self, what: str, holder: Holder | None, hint: str = "stop that one first") -> None:
        who = str(holder) if holder else "holder unknown"
        super().__init__(
            f"{what} is in use by another oasisd ({who}): one daemon per store; {hint}"
        )
        self.holder = holder
        self.what = what


class WriterLock(ABC):
    """The writer lock of one store; see the module docstring."""

    epoch = 0
    """This process's epoch once :meth:`record` ran; 0 before."""

    @abstractmethod
    def try_acquire(self) -> bool:
        """Take the lock if free: True if this process holds it now (also if it already
        did), False if another does. Store outages raise (``DBAPIError``, ``OSError``)."""

    @abstractmethod
    def held(self) -> bool:
        """True if this process still holds the lock (PostgreSQL: its session is alive;
        a round trip, bounded by the store's timeout)."""

    @abstractmethod
    def holder(self) -> Holder | None:
        """Who holds the lock, as recorded; None if nobody or unknown."""

    @abstractmethod
    def release(self) -> None:
        """Let the lock go (never blocks on an unreachable store)."""

    @property
    @abstractmethod
    def what(self) -> str:
        """The store, for messages (no password)."""

    hint = "stop that one first"
    """What a second daemon is told to do (:class:`StoreLockedError`)."""

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreLockedError` naming the holder."""
        if not self.try_acquire():
            raise StoreLockedError(self.what, self.holder(), self.hint)

    def record(
        self,
        db: Database,
        address: str = "",
        now: Callable[[], float] | None = None,
        at_least: int = 0,
    ) -> int:
        """Record this process as the holder in the store's ``meta`` (the schema must
        exist), with the previous epoch + 1, in one transaction (the row locked ``FOR
        UPDATE`` against the fence of :func:`check_epoch`); returns the new epoch. With
        ``now`` (the node's slot clock) its :func:`clock_offset` is recorded too.

        ``at_least``: the highest epoch this process has seen; the new epoch is above it
        even if the store's row is older (a backup restored under running daemons
        rewinds it, and the next leader took an epoch another had led in already)."""
        with db.session() as session:
            previous = session.get(MetaRow, RECORD_KEY, with_for_update=True)
            last = Holder.from_dict(previous.value if previous else None)
            before = max(last.epoch if last else _newest_event_epoch(session), at_least)
            me = this_process(before + 1, address)
            measured = clock_offset(session, now) if now is not None else None
            if measured is not None:
                me = replace(me, clock_offset=measured[0])
            session.merge(MetaRow(key=RECORD_KEY, value=me.to_dict()))
        self.epoch = me.epoch
        return me.epoch

    def recorded_mine(self, db: Database) -> bool:
        """True if the store still records this process, in the epoch :meth:`record`
        gave it, as the holder: nobody else took the lock and wrote in between (a lock
        taken again after a PostgreSQL restart, :mod:`controller.store.watch`)."""
        with db.session() as session:
            holder = recorded_holder(session)
        me = this_process()
        return (
            holder is not None
            and self.epoch > 0
            and (holder.host, holder.pid, holder.epoch) == (me.host, me.pid, self.epoch)
        )


class FileWriterLock(WriterLock):
    """``flock`` on ``path``; the file names the holder (SQLite stores)."""

    hint = "stop that one first (a standby node needs a PostgreSQL store and [ha])"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def what(self) -> str:
        return f"the store {self.path.with_suffix('')}"

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        # never through a symbolic link: one another user put in a data_dir it could
        # write had the daemon overwrite the file it pointed at
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        try:
            last = _parse(os.pread(fd, _RECORD_BYTES, 0))
            line = json.dumps(this_process((last.epoch if last else 0) + 1).to_dict()) + "\n"
            data = line.encode()
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            os.ftruncate(fd, len(data))
        except BaseException:
            os.close(fd)  # releases the lock
            raise
        self._fd = fd
        return True

    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> Holder | None:
        try:
            with open(self.path, "rb") as f:
                return _parse(f.read(_RECORD_BYTES))
        except OSError:
            return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _parse(data: bytes) -> Holder | None:
    try:
        return Holder.from_dict(json.loads(data.decode("utf-8", "replace") or "null"))
    except (ValueError, RecursionError):  # not ours: any bytes may be in that file
        return None


class PostgresWriterLock(WriterLock):
    """A session advisory lock on a dedicated connection of ``db`` (PostgreSQL stores).

    With ``lease`` (seconds; high availability), the lock's session has
    ``idle_session_timeout`` and ``tcp_user_timeout`` set to it: a holder that stops
    asking (:meth:`held`, every ``lease / 4``) -- stopped (SIGSTOP), hung or cut off --
    has its session ended by PostgreSQL after ``lease``, and the lock passes on. TCP
    keepalives alone would not do: the kernel answers them for a stopped process."""

    def __init__(self, db: Database, key: int = LOCK_KEY, lease: float | None = None) -> None:
        self.db = db
        self.key = key
        self.lease = lease
        self.backend_pid: int | None = None
        """The lock session's backend process id while held (the fence checks it)."""
        self._conn: Connection | None = None
        self._using = threading.Lock()  # the connection is not shared between threads

    hint = "stop that one first, or give both an [ha] section (one leads, one stands by)"

    @property
    def what(self) -> str:
        return f"the store {shown(self.db.engine.url)}"

    def try_acquire(self) -> bool:
        with self._using:
            return self._try_acquire()

    def _try_acquire(self) -> bool:
        if self._conn is not None:
            return True
        conn = self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            me = this_process()
            name = f"oasisd {me.pid}@{me.host}"[:63]  # PostgreSQL keeps 63 bytes
            conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": name})
            if self.lease is not None:
                ms = str(max(1, round(self.lease * 1000)))
                for setting in ("idle_session_timeout", "tcp_user_timeout"):
                    conn.execute(text("SELECT set_config(:s, :v, false)"), {"s": setting, "v": ms})
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
        except BaseException:
            conn.close()
            raise
        if got:
            self.backend_pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        if not got:
            if self.lease is not None:  # its session has a short idle timeout: not for the pool
                conn.invalidate()
            conn.close()
            return False
        self._conn = conn
        return True

    def held(self) -> bool:
        with self._using:
            if self._conn is None:
                return False
            try:
                self._conn.execute(text("SELECT 1"))
            except DBAPIError:  # the session is gone, and the lock with it
                self._drop()
                return False
            return True

    def holder(self) -> Holder | None:
        try:
            with self.db.engine.connect() as conn:
                row = conn.execute(
                    text(
                        "SELECT a.application_name, a.backend_start FROM pg_locks l "
                        "JOIN pg_stat_activity a ON a.pid = l.pid "
                        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                        "AND l.database = (SELECT oid FROM pg_database "
                        "WHERE datname = current_database()) "
                        "AND l.classid::bigint = :hi AND l.objid::bigint = :lo"
                    ),
                    {"hi": self.key >> 32, "lo": self.key & 0xFFFF_FFFF},
                ).first()
        except DBAPIError:
            return None
        if row is None:
            return None
        name, started = row
        pid, _, host = (name or "").removeprefix("oasisd ").partition("@")
        return Holder(host, int(pid) if pid.isdigit() else None, started)

    def release(self) -> None:
        with self._using:
            self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            # closing ends the session, which releases the lock; no round trip to wait on
            with contextlib.suppress(DBAPIError):
                self._conn.invalidate()
            self._conn.close()
            self._conn = None
            self.backend_pid = None


def writer_lock(db: Database, lease: float | None = None) -> WriterLock | None:
    """The writer lock for ``db``'s store; None for an in-memory SQLite database or a
    backend without a lock. ``lease``: see :class:`PostgresWriterLock`."""
    url = db.engine.url
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:":
            return None
        return FileWriterLock(Path(f"{Path(url.database).resolve()}.lock"))
    if url.get_backend_name() == "postgresql":
        return PostgresWriterLock(db, lease=lease)
    return None
