"""Price bounds estimated from the jobs seen so far (the daemon's default).

The paper assumes U and L known in advance and shows (its Fig. 6) that mis-estimating
them matters. The daemon cannot know future jobs, so it applies SPEC 4's formulas to
every job it has been asked about (submitted, admitted or not), with ``Tmax = T`` (the
window), and scales the result by safety margins:

- ``L * l_margin`` (default 0.5): a job whose lowest utility per unit is somewhat below
  what was seen still finds an empty slot priced under its worth, so the empty-cluster
  admission property of the paper (its Appendix A) holds with room to spare;
- ``U * u_margin`` (default 1.0): the paper's Fig. 6 shows that over-estimating U hurts
  more than under-estimating it when resources are scarce, so U is not inflated.

Each job is folded in before it is decided, so its own utility is inside the bounds.
The estimate is a running max/min, so it is persisted as a few numbers and a restarted
daemon continues exactly where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pricing.cluster import Cluster
from pricing.job import Job
from pricing.prices import PriceBounds

__all__ = ["BoundEstimate"]


def _side_sums(job: Job) -> tuple[float, float]:
    return float(job.worker.sum()), float(job.ps.sum())


@dataclass
class BoundEstimate:
    """Running extremes of SPEC 4 over the jobs seen.

    Attributes:
        log_u1, log_u2: ``(R,)`` running max of ``log f(d_min) - log w[r]`` (-inf: unseen).
        log_low1, log_low2: running min of ``log f(T) - log(W sum_r w[r])``.
        inv_eta1, inv_eta2: running min of ``1/eta`` (starts at 1).
        jobs: how many jobs were folded in.
    """

    log_u1: NDArray[np.float64]
    log_u2: NDArray[np.float64]
    log_low1: float
    log_low2: float
    inv_eta1: float
    inv_eta2: float
    jobs: int = 0

    @classmethod
    def empty(cls, n_resources: int) -> BoundEstimate:
        return cls(
            np.full(n_resources, -np.inf), np.full(n_resources, -np.inf), np.inf, np.inf, 1.0, 1.0
        )

    def observe(self, job: Job, cluster: Cluster, horizon: int) -> BoundEstimate:
        """A new estimate with ``job`` folded in (this one is unchanged)."""
        best = float(job.utility.log_values(job.min_slots))
        worst = float(job.utility.log_values(horizon))
        sum_w, sum_s = _side_sums(job)
        out = BoundEstimate(
            self.log_u1.copy(),
            self.log_u2.copy(),
            min(self.log_low1, worst - math.log(job.work * sum_w)),
            min(self.log_low2, worst - math.log(job.work * sum_s)),
            min(
                self.inv_eta1,
                job.work * sum_w / (horizon * float(cluster.worker_capacity.sum())),
            ),
            min(self.inv_eta2, job.work * sum_s / (horizon * float(cluster.ps_capacity.sum()))),
            self.jobs + 1,
        )
        for log_u, demand in ((out.log_u1, job.worker), (out.log_u2, job.ps)):
            used = demand > 0
            log_u[used] = np.maximum(log_u[used], best - np.log(demand[used]))
        return out

    def bounds(self, l_margin: float, u_margin: float) -> PriceBounds | None:
        """The price bounds, or None before any job (or if a lowest utility is 0)."""
        if self.jobs == 0 or not (math.isfinite(self.log_low1) and math.isfinite(self.log_low2)):
            return None
        log_l1 = self.log_low1 + math.log(self.inv_eta1 / 4.0) + math.log(l_margin)
        log_l2 = self.log_low2 + math.log(self.inv_eta2 / 4.0) + math.log(l_margin)
        u1 = np.where(np.isfinite(self.log_u1), self.log_u1 + math.log(u_margin), log_l1)
        u2 = np.where(np.isfinite(self.log_u2), self.log_u2 + math.log(u_margin), log_l2)
        return PriceBounds(
            np.maximum(u1, log_l1),
            np.maximum(u2, log_l2),
            log_l1,
            log_l2,
            1.0 / self.inv_eta1,
            1.0 / self.inv_eta2,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state (``None`` stands for an infinity); floats round-trip exactly."""

        def enc(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "log_u1": [enc(float(x)) for x in self.log_u1],
            "log_u2": [enc(float(x)) for x in self.log_u2],
            "log_low1": enc(self.log_low1),
            "log_low2": enc(self.log_low2),
            "inv_eta1": self.inv_eta1,
            "inv_eta2": self.inv_eta2,
            "jobs": self.jobs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoundEstimate:
        def dec(x: float | None, inf: float) -> float:
            return inf if x is None else float(x)

        return cls(
            np.array([dec(x, -np.inf) for x in data["log_u1"]]),
            np.array([dec(x, -np.inf) for x in data["log_u2"]]),
            dec(data["log_low1"], np.inf),
            dec(data["log_low2"], np.inf),
            float(data["inv_eta1"]),
            float(data["inv_eta2"]),
            int(data["jobs"]),
        )
