"""How many of one job's workers may share a server (controller/plane/worker_room.py):
whatever jobs that pass the rule share a server, their workers never outnumber the
worker commands a node agent runs (:data:`controller.plane.workers.MAX_WORKERS`)."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from controller.limits import JobTooLargeError, Limits
from controller.plane.worker_room import least_demand, most_per_server, worker_room_problem
from controller.plane.workers import MAX_WORKERS
from pricing import job_from_dict
from pricing.cluster import Cluster, cluster_from_dict
from pricing.job import Job, room
from tests.servers import CLUSTER_TOML
from tests.test_daemon_e2e import job

WINDOW = 24


def _cluster() -> Cluster:
    raw = tomllib.loads(CLUSTER_TOML)["cluster"]
    return cluster_from_dict(raw["resources"], raw["servers"])


CLUSTER = _cluster()


def _worker(amounts: dict[str, float]) -> dict[str, float]:
    """A worker demand: ``amounts``, and a sliver of bandwidth unless given (it must be > 0)."""
    return {"bandwidth": 0.001, **amounts}


def test_five_resources_allow_203_workers_of_a_job_a_server() -> None:
    assert MAX_WORKERS == 1024 and most_per_server(CLUSTER) == 1024 // 5 - 1 == 203


def test_the_least_demand_passes_and_anything_under_it_does_not() -> None:
    least = least_demand(CLUSTER)
    assert set(least) == set(CLUSTER.resources)
    most = most_per_server(CLUSTER)
    for name, amount in least.items():
        r = CLUSTER.resources.index(name)
        vec = np.zeros(len(CLUSTER.resources))
        vec[r] = amount
        assert room(CLUSTER.worker_capacity, vec).max() <= most, name
        vec[r] = amount * 0.99
        assert room(CLUSTER.worker_capacity, vec).max() > most, name


def _least_passing(capacity: float, most: int) -> float:
    """The least amount ``d`` (a float, found by bisection) with ``room(capacity, d) <=
    most``: the rule's exact edge, tighter than :func:`least_demand`'s rounded one."""
    lo, hi = capacity / (most + 2), capacity / most  # room most + 1 at lo, most at hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if room(np.array([capacity]), np.array([mid]))[()] <= most:
            hi = mid
        else:
            lo = mid
    return hi


def _packed(most: int) -> int:
    """Workers that fit on the largest server when, for each resource, a job's worker
    asks the least of it that ``room <= most`` allows (and nothing else), packed one
    worker at a time of whichever job still fits, in turn."""
    h = int(np.argmax(CLUSTER.worker_capacity[:, 0]))
    free = CLUSTER.worker_capacity[h].copy()
    demands = []
    for r in range(len(CLUSTER.resources)):
        d = np.zeros(len(CLUSTER.resources))
        d[r] = _least_passing(float(free[r]), most)
        demands.append(d)
    placed = 0
    while fitting := [d for d in demands if room(free, d) >= 1]:
        for d in fitting:
            if room(free, d) >= 1:
                free -= d
                placed += 1
    return placed


def test_no_mix_of_jobs_that_pass_fills_a_server_past_what_an_agent_runs() -> None:
    """The worst mix: for each resource, jobs whose worker asks the least of it that the
    rule lets pass (and nothing else). Packed onto the largest server they reach close
    to MAX_WORKERS and never past it; a rule two workers looser would let them."""
    placed = _packed(most_per_server(CLUSTER))
    assert 1000 <= placed <= MAX_WORKERS
    assert _packed(most_per_server(CLUSTER) + 2) > MAX_WORKERS


def test_the_least_demands_it_names_are_jobs_that_pass() -> None:
    for name, amount in least_demand(CLUSTER).items():
        spec = job(f"least-{name}", worker=_worker({name: amount}), grad_mb=0.001)
        parsed = job_from_dict(spec, CLUSTER, slot_seconds=3600,
                               slots_available=lambda _a: WINDOW, arrival=1)  # fmt: skip
        assert worker_room_problem(parsed, CLUSTER) is None, name


def test_a_worker_too_small_is_refused_naming_the_field_and_what_would_do() -> None:
    tiny = job("tiny", chunks=5000, worker={"cpu": 0.01, "bandwidth": 0.01})
    parsed = job_from_dict(tiny, CLUSTER, slot_seconds=3600,
                           slots_available=lambda _a: WINDOW, arrival=1)  # fmt: skip
    with pytest.raises(JobTooLargeError) as err:
        Limits(max_search_steps=1e12, max_search_mb=1e6).check_job(parsed, CLUSTER, WINDOW)
    (problem,) = err.value.problems
    assert problem.field == "job.worker"
    assert problem.reason.startswith("4,000 workers of this job fit on one server (w2), "
                                      "over the 203 one job may put on a server")  # fmt: skip
    assert "ask at least one of gpu 0.0393, cpu 0.314, mem 2.4, disk 2.46, bandwidth 0.197" in (
        problem.reason
    )
    # a single worker (N = 1) is refused all the same: many such jobs share a server
    one = job_from_dict({**tiny, "chunks": 1}, CLUSTER, slot_seconds=3600,
                        slots_available=lambda _a: WINDOW, arrival=1)  # fmt: skip
    assert worker_room_problem(one, CLUSTER) is not None


def test_a_worker_that_fits_one_time_over_the_most_is_refused_and_at_the_most_passes() -> None:
    """The rule's edge: ``most_per_server + 1`` workers of a job on one server are one
    too many (a rule one looser let 1,029 worker commands be planned on a server)."""
    most = most_per_server(CLUSTER)
    r = CLUSTER.resources.index("bandwidth")
    largest = float(CLUSTER.worker_capacity[:, r].max())

    def parsed(amount: float) -> Job:
        spec = job("edge", worker={"bandwidth": amount}, grad_mb=0.001)
        return job_from_dict(spec, CLUSTER, slot_seconds=3600,
                             slots_available=lambda _a: WINDOW, arrival=1)  # fmt: skip

    over, at = parsed(largest / (most + 1.5)), parsed(largest / (most + 0.5))
    assert room(CLUSTER.worker_capacity, over.worker).max() == most + 1
    assert room(CLUSTER.worker_capacity, at.worker).max() == most
    assert worker_room_problem(over, CLUSTER) is not None
    assert worker_room_problem(at, CLUSTER) is None


def test_a_resource_no_worker_server_has_is_left_out_of_what_would_do() -> None:
    """A resource only the parameter servers have (none on any worker server) is no way
    for a worker to pass: the refusal names the others, and does not fail on it."""
    raw = {"resources": ["gpu", "cpu", "bandwidth"],
           "servers": [{"name": "w0", "kind": "worker", "capacity": {"cpu": 32, "bandwidth": 25}},
                       {"name": "p0", "kind": "ps",
                        "capacity": {"gpu": 1, "cpu": 8, "bandwidth": 25}}]}  # fmt: skip
    cluster = cluster_from_dict(raw["resources"], raw["servers"])
    assert set(least_demand(cluster)) == {"cpu", "bandwidth"}
    tiny = job("tiny", worker={"cpu": 0.01, "bandwidth": 0.01}, ps={"cpu": 1, "bandwidth": 1},
               grad_mb=0.001)  # fmt: skip
    parsed = job_from_dict(tiny, cluster, slot_seconds=3600,
                           slots_available=lambda _a: WINDOW, arrival=1)  # fmt: skip
    problem = worker_room_problem(parsed, cluster)
    assert problem is not None and "ask at least one of cpu " in problem.reason
    assert "gpu" not in problem.reason
