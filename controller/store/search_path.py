"""A new store is not begun beside an existing one that the role's ``search_path`` hides.

PostgreSQL looks for unqualified tables along the session's ``search_path``, which a DBA
may change for the daemon's role or database (``ALTER ROLE oasis SET search_path =
app``). In the PostgreSQL audit a daemon restarted after such a change found no tables
where it looked, migrated an empty store into the other schema, and decided on, blind
to every job admitted in ``public`` (their servers' capacity offered again), without a
word. :func:`check_new_store` refuses that: a store about to be created while another
schema of the same database holds one is an error naming both, unless ``store_url``
names the schema itself (``?options=-csearch_path%3Dapp``: the operator's choice).
"""

from __future__ import annotations

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL

__all__ = ["StoreHiddenError", "StoreUnversionedError", "check_new_store", "check_unversioned"]


class StoreHiddenError(Exception):
    """The daemon would create a new store while another schema of the database holds
    one, out of its role's ``search_path`` (the message names both, and what to do)."""


class StoreUnversionedError(Exception):
    """The store holds oasis tables but no schema revision (``alembic_version`` missing
    or empty): a backup restored in part, or a hand edit (the message says so)."""


_OTHER_STORES = text(
    "SELECT n.nspname FROM pg_namespace n "
    "WHERE n.nspname IS DISTINCT FROM current_schema() "
    "AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid "
    "AND c.relname = 'alembic_version' AND c.relkind IN ('r', 'p')) "
    "AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid "
    "AND c.relname = 'jobs' AND c.relkind IN ('r', 'p')) "
    "ORDER BY n.nspname"
)


def names_search_path(url: URL) -> bool:
    """Whether ``url`` sets ``search_path`` itself (libpq ``options``)."""
    options = url.query.get("options", "")
    return "search_path" in " ".join(options if isinstance(options, tuple) else (options,))


def check_new_store(conn: Connection, url: URL) -> None:
    """Before a new store is created on ``conn`` (PostgreSQL, a database whose current
    schema holds none): :class:`StoreHiddenError` if another schema holds one and ``url``
    does not name the schema; nothing otherwise."""
    if names_search_path(url):
        return
    others = [str(name) for name in conn.execute(_OTHER_STORES).scalars()]
    if not others:
        return
    current, search_path = conn.execute(
        text("SELECT current_schema(), current_setting('search_path')")
    ).one()
    role = url.username or "the daemon's role"
    database = url.database or "the store's database"
    here = f"schema {current}" if current else "no schema (none of it exists)"
    schemas = ", ".join(others)
    raise StoreHiddenError(
        f"it holds no oasis tables where role {role} looks (search_path {search_path!r}: "
        f"{here}), but schema {schemas} of database {database} holds an oasis store: the "
        f"search_path of role {role} or of database {database} changed (ALTER ROLE/"
        "DATABASE ... SET search_path). Started so, this daemon would begin an empty store "
        "beside that one, blind to every job admitted there. Set search_path back (ALTER "
        f"ROLE {role} RESET search_path), or name the schema in daemon.store_url "
        f"(?options=-csearch_path%3D{others[0]}); to begin a new store elsewhere on "
        "purpose, name that schema there"
    )


def check_unversioned(conn: Connection, tables: set[str]) -> None:
    """Before a new store is created on ``conn`` (no schema revision recorded):
    :class:`StoreUnversionedError` if the tables it would create (``tables``) are there
    already. The first migration then failed on them: oasisd exited 1 with "table
    servers already exists", and the unit restarted it every 2 s, failing each time."""
    from sqlalchemy import inspect

    found = sorted(tables & set(inspect(conn).get_table_names()))
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise StoreUnversionedError(
            f"holds oasis tables ({shown}) but no schema revision (its alembic_version "
            "table is missing or empty): a backup restored in part, or a hand edit. "
            "Restore the whole backup (alembic_version included), or give oasisd an empty "
            "database (another daemon.data_dir or store_url)"
        )
