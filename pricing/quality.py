"""How good an online run is, against what no scheduler can beat.

- :func:`certified_bound`: ``sum_i f_i(fastest_i)`` over the jobs that can finish, with
  ``fastest_i = ceil(W_i / y_i)`` slots and ``y_i`` the most workers job ``i`` can run in
  one slot on the *empty* cluster (at most ``N_i``, with its PS fitting; SPEC 3, 5). No
  schedule completes job ``i`` sooner, even with the cluster to itself, and ``f_i`` is
  non-increasing, so no scheduler (online or offline, preempting or not) earns more.
- :func:`dmin_bound`: ``sum_i f_i(ceil(W_i / N_i))``, the paper's best utilities, at least
  as large (``N_i >= y_i``); the issue's goals are stated against it.

Both are sums of floats (``inf`` if utilities near ``1e308`` overflow the sum).
"""

from __future__ import annotations

from pricing.job import Job, max_workers_per_slot
from pricing.trace import Trace

__all__ = ["certified_bound", "dmin_bound", "fastest_completion"]


def fastest_completion(job: Job, trace: Trace) -> int | None:
    """The fewest slots ``job`` can take on the empty cluster; None if it cannot finish
    before the horizon."""
    if trace.late(job) is not None:
        return None
    return -(-job.work // max_workers_per_slot(job, trace.cluster))


def certified_bound(trace: Trace) -> float:
    """``sum_i f_i(fastest completion on the empty cluster)``; see the module docstring."""
    total = 0.0
    for job in trace.jobs:
        slots = fastest_completion(job, trace)
        if slots is not None:
            total += float(job.utility.values(slots))
    return total


def dmin_bound(trace: Trace) -> float:
    """``sum_i f_i(ceil(W_i / N_i))`` over the jobs that can finish."""
    return sum(j.best_utility for j in trace.jobs if trace.late(j) is None)
