"""Price bounds estimated from the jobs seen so far, robust to any one job (the daemon's
default; trace pricing ``{"bounds": "estimate"}``).

The paper assumes U and L known in advance and shows (its Fig. 6) that mis-estimating
them matters. The daemon cannot know future jobs, so it estimates both from every job it
has been asked about (submitted, admitted or not), the job being decided included. The
estimate follows *quantiles* of per-job values (:mod:`pricing.quantile_tracker`), never
running extremes, starts from a *prior* (:mod:`pricing.bound_prior`), and measures
demand in *server's worths*: each resource divided by the mean capacity ``cbar[r]`` of
the servers of its kind.

Per job, with ``B = f(d_min)`` its best utility and ``d`` its demand per worker (or PS):

- **floor value** ``log (B / (W sum_r d[r] / cbar[r]))``: its utility per worker-slot and
  server's worth. L follows the quantile of these at ``trim`` (default 0.3), weighted by
  utility capped at a reference ``B_ref`` (the 0.9 count quantile of ``B``): the jobs of
  lowest value that together carry ``trim`` of the (capped) utility on offer lie below
  it. ``L[r] = exp(floor) / 4 / cbar[r]`` (SPEC 4's 4): on an idle cluster every job
  above that tail costs less than a quarter of what it is worth, and one resource of a
  whole server costs the same at the floor for every ``r`` (not one L over raw units,
  where memory and disk in GB would dominate GPUs). The cap keeps one job's weight at
  most that of a typical large job.
- **top value** per resource used, ``log (B / (d[r] / cbar[r]))``: SPEC 4's ``f(d_min) /
  w[r]`` in server's worths. ``U[r] = exp(top) / cbar[r]`` follows the median (SPEC 4
  takes the maximum): the upper half of jobs value ``r`` above ``U``; they pay the top
  price (are admitted if they fit) and do not raise it for the others (the paper's
  Fig. 6, and ours, show an under-estimated U costs little). ``U >= L`` always.

**The bound on one job's influence.** Every followed value moves by at most
``STEP = 0.1`` (natural log) per job, so after one more job every ``U1[r]``, ``U2[r]``,
``L1[r]`` and ``L2[r]`` lies within a factor ``e^0.1 = 1.105`` of what it was (with the
same margins), and ``k`` jobs move them by at most ``e^(0.1 k)``, whatever their
numbers (priority ``1e308``, demands of ``5e-324``: logs are clipped to +-1000 first).
On top of that, the quantiles ignore a few outliers: one job far above the others
moves a quantile by one rank, and once the followed value has caught up with the
ordinary jobs' quantile, they pull it back. Only the very first job of an estimate
without a prior (no value to move from) sets the values outright.

What one *submitter's* many jobs can do is bounded one level up: the daemon keeps an
estimate per submitter and prices with their median (:mod:`pricing.shared_estimate`).

The levels (trim 0.3, median U) were chosen by measurement on seeds 100-102, which no
reported benchmark uses (bench/RESULTS.md, "Price bounds").

**Forgetting.** Each job decays the weight of all earlier ones (and of the prior) by
``1 - 1/WINDOW`` (WINDOW = 400 jobs), so the estimate follows a changing workload and an
old outlier fades; a histogram keeps at most 256 bins of ``exp(0.05)`` width.

**Warm start.** Before jobs are seen the quantiles are those of the prior, which counts
as ``weight`` (default 40) jobs and fades like any old job. The shipped default
(:mod:`pricing.default_prior`) was calibrated on ``oasis gen`` traces; ``oasis calibrate``
makes one from a trace (:func:`calibrate`). Without any prior (``empty``, ``start(...,
None)``) the first job sets the values.

:meth:`BoundEstimate.start` knows the cluster (capacity units, resource names, the
prior); :meth:`BoundEstimate.empty` is the older entry point, which knows only the
number of resources: raw units (``cbar = 1``), no prior. The state is small (bounded
histograms) and JSON-safe, and a restarted daemon continues exactly where it stopped.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pricing.bound_prior import DEFAULT_PRIOR_WEIGHT, Points, Prior, SidePrior
from pricing.cluster import Cluster
from pricing.job import Job
from pricing.prices import PriceBounds
from pricing.quantile_tracker import BIN_WIDTH, Tracker, clip_log
from pricing.utility import Deadline, Sigmoid

__all__ = [
    "BEST_LEVEL",
    "BIN_WIDTH",
    "DEFAULT_TRIM",
    "STEP",
    "TOP_LEVEL",
    "WINDOW",
    "BoundEstimate",
    "SideEstimate",
    "bounds_by_kind",
    "calibrate",
    "exp_shown",
    "log_mean_capacity",
    "units_note",
]

DEFAULT_TRIM = 0.3
"""Share of the (capped) utility on offer whose lowest-value jobs lie below L."""
TOP_LEVEL = 0.5
"""U follows this count quantile of the top values (the median: measured better than
0.7, 0.9, 0.97 and 0.99 on tuning seeds 100-102, bench/RESULTS.md "Price bounds")."""
BEST_LEVEL = 0.9
"""``B_ref``, the cap on a job's weight in L's quantile, is this count quantile of B."""
STEP = 0.1
"""Most a followed log value moves per job: one job moves U or L by at most e^0.1."""
WINDOW = 400
"""Earlier weight decays by ``1 - 1/WINDOW`` per job."""
SETTLE = 20.0
"""Without a prior, a followed value is its quantile itself until this many jobs' worth
of weight is seen (enough that B_ref's 0.9 quantile ignores one outlier); from then on,
and from the start with a prior, it moves by at most STEP per job."""
MIN_WEIGHT = 1e-6
"""Least weight of a job in L's quantile (one whose utility underflows still counts)."""
LOG_DIVISOR = math.log(4.0)
"""L is the floor value divided by 4 (SPEC 4)."""

_DECAY = 1.0 - 1.0 / WINDOW
_VERSION = 4
_READ_VERSIONS = (3, 4)
"""Versions :meth:`BoundEstimate.from_dict` reads: 4 packs each tracker's weights into one
base64 string, 3 (before) lists them."""


def log_mean_capacity(capacity: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(R,)``: ``log`` of the mean capacity per resource over ``(n, R)`` servers; 0
    where no server has the resource (no job can demand it there)."""
    mean = capacity.mean(axis=0) if capacity.shape[0] else np.zeros(capacity.shape[1])
    with np.errstate(divide="ignore"):
        return np.where(mean > 0, np.log(np.where(mean > 0, mean, 1.0)), 0.0)


def _log_size(
    demand: NDArray[np.float64], log_scale: Sequence[float]
) -> tuple[list[int], list[float], float] | None:
    """``(used r, log d[r] - log cbar[r] for them, log sum_r d[r] / cbar[r])``; None if
    the demand is all zero. In logs, so a demand of 5e-324 or 1e308 stays finite."""
    idx = [r for r, d in enumerate(demand.tolist()) if d > 0]
    if not idx:
        return None
    parts = [math.log(float(demand[r])) - log_scale[r] for r in idx]
    top = max(parts)
    return idx, parts, top + math.log(math.fsum(math.exp(p - top) for p in parts))


@dataclass(frozen=True, eq=False)
class SideEstimate:
    """The estimate's state for one kind of server (workers or PS).

    Attributes:
        log_scale: ``(R,)`` float64, ``log cbar[r]`` (0 for raw units).
        floor: the followed floor value (L).
        top: per resource, the followed top value (U).
    """

    log_scale: NDArray[np.float64]
    floor: Tracker
    top: tuple[Tracker, ...]

    @property
    def _scale(self) -> list[float]:
        return self.log_scale.tolist()  # type: ignore[no-any-return]

    @classmethod
    def begin(
        cls,
        log_scale: NDArray[np.float64],
        resources: Sequence[str] | None,
        prior: SidePrior | None,
        prior_weight: float,
        trim: float,
    ) -> SideEstimate:
        n = log_scale.shape[0]
        if prior is None or resources is None:
            return cls(log_scale, Tracker(), tuple(Tracker() for _ in range(n)))

        def of(points: Points, level: float, edge: float, mass: float) -> Tracker:
            return Tracker.of(((x, s * mass) for x, s in points), level, edge)

        top = tuple(
            of(prior.top[r], TOP_LEVEL, 1.0, prior_weight) if r in prior.top else Tracker()
            for r in resources
        )
        floor = of(prior.floor, trim, 0.0, prior_weight * prior.floor_per_job)
        return cls(log_scale, floor, top)

    def observe(
        self, log_best: float, log_work: float, demand: NDArray[np.float64], weight: float,
        trim: float,
    ) -> SideEstimate:  # fmt: skip
        """Fold in one job: ``log f(d_min)``, ``log W``, its demand ``(R,)`` on this side
        and its weight in L's quantile."""
        size = _log_size(demand, self._scale)
        if size is None:
            return self
        idx, parts, log_size = size
        floor = self.floor.observe(
            log_best - log_work - log_size, weight, level=trim, edge=0.0, decay=_DECAY,
            step=STEP, settle=SETTLE,
        )  # fmt: skip
        top = list(self.top)
        for r, part in zip(idx, parts, strict=True):
            top[r] = top[r].observe(
                log_best - part, 1.0, level=TOP_LEVEL, edge=1.0, decay=_DECAY, step=STEP,
                settle=SETTLE,
            )  # fmt: skip
        return SideEstimate(self.log_scale, floor, tuple(top))

    def logs(
        self, log_l_margin: float, log_u_margin: float, shift: float
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(log U (R,), log L (R,))``; the floor must have a value."""
        assert self.floor.value is not None
        log_l = self.floor.value + shift - LOG_DIVISOR + log_l_margin - self.log_scale
        top = np.array([-np.inf if t.value is None else t.value for t in self.top])
        log_u = np.maximum(top + log_u_margin - self.log_scale, log_l)
        return log_u, log_l

    def refit(
        self, old: Sequence[str], new: Sequence[str], fresh: SideEstimate
    ) -> SideEstimate | None:
        """This side over resources ``new`` (its own are ``old``): each resource kept
        keeps its followed U (by name), one added starts from ``fresh``'s (the prior), one
        removed is dropped; the floor is kept. None if a kept resource's mean capacity
        (``log_scale``, from ``fresh``) changed: its values are in other units."""
        at = {r: j for j, r in enumerate(old)}
        top = []
        for i, r in enumerate(new):
            j = at.get(r)
            if j is None:
                top.append(fresh.top[i])
            elif self.log_scale[j] != fresh.log_scale[i]:
                return None
            else:
                top.append(self.top[j])
        return SideEstimate(fresh.log_scale, self.floor, tuple(top))

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.log_scale.tolist(),  # (R,) float64: Python floats
            "floor": self.floor.to_dict(),
            "top": [t.to_dict() for t in self.top],
        }

    @classmethod
    def from_dict(cls, data: Any, n: int) -> SideEstimate:
        if not isinstance(data, dict):
            raise ValueError("a side must be an object")
        scale = np.array([float(x) for x in data["scale"]], np.float64)
        top = tuple(Tracker.from_dict(t) for t in data["top"])
        if scale.shape != (n,) or len(top) != n or not np.isfinite(scale).all():
            raise ValueError("side state does not match the resources")
        return cls(scale, Tracker.from_dict(data["floor"]), top)


@dataclass(frozen=True, eq=False)
class BoundEstimate:
    """The estimate's state over the jobs seen; see the module docstring.

    Attributes:
        worker, ps: per kind of server.
        best: the followed ``log B_ref``.
        trim: L's level (share of capped utility below it), in [0, 1).
        jobs: how many jobs were folded in.
        resources: resource names (None from :meth:`empty`).
        prior: where the prior came from (``"none"`` without one).
        prior_mass: the prior's weight left after decay (jobs' worth).
    """

    worker: SideEstimate
    ps: SideEstimate
    best: Tracker
    trim: float = DEFAULT_TRIM
    jobs: int = 0
    resources: tuple[str, ...] | None = None
    prior: str = "none"
    prior_mass: float = 0.0

    @classmethod
    def empty(cls, n_resources: int, trim: float = DEFAULT_TRIM) -> BoundEstimate:
        """No prior, demands in raw units (the cluster is not known here)."""
        zeros = np.zeros(n_resources)
        side = SideEstimate.begin(zeros, None, None, 0.0, trim)
        return cls(side, side, Tracker(), trim)

    @classmethod
    def start(
        cls, cluster: Cluster, prior: Prior | None, trim: float = DEFAULT_TRIM
    ) -> BoundEstimate:
        """Demands in server's worths of ``cluster``, starting from ``prior`` (None: the
        first job sets the values)."""
        weight = prior.weight if prior is not None else 0.0
        sides = [
            SideEstimate.begin(
                log_mean_capacity(capacity),
                cluster.resources,
                None if prior is None else getattr(prior, kind),
                weight,
                trim,
            )
            for kind, capacity in (("worker", cluster.worker_capacity), ("ps", cluster.ps_capacity))
        ]
        best = Tracker()
        label = "none"
        if prior is not None:
            best = Tracker.of(((x, s * weight) for x, s in prior.best), BEST_LEVEL, 0.5)
            label = prior.source or "given"
        return cls(sides[0], sides[1], best, trim, 0, cluster.resources, label, weight)

    def fits(self, cluster: Cluster) -> bool:
        """True if this state was started for ``cluster`` (:meth:`start`): the same
        resources and mean capacities. A stored state that does not fit (the config's
        servers changed, or one from :meth:`empty`) should be started afresh."""
        return self.resources == cluster.resources and self._scales_are(
            log_mean_capacity(cluster.worker_capacity), log_mean_capacity(cluster.ps_capacity)
        )

    def refit(self, fresh: BoundEstimate) -> BoundEstimate | None:
        """This estimate over the resources of ``fresh`` (:meth:`start` for the
        configured cluster), matched by name, not position: a reorder keeps every
        resource's U; an added resource starts from ``fresh``'s (the prior, at its full
        weight); a removed one drops its own. Itself if it :meth:`fits` already.

        L and ``B_ref`` are kept: a job's floor value sums over the resources it
        demands, and no job seen demanded one added (it did not exist), so each keeps
        its value; after a removal the jobs seen counted a resource the next ones will
        not, which the estimate follows like any change of workload (it moves at most
        ``e^STEP`` per job either way). None (start afresh) for a state without
        resource names (:meth:`empty`), or where a kept resource's mean capacity
        changed (the config's servers changed: the values are in other units)."""
        if fresh.resources is None or self.resources is None:
            return None
        if self.resources == fresh.resources:
            return self if self._scales_are(fresh.worker.log_scale, fresh.ps.log_scale) else None
        sides = [
            mine.refit(self.resources, fresh.resources, theirs)
            for mine, theirs in ((self.worker, fresh.worker), (self.ps, fresh.ps))
        ]
        if sides[0] is None or sides[1] is None:
            return None
        return replace(self, worker=sides[0], ps=sides[1], resources=fresh.resources)

    def _scales_are(self, worker: NDArray[np.float64], ps: NDArray[np.float64]) -> bool:
        """Whether the sides' log mean capacities are ``worker`` and ``ps``, ``(R,)``
        each, position by position."""
        return bool(
            np.array_equal(self.worker.log_scale, worker) and np.array_equal(self.ps.log_scale, ps)
        )

    def observe(self, job: Job) -> BoundEstimate:
        """A new estimate with ``job`` folded in (this one is unchanged)."""
        log_best = clip_log(float(job.utility.log_values(job.min_slots)))
        ref = self.best.value
        weight = 1.0
        if ref is not None:
            weight = max(MIN_WEIGHT, math.exp(min(log_best - ref, 0.0)))
        log_work = math.log(job.work)
        return BoundEstimate(
            self.worker.observe(log_best, log_work, job.worker, weight, self.trim),
            self.ps.observe(log_best, log_work, job.ps, weight, self.trim),
            self.best.observe(
                log_best, 1.0, level=BEST_LEVEL, edge=0.5, decay=_DECAY, step=STEP, settle=SETTLE
            ),
            self.trim,
            self.jobs + 1,
            self.resources,
            self.prior,
            self.prior_mass * _DECAY,
        )

    def bounds(
        self, l_margin: float = 1.0, u_margin: float = 1.0, trim: float | None = None
    ) -> PriceBounds | None:
        """The price bounds (``L`` per resource), or None before any job and prior.

        ``trim`` other than the estimate's own reads L at that level instead: the
        followed L moved by the difference of the two quantiles (the daemon's older
        call passes its configured trim here)."""
        if self.worker.floor.value is None or self.ps.floor.value is None:
            return None
        out = []
        for side in (self.worker, self.ps):
            shift = 0.0
            if trim is not None and trim != self.trim:
                there = side.floor.target(trim, 0.0)
                here = side.floor.target(self.trim, 0.0)
                shift = 0.0 if there is None or here is None else there - here
            out.append(side.logs(math.log(l_margin), math.log(u_margin), shift))
        (u1, l1), (u2, l2) = out
        return PriceBounds(u1, u2, l1, l2, 1.0, 1.0)

    def describe(self, resources: Sequence[str]) -> dict[str, Any]:
        """What ``oasis bounds`` shows: how the bounds are estimated, from how many jobs,
        and U and L per resource and kind of server (null before any job and prior)."""
        b = self.bounds()
        total = self.best.total  # the prior counts as its weight in jobs, each job as 1
        out: dict[str, Any] = {
            "method": (
                f"quantiles: L at trim {self.trim:g} of capped utility / 4, U at the "
                f"{TOP_LEVEL:g} count quantile, in server's worths; at most a factor "
                f"e^{STEP:g} per job; decay 1 - 1/{WINDOW} per job"
            ),
            "jobs": self.jobs,
            "prior": self.prior,
            "prior_share": min(1.0, self.prior_mass / total) if total > 0 else 0.0,
            "units": "raw" if self.resources is None else "server's worth (mean capacity)",
        }
        out.update(bounds_by_kind(b, resources))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state; floats round-trip exactly."""
        return {
            "version": _VERSION,
            "trim": self.trim,
            "jobs": self.jobs,
            "resources": None if self.resources is None else list(self.resources),
            "prior": self.prior,
            "prior_mass": self.prior_mass,
            "best": self.best.to_dict(),
            "worker": self.worker.to_dict(),
            "ps": self.ps.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> BoundEstimate | None:
        """The state :meth:`to_dict` wrote; None for another version or a state that is
        not one (the caller starts afresh)."""
        if not isinstance(data, dict) or data.get("version") not in _READ_VERSIONS:
            return None
        try:
            resources = data["resources"]
            if resources is not None:
                resources = tuple(str(r) for r in resources)
            n = len(data["worker"]["scale"])
            trim = float(data["trim"])
            jobs = int(data["jobs"])
            prior_mass = float(data["prior_mass"])
            # an edit's 2**63 jobs overflowed the count of every submitter's together in
            # GetBounds (a uint64), and a negative prior weight showed as -2e9 %
            if not (0 <= trim < 1 and 0 <= jobs <= 1 << 53 and 0 <= prior_mass < math.inf):
                raise ValueError("trim, jobs or prior_mass out of range")
            if resources is not None and len(resources) != n:
                raise ValueError("resources do not match the state")
            worker = SideEstimate.from_dict(data["worker"], n)
            ps = SideEstimate.from_dict(data["ps"], n)
            # every job and prior gives both kinds a floor: an edit that emptied one
            # left bounds() None, so every tenant's jobs were priced at flat unit prices
            if (worker.floor.value is None) != (ps.floor.value is None):
                raise ValueError("one kind of server has a floor (L), the other none")
            best = Tracker.from_dict(data["best"])
            prior = str(data["prior"])[:500]
            return cls(worker, ps, best, trim, jobs, resources, prior, prior_mass)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None


_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def exp_shown(log_value: float) -> float:
    """``exp(log_value)`` as a bound is shown (``oasis bounds``, the console): at most
    the largest float. A bound's log may lie past it: without a prior, one job of
    priority 1.7e308 demanding 1e-9 of a resource put U's at 730, and showing it
    raised OverflowError (INTERNAL from GetBounds)."""
    return math.exp(min(log_value, _LOG_FLOAT_MAX))


def bounds_by_kind(
    bounds: PriceBounds | None, resources: Sequence[str]
) -> dict[str, dict[str, dict[str, float] | None]]:
    """``{"worker": {r: {"U": x, "L": y}}, "ps": {...}}`` of ``bounds`` as ``oasis bounds``
    describes them (every value null for None: no job and no prior yet)."""
    out: dict[str, dict[str, dict[str, float] | None]] = {}
    for kind, top, floor in (
        (
            "worker",
            None if bounds is None else bounds.log_u1,
            None if bounds is None else bounds.floor1,
        ),
        (
            "ps",
            None if bounds is None else bounds.log_u2,
            None if bounds is None else bounds.floor2,
        ),
    ):
        out[kind] = {
            r: None
            if top is None or floor is None
            else {"U": exp_shown(float(top[i])), "L": exp_shown(float(floor[i]))}
            for i, r in enumerate(resources)
        }
    return out


def _summary(values: Sequence[float], weights: Sequence[float], points: int) -> Points:
    """At most ``points`` ``(value, share)`` pairs with the weighted distribution of
    ``values``: each distinct value with its share when there are few, else the
    weighted quantiles at ``(k + 0.5) / points``."""
    v = np.asarray(values, np.float64)
    w = np.asarray(weights, np.float64)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    distinct, first = np.unique(v, return_index=True)
    if distinct.size <= points:
        xs, shares = distinct, np.add.reduceat(w, first)
    else:
        cumulative = np.cumsum(w) / w.sum()
        levels = (np.arange(points) + 0.5) / points
        picked = v[np.minimum(np.searchsorted(cumulative, levels), v.size - 1)]
        xs, counts = np.unique(picked, return_counts=True)
        shares = counts.astype(np.float64)
    # a summary: 1e-4 in a log is far inside a bin (0.05), and short numbers read well;
    # shares to 6 significant digits, not decimals: a share below 5e-7 (a job's weight
    # far below the others') rounded to 0, which a prior may not hold, and oasisd and
    # replay refused the file oasis calibrate had just written
    return tuple(
        (round(float(x), 4), float(f"{float(s / shares.sum()):.6g}"))
        for x, s in zip(xs, shares, strict=True)
    )


def calibrate(
    jobs: Sequence[Job],
    cluster: Cluster,
    *,
    weight: float = DEFAULT_PRIOR_WEIGHT,
    points: int = 32,
    source: str = "",
) -> Prior:
    """A prior from ``jobs`` (at least one) on ``cluster``: the distribution of each
    value the estimate follows, summarised in at most ``points`` points per list."""
    if not jobs:
        raise ValueError("a prior needs at least one job")
    log_best = np.array([clip_log(float(j.utility.log_values(j.min_slots))) for j in jobs])
    ref = float(np.quantile(log_best, BEST_LEVEL, method="inverted_cdf"))
    weights = np.maximum(MIN_WEIGHT, np.exp(np.minimum(log_best - ref, 0.0)))
    sides = []
    for kind, capacity in (("worker", cluster.worker_capacity), ("ps", cluster.ps_capacity)):
        log_scale = log_mean_capacity(capacity)
        floor_v: list[float] = []
        floor_w: list[float] = []
        top: dict[int, list[float]] = {}
        for job, lb, w in zip(jobs, log_best.tolist(), weights.tolist(), strict=True):
            size = _log_size(getattr(job, kind), log_scale.tolist())
            if size is None:
                continue
            idx, parts, log_size = size
            floor_v.append(clip_log(lb - math.log(job.work) - log_size))
            floor_w.append(w)
            for r, part in zip(idx, parts, strict=True):
                top.setdefault(r, []).append(clip_log(lb - part))
        sides.append(
            SidePrior(
                _summary(floor_v, floor_w, points),
                {
                    cluster.resources[r]: _summary(v, [1.0] * len(v), points)
                    for r, v in sorted(top.items())
                },
                round(min(1.0, math.fsum(floor_w) / len(floor_w)), 6) if floor_w else 1.0,
            )
        )
    best = _summary(log_best.tolist(), [1.0] * len(jobs), points)
    return Prior(weight, best, sides[0], sides[1], source)


UNITS_GAP = math.log(1000.0)
"""A job whose utility scale is this far (a factor 1000) below the prior's ``B_ref`` is
told its units may be the cause of its rejection (:func:`units_note`)."""


def _log_scale(job: Job) -> float:
    """``log`` of the most ``job``'s utility is worth: a sigmoid's priority, a deadline's
    value, else ``f(1)`` (a table's first value). ``f(1)`` alone falls short of a priority
    whose target (or a value whose deadline) is past at the arrival: such a job, worth
    about 0 at any completion, was told its utilities looked 1e+304 times smaller than
    the prior's, in another unit, for a slip of the date."""
    utility = job.utility
    if isinstance(utility, Sigmoid):
        return math.log(utility.priority)
    if isinstance(utility, Deadline):
        return math.log(utility.value)
    return float(utility.log_values(1))


def units_note(fresh: BoundEstimate, job: Job) -> str:
    """A sentence to add to ``job``'s rejection when its utility's scale (its priority or
    value, the most it can be worth: :func:`_log_scale`) is over 1000 times below the ``B_ref``
    of ``fresh``, the estimate before any job (the prior): "" otherwise, or without a
    prior.

    The shipped prior is made from ``oasis gen``'s priorities (1-100). Every job of a
    trace in a 10,000 times smaller unit was priced out, all 300 of them on an idle
    cluster: each job's weight in L's quantile is its best utility over ``B_ref``, so
    L stays where the prior put it until ``B_ref`` has followed hundreds of jobs (with
    ``pricing.prior = "none"``, 160 of the 300 were admitted; with a prior calibrated on
    such jobs, 165). A job's priority alone cannot tell its units, so nothing moves on
    its account: the sentence says what an operator can do."""
    ref = fresh.best.value
    if ref is None:
        return ""
    scale = clip_log(_log_scale(job))
    if not scale < ref - UNITS_GAP:
        return ""
    return (
        f" (its utility is at most {math.exp(scale):.3g}, over "
        f"{math.exp(min(ref - scale, 700.0)):.2g} times below the utilities the price "
        f"bounds' prior was made from (about {math.exp(ref):.3g}); in another unit, jobs "
        "are priced in the prior's until the estimate has followed hundreds of them: an "
        "operator can make a prior from such jobs with `oasis calibrate` (pricing.prior), "
        'or start without one (pricing.prior = "none"))'
    )
