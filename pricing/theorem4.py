"""The worst-case competitive ratio of the paper's Theorem 4 for a trace, and how far
the trace is from the theorem's small-jobs assumption.

Used to read the offline comparison (:mod:`pricing.offline`): ``optimum / online`` is
the measured ratio, ``2 alpha`` (:func:`theorem4_bound`) the proven one.
"""

from __future__ import annotations

import numpy as np

from pricing.trace import Trace

__all__ = ["largest_job_share", "theorem4_alpha", "theorem4_bound"]


def theorem4_alpha(trace: Trace) -> float:
    """``alpha = max(1, max_r ln(U1[r] / L1), max_r ln(U2[r] / L2))`` of the trace's bounds.

    The paper's Theorem 4 (appendix E) states that Alg. 1 is ``2 alpha``-competitive. The
    extracted text lost the formula; what survives fixes its shape: Lemma 1 gives a
    ratio of ``2 alpha`` when every job raises the dual objective by at most ``alpha``
    times the primal (and the initial dual is at most half the optimum, which the
    ``eta`` scaling of ``L`` ensures); alpha "is just the maximum" of per-server,
    per-resource ``alpha_h^r`` and ``alpha_k^r``; and Lemma 3 takes them from the price
    function (22). For ``p(g) = L (U/L)^(g/c)``, ``dp/dg = p ln(U/L) / c``, so the
    differential allocation-cost relationship ``p dg >= (c / alpha) dp`` holds exactly
    when ``alpha >= ln(U/L)``. The 1 in the maximum is the published statement as we
    read it; the extracted text can neither confirm nor refute it, and it only matters
    when every ``U < e L``.

    The proof assumes each worker's and PS's demand is much smaller than a server's
    capacity (appendix E, before Definition 2), so that a price barely moves while one
    job is placed. On small clusters, where one job can fill a server, the measured
    ratio can exceed ``2 alpha`` (see bench/RESULTS.md).
    """
    b = trace.bounds
    return max(
        1.0,
        float(np.max(b.log_u1 - b.log_l1)),
        float(np.max(b.log_u2 - b.log_l2)),
    )


def largest_job_share(trace: Trace) -> tuple[float, str]:
    """The largest share of the cluster one job can take in one slot, and of which
    resource: over jobs, its most workers per slot on the empty cluster and their
    ``z(y)`` PS, against the cluster's total of each resource (worker demand against
    the worker servers' total, PS demand against the PS servers'). Theorem 4 assumes
    this is small (:func:`theorem4_alpha`); ``oasis gen --max-share`` bounds it."""
    from pricing.job import max_workers_per_slot

    c = trace.cluster
    total_w = c.worker_capacity.sum(axis=0)
    total_p = c.ps_capacity.sum(axis=0)
    share, name = 0.0, c.resources[0]
    for job in trace.jobs:
        y = max_workers_per_slot(job, c)
        z = int(job.ps_needed(y))
        for r, resource in enumerate(c.resources):
            for need, total in ((y * job.worker[r], total_w[r]), (z * job.ps[r], total_p[r])):
                if need > 0 and total > 0 and need / total > share:
                    share, name = float(need / total), resource
    return share, name


def theorem4_bound(trace: Trace) -> float:
    """The worst-case competitive ratio ``2 alpha`` of Theorem 4 (see :func:`theorem4_alpha`)."""
    return 2.0 * theorem4_alpha(trace)
