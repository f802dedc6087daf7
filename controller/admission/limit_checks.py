"""Which pending jobs a config change would expire.

A pending job is decided again at each slot boundary, and checked then against the
limits, servers and window in force
(:meth:`controller.admission.pending.PendingQueue._decide_waiting`): one over the
limits, that no server fits any more, or that can no longer finish within its window,
expires, for good. A reload applies ``[limits]`` at once, so a cap lowered by a slip
(``max_job_work = 50`` for ``5000``) expired every tenant's queue at the next boundary
with no word before it; a restart with fewer or smaller servers, or a shorter window,
expired the queue with no word at the reload that read the file. :func:`pending_refused`
lists them, per submitter, for the reload to warn of.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controller.admission.restart_moves import SHOWN_JOBS
from controller.limits import Limits
from controller.store import JobRow
from controller.store.stored import stored_spec
from pricing.cluster import Cluster
from pricing.errors import OasisError
from pricing.job import Job

__all__ = ["pending_refused"]


def pending_refused(
    session: Session,
    parse: Callable[[Any, int], Job],
    limits: Limits,
    cluster: Cluster,
    window: int,
    first: int | None = None,
) -> list[str]:
    """One line per submitter whose pending jobs the next boundary's re-decision would
    expire: over ``limits`` (:meth:`Limits.check_job` over ``cluster`` and ``window``
    slots); and, given ``first`` (the next slot, for a restart's config), also those
    ``parse`` (a spec and its arrival to a job of that cluster) refuses and those that
    could not end by their arrival + ``window`` - 1 starting in slot ``first``. Without
    ``first`` a spec that does not parse is left out (it expires for that, whatever the
    change). Each line: how many, the first few ids, the first one's reason. [] if none."""
    rows = session.execute(
        select(JobRow.id, JobRow.submitter, JobRow.spec, JobRow.arrival_slot)
        .where(JobRow.state == "pending")
        .order_by(JobRow.sequence)
    )
    over: dict[str, list[tuple[str, str]]] = {}
    for job_id, submitter, text, arrival in rows:
        why = ""
        try:
            job = parse(stored_spec(text, job_id), int(arrival))
        except (OasisError, ValueError, TypeError, ArithmeticError) as err:
            if first is None:
                continue
            job, why = None, f"no longer valid: {err}"
        if job is not None:
            try:
                limits.check_job(job, cluster, window, submitter)
            except (OasisError, ValueError) as err:
                why = f"no longer valid: {err}"
            else:
                end = int(arrival) + window - 1
                if first is not None and first + job.min_slots - 1 > end:
                    why = (
                        f"it needs {job.min_slots} slots from slot {first}, past slot "
                        f"{end}, the end of its window"
                    )
        if why:
            over.setdefault(str(submitter or "-"), []).append((str(job_id), why))
    return [
        f"{name}: {len(jobs)} pending job(s) ({', '.join(j for j, _ in jobs[:SHOWN_JOBS])}"
        f"{' ...' if len(jobs) > SHOWN_JOBS else ''}), first: {jobs[0][1][:300]}"
        for name, jobs in sorted(over.items())
    ]
