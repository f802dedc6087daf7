"""What is wrong with the store, in the words a caller may read.

The store's own words name hosts, ports, roles, settings and paths: an operator reads
them (with what to do about a lock), a submitter reads only that something is wrong.
``GetLeadership`` (``oasis status``) and the console's overview both say it this way, from
the store watch's last probe (:class:`controller.store.Database`: ``down_reason``,
``refusing``, ``writes_locked``; each "" when all is well), never from a call of their
own: a hung store must not hang them.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.auth import Caller, Role
from controller.store import Database
from controller.store.lock_waits import LOCK_HELP

__all__ = ["StoreTrouble", "store_trouble"]


@dataclass(frozen=True, slots=True)
class StoreTrouble:
    """Each "" when all is well: ``down``, why the store is out of reach; ``refused``,
    why it refuses writes (reads go on); ``locked``, why the last commit waited for
    another connection's lock (reads go on)."""

    down: str
    refused: str
    locked: str


def store_trouble(db: Database, caller: Caller) -> StoreTrouble:
    """``db``'s trouble as ``caller`` may read it."""
    operator = caller.role is Role.OPERATOR
    down, refused, locked = db.down_reason, db.refusing, db.writes_locked
    return StoreTrouble(
        down=down if operator or not down else "the store is unavailable",
        refused=refused if operator or not refused else "the store refuses writes",
        locked=(f"{locked}: {LOCK_HELP}" if operator else "the store's writes wait for a lock")
        if locked
        else "",
    )
