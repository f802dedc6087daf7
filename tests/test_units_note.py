"""A rejection says when the job's utilities look to be in another unit than the price
bounds' prior (:func:`pricing.bound_estimate.units_note`), in replay and in the daemon.

With the shipped prior (``oasis gen``'s priorities, 1-100), every job of a trace whose
priorities were 10,000 times smaller was priced out, on an idle cluster, with no word of
why: the estimate's floor stays where the prior put it for hundreds of jobs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import numpy as np
import structlog

from controller.admission import AdmissionController
from controller.clock import FakeClock, SlotClock
from controller.config import from_dict
from controller.jobspec import prepare
from controller.replay import replay
from controller.store import Database
from pricing import trace_from_dict
from pricing.workload import generate_trace

NOTE = "times below the utilities the price bounds' prior was made from"


def _raw(times: float, prior: str = "default") -> dict[str, Any]:
    raw = generate_trace(
        np.random.default_rng(2), n_jobs=40, n_worker_servers=4, n_ps_servers=4, horizon=30
    )
    raw["pricing"] = {"bounds": "estimate", "prior": prior}
    for job in cast(list[dict[str, Any]], raw["jobs"]):
        job["utility"]["priority"] *= times
    return raw


def _controller(tmp_path: Path, raw: dict[str, Any], now: float) -> AdmissionController:
    """An opened controller on ``raw``'s cluster with estimated bounds, its clock at
    ``now`` (Unix seconds), slot 0 at the epoch."""
    config = from_dict(
        {
            "daemon": {"data_dir": str(tmp_path), "window": 30, "epoch": 0},
            "pricing": {"bounds": "estimate"},
            "cluster": {"resources": raw["resources"], "servers": raw["servers"]},
        }
    )
    inner = AdmissionController(
        config,
        Database(config.database_url),
        SlotClock(FakeClock(now), 3600.0, 0.0),
        log=structlog.wrap_logger(structlog.ReturnLogger()),
    )
    inner.open()
    return inner


def test_replay_names_the_units_only_where_they_differ() -> None:
    small = list(replay(trace_from_dict(_raw(1e-4))))
    assert not any(r.decision.admitted for r in small)  # the prior prices them all out
    assert all(NOTE in r.reason and "oasis calibrate" in r.reason for r in small)
    ordinary = list(replay(trace_from_dict(_raw(1.0))))
    assert any(r.decision.admitted for r in ordinary)
    assert not any(NOTE in r.reason for r in ordinary)
    # without a prior nothing is compared, and such jobs are admitted
    unprimed = list(replay(trace_from_dict(_raw(1e-4, prior="none"))))
    assert any(r.decision.admitted for r in unprimed)
    assert not any(NOTE in r.reason for r in unprimed)


def test_the_daemon_says_it_in_the_rejection(tmp_path: Path) -> None:
    raw = _raw(1e-4)
    inner = _controller(tmp_path, raw, 1.0)
    try:
        job = {
            k: v for k, v in cast(list[dict[str, Any]], raw["jobs"])[0].items() if k != "arrival"
        }
        view = asyncio.run(inner.submit(job))
    finally:
        inner.close()
    assert not view.decision.admitted and NOTE in view.decision.reason, view.decision.reason


def test_a_date_in_the_past_is_not_taken_for_another_unit(tmp_path: Path) -> None:
    """The note compared ``f(1)`` with the prior's utilities: a job of priority 50 whose
    sigmoid ``target`` (or deadline, with a half-life) lay years before its arrival is
    worth about 0 at any completion, and its rejection, after "is the date right?", went
    on "its utility is at most 0, over 1e+304 times below the utilities the price bounds'
    prior was made from ... in another unit", sending its user to an operator's prior for
    a slip of the date. The note now weighs the utility's own scale (a priority, a value)."""
    raw = _raw(1.0)
    first = {k: v for k, v in cast(list[dict[str, Any]], raw["jobs"])[0].items()}
    late = {"kind": "sigmoid", "priority": 50.0, "decay": 1.0, "target": -20_000.0}
    raw["jobs"] = [{**first, "id": "late", "utility": late}]
    (record,) = replay(trace_from_dict(raw))
    assert not record.decision.admitted and NOTE not in record.reason, record.reason
    small = {**late, "priority": 50e-4, "target": 3.0}
    raw["jobs"] = [{**first, "id": "small", "utility": small}]
    (record,) = replay(trace_from_dict(raw))  # a small unit is still told of
    assert not record.decision.admitted and NOTE in record.reason, record.reason

    inner = _controller(tmp_path, raw, 2e9)  # 2033: a deadline in 2020 is past
    try:
        del first["arrival"]
        past = {"kind": "deadline", "value": 50.0, "deadline": "2020-01-01T00:00:00Z",
                "half_life": 1}  # fmt: skip
        spec = prepare({**first, "id": "past", "utility": past}, inner.slots.times)
        view = asyncio.run(inner.submit(spec))
    finally:
        inner.close()
    reason = view.decision.reason
    assert not view.decision.admitted and "is the date right?" in reason, reason
    assert NOTE not in reason, reason


def test_replay_weighs_each_rejection_against_the_prior_not_the_moving_estimate() -> None:
    """The note compares a job with the prior (``estimate.fresh`` in the daemon), not with
    the estimate the jobs before it moved: on priorities 1000 times smaller, near the
    note's edge, the two disagree on some rejected jobs, and replay says what the prior
    says of every one."""
    from pricing.bound_estimate import units_note

    trace = trace_from_dict(_raw(1e-3))
    fresh = estimate = trace.estimate()
    differ = 0
    for record in replay(trace):
        job = record.decision.job
        estimate = estimate.observe(job)
        if record.decision.admitted:
            continue
        assert (NOTE in record.reason) == bool(units_note(fresh, job)), job.id
        differ += bool(units_note(fresh, job)) != bool(units_note(estimate, job))
    assert differ  # the test tells the two apart


def test_a_utility_at_the_least_float_is_told_of_in_finite_numbers() -> None:
    """Priority 5e-324 (the least float) lies e^748 below the prior's utilities, past
    the largest float: the note says "over 1e+304 times", not an OverflowError from
    the rejection's explanation."""
    raw = _raw(1.0)
    first = cast(list[dict[str, Any]], raw["jobs"])[0]
    tiny = {"kind": "sigmoid", "priority": 5e-324, "decay": 1.0, "target": 3.0}
    raw["jobs"] = [{**first, "id": "tiny", "utility": tiny}]
    (record,) = replay(trace_from_dict(raw))
    assert not record.decision.admitted and NOTE in record.reason, record.reason
    assert "over 1e+304 times below" in record.reason, record.reason
