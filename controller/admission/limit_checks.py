"""Which pending jobs a reload's ``[limits]`` would expire.

A pending job is decided again at each slot boundary, and checked then against the
limits in force (:meth:`controller.admission.pending.PendingQueue._decide_waiting`): one
over them expires, "no longer valid", for good. A reload applies ``[limits]`` at once, so
a cap lowered by a slip (``max_job_work = 50`` for ``5000``) expired every tenant's
queue at the next boundary with no word before it. :func:`pending_over_limits` lists
them, per submitter, for the reload to warn of while the boundary is still ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.limits import Limits
from controller.store import JobRow
from controller.store.stored import stored_spec
from pricing.cluster import Cluster
from pricing.errors import OasisError
from pricing.job import Job

__all__ = ["SHOWN_JOBS", "pending_over_limits"]

SHOWN_JOBS = 5
"""Job ids named per submitter, at most (the count says how many in all)."""


def pending_over_limits(
    session: Session,
    parse: Callable[[Any, int], Job],
    limits: Limits,
    cluster: Cluster,
    window: int,
) -> list[str]:
    """One line per submitter whose pending jobs ``limits`` refuse (as the next
    boundary's re-decision would, :meth:`Limits.check_job` over ``cluster`` and
    ``window`` slots): how many, the first few ids and the first one's reason. A job that
    does not parse is left out (it expires for that, whatever the limits). [] if none."""
    rows = session.execute(
        select(JobRow.id, JobRow.submitter, JobRow.spec, JobRow.arrival_slot)
        .where(JobRow.state == "pending")
        .order_by(JobRow.sequence)
    )
    over: dict[str, list[tuple[str, str]]] = {}
    for job_id, submitter, text, arrival in rows:
        try:
            job = parse(stored_spec(text, job_id), int(arrival))
        except (OasisError, ValueError, TypeError, ArithmeticError):
            continue
        try:
            limits.check_job(job, cluster, window, submitter)
        except (OasisError, ValueError) as err:
            over.setdefault(str(submitter or "-"), []).append((str(job_id), str(err)))
    return [
        f"{name}: {len(jobs)} pending job(s) ({', '.join(j for j, _ in jobs[:SHOWN_JOBS])}"
        f"{' ...' if len(jobs) > SHOWN_JOBS else ''}), first: {jobs[0][1][:300]}"
        for name, jobs in sorted(over.items())
    ]
