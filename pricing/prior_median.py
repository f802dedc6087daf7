"""Priors of several submitters combined into one, as the daemon prices them: by their
median.

A daemon prices with the median of its submitters' estimates
(:mod:`pricing.shared_estimate`), so one tenant's flood cannot move its bounds. A prior
calibrated from its store with every job in one distribution could: 900 jobs of one
tenant in a unit 10^7 times larger than another's 300 made a prior under which none of
300 ordinary jobs was admitted on an idle cluster (165 under their own prior). The
floor's quantile weighs jobs by their utility, so giving each submitter the same share
of the jobs does not help (measured: 0 admitted with three submitters weighed alike).

So ``oasis calibrate --store`` calibrates each submitter's jobs apart and combines the
priors here: each list's quantile function (value at cumulative share ``p``) becomes, at
``p = (k + 0.5) / points``, the median over the submitters whose priors hold that list.
With an even number the lower of the two middle values is taken (a median of two cannot
side with either; ``oasis calibrate`` then says so and names the submitters).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from pricing.bound_prior import Points, Prior, SidePrior

__all__ = ["median_prior"]


def _quantile(points: Points, level: float) -> float:
    """The smallest value of ``points`` whose cumulative share reaches ``level`` (0, 1)."""
    ordered = sorted(points)
    cumulative = list(itertools.accumulate(s for _x, s in ordered))
    i = bisect.bisect_left(cumulative, level * cumulative[-1])
    return ordered[min(i, len(ordered) - 1)][0]


def _median_points(lists: Sequence[Points], points: int) -> Points:
    """The lower-median quantile function of ``lists`` (each non-empty) sampled at
    ``points`` levels, equal values merged; one list is returned as it is."""
    if len(lists) == 1:
        return lists[0]
    picked: list[float] = []
    for k in range(points):
        values = sorted(_quantile(p, (k + 0.5) / points) for p in lists)
        picked.append(values[(len(values) - 1) // 2])
    return tuple(
        (x, float(f"{len(list(group)) / points:.6g}")) for x, group in itertools.groupby(picked)
    )


def _median_side(sides: Sequence[SidePrior], points: int) -> SidePrior:
    floors = [s.floor for s in sides if s.floor]
    names = sorted({r for s in sides for r in s.top})
    per_job = sorted(s.floor_per_job for s in sides)
    return SidePrior(
        _median_points(floors, points) if floors else (),
        {r: _median_points([s.top[r] for s in sides if r in s.top], points) for r in names},
        per_job[(len(per_job) - 1) // 2],
    )


def median_prior(priors: Sequence[Prior], points: int, weight: float, source: str) -> Prior:
    """One prior of ``weight`` jobs from ``priors`` (at least one; each submitter's),
    every list at most ``points`` points; one prior is returned with only its weight and
    source replaced."""
    if not priors:
        raise ValueError("no prior to combine")
    if len(priors) == 1:
        only = priors[0]
        return Prior(weight, only.best, only.worker, only.ps, source)
    return Prior(
        weight,
        _median_points([p.best for p in priors], points),
        _median_side([p.worker for p in priors], points),
        _median_side([p.ps for p in priors], points),
        source,
    )
