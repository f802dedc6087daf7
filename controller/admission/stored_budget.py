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
job leaves the count between 23 and 24 hours after it was stored. Kept in memory from
the daemon's start (or a standby's takeover): a restart forgets the day before it, so
around one a submitter may have up to twice its budget stored in a day.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["BUCKET_SECONDS", "DAY_SECONDS", "StoredBudget", "over_budget"]

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

    def _drop_old(self, by: str | None, buckets: deque[tuple[int, int]], now: float) -> None:
        oldest = math.floor(now / BUCKET_SECONDS) - _BUCKETS + 1
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()
        if not buckets:
            del self._by[by]


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
