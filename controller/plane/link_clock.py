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
must not read as the others' silence, nor stop failure detection for good. Nor does the
time the daemon's own event loop did not run (the process stopped, starved of CPU, its
host paused: :class:`LoopWatch`): no agent could be heard meanwhile, their beats wait
unread in the socket, and a SIGSTOP of 8 s failed every server beating all along.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["LOOP_STALL_SECONDS", "LOOP_TICK_SECONDS", "LinkClock", "LoopWatch"]


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


LOOP_TICK_SECONDS = 0.25
"""How often the event loop's watch (:class:`LoopWatch`) ticks."""

LOOP_STALL_SECONDS = 1.0
"""A tick this much later than due: the event loop did not run meanwhile (the process
stopped or starved); the time past the tick is taken off the link clock. And a review
that finds the last tick older than this judges no one silent: the loop has not read
the socket since it woke, whose beats wait there."""


class LoopWatch:
    """Ticks of the event loop, on ``monotonic`` (seconds): how long it did not run."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self.at: float | None = None  # the last tick; None: not watched (no link yet)

    def tick(self) -> float:
        """A tick (event loop, every :data:`LOOP_TICK_SECONDS`): the seconds past it
        that the loop did not run (0: on time, or later by less than
        :data:`LOOP_STALL_SECONDS`)."""
        now = self._monotonic()
        late = 0.0 if self.at is None else now - self.at - LOOP_TICK_SECONDS
        self.at = now
        return late if late > LOOP_STALL_SECONDS else 0.0

    def awake(self) -> bool:
        """Whether the loop ticked within :data:`LOOP_STALL_SECONDS`, or is not watched
        (any thread)."""
        return self.at is None or self._monotonic() - self.at <= LOOP_STALL_SECONDS
