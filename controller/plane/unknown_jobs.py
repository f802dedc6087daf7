"""Jobs that agents run but the store has no record of.

After a store is restored from a backup, the agents still run the jobs admitted after
that backup was made: the restored store knows nothing of them, so the daemon withdraws
their plans at its next round and their workers stop. Their reports were only counted
("report entries ignored"), so the operator could not tell which tenants' jobs the
restore lost, and those tenants heard nothing (``oasis job ID``: ``NOT_FOUND``). The
plane looks up the ids of ignored entries and names those the store lacks
(:func:`unknown_jobs`), so the operator can tell their tenants to submit them again.

The ids wait in a queue of their reporting server's (:class:`UnknownLookups`), and each
review looks up at most :data:`MAX_LOOKED_UP` of them, taken from the servers in turn
(round-robin, resumed at the next review where it stopped). Before, a review looked up
the first :data:`MAX_LOOKED_UP` ids in sorted order over all servers: one agent sending
that many made-up ids that sort first, at every review, kept every other server's lost
jobs from ever being named (and their retained events from being cleared:
:mod:`controller.plane.unknown_events`). Now a server's agent delays only its own
server's ids: with ``k`` servers holding ids, each gets at least one looked up every
``ceil(k / MAX_LOOKED_UP)`` reviews, whatever the others send.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.plane.unknown_events import crowding
from controller.store import JobRow

__all__ = [
    "MAX_LOOKED_UP",
    "MAX_NAMED",
    "MAX_WAITING",
    "MAX_WAITING_PER_SERVER",
    "UnknownLookups",
    "unknown_jobs",
]

MAX_LOOKED_UP = 200
"""Ids of ignored report entries looked up in the store per review, at most (one
primary-key query), over all servers: a flood of made-up ids costs one bounded query, not
one per id."""
MAX_NAMED = 20
"""Unknown job ids named in one log line, at most."""
MAX_WAITING_PER_SERVER = MAX_LOOKED_UP
"""Ids of one server's ignored entries waiting to be looked up, at most; past it, its
agent's next ids wait for their next report."""
MAX_WAITING = 10_000
"""Ids waiting to be looked up, at most, over all servers; past it, a server's new id
takes the place of the newest of the server that holds the most (if it holds more), so
one agent's flood pushes out only its own server's ids."""


def unknown_jobs(session: Session, ids: Iterable[str]) -> list[str]:
    """The ids among the first :data:`MAX_LOOKED_UP` of ``ids`` that no stored job has,
    sorted."""
    wanted = sorted(set(ids))[:MAX_LOOKED_UP]
    if not wanted:
        return []
    stored = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(wanted))))
    return [job for job in wanted if job not in stored]


class UnknownLookups:
    """The ids of ignored report entries waiting to be looked up, in a queue per
    reporting server (oldest first, each id once), taken a bounded number per review from
    the servers in turn. Used in the decision thread alone."""

    def __init__(self) -> None:
        self._waiting: dict[str, dict[str, None]] = {}  # server -> its ids, oldest first
        self._count = 0  # ids waiting, over all servers
        self._after = ""  # the server the last take stopped at: the next starts after it

    def __len__(self) -> int:
        return self._count

    def add(self, server: str, job_ids: Iterable[str]) -> None:
        """Queue ``job_ids`` (reported by ``server``'s agent) not yet waiting for it,
        within :data:`MAX_WAITING_PER_SERVER` and :data:`MAX_WAITING`."""
        mine = self._waiting.setdefault(server, {})
        for job in job_ids:
            if job in mine:
                continue
            if len(mine) >= MAX_WAITING_PER_SERVER:
                break
            if self._count >= MAX_WAITING and not self._make_room(server):
                break
            mine[job] = None
            self._count += 1
        if not mine:
            del self._waiting[server]

    def _make_room(self, server: str) -> bool:
        """Drop the newest id of the server :func:`~.unknown_events.crowding` names for
        ``server`` to add one; ``True`` if one went."""
        most = crowding(Counter({s: len(ids) for s, ids in self._waiting.items()}), server)
        if most is None:
            return False
        self._waiting[most].popitem()
        self._count -= 1
        return True

    def take(self, limit: int = MAX_LOOKED_UP) -> list[tuple[str, str]]:
        """At most ``limit`` ``(server, job)`` pairs, no longer waiting: one of each
        server's in turn (its oldest), from the server after the one the last take
        stopped at, round after round until ``limit`` or none is left."""
        servers = sorted(self._waiting)
        start = bisect.bisect_right(servers, self._after)
        turn = servers[start:] + servers[:start]
        taken: list[tuple[str, str]] = []
        while turn and len(taken) < limit:
            left = []
            for server in turn:
                if len(taken) >= limit:
                    break
                ids = self._waiting[server]
                job = next(iter(ids))
                del ids[job]
                self._count -= 1
                taken.append((server, job))
                self._after = server
                if ids:
                    left.append(server)
                else:
                    del self._waiting[server]
            turn = left
        return taken
