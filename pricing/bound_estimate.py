"""Price bounds estimated from the jobs seen so far (the daemon's default; trace pricing
``{"bounds": "estimate"}``).

The paper assumes U and L known in advance and shows (its Fig. 6) that mis-estimating
them matters. The daemon cannot know future jobs, so it estimates both from every job it
has been asked about (submitted, admitted or not), the job being decided included.

U: SPEC 4's formula, as a running maximum: ``U[r] = max_i f_i(d_min_i) / w_i[r]``
(likewise for PS), scaled by ``u_margin`` (default 1.0: the paper's Fig. 6 shows that
over-estimating U hurts more than under-estimating it when resources are scarce).

L: **not** SPEC 4's minimum, which does not work as a price floor in practice. SPEC 4
takes ``min_i f_i(Tmax_i) / (W_i sum_r w_i[r])`` and divides it by ``4 eta``. Both parts
are driven by outliers that carry no utility:

- a time-critical job's utility at the latest completion time is ``exp(-1450)`` or less
  (decay 5 over 300 slots), and one with a target below its fewest slots ``d_min`` is worth
  ``exp(-170)`` even at its best;
- ``eta`` is set by the smallest job against the whole cluster over the whole window,
  about ``1e5`` in the paper's setting.

With such an L (``log L ~ -1700`` against ``log U ~ 4``), every price stays below
``1e-9`` until a resource is more than 99% used, so the online algorithm admits whatever
arrives first; on the paper's workload it then earns less than the Risk-Reward heuristic
and no more than Dorm (bench/RESULTS.md, "Price bounds"). The estimate instead takes the
lowest utility per unit of resource among the jobs that matter:

- each job's unit value is taken at its best completion time, ``v_i = f_i(d_min_i) /
  (W_i sum_r w_i[r])`` (its worth per worker-slot and unit of resource when it runs as
  fast as it can, which is what an idle cluster lets it do);
- the jobs of lowest unit value that together carry at most ``trim`` (default 0.2) of the
  total best utility ``sum_i f_i(d_min_i)`` are left out; L is the lowest unit value among
  the rest, divided by 4 (SPEC 4's constant) and scaled by ``l_margin`` (default 1.0).

Meaning: on an idle cluster every job except that low-value tail costs less than it is
worth, and rejecting the whole tail gives up at most ``trim`` of the utility on offer.
``trim = 0.2`` was chosen by the sweep in bench/RESULTS.md ("Price bounds"); ``eta`` is
dropped (it only serves the worst-case proof, which an estimated L gives up anyway).

To keep the state small and restart-exact, unit values are kept as a utility-weighted
histogram of ``log v`` in bins of ``BIN_WIDTH`` (L is the lower edge of a bin, so it errs
low by less than 5%). The state is a few numbers plus one weight per occupied bin, and a
restarted daemon continues exactly where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pricing.job import Job
from pricing.prices import PriceBounds

__all__ = ["BIN_WIDTH", "DEFAULT_TRIM", "BoundEstimate"]

BIN_WIDTH = 0.05
"""Width of a histogram bin of ``log v`` (natural log): L is exact to ``exp(0.05)``."""

DEFAULT_TRIM = 0.2
"""Share of the best utility seen whose lowest-value jobs L ignores."""

_VERSION = 2


def _unit_value(job: Job, demand: NDArray[np.float64], log_best: float) -> float:
    """``log(f(d_min) / (W sum_r d[r]))`` for one side's demand ``d``."""
    return log_best - math.log(job.work * float(demand.sum()))


@dataclass
class BoundEstimate:
    """The estimate's state over the jobs seen.

    Attributes:
        log_u1, log_u2: ``(R,)`` running max of ``log f(d_min) - log w[r]`` (-inf: unseen).
        hist1, hist2: utility-weighted histograms of the log unit value per side: bin
            index ``floor(log v / BIN_WIDTH)`` to the sum of ``f(d_min)`` of its jobs.
        low1, low2: the lowest log unit value seen per side (used when every job's
            utility underflows to 0, so the histogram weighs nothing).
        jobs: how many jobs were folded in.
    """

    log_u1: NDArray[np.float64]
    log_u2: NDArray[np.float64]
    hist1: dict[int, float] = field(default_factory=dict)
    hist2: dict[int, float] = field(default_factory=dict)
    low1: float = math.inf
    low2: float = math.inf
    jobs: int = 0

    @classmethod
    def empty(cls, n_resources: int) -> BoundEstimate:
        return cls(np.full(n_resources, -np.inf), np.full(n_resources, -np.inf))

    def observe(self, job: Job) -> BoundEstimate:
        """A new estimate with ``job`` folded in (this one is unchanged)."""
        log_best = float(job.utility.log_values(job.min_slots))
        weight = math.exp(log_best)
        out = BoundEstimate(
            self.log_u1.copy(),
            self.log_u2.copy(),
            dict(self.hist1),
            dict(self.hist2),
            self.low1,
            self.low2,
            self.jobs + 1,
        )
        for log_u, demand in ((out.log_u1, job.worker), (out.log_u2, job.ps)):
            used = demand > 0
            log_u[used] = np.maximum(log_u[used], log_best - np.log(demand[used]))
        v1 = _unit_value(job, job.worker, log_best)
        v2 = _unit_value(job, job.ps, log_best)
        out.low1, out.low2 = min(out.low1, v1), min(out.low2, v2)
        for hist, v in ((out.hist1, v1), (out.hist2, v2)):
            key = math.floor(v / BIN_WIDTH)
            hist[key] = hist.get(key, 0.0) + weight
        return out

    def bounds(
        self, l_margin: float = 1.0, u_margin: float = 1.0, trim: float = DEFAULT_TRIM
    ) -> PriceBounds | None:
        """The price bounds, or None before any job."""
        if self.jobs == 0:
            return None
        log_l1 = _trimmed_low(self.hist1, self.low1, trim) - math.log(4.0) + math.log(l_margin)
        log_l2 = _trimmed_low(self.hist2, self.low2, trim) - math.log(4.0) + math.log(l_margin)
        u1 = np.where(np.isfinite(self.log_u1), self.log_u1 + math.log(u_margin), log_l1)
        u2 = np.where(np.isfinite(self.log_u2), self.log_u2 + math.log(u_margin), log_l2)
        return PriceBounds(np.maximum(u1, log_l1), np.maximum(u2, log_l2), log_l1, log_l2, 1.0, 1.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state (``None`` stands for an infinity); floats round-trip exactly."""

        def enc(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "version": _VERSION,
            "log_u1": [enc(float(x)) for x in self.log_u1],
            "log_u2": [enc(float(x)) for x in self.log_u2],
            "hist1": {str(k): w for k, w in sorted(self.hist1.items())},
            "hist2": {str(k): w for k, w in sorted(self.hist2.items())},
            "low1": enc(self.low1),
            "low2": enc(self.low2),
            "jobs": self.jobs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoundEstimate | None:
        """The state :meth:`to_dict` wrote; None for another version (start afresh)."""
        if data.get("version") != _VERSION:
            return None

        def dec(x: float | None, inf: float) -> float:
            return inf if x is None else float(x)

        return cls(
            np.array([dec(x, -np.inf) for x in data["log_u1"]]),
            np.array([dec(x, -np.inf) for x in data["log_u2"]]),
            {int(k): float(w) for k, w in data["hist1"].items()},
            {int(k): float(w) for k, w in data["hist2"].items()},
            dec(data["low1"], np.inf),
            dec(data["low2"], np.inf),
            int(data["jobs"]),
        )


def _trimmed_low(hist: dict[int, float], low: float, trim: float) -> float:
    """Lower edge of the first bin (ascending) where the weight below and in it exceeds
    ``trim`` of the total; ``low`` when the histogram weighs nothing."""
    total = math.fsum(hist.values())
    if not total > 0.0:
        return low
    cumulative = 0.0
    keys = sorted(hist)
    for key in keys:
        cumulative += hist[key]
        if cumulative > trim * total:
            return max(key * BIN_WIDTH, low)
    return keys[-1] * BIN_WIDTH  # pragma: no cover - trim < 1 always stops above
