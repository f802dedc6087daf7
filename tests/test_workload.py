"""The synthetic trace generator: deterministic, SPEC 6 shaped, every job feasible."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.reference_alg2 import load_trace
from pricing.workload import RESOURCES, generate_trace, paper_cluster_servers

SMALL = {"n_jobs": 30, "n_worker_servers": 3, "n_ps_servers": 3, "horizon": 10}


def _trace(seed: int = 0, **kwargs: Any) -> dict[str, Any]:
    params = {**SMALL, **kwargs}
    return generate_trace(np.random.default_rng(seed), **params)


def _work(job: dict[str, Any], slot_seconds: float) -> int:
    """SPEC 3, written out again: W in worker-slots."""
    b = float(job["worker"]["bandwidth"])
    m = float(job["tau"]) + 2 * float(job["grad_mb"]) * 0.008 / b / slot_seconds
    return math.ceil(int(job["epochs"]) * int(job["chunks"]) * int(job["minibatches"]) * m - 1e-9)


def _room(demand: dict[str, Any], capacity: dict[str, Any]) -> int:
    return min(
        math.floor(float(capacity.get(r, 0)) / float(need) + 1e-9)
        for r, need in demand.items()
        if need > 0
    )


def test_same_seed_same_trace() -> None:
    assert _trace(7) == _trace(7)
    assert _trace(7) != _trace(8)


def test_trace_is_plain_json() -> None:
    trace = _trace(1)
    assert json.loads(json.dumps(trace)) == trace


def test_spec_shape() -> None:
    trace = _trace(2)
    assert trace["version"] == 1
    assert trace["horizon"] == 10
    assert trace["slot_seconds"] == 3600.0
    assert trace["resources"] == ["gpu", "cpu", "mem", "disk", "bandwidth"] == list(RESOURCES)
    assert trace["pricing"] == {"bounds": "oracle"}
    servers = trace["servers"]
    assert [s["name"] for s in servers] == ["w0", "w1", "w2", "p0", "p1", "p2"]
    assert [s["kind"] for s in servers] == ["worker"] * 3 + ["ps"] * 3
    for server in servers:
        assert set(server) == {"name", "kind", "capacity"}
        assert set(server["capacity"]) <= set(RESOURCES)
        assert 20 <= server["capacity"]["bandwidth"] <= 50
        assert all(v >= 0 for v in server["capacity"].values())
        if server["kind"] == "worker":
            assert server["capacity"]["gpu"] >= 2
        else:
            assert server["capacity"].get("gpu", 0) == 0
    jobs = trace["jobs"]
    assert len(jobs) == 30
    assert [j["id"] for j in jobs] == [f"j{i}" for i in range(30)]
    arrivals = [j["arrival"] for j in jobs]
    assert arrivals == sorted(arrivals)
    for job in jobs:
        assert set(job) == {
            "id",
            "arrival",
            "epochs",
            "chunks",
            "minibatches",
            "tau",
            "grad_mb",
            "worker",
            "ps",
            "utility",
        }
        assert isinstance(job["arrival"], int) and 0 <= job["arrival"] < 10
        for key in ("epochs", "chunks", "minibatches"):
            assert isinstance(job[key], int) and job[key] >= 1
        assert set(job["worker"]) <= set(RESOURCES) and set(job["ps"]) <= set(RESOURCES)
        assert job["utility"]["kind"] == "sigmoid"


def test_parameter_ranges() -> None:
    # a roomy cluster and a long horizon, so no clipping: every job keeps its drawn sizes
    trace = _trace(3, n_jobs=200, n_worker_servers=40, n_ps_servers=40, horizon=1000)
    for job in trace["jobs"][:100]:  # the first arrivals have hundreds of slots left
        assert 5 <= job["epochs"] <= 50
        assert 5 <= job["chunks"] <= 100
        assert 10 <= job["minibatches"] <= 100
    for job in trace["jobs"]:
        w, s, u = job["worker"], job["ps"], job["utility"]
        assert 0 <= w["gpu"] <= 4 and 1 <= w["cpu"] <= 10
        assert 2 <= w["mem"] <= 32 and 5 <= w["disk"] <= 10
        assert 0.1 <= w["bandwidth"] <= 5
        assert "gpu" not in s and 1 <= s["cpu"] <= 10
        assert 2 <= s["mem"] <= 32 and 5 <= s["disk"] <= 10
        assert 5 <= s["bandwidth"] <= 20
        assert 0.001 <= job["tau"] <= 0.01
        assert 30 <= job["grad_mb"] <= 575
        assert 1 <= u["priority"] <= 100
        assert isinstance(u["target"], int) and 1 <= u["target"] <= 15
        assert u["decay"] == 0 or 0.01 <= u["decay"] <= 1 or 4 <= u["decay"] <= 6
        for x in (w["bandwidth"], s["bandwidth"], job["tau"], job["grad_mb"], u["priority"]):
            assert x > 0 and float(f"{x:.4g}") == x


@pytest.mark.parametrize(
    ("mix", "low", "high"),
    [((1.0, 0.0, 0.0), 0.0, 0.0), ((0.0, 1.0, 0.0), 0.01, 1.0), ((0.0, 0.0, 1.0), 4.0, 6.0)],
)
def test_mix_sets_decay_class(mix: tuple[float, float, float], low: float, high: float) -> None:
    trace = _trace(4, mix=mix)
    assert all(low <= j["utility"]["decay"] <= high for j in trace["jobs"])


def test_default_mix_proportions() -> None:
    trace = _trace(5, n_jobs=2000, n_worker_servers=20, n_ps_servers=20, horizon=100)
    decays = [j["utility"]["decay"] for j in trace["jobs"]]
    insensitive = sum(d == 0 for d in decays) / len(decays)
    critical = sum(d >= 4 for d in decays) / len(decays)
    assert 0.07 < insensitive < 0.13
    assert 0.31 < critical < 0.39


def test_arrivals_follow_the_day() -> None:
    trace = _trace(6, n_jobs=5000, n_worker_servers=20, n_ps_servers=20, horizon=240)
    hours = [j["arrival"] % 24 for j in trace["jobs"]]
    day = sum(6 <= h < 18 for h in hours)  # the diurnal rate peaks at noon
    assert day > 1.3 * (len(hours) - day)


def _check_feasible(trace: dict[str, Any]) -> None:
    horizon, slot_seconds = trace["horizon"], trace["slot_seconds"]
    workers = [s["capacity"] for s in trace["servers"] if s["kind"] == "worker"]
    pss = [s["capacity"] for s in trace["servers"] if s["kind"] == "ps"]
    for job in trace["jobs"]:
        b, big_b = job["worker"]["bandwidth"], job["ps"]["bandwidth"]
        assert 0 < b <= big_b
        work = _work(job, slot_seconds)
        assert work >= 1
        slots_left = horizon - job["arrival"]
        assert -(-work // job["chunks"]) <= slots_left  # d_min fits
        # stronger: the empty cluster runs W worker-slots by the horizon
        assert max(_room(job["worker"], cap) for cap in workers) >= 1
        assert sum(_room(job["ps"], cap) for cap in pss) >= 1
        y = _most_per_slot(job, workers, pss)
        assert y >= 1 and -(-work // y) <= slots_left


def _most_per_slot(job: dict[str, Any], workers: list[Any], pss: list[Any]) -> int:
    """Y of the module docstring: at most N, at most the worker servers' room summed, and
    with z(Y) PS in the PS servers' room summed."""
    ps_room = sum(_room(job["ps"], cap) for cap in pss)
    y = min(job["chunks"], sum(_room(job["worker"], cap) for cap in workers))
    while (
        y > 1
        and math.ceil(y * job["worker"]["bandwidth"] / job["ps"]["bandwidth"] - 1e-9) > ps_room
    ):
        y -= 1
    return int(y)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_jobs": 300, "n_worker_servers": 20, "n_ps_servers": 20, "horizon": 50},
        {"n_jobs": 100, "n_worker_servers": 1, "n_ps_servers": 1, "horizon": 2},
    ],
)
def test_the_work_is_clipped_no_further_than_needed(kwargs: dict[str, Any]) -> None:
    # a job below a drawn range's bottom was clipped there, in the order E, then M, then
    # N (the module docstring), and its last step down was needed: one more would not
    # have fit, with Y the workers of the whole empty cluster (every server's room summed)
    trace = _trace(10, **kwargs)
    workers = [s["capacity"] for s in trace["servers"] if s["kind"] == "worker"]
    pss = [s["capacity"] for s in trace["servers"] if s["kind"] == "ps"]
    horizon = kwargs["horizon"]
    checked = 0
    for job in trace["jobs"]:
        e, m, n = job["epochs"], job["minibatches"], job["chunks"]
        assert m >= 10 or e == 1  # M only once E is 1
        assert n >= 5 or e == m == 1  # N only once M is 1 too
        if n < 5:
            before = {**job, "chunks": n + 1}
        elif m < 10:
            before = {**job, "minibatches": m + 1}
        elif e < 5:
            before = {**job, "epochs": e + 1}
        else:
            continue
        checked += 1
        y = _most_per_slot(before, workers, pss)
        assert -(-_work(before, 3600.0) // y) > horizon - job["arrival"], job["id"]
    assert checked >= 5
    if horizon <= 2:  # 1 epoch is too long for most: M goes below its range, down to 1
        assert sum(job["minibatches"] < 10 for job in trace["jobs"]) > 10


def test_parameter_ranges_are_filled() -> None:
    # each range of the module docstring is reached to its ends, not only respected
    trace = _trace(3, n_jobs=400, n_worker_servers=40, n_ps_servers=40, horizon=1000)
    jobs = trace["jobs"]
    assert {j["worker"]["gpu"] for j in jobs} == set(range(5))
    for side in ("worker", "ps"):
        assert {j[side]["cpu"] for j in jobs} == set(range(1, 11))
        assert {j[side]["mem"] for j in jobs} == set(range(2, 33))
        assert {j[side]["disk"] for j in jobs} == set(range(5, 11))
    assert {j["utility"]["target"] for j in jobs} == set(range(1, 16))
    early = jobs[:150]  # hundreds of slots left: not clipped
    for key, bottom, top in (("epochs", 5, 50), ("chunks", 5, 100), ("minibatches", 10, 100)):
        counts = [j[key] for j in early]
        assert bottom <= min(counts) <= bottom + 2 and top - 2 <= max(counts) <= top
    for values, low, high in (
        ([j["worker"]["bandwidth"] for j in jobs], 0.1, 5.0),
        ([j["ps"]["bandwidth"] for j in jobs], 5.0, 20.0),
        ([j["tau"] for j in jobs], 0.001, 0.01),
        ([j["grad_mb"] for j in jobs], 30.0, 575.0),
        ([j["utility"]["priority"] for j in jobs], 1.0, 100.0),
    ):
        near = (high - low) / 50
        assert low <= min(values) < low + near and high - near < max(values) <= high
        # rounded to 4 significant digits, not fewer
        assert any(float(f"{x:.3g}") != x for x in values)


def test_every_job_feasible() -> None:
    _check_feasible(_trace(9))
    _check_feasible(_trace(10, n_jobs=300, n_worker_servers=20, n_ps_servers=20, horizon=50))
    _check_feasible(_trace(11, horizon=1, n_jobs=5))


def test_reference_reads_every_generated_trace() -> None:
    # the reference's own SPEC 3 validation (b <= B, W >= 1, arrivals in order) accepts it
    _, jobs, bounds = load_trace(_trace(12))
    assert bounds is not None and len(jobs) == 30
    for job, raw in zip(jobs, _trace(12)["jobs"], strict=True):
        assert job.work == _work(raw, 3600.0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_jobs=st.integers(0, 20),
    n_worker=st.integers(1, 4),
    n_ps=st.integers(1, 4),
    horizon=st.integers(1, 30),
    slot_seconds=st.sampled_from([600.0, 1800.0, 3600.0, 7200.0]),
)
def test_generated_traces_are_valid(
    seed: int, n_jobs: int, n_worker: int, n_ps: int, horizon: int, slot_seconds: float
) -> None:
    trace = generate_trace(
        np.random.default_rng(seed),
        n_jobs=n_jobs,
        n_worker_servers=n_worker,
        n_ps_servers=n_ps,
        horizon=horizon,
        slot_seconds=slot_seconds,
    )
    assert len(trace["jobs"]) == n_jobs  # type: ignore[arg-type]
    _check_feasible(trace)
    load_trace(trace)


def test_paper_cluster_servers() -> None:
    servers = paper_cluster_servers(np.random.default_rng(0), 5, 2)
    assert [s["kind"] for s in servers] == ["worker"] * 5 + ["ps"] * 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_jobs": -1},
        {"horizon": 0},
        {"n_worker_servers": 0},
        {"n_ps_servers": 0},
        {"slot_seconds": 0.0},
        {"mix": (0.5, 0.5, 0.5)},
        {"max_share": 0.0},
        {"max_share": 1.5},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _trace(0, **kwargs)


@pytest.mark.parametrize("share", [0.05, 0.1, 0.25])
def test_max_share_makes_jobs_small(share: float) -> None:
    """Theorem 4's small jobs: N workers and z(N) PS within ``share`` of every resource's
    total, N as large as that allows (or 1), every other field as without it."""
    plain = _trace(3, n_jobs=40, n_worker_servers=2, n_ps_servers=2)
    small = _trace(3, n_jobs=40, n_worker_servers=2, n_ps_servers=2, max_share=share)
    assert small["servers"] == plain["servers"]
    totals: dict[str, dict[str, float]] = {"worker": {}, "ps": {}}
    for server in small["servers"]:
        for r, c in server["capacity"].items():
            totals[server["kind"]][r] = totals[server["kind"]].get(r, 0.0) + float(c)

    def within(job: dict[str, Any], n: int) -> bool:
        z = math.ceil(n * job["worker"]["bandwidth"] / job["ps"]["bandwidth"] - 1e-9)
        return all(
            count * float(need) <= share * totals[kind].get(r, 0.0)
            for kind, count in (("worker", n), ("ps", z))
            for r, need in job[kind].items()
        )

    lowered = 0
    for job, before in zip(small["jobs"], plain["jobs"], strict=True):
        same = {k: v for k, v in job.items() if k not in ("chunks", "epochs", "minibatches")}
        assert same == {k: v for k, v in before.items() if k in same}
        assert job["chunks"] <= before["chunks"]
        assert job["chunks"] == 1 or within(job, job["chunks"])
        lowered += job["chunks"] < before["chunks"]
    assert lowered > 0  # the paper's sizes are not small on 2 + 2 servers


def test_the_generators_room_is_the_ledgers() -> None:
    """SPEC 5's room, as the generator counts it for feasibility, agrees with the one the
    controller admits by (:func:`pricing.job.room`), on quotients that floating point
    leaves just under a whole number (0.3 / 0.1 is 2.9999999999999996)."""
    from pricing.job import room
    from pricing.workload import _room

    assert 0.3 / 0.1 < 3  # the trap itself
    for capacity, need, fits in ((0.3, 0.1, 3), (0.7, 0.1, 7), (35.1, 1.17, 30), (49.99, 5.0, 9)):
        ledger = int(room(np.array([capacity, 100.0]), np.array([need, 1.0])))
        generator = _room({"bandwidth": need, "cpu": 1}, {"bandwidth": capacity, "cpu": 100.0})
        assert generator == ledger == fits
