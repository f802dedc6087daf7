"""Engines, sessions and schema migration for the store (SQLite or PostgreSQL).

No call waits on PostgreSQL for ever. With ``timeout`` seconds (``daemon.store_timeout``):

- connecting gives up after ``timeout`` (libpq ``connect_timeout``), and so does waiting
  for a free connection of the pool;
- the server cancels a statement that runs, or waits for a lock, longer than ``timeout``
  (``statement_timeout``, ``lock_timeout``);
- a server that does not answer at all (its processes stopped, a host gone) cannot enforce
  those, so the client also gives up on any round trip that takes ``timeout + 1`` seconds
  and closes that connection
  (:class:`~controller.store.bounded_connection.BoundedConnection`); TCP keepalives find a peer
  that vanished while the connection was idle;
- after a failure that says the server is out of reach (no SQLSTATE: the connection broke
  or could not be made), calls fail at once for :data:`RETRY_SECONDS` instead of each
  waiting out its own timeout; then one tries again. :meth:`Database.ping` always tries;
- a refusal only a DBA can mend (a privilege revoked, a read-only database, the tables
  out of the role's ``search_path``: :mod:`.refusals`) is said as such, naming the
  setting and the remedy; the server is reachable, so calls are not failed at once.

Each becomes :class:`StoreUnavailableError` (gRPC ``UNAVAILABLE``). Migrations and the
ledger's rebuild at start-up may take longer on a large store: they run under
:meth:`Database.patient`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from controller.store.lock_waits import is_lock_wait, sqlite_write_lock_free
from controller.store.poolers import MARK_OPTION
from controller.store.refusals import is_refusal, refusal
from controller.store.schema_check import check_tables, revision_behind
from controller.store.search_path import check_new_store, check_unversioned
from controller.store.sqlite_file import StoreFile
from controller.store.write_probe import DRY_WRITES

if TYPE_CHECKING:  # alembic is imported where a migration is read or run, not by every
    # process that opens a store (the commit process: 0.35 s of each start)
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "DEFAULT_TIMEOUT",
    "IN_BATCH",
    "RETRY_SECONDS",
    "REWRITING_REVISIONS",
    "SQLITE_SYNCHRONOUS",
    "Database",
    "StoreUnavailableError",
    "StoreVersionError",
    "in_batches",
    "migrate",
    "newer_revision",
    "rewrites_ahead",
]

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"
_PG_LOCK = 0x6F61_7369  # "oasi": the advisory lock held while migrating
DEFAULT_TIMEOUT = 3.0
"""Seconds any one store operation may take (``daemon.store_timeout``)."""
RETRY_SECONDS = 1.0
"""After PostgreSQL was found out of reach, calls fail at once for this long."""

REFUSAL_LOG_SECONDS = 60.0
"""The same refusal (:mod:`.refusals`) is logged at most once in this many seconds."""

MIN_FREE_BYTES = 1 << 20
"""A SQLite store whose file system has less free than this is full: it cannot grow."""

_FULL = ("database or disk is full", "disk i/o error")
"""What SQLite says when a write fails for space (SQLITE_FULL, SQLITE_IOERR)."""

_PG_FULL = ("no space left on device", "could not extend file")
"""What PostgreSQL says when a write fails for space (SQLSTATE 53100, disk_full)."""

WRITE_PAUSE_SECONDS = 2.0
"""After a commit that PostgreSQL refused for a reason that does not pass by itself (a
refusal only its DBA mends, :mod:`.refusals`; its disk full), decisions are refused at
once for this long (:attr:`Database.writes_refused`), then one is tried again. Each
failed commit costs a rebuild of the ledger from the store in the thread that decides:
in the PostgreSQL audit, clients retrying during such a refusal made 22 rebuilds in 6 s
at 40 jobs (a rebuild takes seconds at 10,000 servers), while every read waited."""

_CLIENT_MARGIN = 1.0  # the server's own timeouts fire first while it runs
# keepalive probes after 30 s idle, every 10 s, 3 unanswered: a vanished peer in ~60 s
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
               "keepalives_count": 3}  # fmt: skip
HELD_IDLE_SECONDS = 1.0
"""A connection :meth:`Database.held_session` keeps is checked out again (and so pinged,
on PostgreSQL) once idle this long; under load it is used as it is."""
REBUILD_SECONDS = 120.0
"""Seconds each statement of a ledger rebuild after an outage may take (under
:meth:`Database.patient`): the rebuild reads the whole store, which the normal
``store_timeout`` does not bound on a large one."""
# seconds a round trip may take where :meth:`Database.patient` says so (None: the default)
_patience: ContextVar[float | None] = ContextVar("store_patience", default=None)
# whether lock waits may take as long there too (:meth:`Database.patient`'s ``locks``)
_patient_locks: ContextVar[bool] = ContextVar("store_patient_locks", default=False)


class StoreUnavailableError(Exception):
    """The database cannot be reached, or refused the operation: for a transient reason,
    or for one its DBA mends (:mod:`.refusals`, the message says what to do)."""


class StoreVersionError(Exception):
    """The store's schema is at a revision this oasis does not know: a newer one wrote it
    (the message says so and what to do)."""


SQLITE_SYNCHRONOUS = ("full", "normal")
"""``daemon.sqlite_synchronous``: ``full`` (the default) syncs the WAL at every commit, so a
commit survives power loss; ``normal`` syncs it only at checkpoints, so a commit survives a
crash of the process but not of the machine, and costs no fsync (about 2.5 ms a commit on
the benchmark machine, bench/results/speed.md)."""


def _sqlite_pragmas(synchronous: str) -> Callable[[Any, Any], None]:
    def pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.close()

    return pragmas


class Database:
    """One engine and its session factory.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``).
        timeout: seconds one operation on PostgreSQL may take (the module docstring);
            SQLite waits up to 5 s for its write lock.
        sqlite_synchronous: one of :data:`SQLITE_SYNCHRONOUS` (SQLite only).
        idle_transaction: PostgreSQL ends a session idle inside a transaction this long
            (seconds; high availability: a stopped leader's transaction must not hold
            the row its successor's epoch bump waits for); None: no limit.
        log: a structlog logger told of refusals a DBA mends (:mod:`.refusals`), at
            most once every :data:`REFUSAL_LOG_SECONDS` while the same one goes on;
            None: not logged (the commit process, whose parent logs them).
    """

    def __init__(
        self,
        url: str,
        timeout: float = DEFAULT_TIMEOUT,
        sqlite_synchronous: str = "full",
        idle_transaction: float | None = None,
        log: Any = None,
    ) -> None:
        if sqlite_synchronous not in SQLITE_SYNCHRONOUS:
            raise ValueError(f"sqlite_synchronous must be one of {SQLITE_SYNCHRONOUS}")
        self.url = url
        self.timeout = timeout
        self.sqlite_synchronous = sqlite_synchronous
        self.idle_transaction = idle_transaction
        self._down = ""  # why PostgreSQL was last found out of reach; "" if it was not
        self._retry_at = 0.0  # time.monotonic() before which calls fail at once
        self._log = log
        self._paused = ""  # why writes pause (PostgreSQL, WRITE_PAUSE_SECONDS), until:
        self._paused_until = 0.0  # time.monotonic()
        self._refused = ""  # the last refusal logged (:mod:`.refusals`)
        self._refusing = ""  # why the last commit or dry write was refused (:attr:`refusing`)
        self._refused_logged = -math.inf  # time.monotonic() it was logged
        self._locked = ""  # why the last commit failed for a lock (:attr:`writes_locked`)
        kwargs: dict[str, Any] = {}
        parsed = make_url(url)
        if parsed.get_backend_name() == "postgresql":
            connect_args = _pg_connect_args(parsed, timeout, idle_transaction)
            kwargs.update(pool_pre_ping=True, pool_size=5, max_overflow=5, pool_timeout=timeout,
                          connect_args=connect_args)  # fmt: skip
        else:  # SQLite keeps any text in a JSON column: text that is not JSON reads as null
            kwargs.update(json_deserializer=lenient_json)
        self.engine: Engine = create_engine(url, **kwargs)
        self.fail_fast = self.engine.dialect.name == "postgresql"
        self._severed = ""  # why every call is refused for good (the file went); "" if not
        self._full = ""  # why a SQLite store cannot take writes now (space); "" if it can
        self.file: StoreFile | None = None  # a SQLite store's file, watched by ping()
        if self.engine.dialect.name == "sqlite" and parsed.database not in (None, "", ":memory:"):
            self.file = StoreFile(Path(str(parsed.database)).absolute())
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas(sqlite_synchronous))
        elif self.engine.dialect.driver == "psycopg":
            event.listen(self.engine, "do_connect", _bounded_connect(timeout + _CLIENT_MARGIN))
            event.listen(self.engine, "begin", _patient_statements)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._held: Connection | None = None  # held_session's
        self._held_used = 0.0  # time.monotonic() of its last transaction

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction, committed on success; database outages become
        StoreUnavailableError."""
        with self._outages(), self._sessions.begin() as session:
            yield session

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A session whose reads all see the store as it was at its first one, for a
        reader of several statements beside a running daemon (``oasis offline --store``):
        without it each statement saw the store of its moment, and a job that retention
        deleted, or a decision committed, between two of them made the reads disagree.

        PostgreSQL: one ``REPEATABLE READ, READ ONLY`` transaction. SQLite: an explicit
        ``BEGIN`` (Python's driver opens none before a read), whose first read fixes the
        snapshot in WAL mode. Nothing is written; the transaction is rolled back."""
        with self._outages(), self.engine.connect() as conn:
            if self.engine.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN")
            else:
                conn.execution_options(isolation_level="REPEATABLE READ")  # this connection
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            try:
                with Session(bind=conn, expire_on_commit=False) as session:
                    yield session
            finally:
                conn.rollback()

    @contextmanager
    def held_session(self) -> Iterator[Session]:
        """As :meth:`session`, on one connection kept open from call to call (for one
        thread: the group-commit writer's), so a transaction costs no pool checkout and
        no pre-ping round trip while calls follow each other; after
        :data:`HELD_IDLE_SECONDS` idle it is checked out again. A failed transaction
        closes it; the next call opens another."""
        with self._outages():
            if time.monotonic() - self._held_used > HELD_IDLE_SECONDS:
                # idle a while: back to the pool, whose checkout pings it (PostgreSQL may
                # have restarted, or something between dropped the idle connection)
                self._drop_held()
            conn = self._held
            if conn is None or conn.closed or conn.invalidated:
                conn = self._held = self.engine.connect()
            try:
                with conn.begin(), Session(bind=conn, expire_on_commit=False) as session:
                    yield session
            except BaseException:
                self._drop_held()
                raise
            finally:
                self._held_used = time.monotonic()

    def _drop_held(self) -> None:
        """Close :meth:`held_session`'s connection (back to the pool), if there is one."""
        held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(Exception):
                held.close()

    @contextmanager
    def _outages(self) -> Iterator[None]:
        """Database outages in the block become StoreUnavailableError (the module
        docstring); while PostgreSQL is known out of reach, fail at once, and always once
        a SQLite store's file is gone (:mod:`.sqlite_file`)."""
        if self._severed:
            raise StoreUnavailableError(self._severed)
        if self._down and time.monotonic() < self._retry_at:
            raise StoreUnavailableError(f"{self._down} (retrying)")
        try:
            yield
            self._down = ""
        except DBAPIError as err:
            refused = refusal(err.orig, self.engine.url)
            if refused is not None:  # a DBA's to mend (:mod:`.refusals`): no outage
                self._note_refusal(refused)
                raise StoreUnavailableError(refused) from err
            if err.connection_invalidated or _is_transient(err):
                reason = _first_line(err)
                if _out_of_reach(err):
                    self._mark_down(reason)
                raise StoreUnavailableError(reason) from err
            raise
        except sa_exc.TimeoutError as err:  # every pooled connection busy for `timeout`
            raise StoreUnavailableError(
                f"no store connection free within {self.timeout:g} s"
            ) from err

    def _note_refusal(self, refused: str) -> None:
        """Log ``refused`` unless it was, less than :data:`REFUSAL_LOG_SECONDS` ago: the
        probe's ``SELECT 1`` goes through, so only this tells the journal why every
        decision fails (the operator's clients are told too, the tenants' are not)."""
        now = time.monotonic()
        if self._log is None or (
            refused == self._refused and now - self._refused_logged < REFUSAL_LOG_SECONDS
        ):
            return
        self._refused, self._refused_logged = refused, now
        self._log.warning("the store refuses this daemon's role", reason=refused)

    def ping(self) -> bool:
        """True if the database answers a trivial query (always tried, even while calls
        fail at once); the answer also ends or starts that fast failing. A SQLite
        store's file is checked first: once it is gone or replaced, False for good. Its
        file system's room is checked too: short of :data:`MIN_FREE_BYTES`, the store
        still answers (reads go on) but refuses writes (:attr:`writes_refused`), as
        PostgreSQL's refusals are (:attr:`refusing`: the Admission service alone is
        NOT_SERVING; all of the daemon was, and a load balancer dropped its reads too)."""
        if self.file is not None and not self._severed:
            what = self.file.check()
            if what:
                self._sever(what)
        if self._severed:
            return False
        self._full = self.space_short()
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except DBAPIError as err:
            self._mark_down(_first_line(err))
            return False
        except sa_exc.TimeoutError:
            self._mark_down(f"no store connection free within {self.timeout:g} s")
            return False
        self._down = ""
        return True

    @property
    def down_reason(self) -> str:
        """Why PostgreSQL was last found out of reach, or the SQLite store's file gone
        (:attr:`severed`); "" if its last answer was fine."""
        return self._severed or self._down

    @property
    def writes_refused(self) -> str:
        """Why the store cannot take a write now; "" if it can. Decisions are refused at
        once meanwhile: each one failed at its commit, and the ledger was rebuilt for it
        (150 ms at 3,000 jobs), as often as clients retried. A SQLite store: a write
        failed for space, or its file system has less than :data:`MIN_FREE_BYTES` free
        (until :meth:`ping` finds room again). PostgreSQL: a commit was refused by its
        DBA's settings or for space less than :data:`WRITE_PAUSE_SECONDS` ago."""
        if self._full:
            return self._full
        if self._paused and time.monotonic() < self._paused_until:
            return self._paused
        return ""

    def note_failed_write(self, reason: str) -> None:
        """A commit failed with ``reason``: a SQLite store out of space takes no more
        writes until :meth:`ping` finds room; a refusal of PostgreSQL's that does not pass
        by itself pauses writes for :data:`WRITE_PAUSE_SECONDS` (:attr:`writes_refused`),
        and a DBA's one is :attr:`refusing` until a write goes through."""
        lower = reason.lower()
        if is_lock_wait(reason):
            self._locked = reason
        if self.file is not None and any(words in lower for words in _FULL):
            self._full = self.space_short() or f"the store's last write failed: {reason}"
        elif self.file is None and (is_refusal(reason) or any(w in lower for w in _PG_FULL)):
            self._paused = reason
            self._paused_until = time.monotonic() + WRITE_PAUSE_SECONDS
            if is_refusal(reason):
                self._refusing = reason

    def note_written(self) -> None:
        """A commit went through: the store takes this daemon's writes (:attr:`refusing`)."""
        self._refusing = ""
        self._locked = ""

    @property
    def writes_locked(self) -> str:
        """Why the last commit failed waiting for another connection's lock
        (:mod:`.lock_waits`), until a commit goes through or :meth:`check_writes` finds
        the lock gone; "" if it did not. The store reads as up meanwhile, and the
        Admission service's health is unchanged (the lock may pass at any moment)."""
        return self._locked

    @property
    def refusing(self) -> str:
        """Why the store refuses this daemon's writes now, "" if it takes them: a DBA's
        refusal (:mod:`.refusals`) that the last commit or :meth:`check_writes` met, until
        one of them goes through, or :attr:`writes_refused`. The Admission service's
        health is NOT_SERVING meanwhile (reads are served: ``SELECT 1`` goes through)."""
        return self._refusing or self.writes_refused

    def check_writes(self) -> None:
        """PostgreSQL: run a decision's writes on no rows, rolled back
        (:mod:`.write_probe`), and keep what they say in :attr:`refusing`: a refusal of
        :mod:`.refusals` (logged as a commit's is), or none. Anything else (an outage, a
        lock wait, no free connection) leaves it as it was: :meth:`ping` says those.
        SQLite: nothing to ask (its disk is :meth:`ping`'s), but while a commit failed
        for a lock, whether a writer gets in now (:attr:`writes_locked`)."""
        if self.engine.dialect.name != "postgresql":
            if self._locked and self.file is not None and sqlite_write_lock_free(self.file.path):
                self._locked = ""
            return
        try:
            with self.engine.connect() as conn, conn.begin() as transaction:
                conn.exec_driver_sql(DRY_WRITES)
                transaction.rollback()
        except DBAPIError as err:
            refused = refusal(err.orig, self.engine.url)
            if refused is not None:
                self._note_refusal(refused)
                self._refusing = refused
            return
        except sa_exc.TimeoutError:
            return
        self._refusing = ""
        self._locked = ""  # the dry writes took the tables' locks

    def space_short(self) -> str:
        """Why a SQLite store's file system is full (less than :data:`MIN_FREE_BYTES`
        free, with the number), or "" (PostgreSQL, room, or no answer from statvfs)."""
        if self.file is None:
            return ""
        folder = self.file.path.parent
        try:
            st = os.statvfs(folder)
        except OSError:
            return ""
        free = st.f_bavail * st.f_frsize
        if free >= MIN_FREE_BYTES:
            return ""
        return f"no space left on device: {free:,} bytes free on the file system of {folder}"

    @property
    def severed(self) -> str:
        """Why every call is refused for good: the SQLite store's file was deleted or
        replaced under this process, with how to copy it back; "" if it was not."""
        return self._severed

    def _sever(self, what: str) -> None:
        """Refuse every call from now on: the store's file ``what`` (:mod:`.sqlite_file`);
        the message says how to copy it back with its write-ahead log (no connection is
        opened here: a new one would make an empty store at the path)."""
        assert self.file is not None
        path = self.file.path
        copies = self.file.open_copies()
        if copies:
            commands = " && ".join(f"cp {src} {dst}" for src, dst in copies)
            rescue = (
                f"the jobs it held are in the copy this process still holds open: while "
                f"oasisd runs, mkdir -p {path.parent} && {commands}; then restart oasisd"
            )
        else:
            rescue = "restart oasisd to open the file now at that path (or a new store)"
        self._severed = (
            f"the store's file {path} {what} under the running oasisd: every call is "
            f"refused, since nothing committed now would be kept; {rescue}"
        )

    @contextmanager
    def patient(self, seconds: float, locks: bool = False) -> Iterator[None]:
        """Within this block (in this thread or task), PostgreSQL statements and round
        trips may take up to ``seconds`` each: for migrations and the ledger's rebuild,
        which grow with the store. A wait for a lock still ends after the store's
        timeout unless ``locks`` (a migration, which waits for another daemon's): a
        session holding a table's lock (``VACUUM FULL``, ``LOCK TABLE`` in psql) held
        each rebuild for two minutes, and every tenant's call queued behind it."""
        token = _patience.set(seconds)
        locks_token = _patient_locks.set(locks)
        try:
            yield
        finally:
            _patient_locks.reset(locks_token)
            _patience.reset(token)

    def _mark_down(self, reason: str) -> None:
        if self.fail_fast:
            self._down = reason or "the store is unreachable"
            self._retry_at = time.monotonic() + RETRY_SECONDS

    def dispose(self) -> None:
        self._drop_held()
        self.engine.dispose()


_V = TypeVar("_V")

IN_BATCH = 500
"""Values in one query's ``IN`` list at most (old SQLite builds bind at most 999)."""


def in_batches(values: Sequence[_V]) -> Iterator[Sequence[_V]]:
    """``values`` in slices of at most :data:`IN_BATCH`, one query's ``IN`` list each."""
    for i in range(0, len(values), IN_BATCH):
        yield values[i : i + IN_BATCH]


def lenient_json(text: str) -> Any:
    """A JSON column's value as stored, None if it is not JSON (nested too deeply for the
    parser included): SQLite keeps any text there, and one row edited by hand must not
    fail every query that reads it (each reader takes None as a value it cannot use, and
    logs it where that matters). PostgreSQL's json type refuses such text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _is_transient(err: DBAPIError) -> bool:
    from sqlalchemy.exc import InterfaceError, OperationalError

    return isinstance(err, OperationalError | InterfaceError)


def _out_of_reach(err: DBAPIError) -> bool:
    """True if the server did not answer (no SQLSTATE): a broken or refused connection or
    a round trip cut off, as opposed to an error the server reported (a lock timeout)."""
    return err.connection_invalidated or getattr(err.orig, "sqlstate", None) is None


def _first_line(err: DBAPIError) -> str:
    lines = str(err.orig if err.orig is not None else err).strip().splitlines()
    return lines[0] if lines else type(err.orig).__name__


def _pg_connect_args(url: URL, timeout: float, idle_transaction: float | None) -> dict[str, Any]:
    """libpq parameters bounding connects and statements; the URL's own win."""
    ms = max(1, round(timeout * 1000))
    options = f"{MARK_OPTION} -c statement_timeout={ms} -c lock_timeout={ms}"  # .poolers
    if idle_transaction is not None:
        idle_ms = max(1, round(idle_transaction * 1000))
        options = f"{options} -c idle_in_transaction_session_timeout={idle_ms}"
    if url.query.get("options"):
        options = f"{options} {url.query['options']}"  # later -c settings override
    args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(timeout)), **_KEEPALIVES}
    args = {k: v for k, v in args.items() if k not in url.query}
    args["options"] = options
    return args


def _bounded_connect(limit: float) -> Any:
    """A ``do_connect`` hook opening
    :class:`~controller.store.bounded_connection.BoundedConnection` s (psycopg is
    imported only for a PostgreSQL store: a SQLite one's daemon and commit process
    spent 0.2 s of each start on it)."""
    from controller.store.bounded_connection import BoundedConnection

    def connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        conn = BoundedConnection.connect(*cargs, **cparams)
        conn.round_trip_limit = limit
        return conn

    return connect


def _patient_statements(conn: Any) -> None:
    """Raise the server's statement timeout for this transaction inside
    :meth:`Database.patient`, and its lock timeout if that says ``locks``."""
    seconds = _patience.get()
    if seconds is not None:
        ms = max(1, round(seconds * 1000))
        raised = f"SET LOCAL statement_timeout = {ms}"
        if _patient_locks.get():
            raised = f"{raised}; SET LOCAL lock_timeout = {ms}"
        # on the driver's connection: psycopg opens the transaction with this statement
        conn.connection.driver_connection.execute(raised)


_MIGRATION_SECONDS = 300.0  # a migration's statements may rewrite whole tables


def _alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _unknown_revision(script: ScriptDirectory, revision: str) -> bool:
    """Whether ``revision`` is none of this oasis's migrations."""
    from alembic import util as alembic_util

    try:
        return script.get_revision(revision) is None
    except alembic_util.CommandError:  # unknown, or ambiguous
        return True


REWRITING_REVISIONS = frozenset({"0008"})
"""Revisions that rewrite stored rows so that an older oasis misreads them: 0008 keys
each submitter's jobs ``NAME:ID``, which an older daemon reads as ids it refuses (leading,
it failed every such job and deleted its plan). No older daemon may run beside an
upgrade across one (:func:`rewrites_ahead`)."""


def _revisions(db: Database) -> tuple[ScriptDirectory, str, str | None]:
    """This oasis's migrations, their newest revision, and the store's (None: new)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config(db.url))
    head = script.get_current_head()
    assert head is not None
    with db.engine.begin() as conn:
        return script, head, MigrationContext.configure(conn).get_current_revision()


@functools.cache
def _known_revisions() -> frozenset[str]:
    """Every revision of this oasis's migrations (read from ``migrations/`` once)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config("sqlite://"))
    return frozenset(r.revision for r in script.walk_revisions())


def newer_revision(conn: Connection) -> str | None:
    """The store's schema revision if this oasis does not know it (a newer oasis migrated
    the store since this daemon started it), else None. A standby asks before it takes
    the lead (:meth:`~controller.admission.follow.Follow.takeover_problem`): in the upgrade
    audit a standby of the older version took the lead of a store an upgraded node had
    just migrated, which it refuses at start."""
    from alembic.runtime.migration import MigrationContext

    current = MigrationContext.configure(conn).get_current_revision()
    return current if current is not None and current not in _known_revisions() else None


def rewrites_ahead(db: Database) -> list[str]:
    """The revisions of :data:`REWRITING_REVISIONS` that :func:`migrate` would apply to
    ``db`` now, oldest first ([] for a new store, or one at the newest revision)."""
    script, head, current = _revisions(db)
    if current is None or current == head or _unknown_revision(script, current):
        return []
    ahead = [r.revision for r in script.iterate_revisions(head, current)]
    return sorted(r for r in ahead if r in REWRITING_REVISIONS)


def migrate(db: Database, log: Any = None) -> str:
    """Bring the schema to the newest revision; returns it.

    Check, lock, check again, upgrade: concurrent daemons on one PostgreSQL serialise on
    an advisory lock; SQLite serialises on its own write lock. StoreVersionError if the
    store is at a revision this oasis does not know (a newer one migrated it);
    StoreHiddenError if a new PostgreSQL store would be created while another schema of
    its database holds one, StoreUnversionedError if over oasis tables that record no
    revision (:mod:`.search_path`). ``log`` (the daemon's: a structlog
    logger) is told of an upgrade before and after it, and of a store created; None:
    nothing said (a tool's or a library's use: structlog's default printed the lines to
    standard output, into ``--json`` output)."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    script, head, current = _revisions(db)
    if current == head:
        _check_tables(db, head)
        return head
    if current is not None and _unknown_revision(script, current):
        raise StoreVersionError(
            f"is at schema revision {current[:64]!r}, which this oasis does not know (its "
            f"newest is {head!r}): a newer oasis migrated it. Run that version, or restore "
            "a backup of the store taken before it ran"
        )
    cfg = _alembic_config(db.url)
    engine = _migration_engine(db)
    if log is None:
        log = structlog.wrap_logger(structlog.ReturnLogger())  # says nothing
    applied: list[str] = []  # what this call migrated, once committed
    now = current
    try:
        with db.patient(_MIGRATION_SECONDS, locks=True), engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
            now = MigrationContext.configure(conn).get_current_revision()
            if now is None and engine.dialect.name == "postgresql":
                check_new_store(conn, db.engine.url)  # not beside one search_path hides
            if now is None:  # not over a store whose revision is gone
                from controller.store.models import Base

                check_unversioned(conn, set(Base.metadata.tables))
            if now != head:
                cfg.attributes["connection"] = conn
                applied = _migration_steps(script, head, now)
                if now is not None:  # an upgrade: say so before a long rewrite starts
                    log.info("migrating the store", from_revision=now, to_revision=head,
                             migrations=applied)  # fmt: skip
                started = time.monotonic()
                command.upgrade(cfg, "head")
    except DBAPIError as err:  # rolled back: the store is as it was
        behind = revision_behind(now, err) if now is not None else None
        if behind is not None:
            raise behind from err
        raise
    else:
        if applied:  # committed: another daemon's migration leaves this one nothing
            log.info(
                "store migrated" if now is not None else "store created",
                from_revision=now,
                to_revision=head,
                migrations=applied,
                seconds=round(time.monotonic() - started, 3),
            )
    finally:
        if engine is not db.engine:
            engine.dispose()
    _check_tables(db, head)
    return head


def _check_tables(db: Database, revision: str) -> None:
    """StoreSchemaError if the store, at ``revision``, lacks a table or column of the
    models (:func:`~controller.store.schema_check.check_tables`)."""
    from controller.store.models import Base

    with db.engine.connect() as conn:
        check_tables(conn, Base.metadata, revision)


def _migration_steps(script: ScriptDirectory, head: str, current: str | None) -> list[str]:
    """The revisions an upgrade from ``current`` (None: a new store) to ``head`` applies,
    oldest first."""
    return [r.revision for r in reversed(list(script.iterate_revisions(head, current or "base")))]


def _migration_engine(db: Database) -> Engine:
    """The engine the migrations run on, every one in one transaction: ``db``'s own on
    PostgreSQL; on SQLite one whose driver leaves transactions to it and begins each with
    ``BEGIN IMMEDIATE``. Python's sqlite3 begins a transaction only before a row is
    written, so a migration's ``ALTER TABLE`` or ``CREATE INDEX`` committed at once: a
    daemon killed in the middle of an upgrade left the columns of a migration its store
    did not record, and every start after failed on them ("duplicate column name")."""
    if db.engine.dialect.name != "sqlite":
        return db.engine
    engine = create_engine(db.url, poolclass=NullPool)
    pragmas = _sqlite_pragmas(db.sqlite_synchronous)

    @event.listens_for(engine, "connect")
    def connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # no implicit BEGIN or COMMIT
        pragmas(dbapi_connection, record)

    @event.listens_for(engine, "begin")
    def begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock from the start

    return engine
