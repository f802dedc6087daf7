"""A store whose writes wait for a lock another connection holds: a ``sqlite3`` shell's
open write transaction, a ``LOCK TABLE`` left open in psql, a ``VACUUM FULL``.

The store answers reads meanwhile (its probe's ``SELECT 1`` goes through), so it reads
as up while every decision's commit fails after ``daemon.store_timeout``:
:class:`~controller.store.database.Database` keeps the last such failure until a commit
or :func:`sqlite_write_lock_free` says the lock is gone.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["LOCK_HELP", "is_lock_wait", "sqlite_write_lock_free"]

_WORDS = (
    "database is locked",  # SQLite's SQLITE_BUSY past its busy timeout
    "database table is locked",
    "lock timeout",  # PostgreSQL's lock_timeout (55P03)
    "could not obtain lock",
)

LOCK_HELP = (
    "another connection held a lock on the store past daemon.store_timeout (a sqlite3 "
    "shell's open transaction, a LOCK TABLE in psql, a VACUUM FULL): end it"
)
"""What the operator does about it, after the store's own words."""


def is_lock_wait(reason: str) -> bool:
    """Whether a failed commit's ``reason`` is a wait for another connection's lock."""
    lower = reason.lower()
    return any(words in lower for words in _WORDS)


def sqlite_write_lock_free(path: Path) -> bool:
    """Whether the SQLite store at ``path`` lets a writer in now: its write lock taken
    and given back at once (``BEGIN IMMEDIATE``, ``ROLLBACK``; nothing written), never
    waited for. An existing file only (``mode=rw``: none is created at the path)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=0)
    except sqlite3.Error:
        return False
    try:
        conn.isolation_level = None
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.Error:
        return False
    finally:
        conn.close()
