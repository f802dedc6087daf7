"""PostgreSQL's refusals that only its DBA can mend, said so: which setting, and what to do.

A server that answers but will not let the daemon's role write (a privilege revoked, the
database or a hot standby read-only, the tables out of the role's ``search_path``) is not
a bug of the daemon's, and not an outage that passes by itself either. Each such error
read as a bug (gRPC ``INTERNAL``, a traceback in the log, a client that does not retry):
in the PostgreSQL audit every tenant's submission failed so while a DBA's ``REVOKE``,
``ALTER DATABASE ... SET default_transaction_read_only = on`` or ``ALTER ROLE ... SET
search_path`` held, and none was tried again once it was undone. :func:`refusal` words
them for the operator; the store turns them into ``StoreUnavailableError``
(``UNAVAILABLE``: nothing was kept, retry), and the start-up into its one-line error,
as it does a lock wait that outlasted ``daemon.store_timeout`` (:func:`lock_waited`,
naming the sessions holding the tables).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

__all__ = ["REFUSED_SQLSTATES", "is_refusal", "lock_waited", "login_refusal", "refusal"]

INSUFFICIENT_PRIVILEGE = "42501"
READ_ONLY_TRANSACTION = "25006"
UNDEFINED_TABLE = "42P01"
NO_SCHEMA = "3F000"  # "no schema has been selected to create in": search_path names none

REFUSED_SQLSTATES = frozenset(
    {INSUFFICIENT_PRIVILEGE, READ_ONLY_TRANSACTION, UNDEFINED_TABLE, NO_SCHEMA}
)
"""The SQLSTATEs :func:`refusal` words."""


def _said(orig: Any) -> str:
    """What PostgreSQL said (its primary message), on one line."""
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    lines = str(primary or orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


def refusal(orig: Any, url: URL) -> str | None:
    """Why the store at ``url`` refused an operation, and what its DBA does about it, if
    ``orig`` (a driver exception: ``DBAPIError.orig``) carries one of
    :data:`REFUSED_SQLSTATES`; None otherwise. Never holds the URL's password."""
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate not in REFUSED_SQLSTATES:
        return None
    said = _said(orig)
    role = url.username or "the daemon's role"
    database = url.database or "the store's database"
    if sqlstate == INSUFFICIENT_PRIVILEGE:
        if " for schema " in said:
            schema = said.rsplit(" ", 1)[-1]
            return (
                f"the store's role {role} may not create or use its tables ({said}): "
                f"PostgreSQL 15 and later let only the owner of schema {schema} create in "
                f"it. A DBA runs ALTER SCHEMA {schema} OWNER TO {role}, or GRANT USAGE, "
                f"CREATE ON SCHEMA {schema} TO {role}, in database {database}"
            )
        return (
            f"the store's role {role} lacks a privilege ({said}): a DBA gives it back, "
            f"e.g. GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "
            f"{role}; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role} "
            f"(in database {database}; the schema of the store's tables if not public). "
            "Upgrades migrate the tables: the role should own them"
        )
    if sqlstate == READ_ONLY_TRANSACTION:
        return (
            f"the store is read-only ({said}): database {database} or role {role} has "
            "default_transaction_read_only on, or daemon.store_url names a hot standby. "
            f"Point store_url at the primary (with several hosts, add "
            f"?target_session_attrs=read-write), or ALTER DATABASE {database} SET "
            "default_transaction_read_only = off (and ALTER ROLE ... RESET it)"
        )
    return (  # the tables are not where the role's sessions look
        f"the store's tables are not in the schemas role {role} searches ({said}): the "
        f"search_path of role {role} or of database {database} changed (ALTER ROLE/"
        "DATABASE ... SET search_path), or the tables were renamed or dropped. Set "
        "search_path back (ALTER ROLE ... RESET search_path), or name the tables' schema "
        "in daemon.store_url (?options=-csearch_path%3Dpublic)"
    )


def login_refusal(said: str, url: URL) -> str | None:
    """Why PostgreSQL refused the connection itself, and what to do, if ``said`` (the
    driver's first line) names the store's role, password, database or ``pg_hba.conf``:
    the operator's or DBA's to mend, so ``oasisd`` exits 2 and systemd does not start it
    again every 2 s for ever. None for anything else (a server out of reach or starting
    up passes by itself). Never holds the URL's password."""
    role = url.username or "the daemon's role"
    database = url.database or "the store's database"
    fatal = said[said.find("FATAL:") :] if "FATAL:" in said else said
    fatal = " ".join(fatal.split())
    if "password authentication failed" in said:
        return (
            f"PostgreSQL refused role {role}'s password ({fatal}): set the right one where "
            "libpq reads it (the oasis user's ~/.pgpass, PGPASSWORD in the unit's "
            "environment), or in daemon.store_url"
        )
    if "role " in said and " does not exist" in said:
        return (
            f"there is no role {role} on that server ({fatal}): a DBA creates it "
            f"(CREATE ROLE {role} LOGIN), or daemon.store_url names another user"
        )
    if "is not permitted to log in" in said:
        return (
            f"role {role} may not log in ({fatal}): a DBA runs ALTER ROLE {role} LOGIN, "
            "or daemon.store_url names another user"
        )
    if "database " in said and " does not exist" in said:
        return (
            f"there is no database {database} on that server ({fatal}): a DBA creates it "
            f"(CREATE DATABASE {database} OWNER {role}), or daemon.store_url names another"
        )
    if "no pg_hba.conf entry" in said:
        return (
            f"PostgreSQL's pg_hba.conf admits no connection of role {role} to database "
            f"{database} from this host ({fatal}): a DBA adds a line for it and reloads "
            "PostgreSQL"
        )
    return None


_OPENINGS = ("the store's role ", "the store is read-only (", "the store's tables are not in ")
"""How every text of :func:`refusal` begins."""


def is_refusal(text: str) -> bool:
    """Whether ``text`` (an error's message, as the commit process passes it back) is one
    of :func:`refusal`'s."""
    return text.startswith(_OPENINGS)


LOCK_NOT_AVAILABLE = "55P03"

_HOLDERS = text(
    "SELECT DISTINCT l.pid, a.usename, a.application_name, a.xact_start, c.relname, l.mode "
    "FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.granted AND l.pid <> pg_backend_pid() "
    "AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', "
    "'AccessExclusiveLock') "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
    "ORDER BY l.pid, c.relname LIMIT 5"
)


def lock_waited(orig: Any, engine: Engine, timeout: float) -> str | None:
    """If ``orig`` is a lock wait PostgreSQL ended (``lock_timeout``, 55P03): which
    sessions hold the store's tables (found on ``engine``, in one more connection; none
    named if that fails too), and what ends them; None for any other error. For the
    start-up's line: "canceling statement due to lock timeout" alone named neither the
    setting nor the session (a VACUUM FULL, a LOCK TABLE left open in psql)."""
    if getattr(orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
        return None
    try:
        with engine.connect() as conn:
            rows = conn.execute(_HOLDERS).all()
    except DBAPIError:
        rows = []
    held = "; ".join(  # what the role may see: another user's xact_start is hidden
        f"session {pid} (user {user}"
        f"{f', application {app!r}' if app else ''}"
        f"{f', in a transaction since {since:%Y-%m-%dT%H:%M:%SZ}' if since else ''}) "
        f"holds {mode} on {table}"
        for pid, user, app, since, table, mode in rows
    )
    pids = sorted({row[0] for row in rows})
    end = (
        " or ".join(f"SELECT pg_terminate_backend({pid})" for pid in pids)
        if pids
        else "pg_terminate_backend"
    )
    return (
        f"{_said(orig)}: another session held a lock on the store's tables longer than "
        f"daemon.store_timeout ({timeout:g} s){': ' + held if held else ''}. End it "
        f"(COMMIT or ROLLBACK in that session, or {end}), or let a VACUUM FULL finish"
    )
