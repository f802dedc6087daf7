"""Jobs' reported progress as the plane keeps it and the store holds it, and as the API
reports it.

Agents' counts are cumulative per agent session (``"server/session"``,
:func:`session_key`): a job's progress is the sum over its sessions, in mini-batches and
worker-seconds; a session's counts never go back (:meth:`JobProgress.take`).
:class:`~controller.plane.execution.Execution` keeps a
:class:`JobProgress` per active job and applies reports to it in the decision thread;
this module reads and writes the stored rows (:class:`~controller.store.ProgressRow`),
in that thread too.

Progress is written to the store once per review (:func:`flush`) and stays marked
changed until a commit succeeds. Jobs that ended (completed, failed, cancelled) are
forgotten once their progress is stored; a late report of one (still within a slot of
its work) is merged with what the store holds rather than overwriting it
(:func:`merged`).

A stored row edited by hand never fails a review or a read: what does not read is left
out (:func:`stored`), and a row past :data:`MAX_PROGRESS_BYTES` is not read at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import Text, bindparam, cast, func, insert, select, update
from sqlalchemy.orm import Session
from structlog.typing import FilteringBoundLogger

from controller.plane.jobs import ACTIVE
from controller.plane.worker_failures import WorkerFailures
from controller.store import JobRow, ProgressRow, in_batches
from pricing import Job
from pricing.runtime_estimate import Interval, RuntimePrior, fit

__all__ = [
    "LEVEL",
    "MAX_PROGRESS_BYTES",
    "MAX_SAMPLES",
    "MAX_SESSIONS_PER_SERVER",
    "MAX_STORED_SESSIONS",
    "MIN_SAMPLES",
    "JobProgress",
    "ProgressView",
    "flush",
    "load_active",
    "merged",
    "progress_view",
    "session_key",
    "sessions_of",
    "stored",
    "with_stored",
]

MAX_SAMPLES = 400
"""Samples a job's progress keeps (the newest)."""
MAX_STORED_SESSIONS = 1 << 16
"""Sessions read from a job's stored progress at most (its agents' on its servers are far
fewer; an edited row's are left out)."""
MAX_PROGRESS_BYTES = 8 << 20
"""A stored progress row's JSON read at most, in characters (the bytes of the ASCII the
daemon writes; a row is a few KB to a few hundred; an edited row of 70 MB took the daemon
from 0.38 to 1.1 GB at start-up): a larger one is not read, and its job's progress
starts again from its agents' reports."""
MAX_SESSIONS_PER_SERVER = 64
"""Agent sessions of one server whose counts a job keeps (a restarted agent starts a
new one); entries of more are dropped. Each entry sums the job's sessions and its
stored row holds them all, so without a bound an agent with a new session id in every
report (a bug, or a forger on its own topic) slowed every review for every tenant."""
MIN_SAMPLES = 4
"""Samples a job needs before its pace is judged (the slow-job review)."""
LEVEL = 0.9
"""The level of the runtime estimate's intervals."""


@dataclass
class JobProgress:
    """A job's reported progress.

    Attributes:
        sessions: ``"server/session" -> [minibatches, worker_seconds]``, cumulative.
        samples: ``[(minibatches, worker_seconds), ...]``: the job's totals after each
            report, the data the runtime estimate is fitted to.
        dirty: changed since last written to the store (cleared by a commit only).
        partial: built from reports alone, without the job's stored progress (a job
            forgotten when it ended, then reported again): merged with the stored row
            before it is written, so sessions only the store knows are kept.
    """

    sessions: dict[str, list[float]] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)
    dirty: bool = False
    partial: bool = False

    def totals(self) -> tuple[float, float]:
        """``(minibatches, worker_seconds)`` over every session."""
        return _totals(self.sessions)

    def take(self, key: str, minibatches: float, worker_seconds: float) -> bool:
        """Take session ``key``'s cumulative counts from a report (mini-batches,
        worker-seconds); False if either is below what the session said before: a stale
        or out-of-order report, or an agent counting wrong. Then the higher of each is
        kept (as :func:`merged` keeps them): a session's counts never go back. Before,
        the lower ones replaced them: a job's progress went from 100 mini-batches back
        to 10, and its estimate said a negative mini-batch time. A sample is added only
        when the job's totals changed: a report repeated (a resend after a
        reconnection, a new worker failure alone) is no new observation, and 400 of
        them pushed every earlier sample out of the runtime estimate's data."""
        old = self.sessions.get(key)
        forward = old is None or (minibatches >= old[0] and worker_seconds >= old[1])
        new = [minibatches, worker_seconds] if old is None else [
            max(old[0], minibatches), max(old[1], worker_seconds)
        ]  # fmt: skip
        if new != old:
            self.sessions[key] = new
            totals = self.totals()
            if not self.samples or self.samples[-1] != totals:
                self.samples.append(totals)
                del self.samples[:-MAX_SAMPLES]
            self.dirty = True
        return forward


def _totals(sessions: dict[str, list[float]]) -> tuple[float, float]:
    return sum(v[0] for v in sessions.values()), sum(v[1] for v in sessions.values())


def session_key(server: str, session: str) -> str:
    """``"server/session"``: one agent session of a server, as :class:`JobProgress`
    keys its counts and the plane names the sessions it ignores."""
    return f"{server}/{session}"


def sessions_of(prog: JobProgress, server: str) -> int:
    """The sessions of ``server`` whose counts ``prog`` holds."""
    prefix = f"{server}/"
    return sum(1 for key in prog.sessions if key.startswith(prefix))


def _pair(value: Any) -> tuple[float, float] | None:
    """A stored ``[minibatches, worker_seconds]``, or None if it does not read as two
    finite numbers >= 0."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    try:
        a, b = float(value[0]), float(value[1])
    except (TypeError, ValueError, OverflowError):
        return None
    return (a, b) if math.isfinite(a) and math.isfinite(b) and min(a, b) >= 0 else None


def stored(row: ProgressRow) -> tuple[JobProgress, int]:
    """A stored row's progress and how many of its entries did not read (an edit: they
    are left out, as are sessions past :data:`MAX_STORED_SESSIONS` and all but the last
    :data:`MAX_SAMPLES` samples), so a row edited by hand never fails a review or a read."""
    per_server = row.per_server if isinstance(row.per_server, dict) else {}
    points = row.samples.get("points", []) if isinstance(row.samples, dict) else []
    points = points if isinstance(points, list) else []
    sessions = {
        key: list(pair)
        for key, value in list(per_server.items())[:MAX_STORED_SESSIONS]
        if isinstance(key, str) and (pair := _pair(value)) is not None
    }
    samples = [p for p in map(_pair, points[-MAX_SAMPLES:]) if p is not None]
    bad = (
        len(per_server) - len(sessions) + min(len(points), MAX_SAMPLES) - len(samples)
        + (not isinstance(row.per_server, dict)) + (not isinstance(row.samples, dict))
    )  # fmt: skip
    return JobProgress(sessions, samples), bad


_PROGRESS = ProgressRow.metadata.tables[ProgressRow.__tablename__]


def _progress_row(session: Session, job_id: str) -> ProgressRow | None:
    """``job_id``'s stored progress, None if none or larger than
    :data:`MAX_PROGRESS_BYTES` (an edit: its JSON is not read)."""
    within = _progress_bytes() <= MAX_PROGRESS_BYTES
    return session.scalar(select(ProgressRow).where(ProgressRow.job_id == job_id, within))


def _progress_bytes() -> Any:
    """The size of a progress row's JSON in characters, as SQL (``length`` of its text
    on both stores)."""
    return func.coalesce(func.length(cast(ProgressRow.per_server, Text)), 0) + func.coalesce(
        func.length(cast(ProgressRow.samples, Text)), 0
    )


def merged(
    prog: JobProgress, row: ProgressRow
) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """A partial entry's sessions and samples merged with the job's stored progress."""
    prior = stored(row)[0]
    sessions = prior.sessions
    for key, (mb, ws) in prog.sessions.items():
        old = sessions.get(key, [0.0, 0.0])
        # counts are cumulative per session: the larger one is the later one
        sessions[key] = [max(old[0], mb), max(old[1], ws)]
    # the partial entry's own samples are totals over a subset of the sessions, not the
    # job's: only the merged totals are a valid new sample
    samples = prior.samples
    totals = _totals(sessions)
    if not samples or samples[-1] != totals:
        samples.append(totals)
    return sessions, samples[-MAX_SAMPLES:]


def load_active(session: Session, log: FilteringBoundLogger) -> dict[str, JobProgress]:
    """The stored progress of the active jobs (start-up). A row past
    :data:`MAX_PROGRESS_BYTES` is not read, and said; entries of a row that do not read
    are left out, and said."""
    active = (
        select(ProgressRow)
        .join(JobRow, JobRow.id == ProgressRow.job_id)
        .where(JobRow.state.in_(ACTIVE))
    )
    size = _progress_bytes()
    oversized = active.with_only_columns(ProgressRow.job_id, size).where(size > MAX_PROGRESS_BYTES)
    for job_id, chars in session.execute(oversized):  # edited by hand: not read
        log.warning("stored progress ignored", job=job_id,
                    why=f"{chars} bytes, over {MAX_PROGRESS_BYTES}")  # fmt: skip
    active = active.where(size <= MAX_PROGRESS_BYTES)
    progress: dict[str, JobProgress] = {}
    for prow in session.scalars(active):
        progress[prow.job_id], bad = stored(prow)
        if bad:  # edited by hand: its agents send again what they sent since
            log.warning("stored progress entries ignored", job=prow.job_id,
                        entries=bad)  # fmt: skip
    return progress


def flush(
    progress: dict[str, JobProgress], write: Callable[[], AbstractContextManager[Session]]
) -> None:
    """Write the changed entries of ``progress`` in one ``write()`` transaction. Entries
    stay dirty until the commit succeeds, so a store outage delays what agents reported
    but loses none of it; an entry of a job the store does not hold is dropped.

    The rows go in one ``UPDATE`` and one ``INSERT`` of many parameter sets, the ids read
    :func:`~controller.store.in_batches` at a time: a statement built for each row took 0.7 s of the
    decision thread for one tenant's 1,000 running jobs, at every round of reports."""
    dirty = {j: p for j, p in progress.items() if p.dirty}
    if not dirty:
        return
    now = datetime.now(UTC)
    written: dict[str, tuple[dict[str, list[float]], list[tuple[float, float]]]] = {}
    ids = list(dirty)
    with write() as session:
        known: set[str] = set()
        have: set[str] = set()  # with a stored row
        for chunk in in_batches(ids):
            known.update(session.scalars(select(JobRow.id).where(JobRow.id.in_(chunk))))
            have.update(session.scalars(
                select(ProgressRow.job_id).where(ProgressRow.job_id.in_(chunk))))  # fmt: skip
        updates: list[dict[str, Any]] = []
        inserts: list[dict[str, Any]] = []
        for job_id, prog in dirty.items():
            if job_id not in known:  # progress for a job this daemon never saw
                continue
            sessions, samples = prog.sessions, prog.samples
            if prog.partial and job_id in have and (row := _progress_row(session, job_id)):
                sessions, samples = merged(prog, row)
            mb, ws = _totals(sessions)
            values = {"minibatches": mb, "worker_seconds": ws, "per_server": sessions,
                      "samples": {"points": [list(p) for p in samples]},
                      "updated_at": now}  # fmt: skip
            if job_id in have:
                updates.append({"b_job_id": job_id, **{f"b_{k}": v for k, v in values.items()}})
            else:
                inserts.append({"job_id": job_id, **values})
            written[job_id] = (sessions, samples)
        table = _PROGRESS
        connection = session.connection()
        if updates:
            columns = ("minibatches", "worker_seconds", "per_server", "samples", "updated_at")
            stmt = (
                update(table)
                .where(table.c.job_id == bindparam("b_job_id"))
                .values({c: bindparam(f"b_{c}") for c in columns})
            )
            connection.execute(stmt, updates)
        if inserts:
            connection.execute(insert(table), inserts)
    for job_id, prog in dirty.items():  # committed
        if job_id not in written:
            del progress[job_id]  # nothing to keep it for
            continue
        prog.sessions, prog.samples = written[job_id]
        prog.dirty = prog.partial = False


def with_stored(session: Session, job_id: str, prog: JobProgress | None) -> JobProgress:
    """``prog`` (the plane's entry for ``job_id``, if any) with what the store holds: an
    ended job's progress is in the store, and a partial entry is merged with it."""
    if prog is None or prog.partial:  # an ended job's progress is in the store
        row = _progress_row(session, job_id)
        if row is not None:
            prog = stored(row)[0] if prog is None else JobProgress(*merged(prog, row))
    if prog is None:
        prog = JobProgress()
    return prog


@dataclass(frozen=True)
class ProgressView:
    """A job's progress and runtime estimate as the API reports it.

    Attributes:
        job_id: the job.
        state: its state.
        minibatches_done, minibatches_total: reported and needed mini-batches.
        worker_seconds: worker-seconds reported so far.
        reports: samples the estimate is fitted to.
        planned_minibatch_seconds: the plan's time of one mini-batch on one worker.
        minibatch_seconds: its posterior estimate and credible interval, seconds.
        total_worker_seconds: predicted worker-seconds for the whole job, with the
            predictive interval.
        planned_worker_seconds: worker-seconds the plan holds in all (slots x length).
        completion_slot: the planned last slot.
        worker_failures: its failing worker commands per server, as their agents last
            said (:mod:`controller.plane.worker_failures`); empty: none heard of.
    """

    job_id: str
    state: str
    minibatches_done: float
    minibatches_total: int
    worker_seconds: float
    reports: int
    planned_minibatch_seconds: float
    minibatch_seconds: Interval
    total_worker_seconds: Interval
    planned_worker_seconds: float
    completion_slot: int | None
    worker_failures: tuple[WorkerFailures, ...] = ()


def progress_view(
    job_id: str, job: Job, state: str, completion: int | None, planned_ws: float, prog: JobProgress,
    slot_seconds: float, failures: tuple[WorkerFailures, ...] = (),
) -> ProgressView:  # fmt: skip
    """``job_id``'s view (``job`` its spec): its progress ``prog`` and the runtime
    estimate fitted to it; ``planned_ws`` is the worker-seconds its plan holds,
    ``slot_seconds`` a slot's length, ``failures`` its failing workers per server."""
    done, spent = prog.totals()
    planned_mb = job.minibatch_slots * slot_seconds
    total = job.total_minibatches
    xs = np.array([p[0] for p in prog.samples])
    ys = np.array([p[1] for p in prog.samples])
    post = fit(xs, ys, RuntimePrior(planned_mb))
    return ProgressView(
        job_id=job_id,
        state=state,
        # each server's count is capped at the whole, their sum too (the audit saw
        # "436 of 432 (100.9%)": workers run on until the job's completion is heard)
        minibatches_done=min(done, float(total)),
        minibatches_total=total,
        worker_seconds=spent,
        reports=len(prog.samples),
        planned_minibatch_seconds=planned_mb,
        minibatch_seconds=post.minibatch_seconds(LEVEL),
        total_worker_seconds=post.seconds_at(total, LEVEL),
        planned_worker_seconds=planned_ws,
        completion_slot=completion,
        worker_failures=failures,
    )
