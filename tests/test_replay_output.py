"""``replay --json``'s numbers (SPEC 6, controller/replay.py): each decision's wall time
as the clock gave it, the summary's percentiles and maximum over those times, and the
repricing of an ``"estimate"`` replay counted in the decision it is part of."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pricing
from controller.replay import replay, replay_json
from pricing.bound_estimate import BoundEstimate
from tests.test_units import base_trace

# the seconds each decision takes on the fake clock: all different, none round in ms
SECONDS = [0.00123456789, 0.0201, 0.00050004, 0.3, 0.0123, 0.00999, 0.0707]


def _trace(bounds: str = "oracle") -> pricing.Trace:
    """SECONDS' count of small jobs (W = 6 each) on base_trace's cluster, arriving 0 .. 2;
    the cluster takes some of them, not all."""
    raw = base_trace()
    first = raw["jobs"][0]
    raw["jobs"] = [
        {**copy.deepcopy(first), "id": f"j{i}", "arrival": min(i // 3, 2)}
        for i in range(len(SECONDS))
    ]
    raw["pricing"] = {"bounds": bounds}
    return pricing.trace_from_dict(raw)


def _clock(steps: list[float]) -> Callable[[], float]:
    """A clock that moves on by the next of ``steps`` each second call (the end of a
    decision), so that decision i takes ``steps[i]`` seconds."""
    calls: Iterator[int] = iter(range(1 << 30))
    now = [100.0]
    it = iter(steps)

    def clock() -> float:
        if next(calls) % 2 == 1:
            now[0] += next(it)
        return now[0]

    return clock


def test_each_decision_time_and_the_summary_are_the_clocks() -> None:
    """``decision_ms`` is the clock's time of the one decision, to 1e-4 ms; the summary's
    p50, p99 and max are those of the times decided (before, only ``>= 0`` was checked:
    a max read as the mean, a p99 as a p90, or times rounded to whole ms passed)."""
    trace = _trace()
    records = list(replay(trace, clock=_clock(SECONDS)))
    out = replay_json(trace, records)
    ms = [s * 1000.0 for s in SECONDS]
    assert [j["decision_ms"] for j in out["jobs"]] == [round(x, 4) for x in ms]
    assert out["jobs"][0]["decision_ms"] == 1.2346  # not 1, as round(ms) gives
    s = out["summary"]
    assert s["decision_ms_max"] == round(max(ms), 4) == 300.0
    assert s["decision_ms_p50"] == round(float(np.percentile(ms, 50)), 4) == 12.3
    assert s["decision_ms_p99"] == round(float(np.percentile(ms, 99)), 4)
    assert s["decision_ms_p99"] > round(float(np.percentile(ms, 90)), 4)
    assert 0 < s["admitted"] < len(SECONDS)  # both kinds of decision are timed


def test_an_estimates_repricing_is_part_of_the_decisions_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``"estimate"`` bounds, taking the job into the estimate and repricing are
    part of its decision, as in the daemon (the docstring of ``replay``): a fake clock
    moved on 2 s inside ``observe`` shows in every decision's time."""
    now = [0.0]
    observe = BoundEstimate.observe

    def slow_observe(self: BoundEstimate, job: Any) -> BoundEstimate:
        now[0] += 2.0
        return observe(self, job)

    monkeypatch.setattr(BoundEstimate, "observe", slow_observe)
    trace = _trace("estimate")
    records = list(replay(trace, clock=lambda: now[0]))
    assert [r.decision_ms for r in records] == [2000.0] * len(SECONDS)


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        ((1.0, None), "over max_search_steps = 1 "),
        ((None, 1e-9), "over max_search_mb = 1e-09 "),
    ],
)
def test_either_search_limit_alone_rejects_unsearched(
    limits: tuple[float | None, float | None], why: str
) -> None:
    """``replay(..., max_search_steps=...)`` without ``max_search_mb`` (and the other way
    round) holds each job to the one limit given, as the daemon's limits do each alone;
    without either, the same job is searched and admitted."""
    trace = pricing.trace_from_dict(base_trace())
    (searched,) = replay(trace)
    assert searched.decision.admitted
    (record,) = replay(trace, max_search_steps=limits[0], max_search_mb=limits[1])
    assert not record.decision.admitted and record.decision.best.payoff is None
    assert record.reason.startswith("not searched: ") and why in record.reason


def test_a_search_exactly_at_a_limit_is_searched() -> None:
    """A limit is the most a search may take: a job whose search takes exactly
    ``max_search_steps`` steps (or ``max_search_mb`` MiB) is searched, as the daemon's
    ``limits`` admit it; a hair less is refused unsearched."""
    from controller.limits import search_size

    trace = pricing.trace_from_dict(base_trace())
    (job,) = trace.jobs
    size = search_size(job, trace.cluster, trace.horizon - job.arrival)
    assert size.steps > 0 and size.megabytes > 0
    for steps, mb in ((size.steps, None), (None, size.megabytes)):
        (record,) = replay(trace, max_search_steps=steps, max_search_mb=mb)
        assert record.decision.admitted, (steps, mb)
        below = (steps and steps * (1 - 1e-9), mb and mb * (1 - 1e-9))
        (record,) = replay(trace, max_search_steps=below[0], max_search_mb=below[1])
        assert not record.decision.admitted and record.reason.startswith("not searched: ")


def test_a_job_priced_out_shows_its_payoff_and_nothing_of_its_schedule() -> None:
    """SPEC 6: a rejected job that has a feasible schedule, priced out, has its best
    payoff (a number) and ``cost``, ``jct``, ``utility`` null and no allocations, and the
    summary counts none of it. Before, every rejection tested had no schedule at all
    (payoff null), where the schedule's fields are null anyway."""
    from controller.replay import record_json

    raw = base_trace()
    prices = {r: 1000.0 for r in raw["resources"]}
    raw["pricing"] = {"U1": {r: 2000.0 for r in prices}, "U2": {r: 2000.0 for r in prices},
                      "L1": 1000.0, "L2": 1000.0}  # fmt: skip
    trace = pricing.trace_from_dict(raw)
    records = list(replay(trace))
    (record,) = records
    best = record.decision.best
    assert not record.decision.admitted and best.payoff is not None and best.payoff < 0
    assert best.cost is not None and best.jct is not None  # the schedule priced out
    out = record_json(record, trace.cluster)
    assert out["payoff"] == best.payoff
    assert out["cost"] is None and out["jct"] is None and out["utility"] is None
    assert out["allocations"] == [] and out["reason"]
    summary = replay_json(trace, records)["summary"]
    assert summary["total_utility"] == 0.0 and summary["total_cost"] == 0.0
    assert (summary["admitted"], summary["rejected"]) == (0, 1)
    # the same job on oracle bounds is admitted: no reason, as null
    trace = pricing.trace_from_dict(base_trace())
    (admitted,) = replay(trace)
    assert admitted.decision.admitted
    assert record_json(admitted, trace.cluster)["reason"] is None


@pytest.mark.parametrize("bounds", ["oracle", "estimate"])
def test_the_l_factor_scales_the_bounds_of_either_kind(bounds: str) -> None:
    """``l_factor`` (the paper's Fig. 6) scales every L used, the estimate's too, which
    is set anew before each decision: L 1000 times higher prices out the job an unscaled
    replay admits, whatever kind of bounds the trace has."""
    raw = base_trace()
    raw["pricing"] = {"bounds": bounds}
    trace = pricing.trace_from_dict(raw)
    (plain,) = replay(trace)
    (scaled,) = replay(trace, l_factor=1000.0)
    assert plain.decision.admitted and not scaled.decision.admitted
    assert scaled.decision.best.payoff is not None and scaled.decision.best.payoff < 0
