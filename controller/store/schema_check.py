"""The store's tables against the schema revision its ``alembic_version`` records.

A hand edit of ``alembic_version``, or a restore that brought back the tables of one
backup and ``alembic_version`` of another, leaves the two apart:

- the revision is older than the tables: the next migration finds its own index or column
  already there and fails (``index ix_jobs_state_sequence already exists``,
  ``duplicate column name: cause``);
- the revision is newer than the tables: nothing is migrated, and the first query of a
  column they lack fails (``no such column: jobs.decided_slot``).

Either way oasisd exited 1 and the systemd unit restarted it every 2 s, failing each time
on a line that did not say what was wrong. Both are now :class:`StoreSchemaError` (exit
2, not restarted), naming the revision, the table and column, and what to do. A migration
runs in one transaction, so one that failed so left the store as it was.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import Connection, MetaData, inspect
from sqlalchemy.exc import DBAPIError

__all__ = ["StoreSchemaError", "check_tables", "revision_behind"]

_ALREADY_THERE = frozenset({"42P07", "42701", "42710"})
"""PostgreSQL's SQLSTATEs of DDL that finds its object there already: a table or index
(``duplicate_table``), a column (``duplicate_column``), a constraint
(``duplicate_object``)."""

_MEND = (
    "Restore the whole backup (alembic_version with its tables), or set "
    "alembic_version.version_num to the revision the tables are at; oasisd migrates them "
    "on from there"
)


class StoreSchemaError(Exception):
    """The store's tables are not at the schema revision it records (the message, read
    after "it", says which and what to do); only an operator can mend it."""


def _already_there(err: DBAPIError) -> bool:
    """Whether ``err`` is DDL that found its table, index, column or constraint there."""
    if not isinstance(err.orig, sqlite3.OperationalError):  # psycopg: by its SQLSTATE
        return getattr(err.orig, "sqlstate", None) in _ALREADY_THERE
    said = str(err.orig).lower()  # SQLite's words: its DDL has no code of its own
    return said.endswith("already exists") or said.startswith("duplicate column name")


def revision_behind(revision: str, err: DBAPIError) -> StoreSchemaError | None:
    """The error to raise for ``err``, raised by migrating a store from ``revision``: a
    :class:`StoreSchemaError` if its DDL found its object there already (the tables are
    past ``revision``), else None (``err`` stands)."""
    if not _already_there(err):
        return None
    lines = str(err.orig).strip().splitlines()
    found = lines[0][:200] if lines else type(err.orig).__name__
    return StoreSchemaError(
        f"records schema revision {revision[:64]!r}, but its tables are already past it: "
        f"migrating them from there found what a later migration makes ({found}); its "
        "alembic_version was edited, or restored from another backup than its tables. "
        "The store was left as it was. " + _MEND
    )


def check_tables(conn: Connection, metadata: MetaData, revision: str) -> None:
    """:class:`StoreSchemaError` if a table or column of ``metadata`` (the models at the
    newest revision) is missing from the store on ``conn``, which records ``revision``."""
    found = inspect(conn)
    tables = set(found.get_table_names())
    missing: list[str] = []
    for name, table in sorted(metadata.tables.items()):
        if name not in tables:
            missing.append(f"table {name}")
            continue
        columns = {c["name"] for c in found.get_columns(name)}
        missing += [f"column {name}.{c.name}" for c in table.columns if c.name not in columns]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if missing[5:] else "")
        raise StoreSchemaError(
            f"records schema revision {revision[:64]!r}, but lacks its {shown}: its tables "
            "are older than its alembic_version (a backup restored in part, or a hand "
            "edit). " + _MEND
        )
