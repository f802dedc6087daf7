"""PostgreSQL's refusals that only its DBA can mend, said so: which setting, and what to do.

A server that answers but will not let the daemon's role write (a privilege revoked, the
database or a hot standby read-only, the tables out of the role's ``search_path``) is not
a bug of the daemon's, and not an outage that passes by itself either. Each such error
read as a bug (gRPC ``INTERNAL``, a traceback in the log, a client that does not retry):
in the PostgreSQL audit every tenant's submission failed so while a DBA's ``REVOKE``,
``ALTER DATABASE ... SET default_transaction_read_only = on`` or ``ALTER ROLE ... SET
search_path`` held, and none was tried again once it was undone. :func:`refusal` words
them for the operator; the store turns them into ``StoreUnavailableError``
(``UNAVAILABLE``: nothing was kept, retry), and the start-up into its one-line error.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

__all__ = ["REFUSED_SQLSTATES", "refusal"]

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
