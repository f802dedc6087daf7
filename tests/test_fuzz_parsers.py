"""Fuzz the job spec and trace parsers: any input either parses or raises SpecError,
each of whose problems names a field and a reason; never another exception, never a hang.

Two kinds of input, both drawn by hypothesis: arbitrary JSON-like values, and valid
specs with a few fields replaced, removed or added, the new values biased to the edges
of floating point (0, subnormals, 1e308, inf, nan, integers past 2**63). NumPy warnings
are errors under the test configuration, so an overflow that produces a garbage number
fails here too. The examples are bounded (derandomized, 300 per test), so the file runs
in seconds; ``OASIS_FUZZ_EXAMPLES=20000`` searches longer, with a random seed.
"""

from __future__ import annotations

import copy
import json
import math
import os
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pricing import SpecError, Trace, job_from_dict, trace_from_dict
from pricing.cluster import cluster_from_dict
from pricing.job import Job

# A hang guard, not a speed goal: a parse takes about a millisecond, and a parser that
# loops over a number taken from the input would take hours. The deadline reports slow
# examples; pytest-timeout (pyproject.toml) ends a test that really hangs.
EXAMPLES = int(os.environ.get("OASIS_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=EXAMPLES or 300,
    derandomize=not EXAMPLES,
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow],
)

EDGE_NUMBERS: list[Any] = [
    0, -1, 1, 2**31, 2**63, 10**30, 10**400, -(10**400),
    0.0, -0.0, 5e-324, 1e-320, 1e-300, 1e-12, 0.5, 1.0 - 1e-16, 1e15, 1e300, 1.7e308,
    math.inf, -math.inf, math.nan, True, False,
]  # fmt: skip

CLUSTER_RAW: dict[str, Any] = {
    "resources": ["gpu", "cpu", "mem", "bandwidth"],
    "servers": [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 4, "cpu": 32, "mem": 244,
                                                       "bandwidth": 25}},
        {"name": "w1", "kind": "worker", "capacity": {"gpu": 8, "cpu": 64, "mem": 488,
                                                       "bandwidth": 40}},
        {"name": "p0", "kind": "ps", "capacity": {"cpu": 36, "mem": 60, "bandwidth": 25}},
    ],
}  # fmt: skip
CLUSTER = cluster_from_dict(CLUSTER_RAW["resources"], CLUSTER_RAW["servers"])

VALID_JOB: dict[str, Any] = {
    "id": "j0",
    "arrival": 0,
    "epochs": 2,
    "chunks": 8,
    "minibatches": 50,
    "tau": 0.01,
    "grad_mb": 100,
    "worker": {"gpu": 1, "cpu": 4, "mem": 8, "bandwidth": 1},
    "ps": {"cpu": 2, "mem": 8, "bandwidth": 5},
    "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
}
TABLE_UTILITY: dict[str, Any] = {"kind": "table", "values": [9.0, 7.5, 3.0, 0.5]}


def valid_trace() -> dict[str, Any]:
    second = {**copy.deepcopy(VALID_JOB), "id": "j1", "arrival": 2, "utility": TABLE_UTILITY}
    return {
        "version": 1,
        "horizon": 24,
        "slot_seconds": 3600,
        **copy.deepcopy(CLUSTER_RAW),
        "pricing": {"bounds": "oracle"},
        "jobs": [copy.deepcopy(VALID_JOB), second],
    }


EXPLICIT_PRICING: dict[str, Any] = {
    "L1": 1e-3,
    "L2": 1e-3,
    "U1": {"gpu": 40.0, "cpu": 5.0, "bandwidth": 2.0},
    "U2": {"cpu": 5.0, "bandwidth": 3.0},
}

# -- strategies ----------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EDGE_NUMBERS),
    st.text(max_size=12),
    st.sampled_from(["", " ", "gpu", "bandwidth", "sigmoid", "table", "oracle", "worker"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=10), inner, max_size=4),
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside nested dicts and lists (the root excluded)."""
    out: list[tuple[Any, ...]] = []
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _parent(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        root = root[key]
    return root


@st.composite
def mutated(draw: st.DrawFn, base: Any, max_mutations: int = 3) -> Any:
    """``base`` with 1..max_mutations values replaced, removed or added."""
    value = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(value)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _parent(value, path)
        action = draw(st.sampled_from(["replace", "replace", "edge", "remove", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "edge":
            parent[path[-1]] = draw(st.sampled_from(EDGE_NUMBERS))
        elif action == "remove":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
        else:
            parent.append(draw(json_values))
    return value


# -- checks --------------------------------------------------------------------------


def _parse_job(raw: Any) -> Job | SpecError:
    try:
        return job_from_dict(
            raw, CLUSTER, slot_seconds=3600.0, slots_available=lambda a: 24 - a, field="job"
        )
    except SpecError as err:
        return err


def _parse_trace(raw: Any) -> Trace | SpecError:
    try:
        return trace_from_dict(raw)
    except SpecError as err:
        return err


def _check_error(err: SpecError) -> None:
    assert err.problems
    for problem in err.problems:
        assert problem.field.strip(), f"a problem without a field: {err}"
        assert problem.reason.strip(), f"a problem without a reason: {err}"
    assert str(err)


def _check_job(job: Job) -> None:
    """A job that parsed has the invariants the search relies on."""
    assert job.work >= 1 and job.chunks >= 1
    assert 0 < job.ps_ratio <= 1
    assert np.isfinite(job.worker).all() and np.isfinite(job.ps).all()
    assert math.isfinite(job.minibatch_slots) and job.minibatch_slots > 0


def _check_trace(trace: Trace) -> None:
    for job in trace.jobs:
        _check_job(job)
    b = trace.bounds
    assert math.isfinite(b.log_l1) and math.isfinite(b.log_l2)
    assert not np.isnan(b.log_u1).any() and not np.isnan(b.log_u2).any()


def _check_job_outcome(raw: Any) -> None:
    """``raw`` parses to a sound job or fails with a clear error, nothing else."""
    out = _parse_job(raw)
    if isinstance(out, SpecError):
        _check_error(out)
    else:
        _check_job(out)


def _check_trace_outcome(raw: Any) -> None:
    """``raw`` parses to a sound trace or fails with a clear error, nothing else."""
    out = _parse_trace(raw)
    if isinstance(out, SpecError):
        _check_error(out)
    else:
        _check_trace(out)


def test_the_valid_examples_parse() -> None:
    assert isinstance(_parse_job(VALID_JOB), Job)
    assert isinstance(_parse_job({**VALID_JOB, "utility": TABLE_UTILITY}), Job)
    assert isinstance(_parse_trace(valid_trace()), Trace)
    assert isinstance(_parse_trace({**valid_trace(), "pricing": EXPLICIT_PRICING}), Trace)


@SETTINGS
@given(json_values)
def test_job_parser_on_arbitrary_values(raw: Any) -> None:
    _check_job_outcome(raw)


@SETTINGS
@given(st.one_of(mutated(VALID_JOB), mutated({**VALID_JOB, "utility": TABLE_UTILITY})))
def test_job_parser_on_mutated_specs(raw: Any) -> None:
    _check_job_outcome(raw)


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(VALID_JOB)), st.sampled_from(EDGE_NUMBERS)))
def test_job_parser_on_extreme_numbers(changes: dict[str, Any]) -> None:
    """Every scalar field at once at the edges of float64 and int64."""
    raw = {**VALID_JOB, **changes}
    _check_job_outcome(raw)


@SETTINGS
@given(
    st.sampled_from(["gpu", "cpu", "mem", "bandwidth"]),
    st.sampled_from(["worker", "ps"]),
    st.sampled_from(EDGE_NUMBERS),
    st.sampled_from([1, 8, 10**6, 10**12, 10**18, 10**30]),
)
def test_job_parser_on_extreme_demands_and_chunks(
    resource: str, side: str, amount: Any, chunks: int
) -> None:
    """Tiny demands make room for huge numbers of workers per server; with many chunks
    the feasibility check must not count them one by one."""
    raw = copy.deepcopy(VALID_JOB)
    raw[side][resource] = amount
    raw["chunks"] = chunks
    _check_job_outcome(raw)


@SETTINGS
@given(json_values)
def test_trace_parser_on_arbitrary_values(raw: Any) -> None:
    _check_trace_outcome(raw)


@SETTINGS
@given(
    st.one_of(
        mutated(valid_trace(), max_mutations=4),
        mutated({**valid_trace(), "pricing": EXPLICIT_PRICING}, max_mutations=4),
    )
)
def test_trace_parser_on_mutated_traces(raw: Any) -> None:
    _check_trace_outcome(raw)


@pytest.mark.parametrize(
    "text",
    ["", "[]", "null", '{"version": 1}', '{"version": 1, "horizon": 1e999}', "[" * 50 + "]" * 50],
)
def test_trace_parser_on_decoded_json_documents(text: str) -> None:
    """What ``oasis replay`` hands the parser after ``json.loads``."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return
    out = _parse_trace(raw)
    assert isinstance(out, SpecError)
    _check_error(out)
