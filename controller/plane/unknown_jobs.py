"""Jobs that agents run but the store has no record of.

After a store is restored from a backup, the agents still run the jobs admitted after
that backup was made: the restored store knows nothing of them, so the daemon withdraws
their plans at its next round and their workers stop. Their reports were only counted
("report entries ignored"), so the operator could not tell which tenants' jobs the
restore lost, and those tenants heard nothing (``oasis job ID``: ``NOT_FOUND``). The
plane looks up the ids of ignored entries (a bounded number per review) and names those
the store lacks (:func:`unknown_jobs`), so the operator can tell their tenants to submit
them again.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.store import JobRow

__all__ = ["MAX_LOOKED_UP", "MAX_NAMED", "unknown_jobs"]

MAX_LOOKED_UP = 200
"""Ids of ignored report entries looked up in the store per review, at most (one
primary-key query): a flood of made-up ids costs one bounded query, not one per id."""
MAX_NAMED = 20
"""Unknown job ids named in one log line, at most."""


def unknown_jobs(session: Session, ids: Iterable[str]) -> list[str]:
    """The ids among the first :data:`MAX_LOOKED_UP` of ``ids`` that no stored job has,
    sorted."""
    wanted = sorted(set(ids))[:MAX_LOOKED_UP]
    if not wanted:
        return []
    stored = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(wanted))))
    return [job for job in wanted if job not in stored]
