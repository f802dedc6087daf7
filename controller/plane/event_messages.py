"""The job events: each job's latest event, retained on ``jobs/<job>/events``
(:class:`~controller.plane.topics.Topics`) and published again on every connection;
consumers dedupe on ``sequence``. A job deleted by retention has its retained event
cleared (an empty payload), which consumers drop.

A rejection (:data:`UNRETAINED`) is published but not retained, nor published again: the
submitter has its answer, and ``GetJob`` gives it later. Retained, every priced-out
submission stayed on the broker (with ``keep_days = 0``, for good), so one tenant's
stream of rejected submissions grew the broker all agents share by a retained message
each, at its rate limit; Mosquitto 2.0.11 also keeps about 0.86 KB for every topic that
ever held one (the soak audit), where a message that is not retained costs it nothing
(measured: 12,000 such publishes, heap unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.plane.codec import _dump

__all__ = ["UNRETAINED", "JobEvent", "event_kind"]

UNRETAINED = "rejected"
"""The published kind of the job events that are not retained (see the module docstring)."""


@dataclass(frozen=True)
class JobEvent:
    """A job's event as published (the store's event log entry).

    Attributes:
        sequence: the event's place in the daemon's log (consumers dedupe on it).
        kind: ``admitted``, ``rejected``, ``pending`` (not admitted yet; decided again at
            each slot boundary), ``expired`` (was pending), ``started``, ``replanned``,
            ``completed``, ``cancelled`` or ``failed``.
        job: the job id.
        slot: the slot it happened in.
        state: the job's state after it.
        detail: kind-specific details.
    """

    sequence: int
    kind: str
    job: str
    slot: int
    state: str
    detail: dict[str, Any]

    def to_bytes(self) -> bytes:
        return _dump(self)


_KINDS = {"running": "started", "completed": "completed", "cancelled": "cancelled",
          "replanned": "replanned", "failed": "failed", "expired": "expired"}  # fmt: skip
_DECIDED = {"admitted": "admitted", "pending": "pending"}


def event_kind(kind: str, state: str) -> str | None:
    """The published kind of a stored event (None: not a job event)."""
    if kind == "decided":
        return _DECIDED.get(state, "rejected")
    return _KINDS.get(kind)
