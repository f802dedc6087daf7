"""The clock a server's silence is timed on: seconds the daemon's broker connection has
been up, summed over its connections.

An agent can be heard only while the daemon is connected, so only that time counts
against it: a broker outage of an hour does not fail every server, and a link that
drops every few seconds (a flapping broker, a proxy that cuts idle streams) does not
restart every server's silence at each reconnection, which would let a dead server
hold its jobs' plans for as long as the link flaps. The time between two reviews in which
an agent flooded the daemon's intake counts half (:meth:`LinkClock.rewind_to`, called by
:meth:`controller.plane.execution.Execution.review_sync`): the broker drops what it
cannot deliver to the daemon, other agents' heartbeats among them, so one agent's flood
must not read as the others' silence, nor stop failure detection for good.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["LinkClock"]


class LinkClock:
    """Connected seconds, read on ``monotonic`` (seconds). Not thread-safe: its caller
    holds a lock around :meth:`up`, :meth:`down` and :meth:`now`."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._before = 0.0  # connected seconds of the connections that ended
        self._since: float | None = None  # monotonic start of the current one

    def up(self) -> None:
        """The connection is up (again); no change if it was."""
        if self._since is None:
            self._since = self._monotonic()

    def down(self) -> None:
        """The connection is down; no change if it was."""
        if self._since is not None:
            self._before += max(self._monotonic() - self._since, 0.0)
            self._since = None

    def now(self) -> float:
        """Connected seconds so far (stands still while the connection is down)."""
        if self._since is None:
            return self._before
        return self._before + max(self._monotonic() - self._since, 0.0)

    def rewind_to(self, mark: float) -> None:
        """Take the clock back to ``mark`` (at most :meth:`now`): the time since does not
        count, or counts in part (a mark between an earlier reading and now)."""
        self._before -= max(self.now() - mark, 0.0)

    def up_for(self) -> float | None:
        """Seconds the current connection has been up; None while it is down."""
        return None if self._since is None else max(self._monotonic() - self._since, 0.0)
