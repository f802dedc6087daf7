"""Utilities in the offline solvers' units, and results back in the trace's.

The offline solvers (HiGHS, CBC, column generation) judge optimality, reduced costs and
gaps with absolute tolerances of about ``1e-6``, and HiGHS reads ``1e20`` as infinite.
A trace whose utilities are in a user's units was therefore solved differently by unit
alone (measured on one 20-job trace, every priority multiplied by a constant):

- times ``1e-8``: the optimum is ``2.40e-6``, and the ILP "proved" ``1.06e-6`` optimal
  with a "certified" bound of ``1.63e-6``, below the optimum: every gap under ``1e-6``
  looked closed;
- times ``1e10`` or ``1e11``: the configuration LP's solve failed ("Solve error"), and
  the ILP never closed an absolute gap of ``1e-6`` on an optimum of ``2e13``;
- one job of priority ``1e300`` among ordinary ones: the master LP failed ("Unknown").

So every solve sees each utility divided by one power of two, the one that brings the
largest best utility of a job, ``max_i f_i(d_min_i)``, into ``[1, 2)``, unless it is
already within :data:`AS_GIVEN` (ordinary traces are solved exactly as before). Dividing
and multiplying by a power of two is exact in binary floating point (short of the
subnormal range, which only utilities ``1e-308`` times the largest reach), so the
results, multiplied back, are what the same solve would give in the trace's units with
tolerances relative to the largest job. With one job worth far more than all others,
their utilities fall inside the tolerances: the comparison is then about that job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pricing.offline_allocation import OfflineJob
from pricing.trace import Trace
from pricing.utility import Utility

__all__ = ["AS_GIVEN", "Scaled", "in_solver_units", "in_trace_units", "utility_scale"]

AS_GIVEN = (1.0, 2.0**14)
"""Largest best utilities solved as given: ``oasis gen``'s priorities are 1-100, and
``1e7`` times them solved alike (the failures above start past ``1e9``)."""


@dataclass(frozen=True)
class Scaled:
    """``inner`` divided by ``scale`` (a power of two): a utility in the solvers' units."""

    inner: Utility
    scale: float

    def values(self, d: ArrayLike) -> NDArray[np.float64]:
        out: NDArray[np.float64] = np.asarray(self.inner.values(d)) / self.scale
        return out

    def log_values(self, d: ArrayLike) -> NDArray[np.float64]:
        out: NDArray[np.float64] = np.asarray(self.inner.log_values(d)) - math.log(self.scale)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The trace's own utility: the scale is the solvers' business."""
        return self.inner.to_dict()


def utility_scale(trace: Trace) -> float:
    """The power of two every utility of ``trace`` is divided by for the solvers: 1.0
    when the largest best utility ``f_i(d_min_i)`` is within :data:`AS_GIVEN` (or no
    job is worth anything), else the one that brings it into ``[1, 2)``. So a trace in
    the solvers' units already (:func:`in_solver_units`) has the scale 1.0: a solve
    given one solves it as given."""
    best = max((job.best_utility for job in trace.jobs), default=0.0)
    if not (best > 0 and math.isfinite(best)) or AS_GIVEN[0] <= best <= AS_GIVEN[1]:
        return 1.0
    return math.ldexp(1.0, math.frexp(best)[1] - 1)


def in_solver_units(trace: Trace, scale: float) -> Trace:
    """``trace`` with every job's utility divided by ``scale`` (``trace`` itself at 1)."""
    if scale == 1.0:
        return trace
    jobs = tuple(replace(job, utility=Scaled(job.utility, scale)) for job in trace.jobs)
    return replace(trace, jobs=jobs)


def in_trace_units(jobs: tuple[OfflineJob, ...], scale: float) -> tuple[OfflineJob, ...]:
    """Each job's utility multiplied back by ``scale``."""
    if scale == 1.0:
        return jobs
    return tuple(replace(job, utility=job.utility * scale) for job in jobs)
