"""Bounds from any source are cut to what float64 prices and costs can hold, and the
oracle's L is drawn from the last completion time where a job is still worth something
(:mod:`pricing.prices`, :mod:`pricing.ledger`), each checked against a plain reading."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pricing import job_from_dict
from pricing.job import Job
from pricing.ledger import LOG_PRICE_CAP, Ledger
from pricing.prices import PriceBounds, _last_positive_log_utility, oracle_bounds
from tests.test_offline_colgen import _small
from tests.test_replan import CLUSTER


@pytest.mark.parametrize("log_l", [300.0, 650.0, 700.0])
def test_absurd_floors_are_cut_to_the_cap_like_the_tops(log_l: float) -> None:
    """An L past :data:`LOG_PRICE_CAP` (a priority of 1e308 in an explicit or estimated
    bound) is cut as U is: L never above U, so prices still rise with use, and every
    price and a full server's cost stay finite."""
    n = len(CLUSTER.resources)
    bounds = PriceBounds(np.full(n, log_l), np.full(n, log_l), log_l, log_l, 1.0, 1.0)
    ledger = Ledger(CLUSTER, bounds, 4)
    for side in (ledger.worker_side, ledger.ps_side):
        cap = side._cap()  # LOG_PRICE_CAP less the log of each resource's largest capacity
        assert np.all(side.log_l <= np.minimum(side.log_u, cap) + 1e-12)
        assert np.all(side.log_l[np.isfinite(cap)] <= LOG_PRICE_CAP)
        prices = side.price
        assert np.isfinite(prices).all()
        assert np.isfinite((prices * side.capacity).sum())


def _plain_last_positive(job: Job, latest: int) -> float | None:
    """The latest ``t <= latest`` (from the fastest completion) with ``log f(t)`` finite,
    by a scan."""
    found = None
    for t in range(int(job.min_slots), latest + 1):
        value = float(job.utility.log_values(t))
        if math.isfinite(value):
            found = value
    return found


@pytest.mark.parametrize("deadline", range(2, 30, 3))
@pytest.mark.parametrize("latest", [7, 12, 31, 40, 97])
def test_the_oracles_floor_is_drawn_at_the_last_positive_utility(
    deadline: int, latest: int
) -> None:
    """A table utility that falls to 0 (as a deadline without a half-life does) is worth
    nothing after it: L is drawn from its value at the last slot where it is still
    positive, found by bisection; a scan finds the same slot's value (None where it is
    worth nothing even at its fastest completion)."""
    job = job_from_dict(
        {"id": "d", "arrival": 0, "epochs": 1, "chunks": 2, "minibatches": 10, "tau": 0.1,
         "grad_mb": 1, "worker": {"gpu": 1, "cpu": 2, "bandwidth": 1},
         "ps": {"cpu": 1, "bandwidth": 4},
         "utility": {"kind": "table", "values": [5.0 - 0.1 * t for t in range(deadline)] + [0.0]}},
        CLUSTER, slot_seconds=3600.0, slots_available=lambda a: 100,
    )  # fmt: skip
    got = _last_positive_log_utility(job, latest)
    want = _plain_last_positive(job, latest)
    assert got == want, (got, want)


def test_scaled_bounds_keep_every_top_at_least_its_floor() -> None:
    """Fig. 6's scaling (replay's ``--l-factor``, ``--u-factor``) raises U to L where it
    would fall below, so prices never fall as a server fills."""
    from pricing.prices import oracle_bounds
    from tests.test_replan import T, make_job

    jobs = [make_job("a"), make_job("b", chunks=3)]
    bounds = oracle_bounds(jobs, CLUSTER, T, {j.id: T for j in jobs})
    for l_factor, u_factor in ((1e6, 1.0), (1.0, 1e-6), (10.0, 0.1)):
        scaled = bounds.scaled(l_factor, u_factor)
        assert np.all(scaled.log_u1 >= scaled.floor1) and np.all(scaled.log_u2 >= scaled.floor2)


@pytest.mark.parametrize("eta", [0.5, 0.7, 0.999])
def test_an_eta_below_one_is_refused_naming_it(eta: float) -> None:
    """SPEC 4's ``1/eta`` is ``min(1, ...)``: an eta under 1 would put L above the
    utility it is a floor of, so a given eta1 or eta2 under 1 is an input error naming
    the field; 1 is taken."""
    from pricing.errors import SpecError
    from pricing.prices import etas_from_dict

    assert etas_from_dict({"eta1": 1.0, "eta2": 1.0}) == (1.0, 1.0)
    for key in ("eta1", "eta2"):
        with pytest.raises(SpecError, match=f"pricing.{key}"):
            etas_from_dict({key: eta})


@pytest.mark.parametrize("which", ["log_u1", "log_u2", "log_l1", "log_l2"])
def test_a_change_of_any_one_bound_reprices_its_side(which: str) -> None:
    """``Ledger.set_bounds`` with bounds that differ in one of U1, U2, L1, L2 only
    prices that side with the new bound (an estimate's U2 moves alone often: PS demands
    differ from workers')."""
    from dataclasses import replace

    from tests.test_replan import T, admitted, make_job

    job = make_job("a")
    ledger = admitted([job])  # amounts in some slots: U enters their prices
    bounds = ledger.bounds
    side = ledger.ps_side if which.endswith("2") else ledger.worker_side
    before = side.price.copy()
    value = getattr(bounds, which)
    moved = replace(bounds, **{which: value + 0.5 if which.startswith("log_u") else value - 0.5})
    ledger.set_bounds(moved)
    assert ledger.bounds is moved
    assert not np.array_equal(side.price, before)
    fresh = Ledger(CLUSTER, moved, T)
    fresh.admit("a", job.worker, job.ps, ledger.schedule("a"))
    fresh_side = fresh.ps_side if which.endswith("2") else fresh.worker_side
    assert np.array_equal(side.price, fresh_side.price)


def test_a_resource_one_side_lacks_is_capped_too() -> None:
    """The PS servers have no GPU: their GPU bound was not cut (no capacity to cut it
    by), so an estimated ``log U`` past 709.78 (``limits.max_utility = 0`` and a priority
    near 1e308) priced it inf, and inf x a PS's GPU demand of 0 made the search's
    stopping bound NaN, which stops a search at its first slot. Now it is capped as a
    resource of capacity 1, and every price and bound stays finite."""
    n = len(CLUSTER.resources)
    gpu = CLUSTER.resources.index("gpu")
    assert not CLUSTER.ps_capacity[:, gpu].any()
    log_u = np.full(n, 5.0)
    log_u[gpu] = 800.0
    bounds = PriceBounds(log_u, log_u.copy(), 0.0, 0.0, 1.0, 1.0)
    ledger = Ledger(CLUSTER, bounds, 4)
    side = ledger.ps_side
    assert side.log_u[gpu] <= LOG_PRICE_CAP
    assert np.isfinite(side.price).all()
    demand = np.where(np.arange(n) == gpu, 0.0, 1.0)  # a PS demands no GPU
    assert np.isfinite(side.min_unit_price(demand, 0, 4)).all()


@pytest.mark.parametrize("seed", range(3))
def test_the_oracles_eta_is_the_largest_of_each_jobs_alone(seed: int) -> None:
    """``1/eta = min(1, min_i W_i sum d_i / (T sum c))`` (SPEC 4): over a job set, eta is
    the largest of the etas each job gives alone (at least 1), in any order of the jobs."""
    trace = _small(seed, jobs=8, servers=3, horizon=40)
    latest = {job.id: trace.horizon for job in trace.jobs}
    alone = [oracle_bounds([job], trace.cluster, trace.horizon, latest) for job in trace.jobs]
    for jobs in (trace.jobs, trace.jobs[::-1]):
        got = oracle_bounds(jobs, trace.cluster, trace.horizon, latest)
        assert got.eta1 == max(b.eta1 for b in alone) and got.eta1 >= 1.0
        assert got.eta2 == max(b.eta2 for b in alone) and got.eta2 >= 1.0
    assert len({b.eta1 for b in alone}) > 1  # the jobs differ
