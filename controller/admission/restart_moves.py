"""What a restart with an edited ``[cluster]`` or ``window`` would do to admitted plans.

A shrunk config never stops a start: each stored plan that no longer fits is re-placed,
re-planned or failed (``config_changed``, :meth:`.recovery.Recovery._refit`). A reload
names the edit as waiting for a restart, but said nothing of those moves, so a server
renamed by a typo, or a capacity lowered under running jobs, moved or failed tenants'
jobs at the next restart with no warning before it (a cordon of a mistyped server is
refused instead). :func:`restart_moves` lists, from the store, the admitted jobs whose
plans from the current slot on use a server the file leaves out, turns to the other
kind or gives less of any resource, or run past its window; the reload logs them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.admission.views import LIVE_STATES
from controller.store import CORDONED, AllocationRow, JobRow, OutageRow
from controller.store.urls import shown
from pricing.cluster import Cluster

__all__ = ["SHOWN_JOBS", "restart_moves", "store_left_behind"]

SHOWN_JOBS = 5
"""Job ids named per reason, at most (the count says how many in all)."""


def _why(server: str, old: Any, new: Any) -> str:
    """Why plans on ``server`` may no longer fit ("" if they still do)."""
    if new is None:
        return f"server {server} is not in the new [cluster] (removed or renamed)"
    if new[0] != old[0]:
        return f"server {server} is now a {new[0]} server"
    lower = [f"{r} {old[1][r]:g} -> {cap:g}" for r, cap in new[1].items()
             if r in old[1] and cap < old[1][r]]  # fmt: skip
    return f"server {server} has less capacity ({', '.join(lower)})" if lower else ""


def restart_moves(
    session: Session, running: Cluster, fresh: Cluster, first: int, last: int
) -> list[str]:
    """One line per reason a restart with ``fresh`` (its servers, and its window's last
    slot ``last``) would re-place, re-plan or fail admitted jobs planned from slot
    ``first`` on under ``running``: the reason, how many jobs, the first few ids. Slots
    are the daemon's slot numbers. [] if none would move."""
    old, new = running.capacities(), fresh.capacities()
    rows = session.execute(
        select(AllocationRow.job_id, AllocationRow.server, func.max(AllocationRow.slot))
        .join(JobRow, JobRow.id == AllocationRow.job_id)
        .where(AllocationRow.slot >= first, JobRow.state.in_(("admitted", "running")))
        .group_by(AllocationRow.job_id, AllocationRow.server)
    ).all()
    moved: dict[str, set[str]] = {}
    for job_id, server, end in rows:
        why = _why(server, old[server], new.get(server)) if server in old else ""
        if why:
            moved.setdefault(why, set()).add(job_id)
        if int(end) > last:
            moved.setdefault(f"planned past the new window's last slot {last}", set()).add(job_id)
    return _cordons_left(session, fresh, first) + [
        f"{why}: {len(jobs)} admitted job(s) planned there would be re-placed, re-planned "
        f"or failed (config_changed): {', '.join(sorted(jobs)[:SHOWN_JOBS])}"
        + (" ..." if len(jobs) > SHOWN_JOBS else "")
        for why, jobs in sorted(moved.items())
    ]


def store_left_behind(session: Session, running: str, fresh: str) -> list[str]:
    """What a restart on the store at URL ``fresh`` (a ``daemon.store_url`` or
    ``data_dir`` edited) leaves behind of the one running, at ``running`` (read through
    ``session``): its jobs that have not ended, per submitter, in one line; [] if it has
    none. Before, a reload named the key as waiting for a restart, and checked the file's
    slots and servers against this store's jobs, which the restart would no longer read:
    a path mistyped began an empty store, every tenant's admitted jobs unseen and their
    servers sold again."""
    counts = session.execute(
        select(JobRow.submitter, func.count())
        .where(JobRow.state.in_(LIVE_STATES))
        .group_by(JobRow.submitter)
    ).all()
    total = sum(int(n) for _, n in counts)
    if not total:
        return []
    tenants = ", ".join(f"{name or '-'}: {int(n)}" for name, n in sorted(counts, key=str)[:20])
    return [
        f"daemon.store_url or daemon.data_dir: a restart opens another store ({shown(fresh)}), "
        f"not this one ({shown(running)}), and none of this one's {total} pending, admitted or "
        f"running job(s) ({tenants}) would be seen, run or held to its plan there (their "
        "servers sold again); copy it first (oasis store copy, the daemon stopped), or set "
        "the key back"
    ]


def _cordons_left(session: Session, fresh: Cluster, first: int) -> list[str]:
    """One line per server cordoned from slot ``first`` on (or later) that ``fresh``
    leaves out: its cordon names it, so the machine renamed in ``[cluster]`` would be in
    service again at the restart, unsaid (no job was planned there to warn of)."""
    names = fresh.capacities()
    rows = session.execute(
        select(OutageRow.server, OutageRow.reason)
        .where(OutageRow.cause == CORDONED)
        .where(OutageRow.up_from.is_(None) | (OutageRow.up_from > first))
    ).all()
    out = {}
    for server, reason in rows:
        if isinstance(server, str) and server not in names:
            why = f" ({str(reason)[:100]})" if reason else ""
            out[server] = (
                f"server {server[:64]} is cordoned{why} but not in the new [cluster] (removed "
                "or renamed): its cordon holds only that name, so renamed, the machine would "
                "be in service again at the restart (oasis cordon the new name after it)"
            )
    return [out[s] for s in sorted(out)]
