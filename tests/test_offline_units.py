"""The offline comparison gives the same answer whatever unit the utilities are in
(:mod:`pricing.offline_units`).

Before, the solvers' absolute tolerances decided by unit alone: priorities times
``1e-8`` gave "optimal" allocations worth half the optimum, with "certified" bounds below
it, or no allocation at all; times ``1e10`` the master LP failed; one job of ``1e300``
failed every method but the bare ILP, which then proved nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from controller.cli import main
from pricing import Trace, trace_from_dict
from pricing.offline import lp_relaxation, solve_offline
from pricing.offline_solve import solve
from pricing.offline_units import AS_GIVEN, in_solver_units, utility_scale
from pricing.workload import generate_trace


def _raw(seed: int, times: float = 1.0) -> dict[str, Any]:
    raw = generate_trace(
        np.random.default_rng(seed), n_jobs=8, n_worker_servers=2, n_ps_servers=2, horizon=8
    )
    raw["pricing"] = {"bounds": "oracle"}
    for job in cast(list[dict[str, Any]], raw["jobs"]):
        job["utility"]["priority"] *= times
    return raw


def _trace(seed: int, times: float = 1.0) -> Trace:
    return trace_from_dict(_raw(seed, times))


@pytest.mark.parametrize("method", ["ilp", "auto"])
@pytest.mark.parametrize("times", [1e-8, 1e10])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_optimum_does_not_depend_on_the_unit(seed: int, times: float, method: Any) -> None:
    as_given = solve(_trace(seed), method=method, time_limit=60)
    assert as_given.status == "optimal" and as_given.optimum is not None
    result = solve(_trace(seed, times), method=method, time_limit=60)
    assert result.status == "optimal" and result.optimum is not None
    assert result.bound is not None and result.bound >= result.optimum
    assert result.optimum == pytest.approx(as_given.optimum * times, rel=1e-9)
    assert result.bound == pytest.approx(as_given.optimum * times, rel=1e-7)
    admitted = [j for j in result.jobs if j.admitted]
    assert math.fsum(j.utility for j in admitted) == pytest.approx(result.optimum, rel=1e-12)


def test_one_job_worth_1e300_is_solved_by_every_method() -> None:
    raw = _raw(1)
    raw["jobs"][3]["utility"]["priority"] = 1e300
    trace = trace_from_dict(raw)
    for method in ("ilp", "colgen", "auto"):
        result = solve(trace, method=method, time_limit=60)
        assert result.optimum is not None and result.bound is not None, method
        assert result.jobs[3].admitted, method
        best = trace.jobs[3].best_utility
        assert best * (1 - 1e-9) <= result.bound <= result.optimum * (1 + 1e-6), method


def test_solve_offline_and_the_lp_relaxation_are_in_the_traces_units() -> None:
    as_given = solve_offline(_trace(2), time_limit=60)
    scaled = solve_offline(_trace(2, 1e-9), time_limit=60)
    assert as_given.optimum is not None and scaled.optimum is not None
    assert scaled.optimum == pytest.approx(as_given.optimum * 1e-9, rel=1e-9)
    assert lp_relaxation(_trace(2, 1e-9)) == pytest.approx(
        lp_relaxation(_trace(2)) * 1e-9, rel=1e-7
    )


def test_the_scale_is_a_power_of_two_and_ordinary_traces_keep_theirs() -> None:
    assert utility_scale(_trace(1)) == 1.0  # priorities 1-100
    for times in (1e-8, 1e10, 1e300 / 100, 1e-300):
        trace = _trace(1, times)
        scale = utility_scale(trace)
        mantissa, _ = math.frexp(scale)
        assert mantissa == 0.5  # a power of two: dividing by it is exact
        scaled = in_solver_units(trace, scale)
        best = max(j.best_utility for j in scaled.jobs)
        assert 1.0 <= best < 2.0
        assert utility_scale(scaled) == 1.0  # solved as given once in the solvers' units
        for mine, theirs in zip(scaled.jobs, trace.jobs, strict=True):
            d = np.arange(1, 9)
            assert np.array_equal(mine.utility.values(d) * scale, theirs.utility.values(d))
            assert mine.utility.to_dict() == theirs.utility.to_dict()
    assert in_solver_units(_trace(1), 1.0).jobs[0].utility.to_dict()["priority"] < AS_GIVEN[1]


def test_offline_prints_the_optimum_in_the_traces_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.json"
    results = []
    for times in (1.0, 1e-8):
        path.write_text(json.dumps(_raw(3, times)))
        assert main(["offline", str(path), "--json", "--no-progress"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    plain, small = results
    assert plain["status"] == small["status"] == "optimal"
    assert small["optimum"] == pytest.approx(plain["optimum"] * 1e-8, rel=1e-9)
    # not the online utility: SPEC 5 admits a job iff its payoff is over 1e-9, in the
    # trace's units, so the online algorithm's decisions do depend on the unit


def test_the_ilps_progress_reports_its_incumbent_and_bound_in_the_traces_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HiGHS's search said nothing between "solving ILP ..." and its end (``--method ilp
    --time-limit 600``: ten silent minutes, and Ctrl-C left no bound on the screen). Now
    its incumbent and bound come every ``PROGRESS_SECONDS`` (here at every callback), in
    the trace's units though the solver sees its own."""
    from pricing import offline_backends

    monkeypatch.setattr(offline_backends, "PROGRESS_SECONDS", 0.0)
    times = 1e-8
    assert utility_scale(_trace(2, times)) != 1.0  # solved in other units
    lines: list[str] = []
    result = solve_offline(_trace(2, times), time_limit=60, progress=lines.append)
    assert result.status == "optimal" and result.optimum is not None
    reports = [x for x in lines if x.startswith("ILP: best allocation ")]
    assert reports, lines
    last = reports[-1].split(", ")
    best = float(last[0].removeprefix("ILP: best allocation "))
    bound = float(last[1].removeprefix("solver's bound "))
    assert best == pytest.approx(result.optimum, rel=1e-5)
    assert result.optimum - 1e-6 * abs(result.optimum) <= bound <= 2 * result.optimum


@pytest.mark.parametrize(
    ("best", "scale"),
    [
        (AS_GIVEN[0], 1.0),  # both ends of AS_GIVEN are solved as given
        (AS_GIVEN[1], 1.0),
        (AS_GIVEN[1] * (1 + 2.0**-20), AS_GIVEN[1]),  # just past it: into [1, 2)
        (AS_GIVEN[1] * 3, AS_GIVEN[1] * 2),
        (0.5, 0.5),  # just under 1: 1 is the bottom of [1, 2)
        (0.75, 0.5),
    ],
)
def test_the_scale_brings_the_best_utility_into_1_2_only_outside_as_given(
    best: float, scale: float
) -> None:
    raw = _raw(1)
    for job in cast(list[dict[str, Any]], raw["jobs"]):
        # worth exactly ``best`` by a deadline past the horizon
        job["utility"] = {"kind": "deadline", "value": best, "deadline": 100}
    trace = trace_from_dict(raw)
    assert max(j.best_utility for j in trace.jobs) == best
    assert utility_scale(trace) == scale
    # in the solvers' units: worth best / scale, in values and logs alike
    d = np.arange(1, 9)
    for solved in in_solver_units(trace, scale).jobs:
        assert np.array_equal(solved.utility.values(d), np.full(8, best / scale))
        assert np.allclose(solved.utility.log_values(d), math.log(best / scale))
