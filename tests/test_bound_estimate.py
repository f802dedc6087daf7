"""The price-bound estimate (pricing/bound_estimate.py, quantile_tracker.py,
bound_prior.py): its quantiles, the bound on one job's influence (property tests),
overflow fuzzing of the pricing path, poisoned streams in replay, the prior (shipped,
calibrated, named by a trace), its persistence, and the daemon deciding as replay does."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cli import main
from controller.config import from_dict
from controller.replay import record_json, replay
from controller.store import Database, MetaRow
from pricing import Ledger, SpecError, decide, job_from_dict, trace_from_dict
from pricing.bound_estimate import STEP, BoundEstimate, calibrate
from pricing.bound_prior import prior_from_dict
from pricing.cluster import cluster_from_dict
from pricing.default_prior import DEFAULT_PRIOR, default_prior
from pricing.job import Job
from pricing.prices import PriceBounds
from pricing.quantile_tracker import BIN_WIDTH, LOG_LIMIT, MAX_BINS, Tracker
from pricing.workload import generate_trace
from tests.stores import decided_store, in_process

RESOURCES = ["gpu", "cpu", "mem", "disk", "bandwidth"]
SERVERS = [
    {"name": "w0", "kind": "worker",
     "capacity": {"gpu": 8, "cpu": 32, "mem": 488, "disk": 500, "bandwidth": 25}},
    {"name": "w1", "kind": "worker",
     "capacity": {"gpu": 2, "cpu": 32, "mem": 244, "disk": 250, "bandwidth": 40}},
    {"name": "p0", "kind": "ps",
     "capacity": {"cpu": 36, "mem": 60, "disk": 500, "bandwidth": 25}},
]  # fmt: skip
CLUSTER = cluster_from_dict(RESOURCES, SERVERS)
EXTREME = [5e-324, 1e-300, 1e-6, 1.0, 77.0, 1e6, 1e300, 1e308, 1.7e308]


def _trace(seed: int, n_jobs: int = 60, horizon: int = 40, **pricing: Any) -> dict[str, Any]:
    raw = generate_trace(
        np.random.default_rng(seed), n_jobs=n_jobs, n_worker_servers=4, n_ps_servers=4,
        horizon=horizon,
    )  # fmt: skip
    raw["pricing"] = {"bounds": "estimate", **pricing}
    return raw


def _logs(b: PriceBounds) -> np.ndarray:
    return np.concatenate([b.log_u1, b.log_u2, b.floor1, b.floor2])


# -- the quantile tracker --------------------------------------------------------------


@given(
    st.lists(st.tuples(st.floats(-20, 20), st.floats(0.01, 5)), min_size=1, max_size=60),
    st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.9]),
)
@settings(max_examples=200, deadline=None)
def test_tracker_quantile_is_the_weighted_quantile_of_its_bins(
    points: list[tuple[float, float]], level: float
) -> None:
    """Before it settles and without decay, the followed value is the bin where the
    weight at and below it first exceeds ``level`` of the total."""
    tracker = Tracker()
    for x, w in points:
        tracker = tracker.observe(x, w, level=level, edge=0.0, decay=1.0, step=0.1, settle=math.inf)
    keys = np.floor(np.array([x for x, _ in points]) / BIN_WIDTH)
    weights = np.array([w for _, w in points])
    order = np.argsort(keys, kind="stable")
    cumulative = np.cumsum(weights[order])
    first = int(np.flatnonzero(cumulative > level * cumulative[-1] * (1 + 1e-12))[0])
    assert tracker.value is not None
    expected = keys[order][first] * BIN_WIDTH
    # float sums may put the crossing one distinct bin either way at an exact tie
    assert abs(tracker.value - expected) <= BIN_WIDTH * 1.01 or math.isclose(
        tracker.value, expected
    )
    assert len(tracker.keys) <= len(set(keys.tolist()))


@pytest.mark.parametrize("level", [0.25, 0.5, 0.75])
def test_at_an_exact_tie_the_quantile_is_the_next_bin_as_the_prior_reads_it(level: float) -> None:
    """Weights summing exactly to ``level`` of the total at a bin do not *exceed* it: the
    quantile is the next bin up, in what a tracker follows (observe) and in how a prior
    starts and a trim is read (target) alike. The property test above allows a bin
    either way at a tie, for float sums; these sums are exact."""
    tracker = Tracker()
    for x in (0.0, 1.0, 2.0, 3.0):  # four bins of weight 1: ties at 0.25, 0.5, 0.75
        tracker = tracker.observe(x, 1.0, level=level, edge=0.0, decay=1.0, step=10.0, settle=0.0)
    expected = float(int(level * 4))  # the bin after the tie: 1.0, 2.0 or 3.0
    assert tracker.value == pytest.approx(expected)
    assert tracker.target(level, 0.0) == pytest.approx(expected)
    prior = Tracker.of([(x, 1.0) for x in (0.0, 1.0, 2.0, 3.0)], level, 0.0)
    assert prior.value == pytest.approx(expected)


def test_a_full_window_stays_within_max_bins_and_reads_back_after_any_outlier() -> None:
    """With every bin of a settled tracker's window holding weight, values far outside
    it are counted at its edges: the histogram stays within MAX_BINS (else the stored
    state would not read back, and a restart would start the estimate afresh), and an
    outlier is weighed at the window's edge, not at its own value."""
    from pricing.quantile_tracker import REACH

    points = [(k * BIN_WIDTH + BIN_WIDTH / 2, 1.0) for k in range(-70, 71)]
    tracker = Tracker.of(points, 0.5, 0.5)
    assert tracker.value is not None
    for x in (1e308, -1e308, 500.0, -500.0):
        before, weight = tracker.value, tracker.total
        tracker = tracker.observe(x, 1.0, level=0.5, edge=0.5, decay=0.99, step=0.1)
        assert len(tracker.keys) <= MAX_BINS
        # the bins beyond the window are folded into its edge bins, no weight lost
        assert tracker.total == pytest.approx(0.99 * weight + 1.0, rel=1e-12)
        assert min(tracker.keys) * BIN_WIDTH >= before - REACH - BIN_WIDTH
        assert max(tracker.keys) * BIN_WIDTH <= before + REACH + BIN_WIDTH
        assert Tracker.from_dict(json.loads(json.dumps(tracker.to_dict()))).keys == tracker.keys


@given(st.lists(st.sampled_from([-1e308, -800.0, -3.0, 0.0, 2.5, 800.0, 1e308, math.nan])))
@settings(max_examples=200, deadline=None)
def test_a_settled_tracker_moves_at_most_step_and_stays_bounded(values: list[float]) -> None:
    tracker = Tracker.of([(0.0, 30.0), (1.0, 10.0)], 0.5, 0.0)
    for x in values:
        after = tracker.observe(x, 1.0, level=0.5, edge=0.0, decay=0.99, step=0.1)
        assert after.value is not None and tracker.value is not None
        assert abs(after.value - tracker.value) <= 0.1 + 1e-12
        assert len(after.keys) <= MAX_BINS and math.isfinite(after.total)
        # values outside the window are counted at its edges, not dropped: no weight lost
        assert after.total == pytest.approx(0.99 * tracker.total + 1.0, rel=1e-12)
        tracker = after


@pytest.mark.parametrize(
    ("x", "expected"),
    [(1e308, LOG_LIMIT), (math.inf, LOG_LIMIT), (-1e308, -LOG_LIMIT), (-math.inf, -LOG_LIMIT),
     (math.nan, -LOG_LIMIT)],
)  # fmt: skip
def test_a_first_value_out_of_range_is_read_at_the_limit_and_nan_at_the_lowest(
    x: float, expected: float
) -> None:
    """An unsettled tracker takes its first value outright: one beyond +-LOG_LIMIT is
    read at the limit (its bin index stays an int, the state reads back), and ``nan``
    (a utility of no number) at the lowest, so that it can never raise a price."""
    fresh = Tracker().observe(x, 1.0, level=0.5, edge=0.0, decay=0.99, step=0.1, settle=20.0)
    prior = Tracker.of([(x, 1.0)], 0.5, 0.0)
    for tracker in (fresh, prior):
        assert tracker.value is not None
        assert abs(tracker.value - expected) <= BIN_WIDTH
        back = Tracker.from_dict(json.loads(json.dumps(tracker.to_dict())))
        assert back.keys == tracker.keys and back.value == tracker.value


def test_every_job_decays_all_earlier_weight_and_the_prior_by_one_over_the_window() -> None:
    """After n jobs, each of weight 1 in B_ref's histogram, the total weight is the
    prior's ``weight * d^n`` plus ``sum_k d^k`` (d = 1 - 1/WINDOW), computed here
    apart: the prior and an old outlier fade, and the weight stays under ``WINDOW``
    plus the prior's, however many jobs come; the prior's share shown fades alike."""
    from pricing.bound_estimate import WINDOW

    trace = trace_from_dict(_trace(4, n_jobs=200, prior="default"))
    estimate = trace.estimate()
    weight = default_prior().weight
    d = 1.0 - 1.0 / WINDOW
    for n, job in enumerate(trace.jobs, 1):
        estimate = estimate.observe(job)
        expected = weight * d**n + math.fsum(d**k for k in range(n))
        assert estimate.best.total == pytest.approx(expected, rel=1e-9)
        assert estimate.prior_mass == pytest.approx(weight * d**n, rel=1e-9)
    share = estimate.describe(RESOURCES)["prior_share"]
    assert share == pytest.approx(weight * d**200 / (weight * d**200 + (1 - d**200) / (1 - d)))


def test_a_decay_scale_past_float_range_is_folded_in_and_faded_bins_dropped() -> None:
    """The decay is kept as one scale factor; 0.5^1075 underflows to 0. Over 3000
    observations at decay 0.5 the tracker folds the scale into the weights before
    that: the total stays 1/(1 - 0.5) = 2, finite, and reads back; a value last seen
    thousands of observations ago weighs far under 1e-12 of the total and its bin
    is gone."""
    tracker = Tracker.of([(0.0, 1.0)], 0.5, 0.0)
    for i in range(3000):
        x = 0.0 if i < 400 else 1.0
        tracker = tracker.observe(x, 1.0, level=0.5, edge=0.0, decay=0.5, step=0.1)
        assert math.isfinite(tracker.total) and tracker.scale > 0
        if i == 599:  # folded in at the 499th: 0's share was 0.5^99 then, still > 0
            assert tracker.keys == (int(1.0 / BIN_WIDTH),)
    assert tracker.total == pytest.approx(2.0)
    assert tracker.keys == (int(1.0 / BIN_WIDTH),)
    back = Tracker.from_dict(json.loads(json.dumps(tracker.to_dict())))
    assert back.keys == tracker.keys and back.total == pytest.approx(2.0)


def test_a_settled_value_stays_while_its_quantile_jitters_to_the_next_bin() -> None:
    """The dead band: a quantile one bin away leaves the followed value (and so every
    price) where it was; one two bins away or more moves it."""
    tracker = Tracker.of([(0.01, 10.0)], 0.5, 0.0)
    assert tracker.value == 0.0
    next_bin = tracker.observe(0.06, 30.0, level=0.5, edge=0.0, decay=1.0, step=0.1)
    assert next_bin.target(0.5, 0.0) == pytest.approx(BIN_WIDTH)
    assert next_bin.value == 0.0
    further = next_bin.observe(0.21, 100.0, level=0.5, edge=0.0, decay=1.0, step=0.1)
    assert further.value == pytest.approx(0.1)


def test_a_tracker_holding_exactly_settle_weight_is_settled() -> None:
    """Without a prior the followed value is the quantile itself while the histogram
    holds *less* than ``settle``; at exactly ``settle`` it moves by at most ``step``."""
    tracker = Tracker()
    for x in [0.0] * 11 + [5.0] * 9:  # weight 20: the median is at 0
        tracker = tracker.observe(x, 1.0, level=0.5, edge=0.0, decay=1.0, step=0.1, settle=20.0)
    assert tracker.total == 20.0 and tracker.value == 0.0
    after = tracker.observe(5.0, 3.0, level=0.5, edge=0.0, decay=1.0, step=0.1, settle=20.0)
    assert after.value == pytest.approx(0.1)  # its quantile went to 5: one step toward it


def test_a_prior_share_too_small_to_weigh_anything_leaves_a_state_that_reads_back() -> None:
    """A valid prior may hold a share so small that, times the prior's weight and
    ``floor_per_job``, it underflows to 0: no bin of weight 0 is kept (a stored state
    refuses one, and the daemon would start afresh at every restart)."""
    raw = copy.deepcopy(DEFAULT_PRIOR)
    raw["worker"]["floor"] = [[-50.0, 1e-320], *raw["worker"]["floor"]]
    raw["worker"]["floor_per_job"] = 1e-6
    estimate = BoundEstimate.start(CLUSTER, prior_from_dict(raw))
    assert all(w > 0 for w in estimate.worker.floor.raw)
    back = BoundEstimate.from_dict(json.loads(json.dumps(estimate.to_dict())))
    assert back is not None and back.to_dict() == estimate.to_dict()


# -- one job's influence: property tests -------------------------------------------------

_amount = st.sampled_from([5e-324, 1e-300, 1e-3, 0.5, 1.0, 2.0, 7.0])
_priority = st.one_of(
    st.sampled_from(EXTREME), st.floats(1e-300, 1.7e308, allow_nan=False, allow_infinity=False)
)


@st.composite
def job_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A job spec with any finite numbers: priorities up to 1.7e308, demands down to
    5e-324, decays up to 1e300; what fits on CLUSTER's servers (else rejected by the
    parser, as a submission would be)."""
    b = draw(_amount)
    return {
        "id": "j",
        "arrival": 0,
        "epochs": draw(st.integers(1, 3)),
        "chunks": draw(st.integers(1, 4)),
        "minibatches": draw(st.integers(1, 3)),
        "tau": draw(st.sampled_from([1e-9, 0.01, 0.3, 1.0])),
        "grad_mb": draw(st.sampled_from([1e-300, 1.0, 100.0])),
        "worker": {"gpu": draw(st.sampled_from([0, 5e-324, 1, 2])), "cpu": draw(_amount),
                   "mem": draw(_amount), "bandwidth": b},
        "ps": {"cpu": draw(_amount), "disk": draw(_amount), "bandwidth": max(b, draw(_amount))},
        "utility": {"kind": "sigmoid", "priority": draw(_priority),
                    "decay": draw(st.sampled_from([0.0, 0.5, 5.0, 1e300])),
                    "target": draw(st.sampled_from([-1e6, 1.0, 3.0, 1e6]))},
    }  # fmt: skip


def _job(spec: dict[str, Any], i: int = 0, arrival: int = 0) -> Job | None:
    try:
        return job_from_dict(
            {**spec, "id": f"j{i}", "arrival": arrival},
            CLUSTER,
            slot_seconds=3600.0,
            slots_available=lambda a: 10**9,
        )
    except SpecError:
        return None


@given(st.lists(job_specs(), min_size=1, max_size=12))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_job_moves_any_bound_by_more_than_e_to_the_step(specs: list[dict[str, Any]]) -> None:
    """From the shipped prior, every U1[r], U2[r], L1[r], L2[r] moves by at most a factor
    e^STEP per job, whatever the job; every bound stays finite and U >= L."""
    estimate = BoundEstimate.start(CLUSTER, default_prior())
    before = estimate.bounds()
    assert before is not None
    for i, spec in enumerate(specs):
        job = _job(spec, i)
        if job is None:
            continue
        estimate = estimate.observe(job)
        after = estimate.bounds()
        assert after is not None
        a, b = _logs(before), _logs(after)
        assert np.isfinite(b).all()
        assert np.abs(b - a).max() <= STEP + 1e-9, (spec, b - a)
        assert (after.log_u1 >= after.floor1).all() and (after.log_u2 >= after.floor2).all()
        before = after


@pytest.mark.parametrize("weight", [1.0, 0.01])
def test_a_prior_lighter_than_settle_still_bounds_every_jobs_move(weight: float) -> None:
    """A prior of less weight than SETTLE jobs settles the estimate from the start and
    for good: no job, the poisoned ones at 1e308 included, moves any bound by more than
    e^STEP, though the histogram holds less than SETTLE for the first jobs."""
    light = prior_from_dict({**DEFAULT_PRIOR, "weight": weight})
    raw = _trace(23, n_jobs=12)
    for k in (1, 2):
        spec = copy.deepcopy(raw["jobs"][0])
        spec.update(id=f"big{k}")
        spec["utility"] = {"kind": "sigmoid", "priority": 1e308, "decay": 0.5, "target": 5}
        raw["jobs"].insert(k, spec)
    trace = trace_from_dict(raw)
    estimate = BoundEstimate.start(trace.cluster, light)
    before = estimate.bounds()
    for job in trace.jobs:
        estimate = estimate.observe(job)
        after = estimate.bounds()
        assert before is not None and after is not None
        assert np.abs(_logs(after) - _logs(before)).max() <= STEP + 1e-9
        before = after


@given(job_specs(), st.integers(0, 39))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_outlier_among_ordinary_jobs_leaves_the_bounds_within_a_step(
    spec: dict[str, Any], position: int
) -> None:
    """After 40 ordinary jobs with one arbitrary job among them, the bounds are within
    e^(2 STEP) of those without it: the quantiles ignore the outlier and the followed
    values move back to them."""
    ordinary = trace_from_dict(_trace(21, n_jobs=40, prior="default"))
    extra = _job(spec, 999, 0)
    if extra is None:
        return
    plain = ordinary.estimate()
    poisoned = ordinary.estimate()
    for i, job in enumerate(ordinary.jobs):
        if i == position:
            poisoned = poisoned.observe(extra)
        plain, poisoned = plain.observe(job), poisoned.observe(job)
    a, b = plain.bounds(), poisoned.bounds()
    assert a is not None and b is not None
    assert np.abs(_logs(a) - _logs(b)).max() <= 2 * STEP + 1e-9


# -- overflow fuzzing of the pricing path --------------------------------------------------


def _big_cluster() -> Any:
    servers = copy.deepcopy(SERVERS)
    servers[0]["capacity"] = dict.fromkeys(RESOURCES, 1e308)
    return cluster_from_dict(RESOURCES, servers)


@given(
    st.lists(job_specs(), min_size=1, max_size=6),
    st.sampled_from(["estimate", "oracle", "explicit"]),
    st.booleans(),
)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_finite_input_prices_finitely(
    specs: list[dict[str, Any]], bounds: str, big: bool
) -> None:
    """Parse, estimate, price, decide and explain jobs with any finite numbers (also on
    a server of capacity 1e308): no exception, prices finite, every payoff, cost and
    utility finite or null, and the replay output is strict JSON."""
    raw: dict[str, Any] = {
        "version": 1, "horizon": 6, "slot_seconds": 3600, "resources": RESOURCES,
        "servers": copy.deepcopy(SERVERS),
        "jobs": [{**s, "id": f"j{i}", "arrival": min(i, 5)} for i, s in enumerate(specs)],
    }  # fmt: skip
    if big:
        raw["servers"][0]["capacity"] = dict.fromkeys(RESOURCES, 1e308)
    raw["pricing"] = {
        "estimate": {"bounds": "estimate"},
        "oracle": {"bounds": "oracle"},
        "explicit": {"U1": dict.fromkeys(RESOURCES, 1.7e308), "U2": {"cpu": 1e308},
                     "L1": {r: 5e-324 for r in RESOURCES}, "L2": 1e-300},
    }[bounds]  # fmt: skip
    try:
        trace = trace_from_dict(raw)
    except SpecError:
        return  # a field the parser refuses (named); not this test's business
    records = list(replay(trace))
    for r in records:
        out = record_json(r, trace.cluster)
        json.dumps(out, allow_nan=False)
        for key in ("payoff", "cost", "utility"):
            assert out[key] is None or math.isfinite(out[key])
        assert out["admitted"] or out["reason"]
    # the same decisions once more, reading the ledger's prices after each
    ledger = Ledger(trace.cluster, trace.bounds, trace.horizon)
    estimate = trace.estimate() if trace.trim is not None else None
    for job in trace.jobs:
        if trace.late(job) is not None:
            continue
        if estimate is not None:
            estimate = estimate.observe(job)
            b = estimate.bounds()
            assert b is not None
            ledger.set_bounds(b)
        decide(job, ledger, job.arrival, trace.horizon - 1)
        for side in (ledger.worker_side, ledger.ps_side):
            assert np.isfinite(side.price).all() and (side.price >= 0).all()


def test_the_issues_numbers_are_admitted_at_the_top_price() -> None:
    """Priority 1e6, 1e308 and 1.7e308 on a 1-worker job among ordinary ones: admitted
    (they fit), priced finitely, and the explanation of a later rejection never says
    "cannot fit" while room is free."""
    raw = _trace(3, n_jobs=30, prior="default")
    for k, priority in enumerate((1e6, 1e308, 1.7e308)):
        spec = copy.deepcopy(raw["jobs"][k * 5])
        spec.update(id=f"big{k}", chunks=1)
        spec["utility"] = {"kind": "sigmoid", "priority": priority, "decay": 0.5, "target": 5}
        raw["jobs"].insert(k * 5 + 1, spec)
    trace = trace_from_dict(raw)
    for r in replay(trace):
        d = r.decision
        if d.job.id.startswith("big"):
            assert d.admitted and d.best.cost is not None and math.isfinite(d.best.cost)
        if d.best.payoff is None and trace.late(d.job) is None:
            assert r.reason.startswith("cannot fit")


_HUGE = {
    "id": "huge", "epochs": 1, "chunks": 1, "minibatches": 1, "tau": 0.01, "grad_mb": 1.0,
    "worker": {"gpu": 1, "cpu": 1e-9, "mem": 1e-9, "bandwidth": 1},
    "ps": {"cpu": 1e-9, "disk": 1e-9, "bandwidth": 1},
    "utility": {"kind": "sigmoid", "priority": 1.7e308, "decay": 0.0, "target": 1e6},
}  # fmt: skip


def test_bounds_past_float_range_are_shown_finite(tmp_path: Path) -> None:
    """Without a prior the first job sets the values: priority 1.7e308 on demands of
    1e-9 puts log U near 730, past the largest float. The bounds still price (logs),
    and what ``oasis bounds`` shows (the estimate's description, the daemon's view) is
    finite strict JSON, not an OverflowError (INTERNAL)."""
    job = job_from_dict({**_HUGE, "arrival": 0}, CLUSTER, slot_seconds=3600.0,
                        slots_available=lambda a: 10**9)  # fmt: skip
    estimate = BoundEstimate.start(CLUSTER, None).observe(job)
    b = estimate.bounds()
    assert b is not None and float(b.log_u1.max()) > math.log(sys.float_info.max)
    json.dumps(estimate.describe(RESOURCES), allow_nan=False)
    shown = estimate.describe(RESOURCES)["worker"]["mem"]
    assert shown is not None and shown["U"] == pytest.approx(sys.float_info.max)

    config = from_dict(
        {
            "daemon": {"data_dir": str(tmp_path), "window": 10, "epoch": 0},
            "pricing": {"bounds": "estimate", "prior": "none"},
            "limits": {"max_utility": 1.7e308},  # an operator lifting the cap
            "cluster": {"resources": RESOURCES, "servers": SERVERS},
        }
    )
    daemon = in_process(config)
    daemon.open()
    try:
        asyncio.run(daemon.submit(dict(_HUGE)))
        view = daemon._bounds_view()
        json.dumps(view, allow_nan=False)
        assert all(math.isfinite(row["U"]) for row in view["bounds"])
    finally:
        daemon.close()


# -- poisoned streams in replay ------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_a_poisoned_stream_costs_ordinary_jobs_at_most_a_tenth_of_their_admissions(
    seed: int,
) -> None:
    raw: dict[str, Any] = generate_trace(
        np.random.default_rng(seed), n_jobs=150, n_worker_servers=10, n_ps_servers=10,
        horizon=100,
    )  # fmt: skip
    raw["pricing"] = {"bounds": "estimate"}
    clean = {r.decision.job.id: r.decision.admitted for r in replay(trace_from_dict(raw))}
    ordinary = sum(clean.values())
    assert ordinary >= 10
    for priority in (1e6, 1e308):
        poisoned: dict[str, Any] = copy.deepcopy(raw)
        spec = copy.deepcopy(raw["jobs"][0])
        spec.update(id="poison", chunks=1)
        spec["utility"] = {"kind": "sigmoid", "priority": priority, "decay": 0.5, "target": 5}
        poisoned["jobs"].insert(0, spec)
        got = {r.decision.job.id: r.decision.admitted for r in replay(trace_from_dict(poisoned))}
        assert got["poison"]  # it fits, so it is admitted at the top price
        kept = sum(got[j] for j in clean)
        assert kept >= 0.9 * ordinary, (priority, kept, ordinary)


# -- the prior -----------------------------------------------------------------------------


def test_the_shipped_prior_is_what_its_command_makes() -> None:
    from bench.default_prior import prior_dict

    assert prior_dict() == DEFAULT_PRIOR
    assert default_prior().weight == 40.0


def test_a_prior_round_trips_and_bad_ones_name_the_field() -> None:
    trace = trace_from_dict(_trace(4))
    prior = calibrate(list(trace.jobs), trace.cluster, weight=12.0, points=8, source="t")
    back = prior_from_dict(json.loads(json.dumps(prior.to_dict())))
    assert back == prior and len(back.worker.floor) <= 8
    bad = prior.to_dict()
    bad["worker"]["floor"][0][1] = -1
    bad["ps"]["top"]["cpu"] = [[1e9, 1]]
    bad["weight"] = 0
    with pytest.raises(SpecError) as err:
        prior_from_dict(bad)
    fields = {p.field for p in err.value.problems}
    assert {"prior.worker.floor[0][1]", "prior.ps.top.cpu[0][0]", "prior.weight"} <= fields
    with pytest.raises(SpecError, match="kind"):
        prior_from_dict({**prior.to_dict(), "kind": "other"})


def test_a_priors_weight_and_floor_share_past_their_caps_are_refused_by_name() -> None:
    """A prior counted as more than 10^6 jobs would hold the bounds for good (no stream
    of jobs moves them), and a floor share above 1 weighs each job more than a job."""
    for path, value, words in ((("weight",), 1e7, "must be <= 1e+06"),
                               (("worker", "floor_per_job"), 1.5, "must be <= 1"),
                               (("ps", "floor_per_job"), 2.0, "must be <= 1")):  # fmt: skip
        raw = copy.deepcopy(DEFAULT_PRIOR)
        at = raw
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
        with pytest.raises(SpecError) as err:
            prior_from_dict(raw)
        assert [(p.field, p.reason) for p in err.value.problems] == [
            ("prior." + ".".join(path), words)
        ]
    ok = copy.deepcopy(DEFAULT_PRIOR)
    ok["weight"], ok["worker"]["floor_per_job"] = 1e6, 1.0  # at the caps: taken
    assert prior_from_dict(ok).weight == 1e6


def test_a_prior_list_without_points_is_refused_by_name() -> None:
    """Every list of a prior needs a point: an empty floor would start the estimate
    with no L (flat unit prices until a job came), an empty best with no B_ref."""
    for path in (("best",), ("worker", "floor"), ("ps", "top", "cpu")):
        raw = copy.deepcopy(DEFAULT_PRIOR)
        at = raw
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = []
        with pytest.raises(SpecError, match=r"prior\." + r"\.".join(path)):
            prior_from_dict(raw)


def test_the_prior_sets_the_start_and_fades() -> None:
    """Before any job the bounds are the prior's; a prior far from the jobs is left
    behind at STEP per job, and one from the same workload starts close to the end."""
    raw = _trace(5, n_jobs=200)
    trace = trace_from_dict(raw)
    own = calibrate(list(trace.jobs), trace.cluster)
    start = BoundEstimate.start(trace.cluster, own)
    assert start.bounds() is not None and start.jobs == 0
    far = copy.deepcopy(own.to_dict())
    for side in ("worker", "ps"):
        far[side]["floor"] = [[x + 5.0, s] for x, s in far[side]["floor"]]
    high = BoundEstimate.start(trace.cluster, prior_from_dict(far))
    near = start
    for job in trace.jobs:
        high, near = high.observe(job), near.observe(job)
    b_high, b_near, b_start = high.bounds(), near.bounds(), start.bounds()
    assert b_high is not None and b_near is not None and b_start is not None
    # 200 jobs at STEP 0.1 can undo the 5 nats the far prior is off by, and its weight
    # has faded to a sixth of the histogram's
    assert np.abs(b_high.floor1 - b_near.floor1).max() < 0.5
    assert np.abs(b_start.floor1 - b_near.floor1).max() < 1.0
    assert high.prior_mass < own.weight * 0.8


def _bin_quantile(values: list[float], weights: list[float], level: float, edge: float) -> float:
    """Reference: the bin (of ``values``) where the weight at and below it first exceeds
    ``level`` of the total, read at ``edge`` of the bin."""
    bins: dict[int, float] = {}
    for v, w in zip(values, weights, strict=True):
        k = math.floor(v / BIN_WIDTH)
        bins[k] = bins.get(k, 0.0) + w
    total, cumulative = math.fsum(bins.values()), 0.0
    for k in sorted(bins):
        cumulative += bins[k]
        if cumulative > level * total:
            return (k + edge) * BIN_WIDTH
    return (max(bins) + edge) * BIN_WIDTH


def _expected_logs(
    top: dict[str, tuple[list[float], list[float]]], floor: tuple[list[float], list[float]],
    scale: np.ndarray, trim: float, resources: list[str],
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Reference ``(log U, log L)`` of one side: U the count median of the top values
    read at the bin's upper edge, L the ``trim`` quantile of the floor values at the
    lower edge, divided by 4, both per mean capacity; U at least L."""
    log_l = _bin_quantile(*floor, trim, 0.0) - math.log(4.0) - scale
    log_u = (
        np.array([_bin_quantile(*top[r], 0.5, 1.0) if r in top else -math.inf for r in resources])
        - scale
    )
    return np.maximum(log_u, log_l), log_l


def test_the_bounds_before_any_job_are_the_priors_quantiles() -> None:
    """Before any job, U and L are the prior's quantiles, computed here from its points:
    U[r] the median of r's top values at the upper edge of its bin, L the trim (0.3)
    quantile of the floor values at the lower edge, / 4, each per mean capacity."""
    prior = default_prior()
    b = BoundEstimate.start(CLUSTER, prior).bounds()
    assert b is not None
    for side, log_u, log_l, capacity in (
        (prior.worker, b.log_u1, b.floor1, CLUSTER.worker_capacity),
        (prior.ps, b.log_u2, b.floor2, CLUSTER.ps_capacity),
    ):
        mean = capacity.mean(axis=0)
        scale = np.log(np.where(mean > 0, mean, 1.0))

        def split(points: Any) -> tuple[list[float], list[float]]:
            return [x for x, _ in points], [s for _, s in points]

        top = {r: split(p) for r, p in side.top.items()}
        u, l_ = _expected_logs(top, split(side.floor), scale, 0.3, RESOURCES)
        np.testing.assert_allclose(log_u, u, rtol=0, atol=1e-9)
        np.testing.assert_allclose(log_l, l_, rtol=0, atol=1e-9)


def test_without_a_prior_the_first_jobs_bounds_are_their_quantiles() -> None:
    """Until SETTLE jobs' weight, an estimate without a prior follows its quantiles
    exactly, computed here from the jobs: U[r] the count median of each job's
    ``log f(d_min) - log (d[r] / cbar[r])`` (each job weighs 1, decayed by 1 - 1/WINDOW
    per later job), L the 0.3 quantile of ``log f(d_min) - log W - log sum d / cbar``
    weighted by the job's utility over B_ref (the 0.9 count quantile of the jobs before
    it), capped at 1."""
    from pricing.bound_estimate import WINDOW

    d = 1.0 - 1.0 / WINDOW
    trace = trace_from_dict(_trace(31, n_jobs=19, prior="none"))
    resources = list(trace.cluster.resources)
    mean = trace.cluster.worker_capacity.mean(axis=0)
    scale = np.log(np.where(mean > 0, mean, 1.0))
    estimate = trace.estimate()
    bests: list[float] = []
    top: dict[str, tuple[list[float], list[float]]] = {}
    floor: tuple[list[float], list[float]] = ([], [])
    for job in trace.jobs:
        best = float(job.utility.log_values(job.min_slots))
        weight = 1.0
        if bests:
            ref = _bin_quantile(bests, [d ** (len(bests) - 1 - i) for i in range(len(bests))],
                                0.9, 0.5)  # fmt: skip
            weight = max(1e-6, min(1.0, math.exp(best - ref)))
        bests.append(best)
        demand = job.worker.tolist()
        floor[0].append(
            best
            - math.log(job.work)
            - math.log(math.fsum(x / m for x, m in zip(demand, mean, strict=True) if x > 0))
        )
        floor[1][:] = [w * d for w in floor[1]]
        floor[1].append(weight)
        for i, r in enumerate(resources):
            values, weights = top.setdefault(r, ([], []))
            if demand[i] > 0:  # a resource's tracker sees (and decays at) its jobs only
                weights[:] = [w * d for w in weights]
                values.append(best - math.log(demand[i] / mean[i]))
                weights.append(1.0)
        estimate = estimate.observe(job)
        b = estimate.bounds()
        assert b is not None
        top_seen = {r: v for r, v in top.items() if v[0]}
        u, l_ = _expected_logs(top_seen, floor, scale, 0.3, resources)
        np.testing.assert_allclose(b.log_u1, u, rtol=0, atol=1e-9)
        np.testing.assert_allclose(b.floor1, l_, rtol=0, atol=1e-9)


def test_b_ref_before_any_job_is_the_priors_0_9_quantile() -> None:
    """``B_ref`` (the cap on a job's weight in L, and what a rejection's units note
    compares a job with) starts at the 0.9 quantile of the prior's ``best`` points, at
    the middle of its bin, computed here from the points."""
    from pricing.bound_estimate import units_note

    prior = default_prior()
    ref = _bin_quantile([x for x, _ in prior.best], [s for _, s in prior.best], 0.9, 0.5)
    fresh = BoundEstimate.start(CLUSTER, prior)
    cheap = job_from_dict(
        {"id": "cheap", "arrival": 0, "epochs": 1, "chunks": 1, "minibatches": 1, "tau": 0.01,
         "grad_mb": 1.0, "worker": {"gpu": 1, "cpu": 1, "bandwidth": 1},
         "ps": {"cpu": 1, "bandwidth": 1},
         "utility": {"kind": "sigmoid", "priority": 1e-6, "decay": 0.5, "target": 5}},
        CLUSTER, slot_seconds=3600.0, slots_available=lambda a: 10**9,
    )  # fmt: skip
    assert f"(about {math.exp(ref):.3g})" in units_note(fresh, cheap)


def test_a_jobs_size_in_servers_worth_is_exact_far_from_one() -> None:
    """``log sum_r d[r] / cbar[r]`` for demands of 1e-9 on servers of 1e308 (each ratio
    near e^-730, under the normal floats): computed in logs, exact to rounding, not a
    sum of subnormals that keeps 20 bits."""
    from pricing.bound_estimate import _log_size

    scale = [math.log(1e308), math.log(5e307)]
    found = _log_size(np.array([1e-9, 3e-9]), scale)
    assert found is not None
    expected = math.log(1e-9) - scale[0] + math.log1p(3.0 * (1e308 / 5e307))
    assert found[2] == pytest.approx(expected, rel=0, abs=1e-12)


def test_without_a_prior_the_first_jobs_set_the_values() -> None:
    trace = trace_from_dict(_trace(6, prior="none"))
    estimate = trace.estimate()
    assert estimate.bounds() is None
    estimate = estimate.observe(trace.jobs[0])
    assert estimate.bounds() is not None
    assert BoundEstimate.empty(5).bounds() is None


def test_margins_and_another_trim_read_the_same_state() -> None:
    trace = trace_from_dict(_trace(7, n_jobs=120))
    estimate = trace.estimate()
    for job in trace.jobs:
        estimate = estimate.observe(job)
    plain = estimate.bounds()
    scaled = estimate.bounds(l_margin=0.5, u_margin=2.0)
    assert plain is not None and scaled is not None
    np.testing.assert_allclose(scaled.floor1, plain.floor1 + math.log(0.5))
    np.testing.assert_allclose(
        scaled.log_u1, np.maximum(plain.log_u1 + math.log(2.0), scaled.floor1)
    )
    lows = []
    for trim in (0.0, 0.1, 0.3, 0.6, 0.9):
        b = estimate.bounds(trim=trim)
        assert b is not None
        lows.append(float(b.floor1[0]))
    assert lows == sorted(lows) and lows[-1] > lows[0]
    assert estimate.bounds(trim=estimate.trim) is not None
    assert _logs(estimate.bounds(trim=estimate.trim)).tolist() == _logs(plain).tolist()  # type: ignore[arg-type]


# -- persistence ---------------------------------------------------------------------------


def test_state_round_trips_exactly_and_stays_small() -> None:
    trace = trace_from_dict(_trace(8, n_jobs=200))
    estimate = trace.estimate()
    for job in trace.jobs:
        estimate = estimate.observe(job)
    text = json.dumps(estimate.to_dict())
    back = BoundEstimate.from_dict(json.loads(text))
    assert back is not None and back.to_dict() == estimate.to_dict()
    a, b = estimate.bounds(), back.bounds()
    assert a is not None and b is not None and a.same_as(b)
    job = trace.jobs[-1]
    assert back.observe(job).to_dict() == estimate.observe(job).to_dict()
    # every histogram is bounded by its window, whatever the numbers
    assert len(text) < 40_000
    assert back.fits(trace.cluster) and not BoundEstimate.empty(5).fits(trace.cluster)
    assert not back.fits(CLUSTER)  # other servers: start afresh
    state = estimate.to_dict()
    bad_best = {**state, "best": {"keys": [1], "raw": [0.0]}}
    # the store audit: 2**63 - 1 jobs overflowed GetBounds' sum of them; a negative
    # prior weight was shown as -2e9 % of the weight behind the bounds
    edits = ({**state, "jobs": -1}, {**state, "jobs": 2**63 - 1}, {**state, "prior_mass": -1e300})
    for bad in ({"version": 2}, *edits, bad_best, "x", None):
        assert BoundEstimate.from_dict(bad) is None


def test_a_stored_value_edited_past_the_log_limit_reads_back_at_it() -> None:
    """A followed value edited in the store to 1e300 (finite, so it reads) is taken at
    +-LOG_LIMIT: every bound stays finite and ``oasis bounds`` can show it (exp of
    1e300 would overflow)."""
    state = BoundEstimate.start(CLUSTER, default_prior()).to_dict()
    for sign in (1.0, -1.0):
        edited = copy.deepcopy(state)
        edited["worker"]["top"][0]["value"] = sign * 1e300
        edited["worker"]["floor"]["value"] = sign * 1e300
        back = BoundEstimate.from_dict(edited)
        assert back is not None
        assert back.worker.top[0].value == sign * LOG_LIMIT
        assert back.worker.floor.value == sign * LOG_LIMIT
        shown = back.describe(RESOURCES)["worker"]["gpu"]
        assert shown is not None and math.isfinite(shown["L"])


def _listed(state: Any) -> Any:
    """``state`` as version 3 wrote it: each tracker's weights as a list (``raw``)."""
    if isinstance(state, list):
        return [_listed(v) for v in state]
    if not isinstance(state, dict):
        return state
    out = {k: _listed(v) for k, v in state.items() if k != "raw64"}
    if "raw64" in state:
        data = base64.b64decode(state["raw64"])
        out["raw"] = list(struct.unpack(f"<{len(data) // 8}d", data))
    return out


def test_a_stored_state_of_version_3_reads_the_same_and_bad_packed_weights_do_not() -> None:
    """The weights are stored packed (version 4); a store written before (weights listed,
    version 3) reads to the same estimate, and packed weights that are not base64 of
    float64, or too many, or not finite, are refused (the daemon starts afresh)."""
    trace = trace_from_dict(_trace(8, n_jobs=60))
    estimate = trace.estimate()
    for job in trace.jobs:
        estimate = estimate.observe(job)
    state = estimate.to_dict()
    assert state["version"] == 4 and isinstance(state["best"]["raw64"], str)
    old = {**_listed(state), "version": 3}
    assert "raw64" not in json.dumps(old) and isinstance(old["best"]["raw"], list)
    back = BoundEstimate.from_dict(json.loads(json.dumps(old)))
    assert back is not None and back.to_dict() == state
    n = len(state["best"]["keys"])
    inf = base64.b64encode(struct.pack(f"<{n}d", *[math.inf] * n)).decode()
    many = base64.b64encode(struct.pack(f"<{MAX_BINS + 1}d", *[1.0] * (MAX_BINS + 1)))
    for raw64 in ("not base64!", state["best"]["raw64"][:-4], inf, many.decode(), 7):
        bad = {**state, "best": {**state["best"], "raw64": raw64}}
        assert BoundEstimate.from_dict(bad) is None, raw64
    # listed weights have no length to refuse them by: more bins than a window holds is
    # an edit (a histogram never has them), refused like the packed ones
    keys, weights = list(range(MAX_BINS + 1)), [1.0] * (MAX_BINS + 1)
    wide = {"keys": keys, "raw": weights, "scale": 1.0, "value": 0.0}
    assert BoundEstimate.from_dict({**old, "best": wide}) is None
    full = {**wide, "keys": keys[:-1], "raw": weights[:-1]}
    assert BoundEstimate.from_dict({**old, "best": full}) is not None


def test_the_daemon_decides_as_replay_does_with_a_prior(tmp_path: Path) -> None:
    """A prior loaded into the daemon's store (as ``oasis bounds`` would, until the
    config names one) gives the decisions replay makes with that prior in the trace.
    All jobs submitted in slot 0 arrive at 1 and may use slots 1 .. T in the daemon; a
    trace of horizon T + 1 with every arrival at 1 gives replay the same slots."""
    window = 30
    raw = _trace(11, n_jobs=40, horizon=window)  # every job fits in T slots
    prior = calibrate(list(trace_from_dict(_trace(12, n_jobs=80)).jobs), CLUSTER_OF(raw))
    raw["horizon"] = window + 1
    raw["pricing"] = {"bounds": "estimate", "trim": 0.25, "prior": prior.to_dict()}
    for job in raw["jobs"]:
        job["arrival"] = 1
    trace = trace_from_dict(raw)
    expected = list(replay(trace))

    config = from_dict(
        {
            "daemon": {"data_dir": str(tmp_path), "window": window, "epoch": 0},
            "pricing": {"bounds": "estimate", "trim": 0.25},
            "cluster": {"resources": raw["resources"], "servers": raw["servers"]},
        }
    )

    first = in_process(config)
    first.open()
    with first.db.session() as session:
        start = BoundEstimate.start(trace.cluster, prior, 0.25).to_dict()
        session.merge(MetaRow(key="bound_estimate", value=start))
    first.close()
    daemon = in_process(config)
    daemon.open()
    try:
        admitted = 0
        for entry, record in zip(raw["jobs"], expected, strict=True):
            spec = {k: v for k, v in entry.items() if k != "arrival"}
            view = asyncio.run(daemon.submit(spec))
            d = record.decision
            assert view.decision.admitted == d.admitted, entry["id"]
            if d.best.payoff is None:
                assert view.decision.payoff is None
            else:
                assert view.decision.payoff == pytest.approx(d.best.payoff, rel=1e-9, abs=1e-12)
            admitted += d.admitted
        assert 0 < admitted < len(expected)  # both outcomes occur
    finally:
        daemon.close()


def CLUSTER_OF(raw: dict[str, Any]) -> Any:  # noqa: N802 - reads as a constant
    return cluster_from_dict(raw["resources"], raw["servers"])


# -- oasis calibrate and a trace naming a prior file ------------------------------------


def test_calibrate_of_jobs_at_the_log_limits_writes_a_prior_that_reads_back() -> None:
    """A job whose utility underflows (its log read as -LOG_LIMIT) and that needs many
    worker-slots has a floor value below -LOG_LIMIT before clipping; calibrate clips it
    as the estimate does, so the prior it writes is one a trace and oasisd accept."""
    raw = _trace(3, n_jobs=3)
    for job in raw["jobs"][:2]:
        job["utility"] = {"kind": "sigmoid", "priority": 5e-324, "decay": 1e6, "target": -1e6}
    trace = trace_from_dict(raw)
    prior = calibrate(list(trace.jobs), trace.cluster)
    lowest = min(x for x, _ in prior.worker.floor)
    assert lowest == -1000.0
    back = prior_from_dict(json.loads(json.dumps(prior.to_dict())))
    assert back.worker.floor == prior.worker.floor


def test_an_edited_estimate_state_is_read_within_its_rules_or_not_at_all() -> None:
    """A stored state an edit left outside what the estimate ever writes: a prior's
    weight above all the weight there is is shown as a share of 1 (not 500%); one kind
    of server's floor emptied is not read (the daemon starts afresh, saying so): it
    left the bounds None, which the daemon prices as flat unit prices for every job."""
    trace = trace_from_dict(_trace(3, n_jobs=3))
    estimate = BoundEstimate.start(trace.cluster, None).observe(trace.jobs[0])
    state = estimate.to_dict()
    heavy = BoundEstimate.from_dict({**state, "prior_mass": 5.0})
    assert heavy is not None and heavy.describe(trace.cluster.resources)["prior_share"] == 1.0
    for kind in ("worker", "ps"):
        edited = copy.deepcopy(state)
        edited[kind]["floor"] = {"keys": [], "raw64": "", "scale": 1.0, "value": None,
                                 "seeded": False}  # fmt: skip
        assert BoundEstimate.from_dict(edited) is None, kind
    both = copy.deepcopy(state)
    for kind in ("worker", "ps"):  # before any job and without a prior: both empty
        both[kind]["floor"] = {"keys": [], "raw64": "", "scale": 1.0, "value": None,
                               "seeded": False}  # fmt: skip
    back = BoundEstimate.from_dict(both)
    assert back is not None and back.bounds() is None


def test_calibrate_keeps_each_jobs_weight_when_the_values_are_as_many_as_the_points() -> None:
    """With as many distinct values as ``points``, the floor's summary is each value
    with its share of the jobs' weights (a job far below the best weighs less), not a
    quantile read of them, which put the whole floor on the heaviest job's value."""
    raw = _trace(5, n_jobs=3)
    for job, priority in zip(raw["jobs"], (1e4, 1e2, 1.0), strict=True):
        job["utility"] = {"kind": "sigmoid", "priority": priority, "decay": 1e-9, "target": 5}
    trace = trace_from_dict(raw)
    prior = calibrate(list(trace.jobs), trace.cluster, points=3)
    for side in (prior.worker, prior.ps):
        shares = sorted(share for _value, share in side.floor)
        assert shares == pytest.approx([1e-4 / 1.0101, 1e-2 / 1.0101, 1 / 1.0101], rel=1e-4)
    assert [share for _value, share in prior.best] == pytest.approx([1 / 3] * 3, rel=1e-5)


def test_calibrate_writes_a_prior_a_trace_can_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "history.json"
    history.write_text(json.dumps(_trace(13, n_jobs=80)))
    assert main(["calibrate", str(history), "-o", str(tmp_path / "prior.json")]) == 0
    err = capsys.readouterr().err
    assert "a prior worth 40 jobs" in err and "note:" not in err
    prior = json.loads((tmp_path / "prior.json").read_text())
    assert prior_from_dict(prior).source == f"oasis calibrate {history}"

    (tmp_path / "runs").mkdir()
    named = _trace(14, prior="../prior.json")
    (tmp_path / "runs" / "t.json").write_text(json.dumps(named))
    assert main(["replay", str(tmp_path / "runs" / "t.json"), "--json", "--compact"]) == 0
    by_file = json.loads(capsys.readouterr().out)
    inline = _trace(14, prior=prior)
    (tmp_path / "inline.json").write_text(json.dumps(inline))
    assert main(["replay", str(tmp_path / "inline.json"), "--json", "--compact"]) == 0
    assert [j["admitted"] for j in by_file["jobs"]] == [
        j["admitted"] for j in json.loads(capsys.readouterr().out)["jobs"]
    ]

    (tmp_path / "runs" / "bad.json").write_text(json.dumps(_trace(14, prior="nope.json")))
    assert main(["replay", str(tmp_path / "runs" / "bad.json")]) == 2
    assert "pricing.prior" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text('{"kind": "oasis-bound-prior"}')
    (tmp_path / "runs" / "junk.json").write_text(json.dumps(_trace(14, prior="../junk.json")))
    assert main(["replay", str(tmp_path / "runs" / "junk.json")]) == 2
    assert "pricing.prior.version" in capsys.readouterr().err
    assert main(["calibrate"]) == 2

    # jobs whose weights differ by far more than 10^6: their shares were rounded to 6
    # decimals, to 0, which a prior may not hold (an audit: oasis gen --jobs 10
    # --worker-servers 4 --ps-servers 3 --horizon 24 --seed 3 --max-share 0.2)
    spread = tmp_path / "spread.json"
    assert main(["gen", "--jobs", "10", "--worker-servers", "4", "--ps-servers", "3",
                 "--horizon", "24", "--seed", "3", "--max-share", "0.2",
                 "-o", str(spread)]) == 0  # fmt: skip
    assert main(["calibrate", str(spread), "-o", str(tmp_path / "spread-prior.json")]) == 0
    # 10 jobs made a prior counted as 40 without a word (the replay audit)
    assert ("note: made from fewer jobs than it counts as: the estimate takes its 10 jobs "
            "for 40 jobs until it has seen as many; calibrate from more jobs, or give "
            "--weight 10") in capsys.readouterr().err  # fmt: skip
    made = json.loads((tmp_path / "spread-prior.json").read_text())
    shares = [s for side in ("worker", "ps") for _v, s in made[side]["floor"]]
    assert min(shares) < 5e-7  # the case: a share 6 decimals made 0
    assert prior_from_dict(made).source.startswith("oasis calibrate")


def test_calibrate_from_a_daemons_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``oasis calibrate --store URL``: the jobs the daemon decided (every one submitted
    but the cancelled), on the daemon's servers."""
    raw = _trace(15, n_jobs=12, horizon=30)
    config = decided_store(tmp_path, raw, 30, {"": raw["jobs"]})
    out = tmp_path / "prior.json"
    assert main(["calibrate", "--store", config.database_url, "-o", str(out)]) == 0
    assert "12 jobs -> a prior" in capsys.readouterr().err
    prior = prior_from_dict(json.loads(out.read_text()))
    made = calibrate(
        list(trace_from_dict(raw).jobs), CLUSTER_OF(raw), source="oasis calibrate --store"
    )
    assert prior == prior_from_dict(made.to_dict())  # read back as the file was
    assert main(["calibrate", "--store", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "--store" in capsys.readouterr().err

    # the newest N (decision order), and a stretch of arrival slots
    jobs = list(trace_from_dict(raw).jobs)
    url = config.database_url
    assert main(["calibrate", "--store", url, "--newest", "5", "-o", str(out)]) == 0
    assert "5 jobs (the newest; --newest sets how many)" in capsys.readouterr().err
    newest = calibrate(jobs[-5:], CLUSTER_OF(raw), source="oasis calibrate --store")
    assert prior_from_dict(json.loads(out.read_text())) == prior_from_dict(newest.to_dict())
    assert prior != prior_from_dict(newest.to_dict())  # it can tell them apart
    import contextlib
    import sqlite3

    # all arrived in the clock's slot
    with contextlib.closing(sqlite3.connect(tmp_path / "oasis.db")) as db:
        (slot,) = db.execute("SELECT DISTINCT arrival_slot FROM jobs").fetchone()
    for stretch, read in (
        (["--from", str(slot), "--to", str(slot)], 12),
        (["--to", str(slot)], 12),
    ):
        assert main(["calibrate", "--store", url, *stretch, "--newest", "0", "-o", str(out)]) == 0
        assert f"{read} jobs -> a prior" in capsys.readouterr().err
        assert prior_from_dict(json.loads(out.read_text())) == prior
    assert main(["calibrate", "--store", url, "--to", str(slot - 1)]) == 2
    assert f"holds no decided job up to slot {slot - 1}" in capsys.readouterr().err
    for wrong, said in (
        (["--store", url, "--from", "5", "--to", "4"], "--to 4 is before --from 5"),
        (["--store", url, "--from", "100000"], "holds no decided job from slot 100000 on"),
        ([str(tmp_path / "t.json"), "--newest", "3"], "choose a store's jobs"),
    ):
        assert main(["calibrate", *wrong]) == 2
        assert said in capsys.readouterr().err, wrong


def test_calibrate_leaves_out_a_trace_job_that_cannot_finish_before_the_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job no schedule can finish (SPEC 6: replay rejects it with ``payoff: null``)
    tells nothing of the values the daemon will see: calibrating a trace with one gives
    the prior of the trace without it, counted without it."""
    raw = _trace(13, n_jobs=80)
    late = copy.deepcopy(raw["jobs"][0])
    late.update(id="late", arrival=raw["horizon"] - 1, epochs=400)
    late["utility"]["priority"] = 1e6  # were it counted, it would move the prior's top
    with_late = copy.deepcopy(raw)
    with_late["jobs"].append(late)
    trace = trace_from_dict(with_late)
    assert trace.late(trace.jobs[-1]) is not None  # the set-up: it cannot finish
    (tmp_path / "with.json").write_text(json.dumps(with_late))
    (tmp_path / "without.json").write_text(json.dumps(raw))
    assert main(["calibrate", str(tmp_path / "with.json"), "-o", str(tmp_path / "a.json")]) == 0
    assert "oasis calibrate: 80 jobs -> a prior worth 40 jobs" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "without.json"), "-o", str(tmp_path / "b.json")]) == 0
    made, plain = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    made.pop("source"), plain.pop("source")
    assert made == plain


def test_calibrate_newest_0_takes_every_stored_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--newest 0`` is "all", not the default cut (the operator-tools audit's K4: read
    as the default it passed every test, the default of 10,000 being more than any test
    store holds; here the default is made 5 of the store's 12)."""
    from controller.commands import calibrate as command

    raw = _trace(15, n_jobs=12, horizon=30)
    url = decided_store(tmp_path, raw, 30, {"": raw["jobs"]}).database_url
    monkeypatch.setattr(command, "DEFAULT_NEWEST", 5)
    out = tmp_path / "prior.json"
    assert main(["calibrate", "--store", url, "-o", str(out)]) == 0
    assert "5 jobs (the newest; --newest sets how many)" in capsys.readouterr().err
    assert main(["calibrate", "--store", url, "--newest", "0", "-o", str(out)]) == 0
    assert "oasis calibrate: 12 jobs -> a prior" in capsys.readouterr().err
    every = calibrate(
        list(trace_from_dict(raw).jobs), CLUSTER_OF(raw), source="oasis calibrate --store"
    )
    assert prior_from_dict(json.loads(out.read_text())) == prior_from_dict(every.to_dict())


def test_calibrate_store_reads_each_submitters_newest_share_oldest_first_and_no_cancelled(
    tmp_path: Path,
) -> None:
    """What ``oasis calibrate --store`` reads (:func:`controller.history.load_jobs`): of
    each of k submitters the ceil(newest / k) jobs decided last, in decision order, and
    never a cancelled one (the replay audit's H26, H27, H29: floor for ceil, the order
    left per submitter, and cancelled jobs read were never run on any test)."""
    import contextlib
    import sqlite3

    from controller.history import load_jobs

    raw = _trace(15, n_jobs=12, horizon=30)
    jobs = raw["jobs"]
    config = decided_store(tmp_path, raw, 30, {"alice": jobs[:6], "bob": jobs[6:]})
    with contextlib.closing(sqlite3.connect(tmp_path / "oasis.db")) as db:  # turns: a b a b
        order = [key for (key,) in db.execute("SELECT id FROM jobs ORDER BY sequence")]
        assert order[:2] == [f"alice:{jobs[0]['id']}", f"bob:{jobs[6]['id']}"]
        db.execute("UPDATE jobs SET state = 'cancelled' WHERE id = ?", (order[-2],))
        db.commit()
    store = Database(config.database_url)
    try:
        newest, _, whom = load_jobs(store, newest=5)  # 3 of each: ceil(5 / 2)
        expected = sorted(
            [k for k in order[::2] if k != order[-2]][-3:] + order[1::2][-3:], key=order.index
        )
        assert [j.id for j in newest] == expected
        assert whom == [key.split(":", 1)[0] for key in expected]
        every, _, _ = load_jobs(store)
        assert [j.id for j in every] == [k for k in order if k != order[-2]]
    finally:
        store.dispose()
