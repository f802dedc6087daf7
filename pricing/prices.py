"""Exponential resource prices (SPEC 4, the paper's eq. 22-26) and their bounds.

A price is ``L * (U / L) ** (used / capacity)``. Bounds are kept as natural logs: ``L``
is a minimum of utilities at the latest completion time, and for a time-critical job
that utility underflows a float64 (``exp(-1450)``), while its log does not.

**(deviation)** SPEC 4 has one floor ``L1`` (and ``L2``) for every resource. A floor may
also be given per resource, ``L1[r]`` (explicit ``"L1": {r: x}``, or the daemon's estimate,
which normalises it by capacity, :mod:`pricing.bound_estimate`); the price of ``r`` is
then ``L1[r] * (U1[r] / L1[r]) ** (g / c)``. One number is the same as that number for
every resource.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pricing import fields
from pricing.cluster import Cluster
from pricing.errors import Problem, SpecError
from pricing.job import Job
from pricing.text import label

__all__ = [
    "EXPLICIT_KEYS",
    "PriceBounds",
    "bounds_from_dict",
    "oracle_bounds",
    "price",
    "same_values",
    "spread",
]

EXPLICIT_KEYS = frozenset({"U1", "U2", "L1", "L2", "eta1", "eta2"})
"""Every key of explicit bounds (SPEC 6)."""


@dataclass(frozen=True, eq=False)
class PriceBounds:
    """Bounds of the price functions of worker servers (1) and PS servers (2).

    Attributes:
        log_u1: ``(R,)`` float64, ``log U1[r]``: the highest utility per unit of r
            on worker servers.
        log_u2: ``(R,)`` float64, ``log U2[r]``, the same for PS servers.
        log_l1: ``log L1``: the lowest utility per unit-resource-slot (workers); one
            number (SPEC 4) or an ``(R,)`` float64 array, one floor per resource.
        log_l2: ``log L2``, the same for PS.
        eta1, eta2: the scaling factors used in L1 and L2 (informational).
    """

    log_u1: NDArray[np.float64]
    log_u2: NDArray[np.float64]
    log_l1: float | NDArray[np.float64]
    log_l2: float | NDArray[np.float64]
    eta1: float
    eta2: float

    @property
    def floor1(self) -> NDArray[np.float64]:
        """``(R,)`` float64, read-only: ``log L1[r]`` per resource (``log_l1`` spread if one
        number)."""
        return spread(self.log_l1, self.log_u1.shape)

    @property
    def floor2(self) -> NDArray[np.float64]:
        """``(R,)`` float64, read-only: ``log L2[r]`` per resource."""
        return spread(self.log_l2, self.log_u2.shape)

    def same_as(self, other: PriceBounds) -> bool:
        """True if every bound is equal, so prices under one equal those under the other."""
        return (
            self.eta1 == other.eta1
            and self.eta2 == other.eta2
            and same_values(self.floor1, other.floor1)
            and same_values(self.floor2, other.floor2)
            and same_values(self.log_u1, other.log_u1)
            and same_values(self.log_u2, other.log_u2)
        )

    def scaled(self, l_factor: float = 1.0, u_factor: float = 1.0) -> PriceBounds:
        """These bounds with every L multiplied by ``l_factor`` and every U by ``u_factor``
        (both > 0), U raised to L where it would fall below (the paper's Fig. 6)."""
        log_l1 = self.log_l1 + math.log(l_factor)
        log_l2 = self.log_l2 + math.log(l_factor)
        du = math.log(u_factor)
        return PriceBounds(
            np.maximum(self.log_u1 + du, log_l1),
            np.maximum(self.log_u2 + du, log_l2),
            log_l1,
            log_l2,
            self.eta1,
            self.eta2,
        )

    def to_dict(self, cluster: Cluster) -> dict[str, Any]:
        """Explicit bounds in the trace's ``pricing`` format (floats may read 0 on
        underflow); a per-resource floor is written as ``{r: x}``."""

        def floor(log_l: float | NDArray[np.float64]) -> float | dict[str, float]:
            if np.ndim(log_l) == 0:
                return math.exp(float(log_l))
            values = np.exp(np.asarray(log_l, np.float64)).tolist()
            return dict(zip(cluster.resources, values, strict=True))

        return {
            "U1": dict(zip(cluster.resources, np.exp(self.log_u1).tolist(), strict=True)),
            "U2": dict(zip(cluster.resources, np.exp(self.log_u2).tolist(), strict=True)),
            "L1": floor(self.log_l1),
            "L2": floor(self.log_l2),
            "eta1": self.eta1,
            "eta2": self.eta2,
        }


def spread(value: float | NDArray[np.float64], shape: tuple[int, ...]) -> NDArray[np.float64]:
    """``value`` (one number or an array) as a read-only float64 array of ``shape``:
    ``np.broadcast_to``'s view, made directly (ten times faster) when ``value`` is already
    a float64 array of that shape."""
    if type(value) is np.ndarray and value.shape == shape and value.dtype == np.float64:
        out = value.view()
        out.flags.writeable = False
        return out
    return np.broadcast_to(np.asarray(value, np.float64), shape)


def same_values(a: NDArray[np.float64], b: NDArray[np.float64]) -> bool:
    """``np.array_equal(a, b)``, compared directly when both are arrays already."""
    if type(a) is np.ndarray and type(b) is np.ndarray:
        return a.shape == b.shape and bool((a == b).all())
    return bool(np.array_equal(a, b))


def price(
    log_l: float | NDArray[np.float64],
    log_u: NDArray[np.float64],
    used: NDArray[np.float64],
    capacity: NDArray[np.float64],
) -> NDArray[np.float64]:
    """``L * (U[r] / L) ** (used / capacity)`` elementwise.

    ``used`` is ``(..., S, R)`` (any leading shape), ``capacity`` broadcasts against it,
    ``log_u`` is ``(R,)`` and ``log_l`` one number or ``(R,)``. A resource a server lacks
    (capacity 0) prices at ``U``: nothing that needs it can be placed there anyway.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(capacity > 0, used / capacity, 1.0)
    return np.exp(log_l + share * (log_u - log_l))


_LOG4 = math.log(4.0)


def _eta(jobs: Sequence[Job], demand_of: str, capacity_total: float, horizon: int) -> float:
    """``eta`` with ``1/eta = min(1, min_i W_i sum_r d_i[r] / (T sum c))``."""
    inv = 1.0
    if not capacity_total > 0:  # no capacity at all: the ratio is infinite, min is 1
        return 1.0
    for job in jobs:
        need = job.work * float(getattr(job, demand_of).sum())
        inv = min(inv, need / (horizon * capacity_total))
    if not inv > 0:  # underflow: a demand ~1e-300 against the capacity, or one ~1e308
        raise SpecError.one(
            "pricing",
            f"eta is not finite: some job's total {demand_of} demand W * sum(d) is "
            "negligible against T * sum(c); give eta1 and eta2",
        )
    return 1.0 / inv


def oracle_bounds(
    jobs: Sequence[Job],
    cluster: Cluster,
    horizon: int,
    latest_jct: Mapping[str, int],
    eta1: float | None = None,
    eta2: float | None = None,
) -> PriceBounds:
    """Bounds over the job set ``jobs`` (SPEC 4).

    Args:
        jobs: the set J (at least one job).
        cluster: the servers, whose total capacity enters eta.
        horizon: T, slots.
        latest_jct: ``Tmax_i`` per job id: ``T - a_i`` in a trace, ``T`` in the daemon.
        eta1, eta2: given scaling factors; computed from the paper's condition when None.
    """
    if not jobs:
        raise ValueError("oracle bounds need at least one job")
    n_res = len(cluster.resources)
    with np.errstate(over="ignore"):  # capacities near 1e308 sum to inf: eta says so
        total1, total2 = float(cluster.worker_capacity.sum()), float(cluster.ps_capacity.sum())
    e1 = eta1 if eta1 is not None else _eta(jobs, "worker", total1, horizon)
    e2 = eta2 if eta2 is not None else _eta(jobs, "ps", total2, horizon)
    log_u = {"worker": np.full(n_res, -np.inf), "ps": np.full(n_res, -np.inf)}
    log_l = {"worker": np.inf, "ps": np.inf}
    for job in jobs:
        best = float(job.utility.log_values(job.min_slots))
        worst = _last_positive_log_utility(job, latest_jct[job.id])
        for side in ("worker", "ps"):
            demand: NDArray[np.float64] = getattr(job, side)
            used = demand > 0
            with np.errstate(divide="ignore"):
                per_unit = best - np.log(demand, where=used, out=np.zeros(n_res))
            log_u[side] = np.where(used, np.maximum(log_u[side], per_unit), log_u[side])
            if worst is not None:
                log_l[side] = min(log_l[side], worst - math.log(job.work * float(demand.sum())))
    if not (math.isfinite(log_l["worker"]) and math.isfinite(log_l["ps"])):
        raise SpecError.one(
            "pricing", "every job's utility is 0 by its fastest completion, so L would be 0: "
            "no price can start"
        )  # fmt: skip
    # in logs: 4 * eta overflows for an eta near 1e308 (L is kept as its log anyway)
    l1 = log_l["worker"] - _LOG4 - math.log(e1)
    l2 = log_l["ps"] - _LOG4 - math.log(e2)
    # a resource no job uses prices flat at L
    u1 = np.where(np.isfinite(log_u["worker"]), log_u["worker"], l1)
    u2 = np.where(np.isfinite(log_u["ps"]), log_u["ps"], l2)
    return PriceBounds(u1, u2, l1, l2, e1, e2)


def _last_positive_log_utility(job: Job, latest: int) -> float | None:
    """``log f(t)`` at the latest completion ``t <= latest`` where the job's utility is
    still positive (SPEC 4's ``f(Tmax)``, the lowest value L is drawn from). A deadline
    without ``half_life`` is worth 0 after its deadline: SPEC 4 would give L = 0, which no
    exponential price can start from, so its value at the deadline counts instead. None
    if it is worth nothing even at its fastest completion. Utilities do not rise with
    time (SPEC 3), so the last positive one is found by bisection."""
    lo = int(job.min_slots)
    if math.isfinite(float(job.utility.log_values(latest))):
        return float(job.utility.log_values(latest))
    if lo > latest or not math.isfinite(float(job.utility.log_values(lo))):
        return None
    hi = latest  # log f(lo) finite, log f(hi) not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if math.isfinite(float(job.utility.log_values(mid))):
            lo = mid
        else:
            hi = mid
    return float(job.utility.log_values(lo))


def bounds_from_dict(raw: Any, cluster: Cluster, field: str = "pricing") -> PriceBounds | None:
    """Read explicit bounds ``{"U1": {r: x}, "U2": {...}, "L1": x, "L2": x}``.

    Returns None for ``{"bounds": "oracle"}`` (the caller computes them from the jobs,
    honouring ``eta1``/``eta2`` read by :func:`etas_from_dict`) and for
    ``{"bounds": "estimate"}`` (the daemon's running estimate, with an optional ``trim``
    and ``prior``, read by :mod:`pricing.trace`). A resource missing from U1 or U2 prices
    flat (``U = L``). ``L1`` and ``L2`` are one number or ``{r: x}`` naming every
    resource (a floor per resource). Every U must be >= its L, or prices would fall as a
    server fills. An unknown key is an error naming the closest known one, in each form.
    """
    spec = fields.mapping(raw, field)
    if "bounds" in spec:
        allowed = {"oracle": {"bounds", "eta1", "eta2"}, "estimate": {"bounds", "trim", "prior"}}
        kind = spec["bounds"]
        if not isinstance(kind, str) or kind not in allowed:
            raise SpecError.one(f"{field}.bounds", f"must be 'oracle' or 'estimate', got {kind!r}")
        fields.check_no_problems(fields.unknown_keys(spec, allowed[kind], field))
        return None
    # "bounds" is absent here; known, it is the suggestion for a mistyped "bound"
    problems = fields.unknown_keys(spec, EXPLICIT_KEYS | {"bounds"}, field)
    if not spec:  # `"pricing": {}` was told only to give U1, U2, L1 and L2
        raise SpecError.one(
            field, 'is empty: give {"bounds": "oracle"} (the default, SPEC 4: from the '
            'jobs), {"bounds": "estimate"} (the daemon\'s), or explicit U1, U2, L1 and L2',
        )  # fmt: skip
    floors: dict[str, float | NDArray[np.float64]] = {}
    for key in ("L1", "L2"):
        try:
            floors[key] = _log_floor(fields.require(spec, key, field), cluster, f"{field}.{key}")
        except SpecError as err:
            problems.extend(err.problems)
    ups: dict[str, NDArray[np.float64]] = {}
    for key, low in (("U1", "L1"), ("U2", "L2")):
        # U is checked against its L where that L read; its own problems are said anyway
        # (before, a bad L hid every problem of U until the next run)
        known = floors.get(low, -math.inf)
        floor = np.broadcast_to(np.asarray(known, np.float64), (len(cluster.resources),))
        vec = floor.copy()
        try:
            given = fields.mapping(fields.require(spec, key, field), f"{field}.{key}")
        except SpecError as err:
            problems.extend(err.problems)
            continue
        for name, value in given.items():
            sub = f"{field}.{key}.{label(name)}"
            if name not in cluster.resources:
                problems.append(Problem(sub, "unknown resource"))
                continue
            try:
                u = fields.positive(value, sub)
            except SpecError as err:
                problems.extend(err.problems)
                continue
            r = cluster.resources.index(name)
            if math.log(u) < floor[r]:
                problems.append(Problem(sub, f"must be >= {low} = {math.exp(floor[r]):g}"))
            vec[r] = math.log(u)
        ups[key] = vec
    e1, e2 = etas_from_dict(spec, field)
    if problems:
        raise SpecError(problems)
    return PriceBounds(ups["U1"], ups["U2"], floors["L1"], floors["L2"], e1 or 1.0, e2 or 1.0)


def _log_floor(value: Any, cluster: Cluster, field: str) -> float | NDArray[np.float64]:
    """``log L``: one number, or ``(R,)`` from ``{r: x}`` naming every resource."""
    if not isinstance(value, Mapping):
        return math.log(fields.positive(value, field))
    problems: list[Problem] = []
    out = np.zeros(len(cluster.resources))
    for name in value:
        if name not in cluster.resources:
            problems.append(Problem(f"{field}.{label(name)}", "unknown resource"))
    for r, name in enumerate(cluster.resources):
        try:
            out[r] = math.log(
                fields.positive(fields.require(value, name, field), f"{field}.{name}")
            )
        except SpecError as err:
            problems.extend(err.problems)
    if problems:
        raise SpecError(problems)
    return out


def etas_from_dict(
    spec: Mapping[str, Any], field: str = "pricing"
) -> tuple[float | None, float | None]:
    """The optional ``eta1``, ``eta2`` of a pricing object (each >= 1: SPEC 4's ``1/eta``
    is ``min(1, ...)``; a smaller one would put L above the utility it is a floor of, and
    one near 0 its log past what a float holds)."""
    out: list[float | None] = []
    for key in ("eta1", "eta2"):
        eta = fields.positive(spec[key], f"{field}.{key}") if key in spec else None
        if eta is not None and eta < 1.0:
            raise SpecError.one(
                f"{field}.{key}", f"must be >= 1 (SPEC 4: 1/eta = min(1, ...)), got {eta:g}"
            )
        out.append(eta)
    return out[0], out[1]
