"""A prior of the price-bound estimate: where its quantiles start before jobs are seen.

The estimate (:mod:`pricing.bound_estimate`) follows quantiles of three kinds of per-job
values, all natural logs in capacity-normalised units (demand divided by the mean
capacity of the servers of its kind):

- ``best``: ``log f(d_min)``, a job's best utility;
- ``floor`` (per side, worker or PS): ``log (f(d_min) / (W sum_r d[r] / cbar[r]))``, its
  utility per worker-slot and server's worth of demand;
- ``top`` (per side and resource ``r``): ``log (f(d_min) / (d[r] / cbar[r]))``, its
  utility per server's worth of ``r``.

A prior summarises each as weighted points, and counts as ``weight`` jobs: the estimate
starts from these points, and as real jobs arrive their weight decays like that of any
old job, so the prior fades once enough jobs are seen. Units are per server's worth,
so a prior carries over to a cluster of other servers (resources are matched by name).

JSON form (``oasis calibrate`` writes it; a trace's ``pricing.prior`` or the daemon's
config reads it)::

    {"kind": "oasis-bound-prior", "version": 1, "source": "...", "weight": 40,
     "best": [[x, share], ...],
     "worker": {"floor": [[x, share], ...], "floor_per_job": 0.2,
                "top": {"gpu": [[x, share], ...], ...}},
     "ps": {"floor": [...], "floor_per_job": 0.2, "top": {...}}}

Shares are normalised per list; at most ``MAX_POINTS`` points per list. A job weighs at
most 1 in the floor's quantile (its utility over a reference, capped), ``floor_per_job``
(default 1) on average in the jobs calibrated from: the floor points weigh ``weight *
floor_per_job``, so the prior counts as ``weight`` typical jobs there too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pricing import fields
from pricing.errors import Problem, SpecError
from pricing.quantile_tracker import LOG_LIMIT

__all__ = [
    "DEFAULT_PRIOR_WEIGHT",
    "MAX_POINTS",
    "MAX_PRIOR_BYTES",
    "PRIOR_KIND",
    "PRIOR_VERSION",
    "Points",
    "Prior",
    "SidePrior",
    "prior_from_dict",
]

PRIOR_KIND = "oasis-bound-prior"
PRIOR_VERSION = 1
DEFAULT_PRIOR_WEIGHT = 40.0
"""How many jobs a prior counts as, unless it says otherwise."""
MAX_POINTS = 64
"""Most points in one list of a prior."""
MAX_PRIOR_BYTES = 1_000_000
"""A prior file larger than this is refused (a real one is a few kilobytes)."""
_MAX_WEIGHT = 1e6
_MAX_SOURCE = 500
_MAX_RESOURCES = 64

Points = tuple[tuple[float, float], ...]
"""``(log value, share)`` pairs; shares > 0 summing to 1."""


@dataclass(frozen=True)
class SidePrior:
    """The prior of one kind of server.

    Attributes:
        floor: points of the floor value (utility per worker-slot per server's worth).
        top: per resource name, points of the top value (utility per server's worth).
        floor_per_job: the mean weight of a job in the floor's quantile, in (0, 1].
    """

    floor: Points
    top: Mapping[str, Points]
    floor_per_job: float = 1.0


@dataclass(frozen=True)
class Prior:
    """Where the estimate starts; see the module docstring.

    Attributes:
        weight: how many jobs the prior counts as, > 0.
        best: points of ``log f(d_min)``.
        worker, ps: the priors of each kind of server.
        source: where it came from (free text, shown by ``oasis bounds``).
    """

    weight: float
    best: Points
    worker: SidePrior
    ps: SidePrior
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the module docstring."""

        def pts(points: Points) -> list[list[float]]:
            return [[x, s] for x, s in points]

        def side(p: SidePrior) -> dict[str, Any]:
            return {
                "floor": pts(p.floor),
                "floor_per_job": p.floor_per_job,
                "top": {r: pts(v) for r, v in p.top.items()},
            }

        return {
            "kind": PRIOR_KIND,
            "version": PRIOR_VERSION,
            "source": self.source,
            "weight": self.weight,
            "best": pts(self.best),
            "worker": side(self.worker),
            "ps": side(self.ps),
        }


def prior_from_dict(raw: Any, field: str = "prior") -> Prior:
    """Validate a prior's JSON form; SpecError names every bad field."""
    spec = fields.mapping(raw, field)
    problems: list[Problem] = []
    allowed = {"kind", "version", "source", "weight", "best", "worker", "ps"}
    extra = sorted(set(spec) - allowed)
    if extra:
        problems.append(Problem(field, f"unexpected keys: {extra[:10]}"))
    if spec.get("kind") != PRIOR_KIND:
        problems.append(Problem(f"{field}.kind", f"must be {PRIOR_KIND!r}"))
    if spec.get("version") != PRIOR_VERSION:
        problems.append(Problem(f"{field}.version", f"must be {PRIOR_VERSION}"))
    source = spec.get("source", "")
    if not isinstance(source, str) or len(source) > _MAX_SOURCE:
        problems.append(Problem(f"{field}.source", f"must be a string of <= {_MAX_SOURCE} chars"))
        source = ""
    weight = DEFAULT_PRIOR_WEIGHT
    try:
        weight = fields.positive(spec.get("weight", DEFAULT_PRIOR_WEIGHT), f"{field}.weight")
        if weight > _MAX_WEIGHT:
            problems.append(Problem(f"{field}.weight", f"must be <= {_MAX_WEIGHT:g}"))
    except SpecError as err:
        problems.extend(err.problems)
    best = _points(spec.get("best"), f"{field}.best", problems)
    sides = [_side(spec.get(name), f"{field}.{name}", problems) for name in ("worker", "ps")]
    if problems:
        raise SpecError(problems[:50])
    return Prior(weight, best, sides[0], sides[1], source)


def _side(raw: Any, field: str, problems: list[Problem]) -> SidePrior:
    try:
        spec = fields.mapping(raw, field)
    except SpecError as err:
        problems.extend(err.problems)
        return SidePrior((), {})
    extra = sorted(set(spec) - {"floor", "floor_per_job", "top"})
    if extra:
        problems.append(Problem(field, f"unexpected keys: {extra[:10]}"))
    floor = _points(spec.get("floor"), f"{field}.floor", problems)
    per_job = 1.0
    try:
        per_job = fields.positive(spec.get("floor_per_job", 1.0), f"{field}.floor_per_job")
        if per_job > 1:
            problems.append(Problem(f"{field}.floor_per_job", "must be <= 1"))
    except SpecError as err:
        problems.extend(err.problems)
    top: dict[str, Points] = {}
    try:
        raw_top = fields.mapping(spec.get("top", {}), f"{field}.top")
    except SpecError as err:
        problems.extend(err.problems)
        return SidePrior(floor, top, per_job)
    if len(raw_top) > _MAX_RESOURCES:
        problems.append(Problem(f"{field}.top", f"at most {_MAX_RESOURCES} resources"))
        return SidePrior(floor, top, per_job)
    for name, value in raw_top.items():
        if not isinstance(name, str) or not name or len(name) > 128:
            problems.append(Problem(f"{field}.top", "resource names must be 1-128 chars"))
            continue
        top[name] = _points(value, f"{field}.top.{name}", problems)
    return SidePrior(floor, top, per_job)


def _points(raw: Any, field: str, problems: list[Problem]) -> Points:
    """A non-empty list of ``[x, share]`` with finite ``|x| <= LOG_LIMIT`` and share > 0."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_POINTS:
        problems.append(Problem(field, f"must be a list of 1-{MAX_POINTS} [value, share] pairs"))
        return ()
    out: list[tuple[float, float]] = []
    for i, pair in enumerate(raw):
        sub = f"{field}[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            problems.append(Problem(sub, "must be a [value, share] pair"))
            continue
        try:
            x = fields.number(pair[0], f"{sub}[0]")
            share = fields.positive(pair[1], f"{sub}[1]")
        except SpecError as err:
            problems.extend(err.problems)
            continue
        if abs(x) > LOG_LIMIT:
            problems.append(Problem(f"{sub}[0]", f"must be within +-{LOG_LIMIT:g} (a log)"))
            continue
        out.append((x, share))
    if not out:
        return ()
    top = max(s for _, s in out)  # shares near 1e308 must not overflow their sum
    total = math.fsum(s / top for _, s in out)
    return tuple((x, s / top / total) for x, s in out)
