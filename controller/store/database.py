"""Engines, sessions and schema migration for the store (SQLite or PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Database", "StoreUnavailableError", "migrate"]

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"
_PG_LOCK = 0x6F61_7369  # "oasi": the advisory lock held while migrating


class StoreUnavailableError(Exception):
    """The database cannot be reached or refused the operation for a transient reason."""


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


class Database:
    """One engine and its session factory.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("postgresql"):
            kwargs.update(pool_pre_ping=True, pool_size=5, max_overflow=5)
        self.engine: Engine = create_engine(url, **kwargs)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction, committed on success; database outages become
        StoreUnavailableError."""
        try:
            with self._sessions.begin() as session:
                yield session
        except DBAPIError as err:
            if err.connection_invalidated or _is_transient(err):
                raise StoreUnavailableError(str(err.orig).strip().splitlines()[0]) from err
            raise

    def ping(self) -> bool:
        """True if the database answers a trivial query."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except DBAPIError:
            return False

    def dispose(self) -> None:
        self.engine.dispose()


def _is_transient(err: DBAPIError) -> bool:
    from sqlalchemy.exc import InterfaceError, OperationalError

    return isinstance(err, OperationalError | InterfaceError)


def _alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(db: Database) -> str:
    """Bring the schema to the newest revision; returns it.

    Check, lock, check again, upgrade: concurrent daemons on one PostgreSQL serialise on
    an advisory lock; SQLite serialises on its own write lock.
    """
    cfg = _alembic_config(db.url)
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    with db.engine.begin() as conn:
        if MigrationContext.configure(conn).get_current_revision() == head:
            return head
    with db.engine.begin() as conn:
        if db.engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
        if MigrationContext.configure(conn).get_current_revision() != head:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    return head
