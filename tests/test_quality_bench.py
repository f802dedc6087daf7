"""``bench/quality.py``: its accounting of OASiS's shortfall adds up, and it earns what
replay earns."""

from __future__ import annotations

import math

import numpy as np

from bench.quality import bounds_row, losses, shifted_prior
from controller.replay import replay
from pricing import trace_from_dict
from pricing.default_prior import DEFAULT_PRIOR
from pricing.quality import dmin_bound
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
