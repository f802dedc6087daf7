"""The counts an agent keeps of the jobs it no longer runs (set aside by
:meth:`controller.plane.agent.Agent.forget_idle`), until no plan can bring them back.

A job set aside keeps its counts (mini-batches, worker-seconds, of its ``run``): a plan
that brings it back carries them on, since the daemon keeps one count per agent session
and a count from 0 again would lose what it did. They were kept for the agent's whole
life, one entry for every job the server ever ran (about 300 bytes each: 30 MB a
100,000 jobs, the soak audit). A job admitted at ``run`` (its admission time,
:func:`controller.plane.plans.run_of`) is planned only up to the last slot of its window,
``T + 1`` slots after ``run`` at most (a pending job's window counts from its arrival,
before its admission; a re-plan stays within it). So once a plan has said ``T``
(:attr:`~controller.plane.plan_messages.Plan.window`), an entry is dropped
:data:`MARGIN_SLOTS` slots after that: no plan of that run can name the job again, and
another run of its id starts from 0 anyway. Without a plan that says ``T`` (an older
daemon), every entry is kept, as before.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["MARGIN_SLOTS", "SetAside", "run_time"]

MARGIN_SLOTS = 2
"""Slots past a run's last possible slot before its counts are dropped: room for the
agent's clock being off the daemon's (warned of past 10 s) and for late plans."""


def run_time(run: str) -> float | None:
    """The Unix time (seconds) of a job's ``run`` (``%Y%m%dT%H%M%S.%f``, UTC); None if
    it does not read (an older daemon's "", or a hand-made plan's)."""
    try:
        return datetime.strptime(run, "%Y%m%dT%H%M%S.%f").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


class SetAside:
    """Job id -> (mini-batches, worker-seconds, run) of the jobs set aside."""

    def __init__(self) -> None:
        self._counts: dict[str, tuple[float, float, str]] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def put(self, job: str, minibatches: float, worker_seconds: float, run: str) -> None:
        self._counts[job] = (minibatches, worker_seconds, run)

    def take(self, job: str) -> tuple[float, float, str]:
        """``job``'s counts and run, no longer held; ``(0.0, 0.0, "")`` if none were."""
        return self._counts.pop(job, (0.0, 0.0, ""))

    def expire(self, now: float, window: int | None, slot_seconds: float) -> int:
        """Drop the counts of runs no plan can name any more at Unix time ``now``:
        admitted over ``(window + 1 + MARGIN_SLOTS) * slot_seconds`` seconds before it.
        ``window``: the daemon's ``T`` in slots (None: not said, nothing is dropped).
        Returns how many were dropped."""
        if window is None:
            return 0
        before = now - (window + 1 + MARGIN_SLOTS) * slot_seconds
        gone = [
            job
            for job, (_, _, run) in self._counts.items()
            if (at := run_time(run)) is not None and at < before
        ]
        for job in gone:
            del self._counts[job]
        return len(gone)
