"""The price-bound estimate (pricing/bound_estimate.py): its L against a direct
computation, its persistence, and the daemon deciding as ``replay`` does with
``{"bounds": "estimate"}``."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.replay import replay
from controller.store import Database
from pricing import SpecError, trace_from_dict
from pricing.bound_estimate import BIN_WIDTH, BoundEstimate
from pricing.workload import generate_trace


def _trace(
    seed: int, n_jobs: int = 60, trim: float | None = None, horizon: int = 40
) -> dict[str, Any]:
    raw = generate_trace(
        np.random.default_rng(seed),
        n_jobs=n_jobs,
        n_worker_servers=4,
        n_ps_servers=4,
        horizon=horizon,
    )
    raw["pricing"] = (
        {"bounds": "estimate"} if trim is None else {"bounds": "estimate", "trim": trim}
    )
    return raw


def _direct_low(jobs: list[Any], side: str, trim: float) -> float:
    """Sort the unit values, drop the prefix carrying <= trim of the best utility."""
    best = np.array([math.exp(float(j.utility.log_values(j.min_slots))) for j in jobs])
    values = np.array(
        [
            float(j.utility.log_values(j.min_slots)) - math.log(j.work * getattr(j, side).sum())
            for j in jobs
        ]
    )
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(best[order])
    first_kept = int(np.flatnonzero(cumulative > trim * cumulative[-1])[0])
    return float(values[order[first_kept]])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("trim", [0.0, 0.2, 0.5])
def test_l_is_the_lowest_unit_value_past_the_trimmed_tail(seed: int, trim: float) -> None:
    trace = trace_from_dict(_trace(seed))
    estimate = BoundEstimate.empty(len(trace.cluster.resources))
    for job in trace.jobs:
        estimate = estimate.observe(job)
    bounds = estimate.bounds(trim=trim)
    assert bounds is not None
    for side, log_l in (("worker", bounds.log_l1), ("ps", bounds.log_l2)):
        direct = _direct_low(list(trace.jobs), side, trim) - math.log(4.0)
        # L is the lower edge of the histogram bin holding the first job kept
        assert direct - BIN_WIDTH - 1e-9 < log_l <= direct + 1e-9


def test_u_is_spec_4_running_max_and_margins_scale() -> None:
    trace = trace_from_dict(_trace(3))
    estimate = BoundEstimate.empty(len(trace.cluster.resources))
    for job in trace.jobs:
        estimate = estimate.observe(job)
    expected = np.full(len(trace.cluster.resources), -np.inf)
    for job in trace.jobs:
        used = job.worker > 0
        value = float(job.utility.log_values(job.min_slots)) - np.log(job.worker[used])
        expected[used] = np.maximum(expected[used], value)
    plain = estimate.bounds()
    scaled = estimate.bounds(l_margin=0.5, u_margin=2.0)
    assert plain is not None and scaled is not None
    used = np.isfinite(expected)
    np.testing.assert_allclose(plain.log_u1[used], expected[used], rtol=0, atol=1e-12)
    assert scaled.log_l1 == pytest.approx(plain.log_l1 + math.log(0.5))
    np.testing.assert_allclose(scaled.log_u1[used], plain.log_u1[used] + math.log(2.0))


def test_more_trim_raises_l_and_never_lowers_it() -> None:
    trace = trace_from_dict(_trace(4, n_jobs=120))
    estimate = BoundEstimate.empty(len(trace.cluster.resources))
    for job in trace.jobs:
        estimate = estimate.observe(job)
    lows = []
    for trim in (0.0, 0.1, 0.2, 0.4, 0.8):
        b = estimate.bounds(trim=trim)
        assert b is not None
        lows.append(b.log_l1)
    assert lows == sorted(lows) and lows[-1] > lows[0]


def test_state_round_trips_exactly_and_an_old_format_starts_afresh() -> None:
    trace = trace_from_dict(_trace(5))
    estimate = BoundEstimate.empty(len(trace.cluster.resources))
    for job in trace.jobs:
        estimate = estimate.observe(job)
    back = BoundEstimate.from_dict(json.loads(json.dumps(estimate.to_dict())))
    assert back is not None
    a, b = estimate.bounds(trim=0.3), back.bounds(trim=0.3)
    assert a is not None and b is not None and a.same_as(b)
    assert back.to_dict() == estimate.to_dict()
    old = {"log_u1": [1.0], "log_u2": [1.0], "log_low1": -3.0, "log_low2": -3.0, "jobs": 1}
    assert BoundEstimate.from_dict(old) is None
    assert BoundEstimate.empty(2).bounds() is None


def test_trace_pricing_estimate_is_validated() -> None:
    raw = _trace(0)
    raw["pricing"] = {"bounds": "estimate", "trim": 1.5}
    with pytest.raises(SpecError) as err:
        trace_from_dict(raw)
    assert err.value.problems[0].field == "pricing.trim"
    raw["pricing"] = {"bounds": "estimate", "eta1": 2}
    with pytest.raises(SpecError, match="unexpected keys with estimate bounds"):
        trace_from_dict(raw)
    raw["pricing"] = {"bounds": "guess"}
    with pytest.raises(SpecError, match="'oracle' or 'estimate'"):
        trace_from_dict(raw)


def test_the_daemon_decides_as_replay_does_with_estimated_bounds(tmp_path: Path) -> None:
    """All jobs submitted in slot 0 arrive at 1 and may use slots 1 .. T in the daemon;
    a trace of horizon T + 1 with every arrival at 1 gives replay the same slots."""
    window = 30
    raw = _trace(11, n_jobs=40, trim=0.25, horizon=window)  # every job fits in T slots
    raw["horizon"] = window + 1
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
    controller = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(FakeClock(10.0), config.slot_seconds, config.epoch),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    controller.open()
    try:
        admitted = 0
        for entry, record in zip(raw["jobs"], expected, strict=True):
            spec = {k: v for k, v in entry.items() if k != "arrival"}
            view = asyncio.run(controller.submit(spec))
            d = record.decision
            assert view.decision.admitted == d.admitted, entry["id"]
            if d.best.payoff is None:
                assert view.decision.payoff is None
            else:
                assert view.decision.payoff == pytest.approx(d.best.payoff, rel=1e-9, abs=1e-12)
            admitted += d.admitted
        assert 0 < admitted < len(expected)  # both outcomes occur
    finally:
        controller.close()
