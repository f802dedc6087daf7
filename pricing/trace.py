"""The trace format (SPEC 6): a cluster, a horizon, price bounds and jobs in arrival order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pricing import fields
from pricing.bound_estimate import DEFAULT_TRIM, BoundEstimate
from pricing.cluster import Cluster, cluster_from_dict
from pricing.errors import Problem, SpecError
from pricing.job import Job, job_from_dict
from pricing.prices import PriceBounds, bounds_from_dict, etas_from_dict, oracle_bounds

__all__ = ["MAX_REPORTED_PROBLEMS", "TRACE_VERSION", "Trace", "trace_from_dict"]

TRACE_VERSION = 1
MAX_REPORTED_PROBLEMS = 50
"""A trace with more bad fields reports the first 50 (and how many more)."""


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated trace.

    Attributes:
        horizon: T; jobs may use slots ``a .. T - 1``.
        slot_seconds: length of a slot, seconds.
        cluster: the servers.
        bounds: price bounds: explicit, computed over all jobs (oracle), or, for
            ``"estimate"``, the running estimate after the last job (replay re-estimates
            before each job, as the daemon does).
        bounds_kind: ``"oracle"``, ``"explicit"`` or ``"estimate"``.
        jobs: in the order they are decided (non-decreasing arrival).
        trim: for ``"estimate"``: the share of utility L ignores
            (:mod:`pricing.bound_estimate`); None otherwise.
    """

    horizon: int
    slot_seconds: float
    cluster: Cluster
    bounds: PriceBounds
    bounds_kind: str
    jobs: tuple[Job, ...]
    trim: float | None = None


def trace_from_dict(raw: Any) -> Trace:
    """Validate a trace object; a SpecError lists every bad field (up to 50)."""
    data: Mapping[str, Any] = fields.mapping(raw, "trace")
    version = fields.require(data, "version", "")
    if version != TRACE_VERSION:
        raise SpecError.one("version", f"must be {TRACE_VERSION}, got {version!r}")
    horizon = fields.positive_int(fields.require(data, "horizon", ""), "horizon")
    slot_seconds = fields.positive(data.get("slot_seconds", 3600), "slot_seconds")
    cluster = cluster_from_dict(
        fields.require(data, "resources", ""), fields.require(data, "servers", "")
    )
    pricing_raw = data.get("pricing", {"bounds": "oracle"})
    explicit = bounds_from_dict(pricing_raw, cluster)

    raw_jobs = fields.require(data, "jobs", "")
    if not isinstance(raw_jobs, list):
        raise SpecError.one("jobs", "must be a list")
    problems: list[Problem] = []
    jobs: list[Job] = []
    ids: set[str] = set()
    last_arrival = 0
    for i, raw_job in enumerate(raw_jobs):
        field = f"jobs[{i}]"
        try:
            job = job_from_dict(
                raw_job,
                cluster,
                slot_seconds=slot_seconds,
                slots_available=lambda a: horizon - a,
                field=field,
            )
        except SpecError as err:
            problems.extend(err.problems)
            continue
        if job.id in ids:
            problems.append(Problem(f"{field}.id", f"duplicate job id {job.id!r}"))
        if job.arrival < last_arrival:
            problems.append(
                Problem(
                    f"{field}.arrival",
                    f"arrivals must not decrease: {job.arrival} after {last_arrival}",
                )
            )
        ids.add(job.id)
        last_arrival = max(last_arrival, job.arrival)
        jobs.append(job)
    if problems:
        shown = problems[:MAX_REPORTED_PROBLEMS]
        if len(problems) > len(shown):
            shown.append(Problem("jobs", f"... and {len(problems) - len(shown)} more problems"))
        raise SpecError(shown)

    if explicit is not None:
        return Trace(horizon, slot_seconds, cluster, explicit, "explicit", tuple(jobs))
    spec = fields.mapping(pricing_raw, "pricing")
    if not jobs:
        raise SpecError.one("jobs", f"{spec['bounds']} price bounds need at least one job")
    if spec["bounds"] == "estimate":
        trim = fields.number(spec.get("trim", DEFAULT_TRIM), "pricing.trim")
        if not 0 <= trim < 1:
            raise SpecError.one("pricing.trim", f"must be in [0, 1), got {trim}")
        estimate = BoundEstimate.empty(len(cluster.resources))
        for job in jobs:
            estimate = estimate.observe(job)
        final = estimate.bounds(trim=trim)
        assert final is not None
        return Trace(horizon, slot_seconds, cluster, final, "estimate", tuple(jobs), trim)
    eta1, eta2 = etas_from_dict(spec)
    bounds = oracle_bounds(
        jobs, cluster, horizon, {j.id: horizon - j.arrival for j in jobs}, eta1, eta2
    )
    return Trace(horizon, slot_seconds, cluster, bounds, "oracle", tuple(jobs))
