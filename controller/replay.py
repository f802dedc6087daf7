"""Replay a trace through the online algorithm or a baseline (SPEC 6 ``replay``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.limits import search_size
from pricing import Decision, Ledger, Trace, decide
from pricing.baselines import Outcome
from pricing.baselines import run as run_baseline
from pricing.best_schedule import BestSchedule, warm_up
from pricing.bound_estimate import units_note
from pricing.cluster import Cluster
from pricing.explain import explain
from pricing.job import Job
from pricing.schedule import Schedule

__all__ = [
    "ReplayRecord",
    "allocations",
    "baseline_json",
    "baseline_summary",
    "replay",
    "replay_baseline",
    "replay_json",
]


@dataclass(frozen=True, eq=False)
class ReplayRecord:
    """One decided job, the wall time of its decision (milliseconds) and, for a
    rejection, why (as the daemon says it)."""

    decision: Decision
    decision_ms: float
    reason: str = ""


def replay(
    trace: Trace,
    clock: Callable[[], float] = time.perf_counter,
    l_factor: float = 1.0,
    u_factor: float = 1.0,
    max_search_steps: float | None = None,
    max_search_mb: float | None = None,
) -> Iterator[ReplayRecord]:
    """Decide every job of ``trace`` in order, yielding each decision as it is made.

    Each job may use slots ``a .. T - 1``; ``clock`` (seconds) times each decision. With
    ``"estimate"`` bounds, the estimate starts from the trace's prior and takes in each
    job before it is decided, as in the daemon (:mod:`pricing.bound_estimate`), and the
    decision time includes the repricing. A job that cannot finish before the horizon
    even on an empty cluster is rejected with payoff None and that reason, and takes no
    part in the estimate (the daemon refuses such a job before deciding). ``l_factor``
    and ``u_factor`` scale every L and U used (the paper's Fig. 6). A rejection's reason
    is found after its decision is timed. With ``max_search_steps``, a job whose search
    would take more steps (``T`` x workers per slot x ``(W + 1)``, as the daemon's
    ``limits.max_search_steps`` counts them) is rejected unsearched, with that reason,
    as the daemon refuses it: one job of a small trace could otherwise search for hours.
    With ``max_search_mb``, likewise a job whose search tables would take more MiB
    (``8 T (W + N + 2)`` bytes, as ``limits.max_search_mb`` counts them): one job of
    ``2**26`` chunks and one worker-slot of work took 23 s and 6.5 GB, and more chunks
    took the machine's memory.
    """
    warm_up()
    last = trace.horizon - 1
    ledger = Ledger(trace.cluster, trace.bounds.scaled(l_factor, u_factor), trace.horizon)
    estimate = trace.estimate() if trace.trim is not None else None
    fresh = estimate  # the prior: a rejection far below its units says so (units_note)
    for job in trace.jobs:
        late = trace.late(job)  # the daemon's parser refuses these: not part of a decision
        if late is not None:
            rejected = Decision(job, False, BestSchedule(None, None, None, None, None, 0))
            yield ReplayRecord(rejected, 0.0, late)
            continue
        why = _too_large(job, trace, last, max_search_steps, max_search_mb)
        if why is not None:
            rejected = Decision(job, False, BestSchedule(None, None, None, None, None, 0))
            yield ReplayRecord(rejected, 0.0, why)
            continue
        start = clock()
        if estimate is not None:
            estimate = estimate.observe(job)
            bounds = estimate.bounds()
            assert bounds is not None  # a job was seen
            ledger.set_bounds(bounds.scaled(l_factor, u_factor))
        decision = decide(job, ledger, job.arrival, last)
        ms = (clock() - start) * 1000.0
        reason = (
            "" if decision.admitted else explain(decision.best, job, ledger, job.arrival, last)[0]
        )
        if reason and fresh is not None:
            reason += units_note(fresh, job)
        yield ReplayRecord(decision, ms, reason)


def _too_large(
    job: Job, trace: Trace, last: int, max_steps: float | None, max_mb: float | None
) -> str | None:
    """Why ``job``'s search is over the limits given (the daemon's ``limits``), or None."""
    if max_steps is None and max_mb is None:
        return None
    size = search_size(job, trace.cluster, last - job.arrival + 1)
    if max_steps is not None and size.steps > max_steps:
        return (f"not searched: its search would take {size.steps:.3g} steps "
                f"({size.slots} slots x {size.workers} workers per slot x (W + 1) "
                f"with W = {job.work}), over max_search_steps = "
                f"{max_steps:g} (the daemon's limits.max_search_steps; "
                "--max-search-steps 0: no limit)")  # fmt: skip
    if max_mb is not None and size.megabytes > max_mb:
        return (f"not searched: its search would need {size.megabytes:.0f} MiB of tables "
                f"({size.slots} slots x (W + N + 2) with W = {job.work}, N = {job.chunks}), "
                f"over max_search_mb = {max_mb:g} (the daemon's limits.max_search_mb; "
                "--max-search-mb 0: no limit)")  # fmt: skip
    return None


def allocations(schedule: Schedule | None, cluster: Cluster) -> list[dict[str, Any]]:
    """SPEC 6 allocation entries: per slot, servers in listing order, workers or PS.

    Only the schedule's nonzero cells are visited (``np.nonzero`` of each kind, ordered
    by slot and listing position), so the work grows with the schedule, not with the
    cluster times its slots."""
    if schedule is None:
        return []
    worker_pos, ps_pos = cluster.listing_positions
    w_rows, w_cols = np.nonzero(schedule.workers)
    p_rows, p_cols = np.nonzero(schedule.ps)
    rows = np.concatenate([w_rows, p_rows])
    positions = np.concatenate([worker_pos[w_cols], ps_pos[p_cols]])
    counts = np.concatenate([schedule.workers[w_rows, w_cols], schedule.ps[p_rows, p_cols]])
    is_worker = np.arange(rows.size) < w_rows.size
    servers = np.concatenate([w_cols, p_cols])
    order = np.lexsort((positions, rows))
    names = (cluster.ps_names, cluster.worker_names)
    out: list[dict[str, Any]] = []
    for row, server, n, worker in zip(
        (rows[order] + schedule.start).tolist(),
        servers[order].tolist(),
        counts[order].tolist(),
        is_worker[order].tolist(),
        strict=True,
    ):
        key = "workers" if worker else "ps"
        out.append({"slot": row, "server": names[worker][server], key: n})
    return out


def record_json(record: ReplayRecord, cluster: Cluster) -> dict[str, Any]:
    """One job of the ``replay --json`` output (SPEC 6), with ``reason``: why a rejected
    job was rejected (null for an admitted one)."""
    d = record.decision
    best = d.best
    return {
        "id": d.job.id,
        "admitted": d.admitted,
        "payoff": best.payoff,
        "cost": best.cost if d.admitted else None,
        "jct": best.jct if d.admitted else None,
        "utility": best.utility if d.admitted else None,
        "decision_ms": round(record.decision_ms, 4),
        "allocations": allocations(best.schedule, cluster) if d.admitted else [],
        "reason": None if d.admitted else record.reason,
    }


def summary(records: list[ReplayRecord]) -> dict[str, Any]:
    """Totals over a replay: utility of admitted jobs, counts, decision-time percentiles."""
    admitted = [r for r in records if r.decision.admitted]
    ms = np.array([r.decision_ms for r in records]) if records else np.zeros(1)
    return {
        "total_utility": float(sum(r.decision.best.utility or 0.0 for r in admitted)),
        "admitted": len(admitted),
        "rejected": len(records) - len(admitted),
        "total_cost": float(sum(r.decision.best.cost or 0.0 for r in admitted)),
        "decision_ms_p50": round(float(np.percentile(ms, 50)), 4),
        "decision_ms_p99": round(float(np.percentile(ms, 99)), 4),
        "decision_ms_max": round(float(ms.max()), 4),
    }


def replay_json(trace: Trace, records: list[ReplayRecord]) -> dict[str, Any]:
    """The whole ``replay --json`` document."""
    return {
        "jobs": [record_json(r, trace.cluster) for r in records],
        "summary": summary(records),
    }


def replay_baseline(
    trace: Trace,
    policy: str,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Simulate ``trace`` under the baseline ``policy`` (``pricing.baselines.POLICIES``).

    ``clock`` (seconds) times each re-plan; a job's ``decision_ms`` is the re-plan at
    its arrival slot. ``progress`` is called with the slot of each re-plan after it.
    """
    return run_baseline(trace, policy, clock, progress)


def baseline_record_json(outcome: Outcome, cluster: Cluster) -> dict[str, Any]:
    """One job of ``replay --policy <baseline> --json``, in the SPEC 6 shape.

    A baseline prices nothing, so ``payoff`` and ``cost`` are null. An admitted job that
    did not complete by ``T - 1`` has ``jct`` null, utility 0, and the allocations it ran;
    a rejected one (RRH only, or a job no policy can run) has utility null, no
    allocations, and its ``reason`` (null for an admitted job), as OASiS's records.
    """
    return {
        "id": outcome.job.id,
        "admitted": outcome.admitted,
        "payoff": None,
        "cost": None,
        "jct": outcome.jct,
        "utility": outcome.utility,
        "decision_ms": round(outcome.decision_ms, 4),
        "allocations": allocations(outcome.schedule, cluster),
        "reason": outcome.reason,
    }


def baseline_summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Totals over a baseline replay, with the keys of :func:`summary`; ``total_cost``
    is null and ``unfinished`` counts admitted jobs that did not complete."""
    ms = np.array([o.decision_ms for o in outcomes]) if outcomes else np.zeros(1)
    admitted = sum(o.admitted for o in outcomes)
    return {
        "total_utility": float(sum(o.utility or 0.0 for o in outcomes)),
        "admitted": admitted,
        "rejected": len(outcomes) - admitted,
        "unfinished": sum(o.admitted and o.jct is None for o in outcomes),
        "total_cost": None,
        "decision_ms_p50": round(float(np.percentile(ms, 50)), 4),
        "decision_ms_p99": round(float(np.percentile(ms, 99)), 4),
        "decision_ms_max": round(float(ms.max()), 4),
    }


def baseline_json(trace: Trace, outcomes: list[Outcome]) -> dict[str, Any]:
    """The whole ``replay --policy <baseline> --json`` document."""
    return {
        "jobs": [baseline_record_json(o, trace.cluster) for o in outcomes],
        "summary": baseline_summary(outcomes),
    }
