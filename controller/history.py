"""What the daemon recorded, as an offline problem (``oasis offline --store URL``).

The comparison re-decides the jobs that arrived in slots ``from .. to`` (all of them by
default) and leaves every other job with the allocation the daemon gave it:

- **compared jobs**: arrival in ``[from, to]``, not cancelled. Each may use slots
  ``a .. a + T - 1`` (T: the daemon's window, from the store's ``settings`` row, i.e. the
  window of the daemon's last start), as the daemon allowed it.
- **held**: the stored allocations of every other job (earlier or later arrivals, and
  cancelled jobs up to their cancellation) are subtracted from the capacities.
- **online**: the utility the daemon planned for each compared job it admitted (its
  stored ``utility``: a job done early or re-planned has it updated, a job still
  running at the end of the history counts at its plan); a job done early thus counts
  more than its spec's work lets the offline side earn with it, and the notes say how
  much (before, ``online >= 245% of the optimum`` stood unexplained on a store whose
  agents finished three jobs early); 0 if rejected, expired or
  still pending, and 0 for a failed job, whose plan was not carried out (none earned,
  as ``oasis jobs`` and the console say).
- **servers out of service**: the slots of each outage (an operator's cordon, a failure
  the execution plane declared) hold the server's whole capacity, as the daemon's
  ledger did (:mod:`controller.history_capacity`).

Slots are shifted so that ``from`` is slot 0 of the problem; the horizon ends at the
last slot any compared job may use. The price bounds of the problem (used only for the
Theorem 4 figure) are SPEC 4's over the compared jobs with ``Tmax = T``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from controller.admission import SETTINGS_KEY
from controller.history_capacity import block_outages, clip_over_capacity, read_outages
from controller.store import AllocationRow, Database, JobRow, MetaRow, ServerRow, in_batches
from controller.store.retention_mark import deleted_before
from controller.store.stored import stored_spec
from pricing import SpecError, fields, job_from_dict
from pricing.cluster import Cluster, cluster_from_dict
from pricing.fields import is_integer
from pricing.job import Job
from pricing.offline import Held
from pricing.prices import oracle_bounds
from pricing.schedule import Schedule
from pricing.trace import Trace, total_utility_problem

__all__ = [
    "MAX_CELLS",
    "History",
    "HistoryError",
    "OnlineJob",
    "load_history",
    "load_jobs",
    "newest_each",
    "span_words",
]

MAX_CELLS = 1 << 26
"""Slots x servers x resources of the problem read at most (two float arrays of 512 MiB):
past it, the comparison asks for a narrower --from/--to instead of running out of
memory (one arrival slot edited a trillion slots out asked for 109 TiB)."""


class HistoryError(Exception):
    """The store cannot be compared as asked; the message says why."""


@dataclass(frozen=True)
class OnlineJob:
    """What the online algorithm did with one job.

    Attributes:
        id: the job's identifier.
        admitted: whether it was admitted.
        jct: its planned completion time, slots (None if rejected or failed).
        utility: ``f(jct)`` (None if rejected; 0.0 if it failed: none earned).
        state: its state in the store (``completed``, ``failed``, ``running``, ...);
            None for a replayed trace.
    """

    id: str
    admitted: bool
    jct: int | None
    utility: float | None
    state: str | None = None


@dataclass(frozen=True, eq=False)
class History:
    """A stored stretch of decisions as an offline problem.

    Attributes:
        trace: the compared jobs (arrivals shifted by ``-first_slot``), the servers and
            the horizon.
        held: other jobs' use per slot and each compared job's last slot.
        online: what the daemon decided for each compared job, in trace order.
        schedules: the daemon's schedule of each compared job (None if rejected), in the
            problem's slots, for the solver's start.
        first_slot: the store slot that is slot 0 of the problem.
        window: the daemon's T.
        notes: what the operator should know of the comparison (jobs left out or
            counted at 0 and why, servers out of service, rows cut or left out), one
            line each.
    """

    trace: Trace
    held: Held
    online: list[OnlineJob]
    schedules: list[Schedule | None]
    first_slot: int
    window: int
    notes: tuple[str, ...] = ()


def load_history(db: Database, first: int | None = None, last: int | None = None) -> History:
    """Read the store (module docstring); ``first``/``last`` bound the arrival slots.

    Only what the stretch needs is read: the compared jobs, the allocations of the
    horizon's slots and the specs of the other jobs those hold. Before, every job and
    allocation of the store was read first: one day's comparison of a year's history
    (10^6 jobs) took 45 s and 2.6 GB (``bench/history_scale.py``). All of it is read in
    one snapshot of the store (:meth:`Database.snapshot`), so a daemon deciding, or its
    retention deleting jobs, meanwhile changes nothing of what is compared."""
    with db.snapshot() as session:
        window, slot_seconds, cluster = _daemon_state(session)
        if first is None or last is None:
            low, high = session.execute(
                select(func.min(JobRow.arrival_slot), func.max(JobRow.arrival_slot))
            ).one()
        lo = first if first is not None else (low if isinstance(low, int) else 0)
        hi = last if last is not None else (high if isinstance(high, int) else lo)
        _check_stretch(lo, hi, first is not None, last is not None)
        lo, retention_notes = _past_deletions(lo, hi, first is None, deleted_before(session))
        arrived = [
            r
            for r in session.scalars(
                select(JobRow)
                .where(JobRow.arrival_slot >= lo, JobRow.arrival_slot <= hi)
                .order_by(JobRow.sequence)
            )
            if isinstance(r.arrival_slot, int)
        ]
        compared = [r for r in arrived if r.state != "cancelled"]
        if not compared:
            raise HistoryError(
                f"no job arrived in slots {lo} .. {hi} (cancelled jobs are left out)"
            )
        horizon = max(r.arrival_slot for r in compared) + window - lo
        resources = list(cluster.resources)
        n_servers = len(cluster.worker_names) + len(cluster.ps_names)
        cells = horizon * n_servers * len(resources)
        if cells > MAX_CELLS:
            raise HistoryError(
                f"the jobs compared arrived in slots {lo} .. {hi}, a horizon of {horizon} "
                f"slots over {n_servers} servers: too large to compare at once; "
                "narrow it with --from and --to"
            )
        allocs = session.execute(
            select(AllocationRow.job_id, AllocationRow.slot, AllocationRow.server,
                   AllocationRow.workers, AllocationRow.ps)
            .where(AllocationRow.slot >= lo, AllocationRow.slot < lo + horizon)
        ).all()  # fmt: skip
        index = {r.id: i for i, r in enumerate(compared)}
        others = sorted({a.job_id for a in allocs} - index.keys())
        held_rows: dict[str, JobRow] = {}
        for batch in in_batches(others):
            held_rows |= {
                r.id: r for r in session.scalars(select(JobRow).where(JobRow.id.in_(batch)))
            }
        outages = read_outages(session, lo + horizon)
    jobs: list[Job] = []
    for r in compared:
        jobs.append(_job(r, cluster, slot_seconds, window, r.arrival_slot - lo))
    kind_index = {name: (kind, i) for kind, i, name, _ in cluster.servers()}
    demand: dict[str, dict[str, Any]] = {}
    worker_used = np.zeros((horizon, *cluster.worker_capacity.shape))
    ps_used = np.zeros((horizon, *cluster.ps_capacity.shape))
    units: dict[str, list[Any]] = {}
    for a in allocs:
        where = (
            f"allocation of job {_named(a.job_id)!r} at slot {str(a.slot)[:24]} on "
            f"{_named(a.server)}"
        )
        if not (_natural(a.slot, 1 << 63) and _natural(a.workers) and _natural(a.ps)):
            raise HistoryError(f"{where}: a slot >= 0 and counts 0 .. 2**31 - 1, got "
                               f"{str(a.workers)[:24]} workers, {str(a.ps)[:24]} PS")  # fmt: skip
        t = a.slot - lo
        if a.server not in kind_index or not 0 <= t < horizon:
            continue
        if a.job_id in index:
            units.setdefault(a.job_id, []).append(a)
            continue
        if a.job_id not in held_rows:
            raise HistoryError(f"{where}: the store holds no such job")
        if a.job_id not in demand:
            demand[a.job_id] = _spec(held_rows[a.job_id])
        kind, s = kind_index[a.server]
        spec = demand[a.job_id]
        try:
            if kind == "worker":
                worker_used[t, s] += a.workers * _vector(spec.get("worker", {}), resources)
            else:
                ps_used[t, s] += a.ps * _vector(spec.get("ps", {}), resources)
        except (AttributeError, TypeError, ValueError) as err:
            raise HistoryError(
                f"the stored spec of job {_named(a.job_id)!r}: its demands: {err}"
            ) from err

    notes = retention_notes + _job_notes(arrived, compared)
    notes += clip_over_capacity(cluster, lo, worker_used, ps_used, allocs, set(index))
    notes += block_outages(outages, cluster, lo, worker_used, ps_used)
    schedules: list[Schedule | None] = []
    for r in compared:
        if not r.admitted or r.id not in units:
            schedules.append(None)
            continue
        slots = [a.slot - lo for a in units[r.id]]
        start, stop = min(slots), max(slots) + 1
        workers = np.zeros((stop - start, len(cluster.worker_names)), np.int32)
        ps = np.zeros((stop - start, len(cluster.ps_names)), np.int32)
        for a in units[r.id]:
            kind, s = kind_index[a.server]
            if kind == "worker":
                workers[a.slot - lo - start, s] = a.workers
            else:
                ps[a.slot - lo - start, s] = a.ps
        schedules.append(Schedule(start, workers, ps))

    for problem in total_utility_problem(jobs):  # a daemon with limits.max_utility = 0
        raise HistoryError(f"the jobs compared: {problem.reason}")
    bounds = oracle_bounds(jobs, cluster, window, {j.id: window for j in jobs})
    trace = Trace(horizon, slot_seconds, cluster, bounds, "oracle", tuple(jobs))
    last_slot = np.array([min(j.arrival + window - 1, horizon - 1) for j in jobs], np.int64)
    online = [_online(r) for r in compared]
    held = Held(worker_used, ps_used, last_slot)
    return History(trace, held, online, schedules, lo, window, tuple(notes))


def _past_deletions(
    lo: int, hi: int, defaulted: bool, deleted: int | None
) -> tuple[int, list[str]]:
    """The first slot compared, and the notes on it, where retention deleted the jobs
    of the slots before slot ``deleted`` (:mod:`controller.store.retention_mark`): their
    use reads as free, so a stretch from before it would compare against a cluster
    emptier than the daemon's. A stretch the operator did not choose (``defaulted``: no
    ``--from``) starts at ``deleted`` if any job arrived from it on; otherwise it stays,
    and so does an operator's ``--from``, with a note saying what is optimistic."""
    if deleted is None or lo >= deleted:
        return lo, []
    why = (f"jobs that ended before slot {deleted} were deleted by retention "
           "(daemon.keep_days)")  # fmt: skip
    if defaulted and hi >= deleted:
        return deleted, [f"compared from slot {deleted} on: {why}, and the slots of jobs "
                         f"that ran beside them would look free (--from {lo} compares "
                         "them anyway)"]  # fmt: skip
    return lo, [f"optimistic: {why}; in slots {lo} .. {deleted - 1} their resources "
                f"count as free offline (--from {deleted} compares only what is kept)"]  # fmt: skip


def _online(row: JobRow) -> OnlineJob:
    """What the daemon earned with a compared job (module docstring: a failed job's plan
    was not carried out, so it counts 0; one whose stored utility is not a finite number
    counts 0 too, named in the notes: :func:`_unread_utilities`)."""
    if not row.admitted:
        return OnlineJob(row.id, False, None, None, row.state)
    if row.state == "failed":
        return OnlineJob(row.id, True, None, 0.0, row.state)
    utility = row.utility if _finite(row.utility) else None
    return OnlineJob(row.id, True, row.jct, utility, row.state)


def _finite(value: Any) -> TypeGuard[float]:
    """Whether a stored amount read back as a finite number (text reads as None on
    SQLite; PostgreSQL keeps NaN and infinities)."""
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def _unread_utilities(compared: list[JobRow]) -> list[str]:
    """A note naming the admitted jobs (not failed) whose stored utility is not a finite
    number: counted 0 online. Before, text (read as none) was counted 0 unsaid, and NaN
    made the online total NaN."""
    unread = [r.id for r in compared
              if r.admitted and r.state != "failed" and not _finite(r.utility)]  # fmt: skip
    if not unread:
        return []
    named = ", ".join(repr(job_id[:128]) for job_id in unread[:5])
    more = f" and {len(unread) - 5} more" if len(unread) > 5 else ""
    return [f"counted 0 online: {len(unread)} job(s) whose stored utility (jobs.utility) "
            f"is not a number: {named}{more}"]  # fmt: skip


def _job_notes(arrived: list[JobRow], compared: list[JobRow]) -> list[str]:
    """Lines saying which jobs of the stretch are left out, or counted otherwise than at
    the utility they were admitted with, and why."""
    notes = []
    cancelled = len(arrived) - len(compared)
    if cancelled:
        notes.append(f"left out: {cancelled} cancelled job(s) (their slots before the "
                     "cancel are held)")  # fmt: skip
    failed = [r for r in compared if r.admitted and r.state == "failed"]
    if failed:
        planned = sum(r.utility for r in failed if _finite(r.utility))
        notes.append(f"counted 0 online: {len(failed)} failed job(s), their plans not "
                     f"carried out ({planned:.6g} utility planned)")  # fmt: skip
    early = [gain for r in compared if r.state == "completed"
             and (gain := _early_gain(r.utility, r.payoff, r.cost)) > 0]  # fmt: skip
    if early:
        notes.append(f"counted at their earlier completion: {len(early)} job(s) done early, "
                     f"{sum(early):.6g} utility above their admission's; the offline side "
                     "holds each job to its spec's work, so the online side may pass the "
                     "bound")  # fmt: skip
    live = [r for r in compared if r.state in ("admitted", "running")]
    if live:
        notes.append(f"counted at their plan: {len(live)} job(s) still admitted or running "
                     "at the end of the history")  # fmt: skip
    pending = sum(r.state == "pending" for r in compared)
    if pending:
        notes.append(f"counted 0 online: {pending} job(s) still pending (they may yet be "
                     "admitted)")  # fmt: skip
    return notes + _unread_utilities(compared)


def _early_gain(utility: float | None, payoff: float | None, cost: float | None) -> float:
    """How much more a completed job's stored ``utility`` is than the one it was admitted
    with (``payoff + cost``): above 0 for a job its agents finished early; 0 otherwise
    (within float rounding, or a value missing or not finite)."""
    if not (_finite(utility) and _finite(payoff) and _finite(cost)):
        return 0.0
    admitted = payoff + cost
    return utility - admitted if utility > admitted * (1 + 1e-9) + 1e-9 else 0.0


def load_jobs(
    db: Database,
    first: int | None = None,
    last: int | None = None,
    newest: int | None = None,
    submitters: Sequence[str] | None = None,
) -> tuple[list[Job], Cluster, list[str]]:
    """The jobs a daemon decided, as :class:`~pricing.job.Job` on its servers, for
    ``oasis calibrate --store``: those that arrived in slots ``first .. last`` (each bound
    optional), not cancelled, of the named ``submitters`` only (``""``: the jobs of no
    token's; None: all), of each of their ``k`` submitters at most the ``ceil(newest /
    k)`` most recently decided (so that one submitter's many jobs push no other's out),
    oldest first; the cluster; and each job's submitter (``""`` for none). Only the jobs'
    rows are read, in batches (not allocations, which a prior does not need); arrivals
    are 0 (a prior does not use them).

    Raises:
        HistoryError: ``last`` before ``first``, no daemon state, no such job, or a row
            that does not read back (naming it).
    """
    if first is not None and last is not None:
        _check_stretch(first, last)
    with db.snapshot() as session:
        window, slot_seconds, cluster = _daemon_state(session)
        where = [JobRow.state != "cancelled"]
        if first is not None:
            where.append(JobRow.arrival_slot >= first)
        if last is not None:
            where.append(JobRow.arrival_slot <= last)
        columns = (JobRow.id, JobRow.spec, JobRow.submitter, JobRow.sequence)
        if newest is None:
            if submitters is not None:
                where.append(or_(*(_of(name) for name in submitters)))
            queries = [select(*columns).where(*where).order_by(JobRow.sequence)]
        else:  # each submitter's newest: another's many push none out
            queries = [
                select(*columns).where(*where, _of(name)).order_by(JobRow.sequence.desc())
                for name in _submitters(session, where, submitters)
            ]
            per = newest_each(newest, len(queries))
            queries = [query.limit(per) for query in queries]
        picked: list[tuple[int, Job, str]] = []
        for query in queries:
            for row in session.execute(query.execution_options(yield_per=JOB_BATCH)):
                job = _job(row, cluster, slot_seconds, window, 0)
                picked.append((row.sequence, job, row.submitter or ""))
        picked.sort(key=lambda item: item[0])  # oldest first
        jobs = [job for _sequence, job, _name in picked]
        whom = [name for _sequence, _job, name in picked]
    if not jobs:
        span = span_words(first, last)
        of = "" if submitters is None else " of " + ", ".join(n or "-" for n in submitters)
        raise HistoryError(
            f"the store holds no decided job{of}{span} (cancelled jobs are left out)"
        )
    return jobs, cluster, whom


def newest_each(newest: int, submitters: int) -> int:
    """Jobs :func:`load_jobs` reads of each of ``submitters`` for ``newest`` in all:
    ``ceil(newest / submitters)``."""
    return -(-newest // max(1, submitters))


def _of(name: str) -> Any:
    """The condition on a job row of being submitted by ``name`` (``""``: no token)."""
    return JobRow.submitter.is_(None) if name == "" else JobRow.submitter == name


def _submitters(session: Session, where: list[Any], named: Sequence[str] | None) -> list[str]:
    """The submitters (``""``: no token) among ``named`` (None: all) with a job row
    meeting ``where``: the distinct names from their index, then one row of each sought
    (the index again), not a scan of every row."""
    if named is None:
        found = session.execute(select(JobRow.submitter).distinct()).scalars()
        named = sorted({name or "" for name in found})
    alive = []
    for name in dict.fromkeys(named):
        if session.execute(select(JobRow.id).where(*where, _of(name)).limit(1)).first():
            alive.append(name)
    return alive


JOB_BATCH = 1000
"""Job rows :func:`load_jobs` holds from the store at once."""


def _check_stretch(
    first: int, last: int, given_first: bool = True, given_last: bool = True
) -> None:
    """HistoryError unless arrival slots ``first .. last`` (``--from``, ``--to``) are a
    stretch; a bound not given is the store's oldest or newest arrival, and is named so
    (``offline --store S --from 100`` said "--to 13 is before --from 100", with no --to)."""
    if last >= first:
        return
    if given_first and not given_last:
        raise HistoryError(f"--from {first} is after the newest arrival the store holds, "
                           f"slot {last}: no job to compare")  # fmt: skip
    if given_last and not given_first:
        raise HistoryError(f"--to {last} is before the oldest arrival the store holds, "
                           f"slot {first}: no job to compare")  # fmt: skip
    raise HistoryError(f"--to {last} is before --from {first}")


def span_words(first: int | None, last: int | None) -> str:
    """`` in slots 3 .. 9``, `` from slot 3 on``, `` up to slot 9``, or ``""`` (it read
    "in slots 100 .. any")."""
    if first is not None and last is not None:
        return f" in slots {first} .. {last}"
    if first is not None:
        return f" from slot {first} on"
    return "" if last is None else f" up to slot {last}"


def _job(row: Any, cluster: Cluster, slot_seconds: float, window: int, arrival: int) -> Job:
    """A stored job (``row`` with ``id`` and ``spec``) arriving at ``arrival``, its work
    within ``window`` slots, as the daemon parsed it; HistoryError naming it otherwise."""
    try:
        return job_from_dict(
            _spec(row),
            cluster,
            slot_seconds=slot_seconds,
            slots_available=lambda _a: window,
            arrival=arrival,
            field=f"job {_named(row.id)}",
            keyed=True,
        )
    except SpecError as err:
        raise HistoryError(
            f"stored job {_named(row.id)} no longer fits the servers: {err}"
        ) from err


def _named(job_id: Any) -> str:
    """A stored job id as a message names it: its first 128 characters (an edited row's
    id may be megabytes long, which the message printed whole)."""
    text = str(job_id)
    return text if len(text) <= 128 else f"{text[:128]}... ({len(text)} characters)"


def _daemon_state(session: Session) -> tuple[int, float, Cluster]:
    """The daemon's window (slots), slot length (seconds) and servers, from the store's
    ``settings`` meta row and ``servers`` rows; HistoryError naming what does not read."""
    settings = session.get(MetaRow, SETTINGS_KEY)
    servers = session.scalars(select(ServerRow).order_by(ServerRow.position)).all()
    if settings is None or not servers:
        raise HistoryError("the store holds no daemon state (has a daemon run on it?)")
    window, slot_seconds = _settings(settings.value)
    resources = list(servers[0].capacity) if isinstance(servers[0].capacity, dict) else []
    try:
        cluster = cluster_from_dict(
            resources,
            [{"name": s.name, "kind": s.kind, "capacity": s.capacity} for s in servers],
            prefix="the store's servers rows: ",
        )
    except SpecError as err:
        raise HistoryError(str(err)) from err
    return window, slot_seconds, cluster


def _natural(value: Any, end: int = 1 << 31) -> bool:
    """Whether a stored slot or count is an integer ``0 .. end - 1`` (SQLite keeps what
    it is given; the arrays counts go into hold int32)."""
    return is_integer(value) and 0 <= value < end


def _settings(value: Any) -> tuple[int, float]:
    """The daemon's window and slot length from the meta row ``settings``."""
    where = f"the store's meta row {SETTINGS_KEY!r}"
    if not isinstance(value, dict):
        raise HistoryError(f"{where}: must be an object, got {type(value).__name__}")
    try:
        window = fields.positive_int(value.get("window"), f"{where}: window")
        slot_seconds = fields.positive(value.get("slot_seconds"), f"{where}: slot_seconds")
    except SpecError as err:
        raise HistoryError(str(err)) from err
    return window, slot_seconds


def _spec(row: Any) -> dict[str, Any]:
    """A stored job's spec (``row``: a JobRow, or a row with ``id`` and ``spec``), a JSON
    object (else HistoryError naming the job)."""
    try:
        spec = stored_spec(row.spec, row.id)
    except SpecError as err:
        raise HistoryError(str(err)) from err
    if not isinstance(spec, dict):
        raise HistoryError(f"the stored spec of job {_named(row.id)!r}: must be a JSON object, got "
                           f"{type(spec).__name__}")  # fmt: skip
    return spec


def _vector(demand: dict[str, float], resources: list[str]) -> NDArray[np.float64]:
    return np.array([float(demand.get(r, 0.0)) for r in resources])
