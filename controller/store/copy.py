"""Move a whole store to another database: every row of every table, ids kept.

``oasis store copy`` (:mod:`controller.commands.store`) runs :func:`copy_store` with the
daemon stopped, e.g. from the embedded SQLite store to PostgreSQL (two head nodes need
one). In order:

1. both stores' writer locks are taken (:mod:`.writer_lock`) and held to the end: a
   daemon running on either makes the copy refuse, naming it, and no daemon can start on
   either mid-copy;
2. the source must hold an oasis store at a revision this oasis knows, and the
   destination no row of any oasis table (both checked before either is migrated);
   then the source is migrated to this oasis's newest revision, and the destination
   created or migrated to the same;
3. every table of :mod:`.models` is copied in dependency order (foreign keys hold), in
   batches of ``batch`` rows read from a streaming cursor (memory bounded by one batch,
   whatever the store's size), in one transaction on the destination: all or nothing;
4. on PostgreSQL the sequences of the auto-numbered keys (``events.sequence``,
   ``server_outages.id``) are set past the copied ids, in the same transaction.

Values go through the models' column types: a time SQLite kept without a zone (the
daemon writes UTC) is written as UTC; a value SQLite kept that is not of its column's
type reads as NULL (:mod:`.lenient`): where NULL is not allowed, or a string is longer
than its column (which PostgreSQL enforces), the copy fails naming the table, the row's
key and the column, and the destination stays empty.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from alembic.runtime.migration import MigrationContext
from sqlalchemy import JSON, Connection, DateTime, String, Table, func, inspect, select, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from controller.store.database import (
    Database,
    StoreUnavailableError,
    StoreVersionError,
    migrate,
    newer_revision,
)
from controller.store.models import Base
from controller.store.poolers import StorePoolerError, check_session, pooler_refusal
from controller.store.stored import utc
from controller.store.urls import shown
from controller.store.writer_lock import (
    PostgresWriterLock,
    StoreLockedError,
    WriterLock,
    writer_lock,
)

__all__ = ["DEFAULT_BATCH", "CopyError", "CopyReport", "copy_store", "store_tables"]

DEFAULT_BATCH = 5_000
"""Rows read and written per batch: a few MB of Python objects for the widest table
(``jobs``, whose spec is a few KB of JSON), one ``INSERT`` with that many parameter sets."""

COPY_SECONDS = 3600.0
"""Seconds one statement of the copy may take on PostgreSQL (a batch's insert, a table's
count; :meth:`Database.patient`), instead of the daemon's ``store_timeout``."""

CONNECT_SECONDS = 10.0
"""Seconds a connection to either store may take to open (and any statement outside the
copy's patient ones: the lock, the checks)."""

Progress = Callable[[str, int, int], None]
"""Told ``(table, rows copied so far, rows in the table)`` after each batch."""


class CopyError(Exception):
    """The copy refused or failed; the message says why and which store. The destination
    holds no row of the copy (its transaction was rolled back, or never began)."""


@dataclass
class CopyReport:
    """What :func:`copy_store` copied.

    Attributes:
        source, destination: the stores, as shown (passwords masked).
        revision: the schema revision both are at.
        rows: rows copied per table, in the order copied.
        sequences: per auto-numbered key (``table.column``) of a PostgreSQL destination,
            the next value it will give.
        seconds: wall time of the whole copy, locks and migrations included.
    """

    source: str
    destination: str
    revision: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.destination,
            "revision": self.revision,
            "tables": [{"table": t, "rows": n} for t, n in self.rows.items()],
            "rows": sum(self.rows.values()),
            "sequences": self.sequences,
            "seconds": round(self.seconds, 3),
        }


def store_tables() -> list[Table]:
    """Every table of the models, each after the tables its foreign keys name."""
    return list(Base.metadata.sorted_tables)


def copy_store(
    source_url: str,
    destination_url: str,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
) -> CopyReport:
    """Copy the store at ``source_url`` into the one at ``destination_url`` (module
    docstring); ``say`` is told each step (a line for a person). Raises
    :class:`CopyError`; the destination then holds no copied row."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    started = time.monotonic()
    report = CopyReport(shown(source_url), shown(destination_url))
    tell = say or (lambda _line: None)
    # a connect gives up after CONNECT_SECONDS; the copy's statements are patient
    source = Database(source_url, timeout=CONNECT_SECONDS)
    destination = Database(destination_url, timeout=CONNECT_SECONDS)
    try:
        with _locked(source, "source"), _locked(destination, "destination"):
            # refusals first, before either store is migrated
            _check_source(source, report.source)
            _check_empty(destination, report.destination)
            tell(f"migrating the source {report.source}")
            report.revision = _migrated(source, "source", report.source)
            tell(f"migrating the destination {report.destination}")
            _migrated(destination, "destination", report.destination)
            _check_empty(destination, report.destination)
            tell(f"copying (schema revision {report.revision})")
            _copy(source, destination, batch, progress or (lambda *_: None), report)
    finally:
        source.dispose()
        destination.dispose()
    report.seconds = time.monotonic() - started
    return report


@contextlib.contextmanager
def _locked(db: Database, role: str) -> Iterator[None]:
    """Hold ``db``'s writer lock in the block; CopyError naming the holder if another
    process holds it."""
    lock: WriterLock | None = writer_lock(db)
    if lock is None:
        yield
        return
    flag = "--from" if role == "source" else "--to"
    try:
        if isinstance(lock, PostgresWriterLock):
            check_session(db, flag)  # a pooler's session keeps no lock (:mod:`.poolers`)
        lock.acquire()
    except StoreLockedError as err:
        me = err.holder is not None and (err.holder.host, err.holder.pid) == (
            socket.gethostname(), os.getpid())  # fmt: skip
        if me:  # this copy holds it already: the source's lock, under another name
            raise CopyError("the source and the destination are the same store") from err
        who = str(err.holder) if err.holder else "holder unknown"
        raise CopyError(f"{role}: {err.what} is in use by an oasisd ({who}): stop it before "
                        "copying (a copy needs both stores to itself)") from err  # fmt: skip
    except StorePoolerError as err:
        raise CopyError(f"{role}: {err}") from err
    except (DBAPIError, OSError, StoreUnavailableError) as err:
        said = _first(err)
        why = pooler_refusal(said, flag) or said
        raise CopyError(f"{role}: cannot take the store's writer lock: {why}") from err
    try:
        yield
    finally:
        lock.release()


def _check_source(db: Database, shown_url: str) -> None:
    """CopyError unless the source holds an oasis store (a schema revision) at a
    revision this oasis knows."""
    try:
        with db.engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            newer = newer_revision(conn)
    except SQLAlchemyError as err:
        raise CopyError(f"source {shown_url}: cannot read it: {_first(err)}") from err
    if current is None:
        raise CopyError(f"source {shown_url} holds no oasis store (no schema revision)")
    _refuse_newer("source", shown_url, newer)


def _refuse_newer(role: str, shown_url: str, newer: str | None) -> None:
    """CopyError if the store is at ``newer``, a revision this oasis does not know."""
    if newer is not None:
        raise CopyError(
            f"{role} {shown_url} is at schema revision {newer[:64]!r}, which this oasis "
            "does not know: a newer oasis migrated it; copy it with that version"
        )


def _migrated(db: Database, role: str, shown_url: str) -> str:
    """Migrate ``db`` to the newest revision; returns it."""
    try:
        return migrate(db)
    except StoreVersionError as err:
        raise CopyError(f"{role} {shown_url} {err}") from err
    except (SQLAlchemyError, StoreUnavailableError) as err:
        raise CopyError(f"{role} {shown_url}: cannot migrate it: {_first(err)}") from err
    except Exception as err:  # StoreHiddenError and the like: the message says it
        raise CopyError(f"{role} {shown_url}: {err}") from err


def _check_empty(db: Database, shown_url: str) -> None:
    """CopyError naming the tables of the models that hold rows, if any does (a table
    not there yet holds none), or if the store is at a revision this oasis does not
    know."""
    held = []
    try:
        with db.patient(COPY_SECONDS), db.engine.connect() as conn:
            _refuse_newer("destination", shown_url, newer_revision(conn))
            there = set(inspect(conn).get_table_names())
            for table in store_tables():
                if table.name not in there:
                    continue
                n = conn.scalar(select(func.count()).select_from(table))
                if n:
                    held.append(f"{table.name} {n:,}")
    except SQLAlchemyError as err:
        raise CopyError(f"destination {shown_url}: cannot read it: {_first(err)}") from err
    if held:
        raise CopyError(
            f"destination {shown_url} is not empty ({', '.join(held)} rows): the copy "
            "goes only into a store with no rows; name a new database (CREATE DATABASE), "
            "or drop this one's tables if nothing there is needed"
        )


def _copy(
    source: Database, destination: Database, batch: int, progress: Progress, report: CopyReport
) -> None:
    """Every table, in one destination transaction; the sequences set at its end."""
    table = ""
    try:
        with (
            source.patient(COPY_SECONDS),
            destination.patient(COPY_SECONDS),
            source.engine.connect() as reading,
            destination.engine.begin() as writing,
        ):
            for t in store_tables():
                table = t.name
                report.rows[t.name] = _copy_table(t, reading, writing, batch, progress)
            table = ""
            report.sequences = _advance_sequences(writing)
    except _BadRowError as err:
        raise CopyError(
            f"copying {table}: {err}; nothing was copied: the destination "
            f"{report.destination} holds no row"
        ) from err
    except DBAPIError as err:
        where = f"copying {table}: " if table else ""
        raise CopyError(
            f"{where}{_first(err)}; nothing was copied: the destination "
            f"{report.destination} holds no row"
        ) from err
    except StoreUnavailableError as err:
        raise CopyError(f"{err}; nothing was copied") from err


def _copy_table(
    table: Table, reading: Connection, writing: Connection, batch: int, progress: Progress
) -> int:
    """Copy ``table``'s rows in key order, ``batch`` at a time; returns how many."""
    total = int(reading.scalar(select(func.count()).select_from(table)) or 0)
    progress(table.name, 0, total)
    # a lenient type's python_type is object: its plain type says it is a time (before,
    # none was found, and SQLite's naive times were read in the destination's zone)
    times = [
        c.name
        for c in table.columns
        if isinstance(getattr(c.type, "impl_instance", c.type), DateTime)
    ]
    query = select(table).order_by(*table.primary_key.columns)
    done = 0
    # NOT NULL, but JSON: a document that does not read is written as JSON null, which
    # the column allows and the daemon reads as it read the source's
    required = [c.name for c in table.columns if not c.nullable and not isinstance(c.type, JSON)]
    lengths = [
        (c.name, c.type.length)
        for c in table.columns
        if isinstance(c.type, String) and c.type.length is not None
    ]
    result = reading.execution_options(yield_per=batch).execute(query)
    for rows in result.partitions(batch):
        values = [dict(row._mapping) for row in rows]
        for value in values:
            _check_row(table, value, required, lengths)
            for name in times:
                at = value[name]
                if isinstance(at, datetime):
                    value[name] = utc(at)
        writing.execute(table.insert(), values)
        done += len(values)
        progress(table.name, done, total)
    return done


class _BadRowError(Exception):
    """A source row the destination would refuse (the message names it and why)."""


def _check_row(
    table: Table, value: dict[str, Any], required: list[str], lengths: list[tuple[str, int]]
) -> None:
    """:class:`_BadRowError` naming ``value`` (a row of ``table`` as read) by its key if a
    column of ``required`` (NOT NULL) read as None, or a string is longer than its
    column's length (``lengths``: PostgreSQL holds a VARCHAR to it, SQLite does not).
    Before, the copy failed on PostgreSQL's words alone (``null value in column
    "decided_at" of relation "jobs"``), where the source row holds no NULL but a value
    SQLite kept of another type ('yesterday'), which no ``IS NULL`` finds."""
    key = ", ".join(f"{c.name} {str(value.get(c.name))[:64]!r}" for c in table.primary_key.columns)
    for name in required:
        if value.get(name) is None:
            column_type = table.columns[name].type
            plain = getattr(column_type, "impl_instance", column_type)  # a lenient type's
            raise _BadRowError(
                f"the row of {key}: its {name} does not read as {plain} (a value of another "
                "type, kept by SQLite from a hand edit, reads as NULL, which the column "
                "does not allow); mend that row in the source and copy again"
            )
    for name, length in lengths:
        text_value = value.get(name)
        if isinstance(text_value, str) and len(text_value) > length:
            raise _BadRowError(
                f"the row of {key}: its {name} is {len(text_value)} characters, over the "
                f"column's {length}; mend that row in the source and copy again"
            )


def _advance_sequences(conn: Connection) -> dict[str, int]:
    """Set each auto-numbered key's sequence (PostgreSQL) past the largest copied id;
    returns the next value of each."""
    if conn.dialect.name != "postgresql":
        return {}
    out = {}
    for table in store_tables():
        column = table.autoincrement_column
        if column is None:
            continue
        sequence = conn.scalar(
            text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": column.name}
        )
        if sequence is None:
            continue
        largest = conn.scalar(select(func.max(column)))
        if largest is None:
            conn.execute(text("SELECT setval(:s, 1, false)"), {"s": sequence})
            out[f"{table.name}.{column.name}"] = 1
        else:
            conn.execute(text("SELECT setval(:s, :v, true)"), {"s": sequence, "v": largest})
            out[f"{table.name}.{column.name}"] = int(largest) + 1
    return out


def _first(err: BaseException) -> str:
    """The first line of an error's message (a driver's runs on with its statement)."""
    inner = getattr(err, "orig", None)
    lines = str(inner if inner is not None else err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
