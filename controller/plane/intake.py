"""What agents send, on its way in: a bounded inbox of progress reports, and warnings
that a flood of bad messages cannot turn into a flood of log lines.

The inbox sits between the event loop, which only puts reports in, and the decision
thread, which takes them all at once (:meth:`controller.plane.execution.Execution._drain`).
It is bounded per server, so one agent sending too much (a bug, or a forger on its own
topic) can crowd out only its own reports. Counts are cumulative per agent session and
job, so when a server's reports are over the bound the oldest ones leave the queue but
their latest count per ``(session, job)`` is kept (the *carry*): a job's last report is
never lost to newer reports of other jobs. Only when the carry is full too are entries
dropped, and counted per server (the decision thread says them:
:meth:`ReportInbox.take_dropped`).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from controller.plane.agent_messages import Progress, TaskProgress

__all__ = ["Received", "ReportInbox"]


@dataclass(frozen=True)
class Received:
    """A progress report as received.

    Attributes:
        at: when, on the daemon's link clock (:mod:`controller.plane.link_clock`),
            seconds.
        slot: the daemon's slot then (a report counts for jobs planned around it).
        progress: the report; its ``server`` is the topic's.
    """

    at: float
    slot: int
    progress: Progress


class ReportInbox:
    """Reports per server, oldest first, at most ``max_entries`` job entries each in the
    queue plus as many in the carry (see the module docstring). Thread-safe."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.dropped = 0  # entries lost with the carry full, in all
        self._dropped: Counter[str] = Counter()  # ... per server, since take_dropped
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Received]] = {}
        self._sizes: dict[str, int] = {}
        # server -> (session, job) -> (at, slot, entry): the latest count of reports
        # that left the queue
        self._carry: dict[str, dict[tuple[str, str], tuple[float, int, TaskProgress]]] = {}

    def put(self, received: Received) -> None:
        """Queue a report (event loop)."""
        with self._lock:
            self._append(received)

    def take(self) -> list[Received]:
        """Everything held, oldest first (decision thread); a carried entry comes as a
        report of its own."""
        with self._lock:
            queues, carry = self._queues, self._carry
            self._queues, self._sizes, self._carry = {}, {}, {}
        out = [
            Received(at, slot, Progress(server, session, [entry]))
            for server, entries in carry.items()
            for (session, _job), (at, slot, entry) in entries.items()
        ]
        out += [r for q in queues.values() for r in q]
        out.sort(key=lambda r: r.at)  # stable: a server's carry stays before its queue
        return out

    def take_dropped(self) -> Counter[str]:
        """The entries dropped per server since the last call (decision thread, which
        says them: before, they were counted here and said nowhere)."""
        with self._lock:
            dropped, self._dropped = self._dropped, Counter()
        return dropped

    def put_back(self, taken: Iterable[Received]) -> None:
        """Return what :meth:`take` gave (nothing was applied), before what came since."""
        with self._lock:
            since = [r for q in self._queues.values() for r in q]
            self._queues, self._sizes = {}, {}
            for received in (*taken, *since):
                self._append(received)

    def _append(self, received: Received) -> None:
        server = received.progress.server
        queue = self._queues.setdefault(server, deque())
        queue.append(received)
        size = self._sizes.get(server, 0) + len(received.progress.jobs)
        while size > self.max_entries and len(queue) > 1:
            old = queue.popleft()
            size -= len(old.progress.jobs)
            self._keep(server, old)
        self._sizes[server] = size

    def _keep(self, server: str, old: Received) -> None:
        carry = self._carry.setdefault(server, {})
        for entry in old.progress.jobs:
            key = (old.progress.session, entry.job)
            if key not in carry and len(carry) >= self.max_entries:
                self.dropped += 1
                self._dropped[server] += 1
                continue
            carry[key] = (old.at, old.slot, entry)
