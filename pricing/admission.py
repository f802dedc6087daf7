"""Online admission (the paper's Alg. 1): admit a job iff its best payoff is positive."""

from __future__ import annotations

from dataclasses import dataclass

from pricing.best_schedule import BestSchedule, best_schedule
from pricing.job import Job
from pricing.ledger import Ledger

__all__ = ["ADMIT_THRESHOLD", "Decision", "decide"]

ADMIT_THRESHOLD = 1e-9
"""A job is admitted iff its best payoff exceeds this (SPEC 5)."""


@dataclass(frozen=True, eq=False)
class Decision:
    """What the online algorithm decided for one job.

    Attributes:
        job: the job.
        admitted: whether its best schedule was added to the ledger.
        best: the best schedule found (its payoff is reported for a rejection too).
    """

    job: Job
    admitted: bool
    best: BestSchedule


def decide(job: Job, ledger: Ledger, first_slot: int, last_slot: int) -> Decision:
    """Price ``job`` over ``first_slot .. last_slot``; admit it into ``ledger`` iff its
    best payoff is > ``ADMIT_THRESHOLD``. A rejected job changes nothing."""
    best = best_schedule(job, ledger, first_slot, last_slot)
    admitted = best.payoff is not None and best.payoff > ADMIT_THRESHOLD
    if admitted:
        assert best.schedule is not None
        ledger.admit(job.id, job.worker, job.ps, best.schedule)
    return Decision(job, admitted, best)
