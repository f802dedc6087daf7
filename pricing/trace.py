"""The trace format (SPEC 6): a cluster, a horizon, price bounds and jobs in arrival order.

A job that cannot finish before the horizon even on an empty cluster (it arrives at or
after it, its work takes longer, or one of its workers or PS fits on no server even
empty) is part of the trace like any other: replay rejects it with ``payoff: null`` and
the reason (:func:`pricing.explain.cannot_finish`). SPEC 4's oracle bounds take it in
(they are over every job of the trace); the estimate does not (the daemon refuses such a
job before it is priced).

``pricing`` with ``{"bounds": "estimate"}`` may add ``"trim"`` (L's level, default 0.2)
and ``"prior"``: ``"default"`` (the shipped prior, also when absent), ``"none"`` (the
first job sets the estimate) or a prior object (:mod:`pricing.bound_prior`; ``oasis
replay`` also reads a file named there, relative to the trace).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pricing import fields
from pricing.bound_estimate import DEFAULT_TRIM, BoundEstimate
from pricing.bound_prior import Prior, prior_from_dict
from pricing.cluster import Cluster, cluster_from_dict
from pricing.default_prior import default_prior
from pricing.errors import Problem, SpecError
from pricing.explain import cannot_finish
from pricing.job import Job, job_from_dict
from pricing.ledger import ledger_bytes, ledger_need
from pricing.prices import PriceBounds, bounds_from_dict, etas_from_dict, oracle_bounds

__all__ = [
    "MAX_REPORTED_PROBLEMS",
    "TRACE_KEYS",
    "TRACE_VERSION",
    "Trace",
    "total_utility_problem",
    "trace_from_dict",
]

TRACE_VERSION = 1
TRACE_KEYS = frozenset(
    {"version", "horizon", "slot_seconds", "resources", "servers", "pricing", "jobs"}
)
"""Every key a trace object may have (SPEC 6)."""
MAX_REPORTED_PROBLEMS = 50
"""A trace with more bad fields reports the first 50 (and how many more: ``SpecError.more``)."""


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
        jobs: in the order they are decided (non-decreasing arrival), those that cannot
            finish before the horizon included.
        trim: for ``"estimate"``: the share of utility L ignores
            (:mod:`pricing.bound_estimate`); None otherwise.
        prior: for ``"estimate"``: the prior the estimate starts from (None: none).
    """

    horizon: int
    slot_seconds: float
    cluster: Cluster
    bounds: PriceBounds
    bounds_kind: str
    jobs: tuple[Job, ...]
    trim: float | None = None
    prior: Prior | None = None

    def late(self, job: Job) -> str | None:
        """Why ``job`` cannot finish before the horizon even on an empty cluster, or None."""
        return cannot_finish(job, self.cluster, self.horizon - job.arrival)

    def estimate(self) -> BoundEstimate:
        """The estimate replay starts from (``"estimate"`` bounds only), as the daemon
        starts from its prior."""
        if self.trim is None:
            raise ValueError("the trace's bounds are not estimated")
        return BoundEstimate.start(self.cluster, self.prior, self.trim)


MAX_LEDGER_BYTES = 16 * 2**30
"""The largest price ledger a trace may need (:func:`pricing.ledger.ledger_bytes` of its
cluster over its horizon): past it ``horizon`` is refused, instead of the allocation
failing (or the kernel killing the replay) deep in a run. 10,000 servers over 20,000
slots fit."""


def trace_from_dict(raw: Any) -> Trace:
    """Validate a trace object; a SpecError lists every bad field (up to 50).

    Unknown top-level keys are listed first and alone: a mistyped ``slot_seconds`` or
    ``pricing`` would have every other field read under its default."""
    data: Mapping[str, Any] = fields.mapping(raw, "trace")
    fields.check_no_problems(fields.unknown_keys(data, TRACE_KEYS, ""))
    version = fields.require(data, "version", "")
    if type(version) is not int or version != TRACE_VERSION:  # not true, nor 1.0
        raise SpecError.one("version", f"must be {TRACE_VERSION}, got {version!r}")
    horizon = fields.positive_int(fields.require(data, "horizon", ""), "horizon")
    slot_seconds = fields.positive(data.get("slot_seconds", 3600), "slot_seconds")
    cluster = cluster_from_dict(
        fields.require(data, "resources", ""), fields.require(data, "servers", "")
    )
    need = ledger_bytes(cluster, horizon)
    if need > MAX_LEDGER_BYTES:
        servers = len(cluster.worker_names) + len(cluster.ps_names)
        raise SpecError.one(
            "horizon",
            f"{ledger_need(horizon, servers, need)}, over the {MAX_LEDGER_BYTES / 2**30:g} "
            "GiB a trace may take; a shorter horizon, or fewer servers",
        )
    pricing_raw = data.get("pricing", {"bounds": "oracle"})
    problems: list[Problem] = []  # the pricing's and the jobs', reported together
    explicit, pricing = None, None
    try:
        explicit = bounds_from_dict(pricing_raw, cluster)
        if explicit is None:
            pricing = _pricing_rule(pricing_raw)
    except SpecError as err:
        problems.extend(err.problems)

    if "jobs" not in data:
        raise SpecError([*problems, Problem("jobs", "is required")])
    raw_jobs = data["jobs"]
    if not isinstance(raw_jobs, list):
        raise SpecError([*problems, Problem("jobs", "must be a list")])
    jobs: list[Job] = []
    ids: set[str] = set()
    last_arrival, latest_at = 0, "jobs[0]"  # the latest arrival so far, and whose
    for i, raw_job in enumerate(raw_jobs):
        field = f"jobs[{i}]"
        try:
            job = job_from_dict(
                raw_job,
                cluster,
                slot_seconds=slot_seconds,
                # a job too late for the horizon is a rejection (SPEC 6), not a bad field,
                # and so is one that fits on no server
                slots_available=lambda a: fields.MAX_INTEGER,
                field=field,
                must_fit=False,
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
                    f"arrivals must not decrease: {job.arrival} after {last_arrival} "
                    f"({latest_at}.arrival; is that one too late?)",
                )
            )
        ids.add(job.id)
        if job.arrival > last_arrival:
            last_arrival, latest_at = job.arrival, field
        jobs.append(job)
    if problems:  # the first 50, and how many more (not a problem line counted as one)
        shown = problems[:MAX_REPORTED_PROBLEMS]
        raise SpecError(shown, more=len(problems) - len(shown))

    if explicit is not None:
        return Trace(horizon, slot_seconds, cluster, explicit, "explicit", tuple(jobs))
    assert pricing is not None  # else a problem was raised above
    if isinstance(pricing, _EstimateRule):  # no job: the prior's bounds (or flat without one)
        fit = [j for j in jobs if cannot_finish(j, cluster, horizon - j.arrival) is None]
        trim, prior = pricing.trim, pricing.prior
        estimate = BoundEstimate.start(cluster, prior, trim)
        for job in fit:
            estimate = estimate.observe(job)
        final = estimate.bounds() or _flat(cluster)
        return Trace(horizon, slot_seconds, cluster, final, "estimate", tuple(jobs), trim, prior)
    if not jobs:
        raise SpecError.one(
            "jobs", "oracle price bounds need at least one job (SPEC 4 takes them over the "
            "jobs); give explicit bounds, or estimate",
        )  # fmt: skip
    eta1, eta2 = pricing
    # SPEC 4: over every job of the trace, those too late for the horizon included
    # (one arriving at or after T, where T - a is no completion time, with Tmax = 1:
    # a choice, README "Implementation choices")
    latest = {j.id: max(horizon - j.arrival, 1) for j in jobs}
    bounds = oracle_bounds(jobs, cluster, horizon, latest, eta1, eta2)
    return Trace(horizon, slot_seconds, cluster, bounds, "oracle", tuple(jobs))


def total_utility_problem(jobs: Sequence[Job]) -> list[Problem]:
    """A problem if the jobs' best utilities ``f(d_min)`` sum past the largest float:
    each job's is finite, but two of ``1e308`` made `offline`'s optimum and bound ``inf``,
    and its JSON ``Infinity``, which is no JSON. The offline comparison refuses them
    (its totals are over all jobs); a replay decides them (only its total can fail)."""
    total = 0.0
    for job in jobs:
        total += job.best_utility  # inf past the largest float
    if math.isfinite(total):
        return []
    return [
        Problem(
            "jobs",
            "the jobs' best utilities f(d_min) sum past the largest number (1.8e308), so "
            "totals and ratios cannot be reported: divide every utility by one factor",
        )
    ]


@dataclass(frozen=True)
class _EstimateRule:
    """``{"bounds": "estimate"}``'s settings, checked."""

    trim: float
    prior: Prior | None


def _pricing_rule(pricing_raw: Any) -> _EstimateRule | tuple[float | None, float | None]:
    """The checked rule of a pricing that is not explicit bounds: the estimate's
    settings, or the oracle's ``(eta1, eta2)``; a SpecError names a bad field."""
    spec = fields.mapping(pricing_raw, "pricing")
    if spec["bounds"] == "estimate":
        trim = fields.number(spec.get("trim", DEFAULT_TRIM), "pricing.trim")
        if not 0 <= trim < 1:
            raise SpecError.one("pricing.trim", f"must be in [0, 1), got {trim}")
        return _EstimateRule(trim, _prior(spec.get("prior", "default")))
    return etas_from_dict(spec)


def _flat(cluster: Cluster) -> PriceBounds:
    """Every price 1: for a trace in which no job can run."""
    zeros = np.zeros(len(cluster.resources))
    return PriceBounds(zeros, zeros.copy(), 0.0, 0.0, 1.0, 1.0)


def _prior(raw: Any) -> Prior | None:
    """``pricing.prior``: ``"default"``, ``"none"`` or a prior object."""
    if raw == "default":
        return default_prior()
    if raw == "none":
        return None
    if isinstance(raw, str):
        raise SpecError.one(
            "pricing.prior",
            f"must be 'default', 'none' or a prior object, got {raw[:80]!r} (oasis replay "
            "reads a file named here; pricing itself reads no files)",
        )
    return prior_from_dict(raw, "pricing.prior")
