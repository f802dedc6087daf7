"""The smallest workers a job may ask for (:mod:`controller.plane.worker_room`), for the
benchmarks of one tenant's many tiny jobs (``bench/tenant_plans.py``,
``bench/cordon.py --tiny``).

Before the rule, those benchmarks asked 0.001 of every resource, and thousands of such
workers shared a server: more than a node agent runs (1,024), so the plans they measured
could not all have run. Now job ``i``'s worker asks the least the rule allows of one
resource, the ``i``-th in turn, and a sliver of the others (bandwidth must be > 0): a
server then holds up to about 1,020 of them, about 200 a resource.
"""

from __future__ import annotations

from controller.plane.worker_room import least_demand
from pricing.cluster import Cluster

__all__ = ["tiny_ps", "tiny_worker"]

SLIVER = 0.001
"""What a tiny worker asks of every resource but the one it is sized by."""


def tiny_worker(cluster: Cluster, i: int) -> dict[str, float]:
    """Job ``i``'s worker demand: :func:`least_demand` of resource ``i mod R`` (those
    every worker server has none of left out), :data:`SLIVER` of each other resource."""
    least = least_demand(cluster)
    names = list(least)
    out = {name: SLIVER for name in cluster.resources}
    out[names[i % len(names)]] = least[names[i % len(names)]]
    return out


def tiny_ps(worker: dict[str, float]) -> dict[str, float]:
    """A PS for ``worker``: :data:`SLIVER` of cpu and mem, and the worker's bandwidth (a
    PS's bandwidth may not be below its workers')."""
    return {"cpu": SLIVER, "mem": SLIVER, "bandwidth": worker["bandwidth"]}
