"""The learned price-bound estimate across a change of ``[cluster] resources``: kept by
resource name, not position. Before, reordering the list (cosmetic) or adding a resource
threw away every submitter's estimate ("price-bound estimate starts afresh")."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import numpy as np

from controller.admission.controller import AdmissionController
from controller.clock import FakeClock
from controller.config import load
from pricing import job_from_dict
from pricing.bound_estimate import BoundEstimate
from pricing.cluster import cluster_from_dict
from pricing.default_prior import default_prior
from pricing.shared_estimate import SharedEstimate
from tests.servers import write_config
from tests.test_bounds_daemon import CLUSTER_RAW, ordinary_jobs
from tests.test_pending import opened

RESOURCES = '["gpu", "cpu", "mem", "disk", "bandwidth"]'
REORDERED = '["bandwidth", "mem", "gpu", "disk", "cpu"]'


def _open(tmp: Path, clock: FakeClock, resources: str, ib: bool = False) -> AdmissionController:
    """The in-process controller of the store in ``tmp`` with ``resources`` (and with
    ``ib``, a resource ``ib`` added: 10 on each worker)."""
    path = write_config(tmp / "c.toml", tmp / "data", epoch=1_000_000.0, extra="")
    text = path.read_text().replace(f"resources = {RESOURCES}", f"resources = {resources}")
    if ib:
        text = re.sub(r'(kind="worker", capacity=\{[^}]*)\}', r"\1, ib=10}", text)
    path.write_text(text)
    return opened(load(path), clock)


def _by_name(c: AdmissionController) -> dict[tuple[str, str], tuple[float, float, str]]:
    """``(kind, resource) -> (U, L, how)`` of the bounds in use (``oasis bounds``)."""
    return {(b["kind"], b["resource"]): (b["U"], b["L"], b["how"])
            for b in c._bounds_view()["bounds"]}  # fmt: skip


def test_reordered_or_added_resources_keep_the_learned_estimate(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000.0)
    c = _open(tmp_path, clock, RESOURCES)
    try:
        for i, spec in enumerate(ordinary_jobs(12)):  # three submitters: a median, a lag
            asyncio.run(c.submit(spec, by=("alice", "bob", "carol")[i % 3]))
        before = _by_name(c)
        jobs = c._bounds_view()["jobs"]
    finally:
        c.close()
    assert jobs == 12 and {how for _, _, how in before.values()} == {"observed"}

    c = _open(tmp_path, clock, REORDERED)
    try:
        assert c._bounds_view()["jobs"] == 12
        assert _by_name(c) == before  # per resource name, exactly
    finally:
        c.close()

    c = _open(tmp_path, clock, RESOURCES.replace("]", ', "ib"]'), ib=True)
    try:
        after = _by_name(c)
        assert c._bounds_view()["jobs"] == 12
        assert {k: v for k, v in after.items() if k[1] != "ib"} == before
        assert ("worker", "ib") in after and ("ps", "ib") not in after  # no PS has it
        u, low, _ = after["worker", "ib"]
        assert 0 < low <= u < float("inf")
    finally:
        c.close()


def _cluster(resources: list[str], servers: list[dict[str, Any]] | None = None) -> Any:
    """The test cluster (or ``servers``) over ``resources``: others left out."""
    servers = [
        {**s, "capacity": {r: v for r, v in s["capacity"].items() if r in resources}}
        for s in (servers or CLUSTER_RAW["servers"])
    ]
    return cluster_from_dict(resources, servers)


def test_a_removed_resource_drops_only_its_own_estimate() -> None:
    """Pure: an estimate refit to fewer resources keeps U and L of the others; to a
    cluster whose kept resource's mean capacity changed, it cannot be (start afresh)."""
    full = _cluster(["gpu", "cpu", "mem", "disk", "bandwidth"])
    fewer = _cluster(["mem", "gpu", "bandwidth", "cpu"])
    estimate = BoundEstimate.start(full, None)
    for spec in ordinary_jobs(8):
        estimate = estimate.observe(_job(spec, full))
    refit = estimate.refit(BoundEstimate.start(fewer, None))
    assert refit is not None and refit.resources == fewer.resources
    old, new = estimate.bounds(), refit.bounds()
    assert old is not None and new is not None
    for i, r in enumerate(fewer.resources):
        j = full.resources.index(r)
        for a, b in zip(
            (old.log_u1, old.log_u2, old.floor1, old.floor2),
            (new.log_u1, new.log_u2, new.floor1, new.floor2),
            strict=True,
        ):
            assert a[j] == b[i], r
    servers = [*CLUSTER_RAW["servers"], {**CLUSTER_RAW["servers"][2], "name": "w3"}]
    bigger = _cluster(list(full.resources), servers)  # the workers' mean capacities grow
    assert estimate.refit(BoundEstimate.start(bigger, None)) is None
    # reordered (matched by name) and grown: still other units, start afresh
    moved = _cluster(["mem", "gpu", "bandwidth", "cpu", "disk"], servers)
    assert estimate.refit(BoundEstimate.start(moved, None)) is None
    assert estimate.refit(BoundEstimate.start(_cluster(list(moved.resources)), None)) is not None
    # a resource added starts from the prior, where a fresh estimate of it starts
    before = BoundEstimate.start(fewer, default_prior())
    fresh = BoundEstimate.start(full, default_prior())
    added = before.refit(fresh)
    assert added is not None
    got, want = added.bounds(), fresh.bounds()
    assert got is not None and want is not None
    d = full.resources.index("disk")
    assert got.log_u1[d] == want.log_u1[d] and got.log_u2[d] == want.log_u2[d]
    assert got.log_u1[d] > got.floor1[d]  # the prior's U, not raised to L from nothing
    shared = SharedEstimate(BoundEstimate.start(fewer, None), {"a": estimate})
    again = shared.refit()
    assert again is not None and np.array_equal(again.submitters["a"].worker.log_scale,
                                                refit.worker.log_scale)  # fmt: skip


def _job(spec: dict[str, Any], cluster: Any) -> Any:
    return job_from_dict(
        {**spec, "arrival": 1}, cluster, slot_seconds=3600, slots_available=lambda _a: 24
    )


def test_a_lag_follows_its_resources_by_name_through_a_reorder() -> None:
    """The gap between the bounds in use and the submitters' median (the lag, one column
    per resource) is read back by resource name and kept by the refit: a reordered
    ``[cluster] resources`` moved each resource's lag onto another resource, or dropped
    it, and a restart priced every tenant's jobs differently."""
    full = _cluster(["gpu", "cpu", "mem", "disk", "bandwidth"])
    moved = _cluster(["bandwidth", "mem", "gpu", "disk", "cpu"])
    shared = SharedEstimate.start(BoundEstimate.start(full, default_prior()))
    for i, spec in enumerate(ordinary_jobs(6)):
        shared = shared.observe(_job(spec, full), ("alice", "bob")[i % 2])
    lag = np.array([[0.01 * (i + 1) + 0.1 * k for i in range(5)] for k in range(4)])
    lagging = SharedEstimate(shared.fresh, shared.submitters, lag=lag)
    back = SharedEstimate.from_dict(lagging.to_dict(), BoundEstimate.start(moved, default_prior()))
    assert back is not None
    again = back.refit()
    assert again is not None and again.lag is not None
    want, got = lagging.bounds(), again.bounds()
    assert want is not None and got is not None
    for i, r in enumerate(moved.resources):
        j = full.resources.index(r)
        assert again.lag[:, i].tolist() == lag[:, j].tolist(), r
        for a, b in zip(
            (want.log_u1, want.log_u2, want.floor1, want.floor2),
            (got.log_u1, got.log_u2, got.floor1, got.floor2),
            strict=True,
        ):
            assert a[j] == b[i], r
