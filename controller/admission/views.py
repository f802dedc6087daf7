"""What the admission API reports: a decision, a stored job, and the job states."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pricing.fields import is_integer

__all__ = [
    "LIVE_STATES",
    "MAX_TOKEN_SEQUENCE",
    "STATES",
    "Cordon",
    "DecisionView",
    "JobView",
    "canonical_spec",
    "names_a_page",
    "page_after",
]

STATES = (
    "pending",
    "admitted",
    "running",
    "completed",
    "cancelled",
    "rejected",
    "expired",
    "failed",
)
"""``pending``: not admitted yet, decided again at each slot boundary until its wait ends;
``expired``: a pending job whose wait ended, or that could no longer pay off."""

LIVE_STATES = ("pending", "admitted", "running")
"""The states of a job that has not ended: it holds or awaits a plan, and may be
cancelled."""


@dataclass(frozen=True)
class Cordon:
    """A server's cordon in force (:mod:`.cordons`).

    Attributes:
        from_slot: the first slot it is out of service in (after the next one for a
            planned cordon, ``oasis cordon --from``).
        reason: what the operator gave (``--reason``; empty if none).
        by: who cordoned it (the token's name; empty without ``[auth]``).
        until: the first slot it is back in service in, if the operator set an end
            (``oasis cordon --for/--until``); None: until ``oasis uncordon``.
    """

    from_slot: int
    reason: str = ""
    by: str = ""
    until: int | None = None

    def ended(self, slot: int) -> bool:
        """Whether it no longer blocks the slot after ``slot`` (the current one): its
        end came, or comes at the next boundary."""
        return self.until is not None and self.until <= slot + 1

    def started(self, slot: int) -> bool:
        """Whether the server is out from the slot after ``slot`` (the current one) on;
        False for a cordon planned to start later (``oasis cordon --from``), when the
        server is in service until its first slot."""
        return self.from_slot <= slot + 1


@dataclass(frozen=True)
class DecisionView:
    """A decision as the API reports it (allocations as in SPEC 6)."""

    admitted: bool
    payoff: float | None
    cost: float | None
    completion_slot: int | None
    jct: int | None
    utility: float | None
    arrival_slot: int
    work: int
    allocations: list[dict[str, Any]]
    reason: str = ""
    drivers: list[dict[str, Any]] = field(default_factory=list)
    decision_ms: float = 0.0


@dataclass(frozen=True)
class JobView:
    """A stored job: spec, state and decision."""

    id: str
    spec: dict[str, Any]
    state: str
    decision: DecisionView
    submitted_slot: int
    sequence: int
    duplicate: bool = False
    wait_until_slot: int | None = None
    """For a job submitted with a wait: the last slot boundary it may be admitted at."""


MAX_TOKEN_SEQUENCE = 10**18 - 1
"""The largest sequence a page of jobs continues after (``ListJobs``' ``page_token`` and
the console's ``?after=`` are at most 18 digits). The daemon numbers its decisions from 1
up; a larger stored sequence, or one that does not read as an integer (SQLite keeps an
edit's text or real, and sorts it after every integer), is an edit's, and such rows are
listed on a last page of their own (``controller.admission.reads``)."""


def names_a_page(sequence: object) -> bool:
    """Whether a stored ``sequence`` (as read: None where SQLite kept an edit's text or
    real) is one a page token can continue after: an integer from 1 to
    :data:`MAX_TOKEN_SEQUENCE`."""
    return is_integer(sequence) and 0 < sequence <= MAX_TOKEN_SEQUENCE


def page_after(view: JobView) -> int | None:
    """The sequence the next page of a listing that ends at ``view`` starts after: its
    own, or None (no next page) for a row whose sequence an edit made unreadable (shown
    as 0) or larger than :data:`MAX_TOKEN_SEQUENCE`. Before, such a row's 0 was the next
    page's token, which reads as the start, and ``oasis jobs`` listed it all again, for
    good."""
    return view.sequence if names_a_page(view.sequence) else None


def canonical_spec(spec: dict[str, Any]) -> str:
    """The spec as canonical JSON: equal specs give equal strings."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))
