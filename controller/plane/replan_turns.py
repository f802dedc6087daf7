"""Turns for slow jobs' re-plans: the search steps one submitter's re-plans may take in a
slot, and all of them together in one review (:mod:`controller.plane.job_review`).

A job whose agents report it slower than planned is re-planned from its remaining work
with the best-schedule search, in the decision thread, where every tenant's calls wait.
Each search is held to the limits a submission is (``max_search_steps``), and each job
is searched at most once a slot; but nothing held the sum. The reviews of every job
with new counts ran in one turn of the decision thread, and the first counts of a slot
arrive for every running job within seconds: a tenant whose jobs all ran slower than
their specs said (a ``minibatch_seconds`` in the wrong unit, a slow data loader) had
every one of them searched in one turn, at every slot, and every other tenant's calls
waited for all of it.

- ``[limits] replan_steps_per_submitter`` (3e9, ten searches of the largest job
  ``max_search_steps`` allows): the steps one submitter's re-plans may take in one slot,
  each search counted at its bound ``T x Y x (W + 1)`` (:func:`controller.limits.
  search_size`). Its first re-plan of a slot always runs; one that would go past the
  budget waits for the next slot, when its job's counts arrive again.
- ``[limits] replan_steps_per_review`` (3e8): the steps all re-plans of one review (a
  turn of the decision thread, every second) may take together; the first always runs,
  the rest stay to review at the next turn, a second later, with the other tenants'
  calls decided in between. Jobs are reviewed in turn by submitter (the part of the
  job's key before ``:``), so one tenant's many jobs do not go first at every review,
  and a submitter's jobs whose re-plan was tried longest ago first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["ReplanTurns", "in_turn"]


class ReplanTurns:
    """The re-plan search steps spent in the current slot by submitter, and in the
    current review in all (see the module docstring).

    Args:
        per_submitter: steps one submitter's re-plans may take in one slot.
        per_review: steps all re-plans of one review may take together.
    """

    def __init__(self, per_submitter: float, per_review: float) -> None:
        self.per_submitter = per_submitter
        self.per_review = per_review
        self._slot: int | None = None
        self._by_submitter: dict[str | None, float] = {}  # this slot's, by submitter
        self._review = 0.0  # this review's, all submitters

    def new_review(self, slot: int) -> None:
        """Start a review in ``slot``: its steps from 0, and a new slot's budgets."""
        self._review = 0.0
        if slot != self._slot:
            self._slot = slot
            self._by_submitter.clear()

    def take(self, submitter: str | None, steps: float) -> str:
        """Charge a re-plan of ``steps`` to ``submitter`` and the review, and return "";
        or, if it would take either past its budget (each one's first always fits),
        charge nothing and return which ran out: ``"review"`` or ``"submitter"``."""
        if self._review and self._review + steps > self.per_review:
            return "review"
        spent = self._by_submitter.get(submitter, 0.0)
        if spent and spent + steps > self.per_submitter:
            return "submitter"
        self._by_submitter[submitter] = spent + steps
        self._review += steps
        return ""


def in_turn(job_ids: Iterable[str], last_turn: Mapping[str, int]) -> list[str]:
    """``job_ids`` in turn by submitter: each submitter's first, then each one's second,
    ..., the submitters by name. A job's submitter is its key's part before ``:``
    (:mod:`controller.job_keys`; none for a key without one). Within a submitter, the
    jobs whose re-plan was last tried longest ago go first (``last_turn``: job -> slot;
    never tried first), then by id: one tenant's first job does not take its budget at
    every slot."""
    queues: dict[str, list[str]] = {}
    for job_id in sorted(job_ids, key=lambda j: (last_turn.get(j, -1), j)):
        queues.setdefault(job_id.split(":", 1)[0] if ":" in job_id else "", []).append(job_id)
    out: list[str] = []
    lists = [queues[k] for k in sorted(queues)]
    for i in range(max((len(q) for q in lists), default=0)):
        out.extend(q[i] for q in lists if i < len(q))
    return out
