"""How much each submitter has had stored lately: the bytes of the job specs of its
submissions of the last day, against ``limits.max_stored_mb_per_day``.

Every submission is stored, a rejected one too (a retry of it gets its first answer, and
``oasis offline --store`` reads it back), with its spec of up to ``limits.max_spec_bytes``.
So the store grew as fast as one tenant submitted: an audit's tenant, within the example
config's rate (20 a second), had 10.6 rejected jobs a second of 31 KB specs stored, 28 GB
a day, and with the default ``rate = 0`` the decision thread's pace alone allows more.
A full disk then refuses every tenant's submissions. Past its budget a submitter's new
jobs are refused (``RESOURCE_EXHAUSTED``, nothing stored) until its older ones leave the
day; other submitters are not touched, and a retry of a stored job is answered as always.

Counted per hour (``BUCKET_SECONDS``): a submitter's day is its 24 newest hours, so a
job leaves the count between 23 and 24 hours after it was stored. Kept in memory, and
read back from the store when a daemon starts to lead (its start, a standby's takeover:
:func:`stored_day`) while a limit is set: before, a restart forgot the day, so a tenant
could store its budget again after each one. A job is counted at its ``decided_at``,
which is when it was stored, or later for a job that waited (counted once it was decided
again, a slight over-count, never an under-count, for an admitted one; a job that expired
after waiting keeps its older sequence and may be missed, which the queue's limits bound).
"""

from __future__ import annotations

import math
from collections import deque
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, cast, func, select
from sqlalchemy.orm import Session

from controller.store import JobRow
from controller.store.stored import utc
from pricing.fields import is_integer

__all__ = ["BUCKET_SECONDS", "DAY_SECONDS", "StoredBudget", "over_budget", "stored_day"]


DAY_SECONDS = 86_400.0
BUCKET_SECONDS = 3_600.0
_BUCKETS = int(DAY_SECONDS // BUCKET_SECONDS)


class StoredBudget:
    """Bytes stored per submitter (a token's name; None without ``[auth]``) over its last
    day, in hourly buckets: ``deque[(hour number, bytes)]``, newest last, at most 24
    buckets a submitter. Used by the decision thread alone."""

    def __init__(self) -> None:
        self._by: dict[str | None, deque[tuple[int, int]]] = {}

    def used(self, by: str | None, now: float) -> int:
        """Bytes ``by`` had stored in the day up to ``now`` (Unix seconds)."""
        buckets = self._by.get(by)
        if buckets is None:
            return 0
        self._drop_old(by, buckets, now)
        return sum(n for _, n in buckets)

    def add(self, by: str | None, now: float, size: int) -> None:
        """Count ``size`` bytes stored for ``by`` at ``now`` (Unix seconds)."""
        hour = math.floor(now / BUCKET_SECONDS)
        buckets = self._by.setdefault(by, deque())
        if buckets and buckets[-1][0] == hour:
            buckets[-1] = (hour, buckets[-1][1] + size)
        else:
            buckets.append((hour, size))
        self._drop_old(by, buckets, now)

    def restore(self, hours: list[tuple[str | None, int, int]], now: float) -> None:
        """Count ``(submitter, hour number, bytes)`` (:func:`stored_day`, in any order)
        of the day up to ``now`` (Unix seconds) on top of what is counted."""
        newest = math.floor(now / BUCKET_SECONDS)
        for by, hour, size in sorted(hours, key=lambda h: h[1]):  # add() keeps them in order
            if newest - _BUCKETS < hour <= newest:
                self.add(by, hour * BUCKET_SECONDS, size)

    def submitters(self) -> int:
        """How many submitters have bytes counted."""
        return len(self._by)

    def _drop_old(self, by: str | None, buckets: deque[tuple[int, int]], now: float) -> None:
        oldest = math.floor(now / BUCKET_SECONDS) - _BUCKETS + 1
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()
        if not buckets:
            del self._by[by]


def stored_day(session: Session, now: float) -> tuple[list[tuple[str | None, int, int]], int]:
    """What the store holds of the day up to ``now`` (Unix seconds): ``(submitter, hour
    number, bytes of specs)`` per submitter and hour (``floor(Unix seconds / 3600)``),
    and the jobs counted.

    The jobs of the day are found by their sequence (:func:`_first_of_day`), so an old
    history costs nothing, and summed by the database, so a day of 10^5 jobs costs no
    Python per job. A spec is canonical JSON, all ASCII, so its length is its bytes."""
    since = datetime.fromtimestamp(now - DAY_SECONDS, UTC)
    first = _first_of_day(session, since)
    if first is None:
        return [], 0
    at = JobRow.decided_at
    if session.get_bind().dialect.name == "postgresql":
        hour: ColumnElement[Any] = cast(
            func.floor(func.extract("epoch", at) / BUCKET_SECONDS), BigInteger
        )
    else:  # SQLite keeps the time as SQLAlchemy writes it, UTC: 'YYYY-MM-DD HH:MM:SS.ffffff'
        hour = func.substr(at, 1, 13)  # to the hour (strftime('%s') took twice as long)
    query = (
        select(JobRow.submitter, hour, func.sum(func.length(JobRow.spec)), func.count())
        .where(JobRow.sequence >= first, at >= since)
        .group_by(JobRow.submitter, hour)
    )
    out: list[tuple[str | None, int, int]] = []
    jobs = 0
    for by, key, size, count in session.execute(query):
        number = _hour_number(key)
        if number is not None and is_integer(size) and is_integer(count):  # else an edit's
            out.append((by if isinstance(by, str) else None, number, int(size)))
            jobs += int(count)
    return out, jobs


def _hour_number(key: Any) -> int | None:
    """``floor(Unix seconds / 3600)`` of an hour as :func:`stored_day` groups by it: a
    number (PostgreSQL) or ``'YYYY-MM-DD HH'`` in UTC (SQLite); None for anything else."""
    if is_integer(key):
        return key
    if not isinstance(key, str):
        return None
    try:
        at = datetime.fromisoformat(key)
    except ValueError:
        return None
    return math.floor(at.replace(tzinfo=UTC).timestamp() / BUCKET_SECONDS)


def _first_of_day(session: Session, since: datetime) -> int | None:
    """The least job sequence decided at or after ``since`` (None: none is), by a binary
    search down the sequence index (a job's sequence and ``decided_at`` are set together,
    so they rise together; a job that expired after waiting keeps its older sequence and
    is missed, which the queue's limits bound; a clock stepped back, or an edit, makes
    the boundary off by those jobs)."""
    lo, hi = session.execute(select(func.min(JobRow.sequence), func.max(JobRow.sequence))).one()
    if not (is_integer(lo) and is_integer(hi)):
        return None

    def after(sequence: int) -> tuple[int, bool] | None:
        """The first job at or after ``sequence``, and whether it is of the day."""
        row = session.execute(
            select(JobRow.sequence, JobRow.decided_at)
            .where(JobRow.sequence >= sequence)
            .order_by(JobRow.sequence)
            .limit(1)
        ).first()
        if row is None:
            return None
        at = row.decided_at
        if not isinstance(at, datetime):
            return row.sequence, False
        return row.sequence, utc(at) >= since

    newest = after(hi)
    if newest is None or not newest[1]:
        return None
    lo, hi = int(lo), int(hi)  # the answer is in (lo - 1, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        found = after(mid)
        if found is None or found[1]:
            hi = mid
        else:
            lo = found[0] + 1
    return lo


def over_budget(used: int, size: int, limit_mb: float) -> str:
    """Why a spec of ``size`` bytes may not be stored for a submitter that had ``used``
    bytes stored in the day, under ``limits.max_stored_mb_per_day = limit_mb`` (0: no
    limit); "" if it may."""
    if limit_mb <= 0:
        return ""
    limit = limit_mb * 2**20
    if used + size <= limit:
        return ""
    return (
        f"this submitter's jobs stored in the last day hold {used / 2**20:.1f} MiB of specs "
        f"and this one {size / 1024:.1f} KiB more, over limits.max_stored_mb_per_day = "
        f"{limit_mb:g}; nothing was stored: submit it again once older jobs have left "
        "the day (each counts for 23 to 24 hours), or ask an operator for a higher limit"
    )
