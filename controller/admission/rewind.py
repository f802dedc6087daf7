"""A store rewound under a running daemon: a backup restored over it (``pg_restore
--clean``, a schema dropped and reloaded, a point-in-time recovery) or its newest events
deleted by hand, while the daemon's ledger still holds what was decided after the copy.

Left alone, a leader went on pricing against jobs the store no longer holds (a tenant
submitting such a job id again got ``INTERNAL: LedgerError``), and a standby skipped the
events the leader committed next, as the restored event sequence hands out numbers it had
already applied: a standby taking over then led on a ledger missing admitted jobs, which
can fill servers past capacity (the PostgreSQL restore audit).

The signs, read by :func:`rewound`:

- the store's newest event is older than the last one the daemon's ledger reflects;
- another event holds the number of the one the ledger reflects last (:class:`EventMark`,
  a standby's): the leader numbered new events past it after the restore;
- a leader's commit was given event numbers at or below ones it had seen
  (:meth:`~controller.admission.commit.GroupCommit._commit_batch`).

Any one of them marks the ledger stale and rewound: the daemon rebuilds it from the store
as it is (as at start), says so in the journal (``the store was rewound``), and counts on
from the store's newest event. What the restore dropped stays dropped: their tenants
must submit those jobs again (README, Backups).

Retention (``keep_days``) never deletes the newest event without writing a newer one
(:mod:`.retention`), so a store where nothing happened for that long is not one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.store import EventRow

__all__ = ["REWOUND_HINT", "EventMark", "mark_at", "rewound"]

REWOUND_HINT = (
    "the store was restored from an older copy, or its newest events deleted, under this "
    "daemon: the ledger is rebuilt from the store as it is now; jobs decided after the "
    "copy are gone from it and their tenants must submit them again (README: Backups)"
)
"""What the journal says along with :func:`rewound`'s finding."""


@dataclass(frozen=True)
class EventMark:
    """The identity of one stored event: its number and what a restore would not give
    the same number again (its time, kind and job).

    Attributes:
        sequence: the event's number.
        at: when it was written, as stored.
        kind: its kind.
        job_id: its job ("" for none).
    """

    sequence: int
    at: datetime | None
    kind: str
    job_id: str

    @classmethod
    def of(cls, row: EventRow) -> EventMark:
        """The mark of a stored event row."""
        return cls(row.sequence, row.at, row.kind, row.job_id)


def mark_at(session: Session, sequence: int) -> EventMark | None:
    """The mark of stored event ``sequence``; None if there is none."""
    row = session.scalar(select(EventRow).where(EventRow.sequence == sequence))
    return EventMark.of(row) if row is not None else None


def rewound(session: Session, seen: int, mark: EventMark | None = None) -> str:
    """Why the store no longer holds the events up to ``seen`` (the last the daemon's
    ledger reflects) -- ``mark`` being that event, if known -- or "" if it does."""
    newest = int(session.scalar(select(func.max(EventRow.sequence))) or 0)
    if newest < seen:
        return f"the store's newest event is {newest}, older than event {seen} this daemon applied"
    if mark is None or mark.sequence != seen or seen <= 0:
        return ""
    row = session.execute(
        select(EventRow.at, EventRow.kind, EventRow.job_id).where(EventRow.sequence == seen)
    ).first()
    # gone with newer ones stored: retention deleted it (its job ended keep_days ago);
    # a restore that the leader numbered past gives the number to another event
    if row is not None and (row.at, row.kind, row.job_id) != (mark.at, mark.kind, mark.job_id):
        return (
            f"event {seen} is another one now ({row.kind} of job {row.job_id!r} instead of "
            f"{mark.kind} of job {mark.job_id!r})"
        )
    return ""
