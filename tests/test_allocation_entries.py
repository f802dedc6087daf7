"""SPEC 6 allocation entries (controller/replay.py ``allocations``): per slot, servers in
listing order, workers or PS; checked against the plain loop over every cell."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from controller.replay import allocations
from pricing.cluster import Cluster, cluster_from_dict
from pricing.schedule import Schedule


def plain(schedule: Schedule, cluster: Cluster) -> list[dict[str, Any]]:
    """Every slot, every server in listing order: the definition."""
    out: list[dict[str, Any]] = []
    for row in range(schedule.slots):
        for kind, idx in cluster.listing:
            if kind == "worker":
                n = int(schedule.workers[row, idx])
                if n:
                    name = cluster.worker_names[idx]
                    out.append({"slot": schedule.start + row, "server": name, "workers": n})
            else:
                n = int(schedule.ps[row, idx])
                if n:
                    out.append(
                        {"slot": schedule.start + row, "server": cluster.ps_names[idx], "ps": n}
                    )
    return out


def interleaved(rng: np.random.Generator, n_worker: int, n_ps: int) -> Cluster:
    """Worker and PS servers listed in a random order."""
    kinds = ["worker"] * n_worker + ["ps"] * n_ps
    rng.shuffle(kinds)
    servers = []
    for i, kind in enumerate(kinds):
        cap = {"cpu": 8, "mem": 64, "disk": 100, "bandwidth": 10}
        if kind == "worker":
            cap["gpu"] = 4
        servers.append({"name": f"s{i}", "kind": kind, "capacity": cap})
    return cluster_from_dict(["gpu", "cpu", "mem", "disk", "bandwidth"], servers)


@pytest.mark.parametrize("seed", range(20))
def test_entries_match_the_plain_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cluster = interleaved(rng, int(rng.integers(1, 6)), int(rng.integers(1, 6)))
    slots = int(rng.integers(1, 8))
    h, k = len(cluster.worker_names), len(cluster.ps_names)
    dense = rng.random() < 0.5
    workers = rng.integers(0, 4, (slots, h)) * (rng.random((slots, h)) < (0.9 if dense else 0.2))
    ps = rng.integers(0, 3, (slots, k)) * (rng.random((slots, k)) < (0.9 if dense else 0.2))
    schedule = Schedule(int(rng.integers(0, 50)), workers.astype(np.int32), ps.astype(np.int32))
    got = allocations(schedule, cluster)
    assert got == plain(schedule, cluster)
    assert all(type(e["slot"]) is int and type(e.get("workers", e.get("ps"))) is int for e in got)


def test_no_schedule_no_entries() -> None:
    cluster = interleaved(np.random.default_rng(0), 2, 2)
    assert allocations(None, cluster) == []
    empty = Schedule(3, np.zeros((2, 2), np.int32), np.zeros((2, 2), np.int32))
    assert allocations(empty, cluster) == []
