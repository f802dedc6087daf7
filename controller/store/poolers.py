"""A connection pooler between oasisd and PostgreSQL, found at start and refused in words.

oasisd's sessions are its own: every connection starts with the settings that bound the
store's calls (``statement_timeout``, ``lock_timeout``: ``daemon.store_timeout``), passed
in the startup packet's ``options``; the writer lock is a *session* advisory lock
(:mod:`.writer_lock`); psycopg prepares the statements it runs often. A pooler such as
pgbouncer keeps none of that:

- by default it refuses the connection ("unsupported startup parameter: options"), which
  read as PostgreSQL's own words named nothing an operator could act on;
- told to ignore ``options`` (``ignore_startup_parameters = options``, the usual advice),
  it connects, and every session runs with no statement or lock timeout: a store that
  hangs holds the daemon's calls for ever;
- in its transaction mode, a session lock stays on the server connection the pooler
  hands to the next client, a second daemon included, and prepared statements meet
  other sessions' names (in the pooler audit the first submission through pgbouncer
  1.18 failed ``INTERNAL``: ``prepared statement "_pg3_0" already exists``).

So each session also sets :data:`MARK` (a custom setting, which PostgreSQL keeps for the
session), and the daemon reads it back before it takes the writer lock
(:func:`check_session`): absent, the settings were dropped on the way, and the start is
refused, naming the pooler and the remedy. oasisd holds few connections of its own
(``daemon.store_timeout`` bounds each), so it needs no pooler in front of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:  # the store's engine module imports this one's MARK_OPTION
    from controller.store.database import Database

__all__ = ["MARK", "MARK_OPTION", "StorePoolerError", "check_session", "pooler_refusal"]

MARK = "oasis.session_settings"
"""A custom setting each oasisd session starts with (:data:`MARK_OPTION`)."""

MARK_OPTION = f"-c {MARK}=on"
"""The libpq ``options`` item that sets :data:`MARK` (``controller/store/database.py``)."""


def _remedy(setting: str) -> str:
    return (
        f"point {setting} at PostgreSQL itself (oasisd keeps a few connections of its own; "
        "its writer lock is a session lock, which a pooler in transaction mode hands to "
        "other clients)"
    )


class StorePoolerError(Exception):
    """The store is reached through a pooler that drops oasisd's session settings: an
    operator's to mend (a restart would meet it again)."""


def check_session(db: Database, setting: str = "daemon.store_url") -> None:
    """Raise :class:`StorePoolerError` unless a session of ``db`` (PostgreSQL) holds the
    settings oasisd connects with, naming ``setting`` (the store's URL) in the remedy.
    One round trip on a pooled connection."""
    asked = text("SELECT current_setting(:m, true), current_setting('statement_timeout')")
    with db.engine.connect() as conn:
        held, timeout = conn.execute(asked, {"m": MARK}).one()
    if held != "on":
        raise StorePoolerError(
            "its sessions do not hold the settings oasisd connects with (statement_timeout "
            f"is {timeout}, not the {db.timeout:g} s it asked): a connection "
            "pooler between oasisd and PostgreSQL drops them (pgbouncer does, with "
            f"ignore_startup_parameters = options); {_remedy(setting)}"
        )


def pooler_refusal(said: str, setting: str = "daemon.store_url") -> str | None:
    """Why a connection was refused, if ``said`` (the driver's message) is a pooler's
    refusal of the session settings, naming ``setting`` (the store's URL); None
    otherwise."""
    at = said.find("unsupported startup parameter")
    if at < 0:
        return None
    return (
        f"a connection pooler between oasisd and PostgreSQL refused the session settings "
        f"oasisd connects with ({said[at:].strip()}); pgbouncer does that. Do not make it ignore "
        f"them (every call would then run without its statement and lock timeouts): "
        f"{_remedy(setting)}"
    )
