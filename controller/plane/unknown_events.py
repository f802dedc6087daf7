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
(:data:`~controller.plane.unknown_jobs.MAX_LOOKED_UP`, shared fairly among the servers:
:class:`~controller.plane.unknown_jobs.UnknownLookups`), each once per daemon process
(:data:`MAX_REMEMBERED`), and the store is asked again just before the clear
(:meth:`UnknownJobEvents.take`): a job of the same id submitted since has its own event,
published after the clear.

Each id is held for the server whose agent reported it, and past either bound the ids
that go are those of the server that holds the most: one agent reporting ever new
made-up ids neither keeps another server's lost jobs out of the queue nor makes the
daemon forget that it cleared theirs (before, its ids filled the one queue while the
broker was away, and their overflow of the ids remembered forgot every server's, so the
other servers' cleared events were cleared again).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

__all__ = ["MAX_QUEUED", "MAX_REMEMBERED", "UnknownJobEvents", "crowding"]

MAX_QUEUED = 1000
"""Unknown jobs waiting for their retained event to be cleared, at most, over all
servers; past it, a server's new one takes the place of the newest of the server that
queued the most (if it queued more), or waits for the agents' next report of it."""
MAX_REMEMBERED = 10_000
"""Unknown jobs whose retained event was cleared, remembered so that an agent reporting
one again does not clear it again; past it, those of the server that reported the most
are forgotten all at once (a clear again costs one empty message)."""


def _most(held: Mapping[str, str]) -> tuple[str, int]:
    """The server that holds the most of ``held`` (job -> server), and how many."""
    return Counter(held.values()).most_common(1)[0]


def crowding(counts: Counter[str], server: str) -> str | None:
    """The server that gives up its newest id so that ``server`` may add one to a full
    queue (``counts``: ids held per server): the one that holds the most, if it holds
    more than ``server`` will with one more; None: ``server`` waits. The fairness rule
    of the unknown ids' queues here and in :mod:`controller.plane.unknown_jobs`: one
    agent's flood pushes out only its own server's ids."""
    most, count = counts.most_common(1)[0]
    return most if count > counts[server] + 1 else None


class UnknownJobEvents:
    """The queue of unknown jobs whose retained events the plane clears, each held for
    the server whose agent reported it.

    :meth:`add` and :meth:`take` are called in the decision thread (:meth:`take` on the
    event loop through it); ``bool()`` on the event loop reads the queue's length alone.
    """

    def __init__(self) -> None:
        self._queued: dict[str, str] = {}  # job -> server, oldest first
        self._done: dict[str, str] = {}  # job -> server: cleared

    def add(self, by_server: Mapping[str, Iterable[str]]) -> bool:
        """Queue the jobs of ``by_server`` (server -> ids its agent reported, that the
        store lacks) not yet cleared or queued; ``True`` if any was queued."""
        added = False
        for server, job_ids in by_server.items():
            for job in job_ids:
                if job in self._done or job in self._queued:
                    continue
                if len(self._queued) >= MAX_QUEUED and not self._make_room(server):
                    break
                self._queued[job] = server
                added = True
        return added

    def _make_room(self, server: str) -> bool:
        """Unqueue the newest job of the server that queued the most, if it queued more
        than ``server`` will with one more; ``True`` if one went."""
        most = crowding(Counter(self._queued.values()), server)
        if most is None:
            return False
        del self._queued[next(j for j in reversed(self._queued) if self._queued[j] == most)]
        return True

    def __bool__(self) -> bool:
        return bool(self._queued)

    def take(self, still_unknown: Callable[[list[str]], list[str]]) -> list[str]:
        """The queued jobs, emptied, that ``still_unknown`` (the store, asked now) still
        lacks; those are remembered as cleared."""
        queued, self._queued = self._queued, {}
        if not queued:
            return []
        gone = still_unknown(list(queued))
        for job in gone:
            self._done[job] = queued.get(job, "")
        while len(self._done) > MAX_REMEMBERED:
            most, _ = _most(self._done)
            self._done = {job: s for job, s in self._done.items() if s != most}
        return gone
