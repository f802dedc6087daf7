"""Agents that follow an older plan than the one published for their server.

An agent takes a plan of a higher epoch than the one it follows as soon as it comes, and
says the epoch it follows in every heartbeat. One that still follows an older epoch a
while after its server's plan was published did not take the new one: it refused it as
a whole (an agent older than the daemon: a plan in parts, a field it cannot read; its
log says ``bad plan``), or never received it (its broker user cannot read the plan's
part topics). The jobs that plan put on its server do not run there, and before this,
nothing on the daemon's side said so (the agent's own log alone did).

:class:`PlanLag` keeps, per server, the epochs of its plans published within the last
:data:`LAG_SECONDS` and the newest published before that, and tells whether a heartbeat's
epoch is below the latter: behind a plan it has had :data:`LAG_SECONDS` to take, however
often plans change (an agent a round behind at each beat, while rounds go out every
second, is not behind). Used on the event loop alone (:mod:`controller.plane.link`).
"""

from __future__ import annotations

from collections import deque

__all__ = ["LAG_SECONDS", "PlanLag"]

LAG_SECONDS = 10.0
"""How long after its plan was published an agent may still follow an older one."""


class PlanLag:
    """Each server's plan epochs as published, against the epochs its agent follows
    (see the module docstring). Times are monotonic seconds."""

    def __init__(self) -> None:
        # server -> [(published at, epoch), ...], oldest first: the newest published
        # LAG_SECONDS ago or more, then those since
        self._published: dict[str, deque[tuple[float, int]]] = {}

    def published(self, server: str, epoch: int, at: float) -> None:
        """``server``'s plan of ``epoch`` was published at ``at``."""
        self._published.setdefault(server, deque()).append((at, epoch))
        self._trim(server, at)

    def forget(self) -> None:
        """Every plan is to be published again (a new connection): start afresh."""
        self._published.clear()

    def behind(self, server: str, epoch: int, at: float) -> tuple[int, float] | None:
        """``(epoch published, seconds ago)`` of the newest plan of ``server``
        published :data:`LAG_SECONDS` or more before ``at`` if its agent, following
        ``epoch`` (> 0), is below it; None if not."""
        if server not in self._published:
            return None
        self._trim(server, at)
        published_at, newest = self._published[server][0]
        if at - published_at < LAG_SECONDS or epoch >= newest:
            return None
        return newest, at - published_at

    def _trim(self, server: str, at: float) -> None:
        """Drop the plans of ``server`` older than the newest published
        :data:`LAG_SECONDS` or more before ``at`` (its agent is measured against it)."""
        plans = self._published[server]
        while len(plans) > 1 and at - plans[1][0] >= LAG_SECONDS:
            plans.popleft()
