"""``bench/quality.py``: its accounting of OASiS's shortfall adds up, and it earns what
replay earns; and the bounds of ``pricing.quality`` it and the figures report against."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.quality import bounds_row, losses, shifted_prior
from controller.replay import replay
from pricing import trace_from_dict
from pricing.default_prior import DEFAULT_PRIOR
from pricing.quality import certified_bound, dmin_bound, fastest_completion
from pricing.workload import generate_trace


def test_the_losses_add_up_to_the_shortfall_and_oasis_is_replays() -> None:
    raw = generate_trace(
        np.random.default_rng(3), n_jobs=40, n_worker_servers=4, n_ps_servers=4, horizon=30
    )
    trace = trace_from_dict({**raw, "pricing": {"bounds": "estimate"}})
    got = losses(trace)
    shortfall = got["rejected at L"] + got["rejected under load"] + got["late"]
    assert math.isclose(got["oasis"] + shortfall, dmin_bound(trace), rel_tol=1e-9)
    earned = math.fsum(
        float(r.decision.best.utility or 0.0) for r in replay(trace) if r.decision.admitted
    )
    assert math.isclose(got["oasis"], earned, rel_tol=1e-12, abs_tol=1e-12)
    assert got["admitted (jobs)"] > 0 and got["rejected at L (jobs)"] > 0


def test_the_shifted_prior_moves_only_the_floor() -> None:
    moved = shifted_prior(10)
    shift = math.log(30)
    for side in ("worker", "ps"):
        assert moved[side]["top"] == DEFAULT_PRIOR[side]["top"]
        pairs = zip(moved[side]["floor"], DEFAULT_PRIOR[side]["floor"], strict=True)
        assert all(math.isclose(a[0], b[0] + shift) and a[1] == b[1] for a, b in pairs)
    assert moved["best"] == DEFAULT_PRIOR["best"]
    trace_from_dict(  # a valid prior object for a trace
        {
            **generate_trace(
                np.random.default_rng(1), n_jobs=3, n_worker_servers=2, n_ps_servers=1,
                horizon=10,
            ),
            "pricing": {"bounds": "estimate", "prior": moved},
        }
    )  # fmt: skip


def test_a_bounds_row_orders_oasis_the_allocation_and_the_bounds() -> None:
    row = bounds_row(12, 1, 20.0, servers=3, horizon=20)
    eps = 1e-6 * max(1.0, row["dmin"])
    assert row["oasis"] <= row["allocation"] + eps  # started from OASiS's allocation
    assert row["allocation"] <= row["tightest"] + eps <= row["lp"] + 2 * eps
    assert row["tightest"] <= row["empty"] + eps <= row["dmin"] + 2 * eps
    assert row["rounds"] is not None and row["rounds"] >= 1
    assert row["stop"] in {"converged", "gap", "time limit", "iterations", "stalled"}
    trace = trace_from_dict(
        {
            **generate_trace(
                np.random.default_rng(1), n_jobs=12, n_worker_servers=3, n_ps_servers=3,
                horizon=20,
            ),
            "pricing": {"bounds": "estimate"},
        }
    )  # fmt: skip
    earned = math.fsum(
        float(r.decision.best.utility or 0.0) for r in replay(trace) if r.decision.admitted
    )
    assert math.isclose(row["oasis"], earned, rel_tol=1e-12, abs_tol=1e-12)


def _bound_job(job_id: str, arrival: int, chunks: int, work: int, gpu: int) -> dict[str, object]:
    """Exactly ``work`` worker-slots (E N M m = work - 0.5 + ~1e-9), ``gpu`` GPUs a worker;
    one PS (10 Gbps) serves 10 workers of 1 Gbps; f(d) = 10 / (1 + e^(d - 2))."""
    return {
        "id": job_id, "arrival": arrival, "epochs": 1, "chunks": chunks, "minibatches": 1,
        "tau": (work - 0.5) / chunks, "grad_mb": 0.001,
        "worker": {"gpu": gpu, "cpu": 1, "bandwidth": 1}, "ps": {"cpu": 1, "bandwidth": 10},
        "utility": {"kind": "sigmoid", "priority": 10, "decay": 1, "target": 2},
    }  # fmt: skip


def test_the_certified_bound_is_each_jobs_utility_at_its_fastest_on_the_empty_cluster() -> None:
    """Worked by hand on one 4-GPU worker server (T = 10):
    - a: N = 4 but 2 GPUs a worker, so at most 2 workers fit: W = 5 takes ceil(5/2) = 3
      slots at best (the paper's d_min, ceil(W/N) = 2, is not reachable);
    - c: N = 1, W = 1: 1 slot;
    - late: arrives at 9 with W = 5 at most 4 a slot: 2 slots, 1 left: counted in neither.
    So the certified bound is f(3) + f(1) and the paper's sum f(2) + f(1)."""
    raw = {
        "version": 1, "horizon": 10, "resources": ["gpu", "cpu", "bandwidth"],
        "servers": [
            {"name": "w0", "kind": "worker", "capacity": {"gpu": 4, "cpu": 100, "bandwidth": 100}},
            {"name": "p0", "kind": "ps", "capacity": {"cpu": 100, "bandwidth": 100}},
        ],
        "jobs": [_bound_job("a", 0, 4, 5, gpu=2), _bound_job("c", 0, 1, 1, gpu=1),
                 _bound_job("late", 9, 4, 5, gpu=1)],
    }  # fmt: skip
    trace = trace_from_dict(raw)
    a, c, late = trace.jobs
    assert (a.work, c.work, late.work) == (5, 1, 5)
    assert [fastest_completion(j, trace) for j in trace.jobs] == [3, 1, None]

    def f(d: int) -> float:
        return 10.0 / (1.0 + math.exp(d - 2))

    assert certified_bound(trace) == pytest.approx(f(3) + f(1), rel=1e-12)
    assert dmin_bound(trace) == pytest.approx(f(2) + f(1), rel=1e-12)
