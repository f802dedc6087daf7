"""Which slots of each job's plan no round of plans carried to its agents: the per-job
part of the ``plan_not_sent`` rule (:class:`~controller.plane.job_review.JobReview`).

The slot-wide rule (:attr:`JobReview.unsent <controller.plane.job_review.JobReview.unsent>`)
counts the slots begun without a round of their own. It missed a plan written after the
latest round went out in slots that round had already covered (a round holds its slot
and the next): a job admitted, re-placed or re-planned while the broker or the store was
out, planned in the current slot or the next, was in no round any agent received, and
completed at its plan's end with its whole utility and none of its work reported.

Every write of a job's plan is stored with its event (``decided`` admitted,
``replanned``), numbered in the store's order, and a round of plans is built from the
store after every write up to the newest event when it began
(:attr:`~controller.plane.execution.PlanRound.upto`). So when a round goes out in slot
``r``, the plans written since the previous round that went out held their slots from
``r`` on; those before ``r`` (from the slot each write changed the plan from) reached no
agent: kept per job (:attr:`SentPlans.runs`, the jobs planned in them only). A plan
written since the latest round that went out has reached none yet.

Kept: the newest event the latest round that went out was built after
(:attr:`SentPlans.sent_event`) and the runs, both stored with the plane's state (a
restart reads them), the runs of active jobs only, at most :data:`MAX_RUNS_PER_JOB` a
job.
"""

from __future__ import annotations

from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.store import AllocationRow, EventRow, in_batches
from pricing.fields import is_integer

__all__ = ["MAX_RUNS_PER_JOB", "PLAN_KINDS", "SentPlans", "counter", "joined_runs"]

PLAN_KINDS = ("decided", "replanned")
"""The stored events that write a job's plan (a ``decided`` one if it was admitted)."""
MAX_RUNS_PER_JOB = 16
"""Runs of a job's slots whose plans never went out that are kept (the newest)."""
_NAMED = 20  # jobs named in one log line, at most


def joined_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` of slots ``(first, last)`` in order, those that overlap or meet made one
    (a daemon restarted again and again with the broker down adds the same slots)."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def counter(value: Any) -> bool:
    """Whether a stored plan epoch, event count or slot is an integer in ``[0, 2**53]``
    (an edit's 10**29 overflowed every query of the events after it: the plane
    reconnected every second)."""
    return is_integer(value) and 0 <= value <= 1 << 53


def _written_from(kind: str, state: str, slot: Any, detail: Any) -> int | None:
    """The first slot a plan-writing event changed its job's plan from (None: it wrote
    none, or does not read): a decision's slot on (it admitted the job); a move's
    ``from_slot``; a slow job's re-plan, the slot after its own."""
    if not counter(slot):
        return None
    if kind == "decided":
        return int(slot) if state == "admitted" else None
    given: Any = detail.get("from_slot") if isinstance(detail, dict) else None
    return int(given) if counter(given) else int(slot) + 1


class SentPlans:
    """The per-job record of plans written and not sent; see the module docstring.
    Decision thread only."""

    def __init__(self) -> None:
        self.log = structlog.get_logger("oasisd")
        # the newest event the latest round that went out was built after
        self.sent_event = 0
        # job -> runs (first, last) of its slots whose plans no round carried
        self.runs: dict[str, list[tuple[int, int]]] = {}

    def load(self, stored_event: Any, stored_runs: Any, newest: int, oldest: int) -> None:
        """Read what :meth:`stored` kept (an edited store: what does not read is
        dropped); ``newest``: the store's newest event (a store kept before these were,
        or rewound: every plan written up to it counts as sent, as it did); ``oldest``:
        the first slot a job still running may be planned in."""
        self.sent_event = int(stored_event) if counter(stored_event) else newest
        self.sent_event = min(self.sent_event, newest)
        if not isinstance(stored_runs, dict):
            return
        for job_id, runs in stored_runs.items():
            kept = [(int(r[0]), int(r[1])) for r in (runs if isinstance(runs, list) else [])
                    if isinstance(r, list) and len(r) == 2 and counter(r[0]) and counter(r[1])
                    and oldest <= r[1] and r[0] <= r[1]]  # fmt: skip
            if kept and isinstance(job_id, str):
                self.runs[job_id] = joined_runs(kept)[-MAX_RUNS_PER_JOB:]

    def stored(self) -> dict[str, Any]:
        """What the plane's stored state keeps of it."""
        runs = {job_id: [list(run) for run in runs] for job_id, runs in self.runs.items()}
        return {"sent_event": self.sent_event, "job_unsent": runs}

    def _written(self, session: Session, upto: int | None, job_id: str = "") -> dict[str, int]:
        """``{job: first slot}`` of the plans written after :attr:`sent_event` (up to
        event ``upto``; None: all), of ``job_id`` only if given."""
        query = select(EventRow.job_id, EventRow.kind, EventRow.state, EventRow.slot,
                       EventRow.detail).where(EventRow.sequence > self.sent_event,
                                              EventRow.kind.in_(PLAN_KINDS))  # fmt: skip
        if upto is not None:
            query = query.where(EventRow.sequence <= upto)
        if job_id:
            query = query.where(EventRow.job_id == job_id)
        out: dict[str, int] = {}
        for job, kind, state, slot, detail in session.execute(query):
            first = _written_from(kind, state, slot, detail)
            if first is not None and job:
                out[job] = min(first, out.get(job, first))
        return out

    def went_out(self, session: Session, upto: int, slot: int) -> None:
        """A round of plans built after event ``upto`` went out in ``slot``: the plans
        written since the previous one's went out from ``slot`` on; their slots before
        it, where their jobs were planned, are noted (:attr:`runs`) and logged."""
        if upto <= self.sent_event:
            return
        written = {j: f for j, f in self._written(session, upto).items() if f < slot}
        self.sent_event = upto
        if not written:
            return
        missed: dict[str, tuple[int, int]] = {}
        for chunk in in_batches(sorted(written)):
            rows = session.execute(
                select(AllocationRow.job_id, AllocationRow.slot).where(
                    AllocationRow.job_id.in_(chunk), AllocationRow.workers > 0,
                    AllocationRow.slot >= min(written[j] for j in chunk), AllocationRow.slot < slot)
            )  # fmt: skip
            for job_id, planned in rows:
                if planned >= written[job_id]:
                    missed[job_id] = (written[job_id], slot - 1)
        for job_id, run in missed.items():
            self.runs[job_id] = joined_runs([*self.runs.get(job_id, []), run])[-MAX_RUNS_PER_JOB:]
        if missed:
            self.log.warning("plans no agent was sent: written while the broker or the store "
                             "was out, for slots past before plans went out again; such a job "
                             "completes only as its agents report", slot=slot,
                             jobs=sorted(missed)[:_NAMED], count=len(missed))  # fmt: skip

    def runs_of(self, job_id: str, session: Session, slot: int) -> list[tuple[int, int]]:
        """The runs of ``job_id``'s slots whose plans no round carried: those noted, and,
        for a plan written since the latest round went out, its slots before ``slot``
        (the current one) from the first it changed (one query)."""
        runs = list(self.runs.get(job_id, []))
        first = self._written(session, None, job_id).get(job_id)
        if first is not None and first <= slot - 1:
            runs.append((first, slot - 1))
        return joined_runs(runs)

    def forget(self, active: set[str]) -> None:
        """Forget the runs of jobs not in ``active``."""
        for job_id in [j for j in self.runs if j not in active]:
            del self.runs[job_id]
