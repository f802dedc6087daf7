"""Clearing the retained events of jobs the store does not know.

A store restored from an older backup knows nothing of the jobs admitted after that
backup, but the broker still retains each one's latest event on ``jobs/<job>/events``
(e.g. ``started``): a tenant's subscriber saw a job running that no longer exists, for
good (retention clears only the topics of jobs the store deletes). When the agents report
such a job (:mod:`controller.plane.unknown_jobs`), the plane clears its retained event
with an empty retained message, as retention does for a deleted job: a live subscriber
gets the empty payload (the job is gone), a later one nothing.

No final ``lost`` event is published first. Job events carry their place in the store's
event log (``sequence``), on which consumers dedupe; the restored store's log is behind
the lost job's last published event, so a made-up event would carry either a sequence
lower than the one retained (a deduping consumer drops it as stale) or one a later real
event of another job also takes. And retained, nothing would ever clear it. The empty
payload is what consumers already take as "this job's record is gone"; a job that was
running never gets it otherwise (retention deletes only ended jobs).

Only ids the agents reported and the store lacks are queued, a bounded number per review
(:data:`~controller.plane.unknown_jobs.MAX_LOOKED_UP`), each once per daemon process
(:data:`MAX_REMEMBERED`), and the store is asked again just before the clear
(:meth:`UnknownJobEvents.take`): a job of the same id submitted since has its own event,
published after the clear.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

__all__ = ["MAX_QUEUED", "MAX_REMEMBERED", "UnknownJobEvents"]

MAX_QUEUED = 1000
"""Unknown jobs waiting for their retained event to be cleared, at most; past it, the
rest wait for the agents' next report of them."""
MAX_REMEMBERED = 10_000
"""Unknown jobs whose retained event was cleared, remembered so that an agent reporting
one again does not clear it again; past it, forgotten all at once (a clear again costs
one empty message)."""


class UnknownJobEvents:
    """The queue of unknown jobs whose retained events the plane clears.

    :meth:`add` is called in the decision thread (the review), :meth:`take` on the event
    loop through the decision thread; the deque's appends and pops are atomic.
    """

    def __init__(self) -> None:
        self._queued: collections.deque[str] = collections.deque()
        self._done: set[str] = set()

    def add(self, job_ids: Iterable[str]) -> bool:
        """Queue ``job_ids`` (the store lacks them) not yet cleared or queued; ``True`` if
        any was queued."""
        queued = set(self._queued)
        new = [j for j in dict.fromkeys(job_ids) if j not in self._done and j not in queued]
        new = new[: max(MAX_QUEUED - len(self._queued), 0)]
        self._queued.extend(new)
        return bool(new)

    def __bool__(self) -> bool:
        return bool(self._queued)

    def take(self, still_unknown: Callable[[list[str]], list[str]]) -> list[str]:
        """The queued jobs, emptied, that ``still_unknown`` (the store, asked now) still
        lacks; those are remembered as cleared."""
        queued = [self._queued.popleft() for _ in range(len(self._queued))]
        if not queued:
            return []
        gone = still_unknown(queued)
        if len(self._done) + len(gone) > MAX_REMEMBERED:
            self._done.clear()
        self._done.update(gone)
        return gone
