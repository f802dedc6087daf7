"""Whether a server's agent took the plan that carried a job there.

A job nobody reported on completes with its plan at its end, its plan being all the
daemon knows (:mod:`controller.plane.job_review`), unless it did not run: slots whose
plans never went out, servers whose agent was never heard or never had a plan. The
agents audit found one more: an agent following an older plan than the one that carried
the job to its server (it refused the newer as a whole, an agent older than the daemon
with ``bad plan`` in its log, or could not read its parts) never ran the job there, and
the job completed with its whole utility.

:class:`TakenPlans` keeps, per active job and server, the epoch of the first plan
published that gave the job workers or parameter servers there, and per server the
highest epoch its agent's heartbeats said it follows. Both are in memory only: after a
restart or a takeover a job carried before counts as taken (as before this check), and
so does a server whose agent does not say its epoch. Used in the decision thread alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.plane.plan_messages import Plan

__all__ = ["TakenPlans"]


class TakenPlans:
    """See the module docstring."""

    def __init__(self) -> None:
        self.first: dict[str, dict[str, int]] = {}  # job -> server -> first epoch carrying it
        self.followed: dict[str, int] = {}  # server -> highest epoch its agent followed

    def carried(self, plans: Iterable[Plan]) -> None:
        """``plans`` were published (the broker acknowledged them)."""
        for plan in plans:
            for part in (plan.current, plan.next):
                for task in part.tasks:
                    if task.workers or task.ps:
                        self.first.setdefault(task.job, {}).setdefault(plan.server, plan.epoch)

    def follows(self, server: str, epoch: int) -> None:
        """``server``'s agent said it follows ``epoch``."""
        self.followed[server] = max(epoch, self.followed.get(server, 0))

    def not_taken(self, job_id: str, servers: Iterable[str]) -> list[str]:
        """Those of ``servers`` whose agent said it follows an epoch, every one below
        the first that carried ``job_id`` there (in ``servers``' order)."""
        first = self.first.get(job_id, {})
        return [
            s for s in servers if s in first and s in self.followed and self.followed[s] < first[s]
        ]

    def forget(self, active: set[str]) -> None:
        """Forget the jobs not in ``active``."""
        for job_id in [j for j in self.first if j not in active]:
            del self.first[job_id]
