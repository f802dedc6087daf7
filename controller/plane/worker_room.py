"""How many of one job's workers may share a server: the rule that keeps every node
agent within the worker commands it runs.

An agent runs at most :data:`controller.plane.workers.MAX_WORKERS` (1,024) worker
commands at once, shared by every job planned on its server; past that it starts none
of a job's workers (all or none), whichever tenant's job that is. The daemon counts a
server's capacity per resource, not its processes, so a job whose worker asks for a
sliver of every resource (``cpu: 0.01, bandwidth: 0.01``, no GPU) could be planned
thousands of times on one server: admitted, and never started, and taking the agent's
room from the other tenants' jobs there. Before, nothing kept that from happening.

The rule, checked when a job is submitted or quoted, and when a pending one is decided
again (:meth:`controller.limits.Limits.check_job`, INVALID_ARGUMENT):
one worker of the job fits at most :func:`most_per_server` times on every worker server
of the cluster, empty (SPEC 5's room). With ``R`` resources that is
``MAX_WORKERS // R - 1``: each worker then takes more than ``1 / (K + 1)`` of some
resource of its server (the one its room is counted by), so at most ``K + 1`` workers of
all jobs together are held by each resource, and ``R (K + 1) <= MAX_WORKERS`` in all,
whatever mix of jobs shares the server. Five resources give 203 workers of one job a
server; a GPU worker (8 GPUs a server) is far from it.

Parameter servers run no command on an agent (``--command`` is per worker), so they are
not counted. The rule holds for the capacities of the config the job is decided under: a
reload that grows a server's capacities does not re-check the jobs already admitted.
"""

from __future__ import annotations

import math

import numpy as np

from controller.plane.workers import MAX_WORKERS
from pricing.cluster import Cluster
from pricing.errors import Problem
from pricing.job import Job, most_on_one_server, room

__all__ = ["most_per_server", "worker_room_problem"]


def most_per_server(cluster: Cluster) -> int:
    """The most workers of one job that may fit on one empty server of ``cluster``,
    ``MAX_WORKERS // R - 1`` for its ``R`` resources (at least 1)."""
    return max(1, MAX_WORKERS // max(1, len(cluster.resources)) - 1)


def least_demand(cluster: Cluster) -> dict[str, float]:
    """Per resource that some worker server has, the least amount one worker may ask of
    it alone to pass the rule (every other amount 0): ``{name: amount}``, each just above
    ``max_h c[h, r] / (K + 1)`` at three significant digits, so that it fits at most
    ``K = most_per_server(cluster)`` times on every worker server."""
    most = most_per_server(cluster)
    largest = cluster.worker_capacity.max(axis=0, initial=0.0)  # (R,)
    return {
        name: _just_above(float(largest[r]) / (most + 1))
        for r, name in enumerate(cluster.resources)
        if largest[r] > 0 and math.isfinite(largest[r])
    }


def _just_above(x: float) -> float:
    """The least number of three significant digits above ``x`` > 0."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 2)
    digits = math.floor(x / scale + 1e-9) + 1
    return float(f"{digits * scale:.3g}")


def worker_room_problem(job: Job, cluster: Cluster, field: str = "job.worker") -> Problem | None:
    """The problem, naming ``field``, if one worker of ``job`` fits more than
    :func:`most_per_server` times on some empty worker server: that server, the count,
    and the least of each resource that would do (:func:`least_demand`); None if it
    does not."""
    most = most_per_server(cluster)
    if most_on_one_server(cluster, "worker", job.worker) <= most:
        return None  # the common case, remembered per demand: no pass over the servers
    rooms = room(cluster.worker_capacity, job.worker)  # (H,)
    h = int(np.argmax(rooms))
    enough = ", ".join(f"{name} {amount:g}" for name, amount in least_demand(cluster).items())
    return Problem(
        field,
        f"{int(rooms[h]):,} workers of this job fit on one server "
        f"({cluster.worker_names[h]}), over the {most} one job may put on a server: a "
        f"node agent runs at most {MAX_WORKERS:,} worker commands, shared by every job "
        f"on its server; ask at least one of {enough} per worker",
    )
