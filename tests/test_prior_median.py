"""A prior calibrated from a daemon's store is the median of its submitters' priors
(pricing/prior_median.py, ``oasis calibrate --store``): one tenant's many jobs in another
unit do not make the prior every tenant is then priced from."""

from __future__ import annotations

import copy
import json
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cli import main
from controller.replay import replay
from pricing import trace_from_dict
from pricing.bound_estimate import BoundEstimate, calibrate
from pricing.bound_prior import Points, Prior, prior_from_dict
from pricing.cluster import Cluster
from pricing.job import Job
from pricing.prior_median import _median_points, _quantile, median_prior
from pricing.workload import generate_trace
from tests.servers import Postgres
from tests.stores import decided_store

HORIZON = 40


def _trace(seed: int, n_jobs: int, scale: float = 1.0) -> dict[str, Any]:
    """A trace of 12 + 12 servers, estimated bounds, every priority times ``scale``."""
    raw: dict[str, Any] = generate_trace(
        np.random.default_rng(seed), n_jobs=n_jobs, n_worker_servers=12, n_ps_servers=12,
        horizon=HORIZON,
    )  # fmt: skip
    raw["pricing"] = {"bounds": "estimate"}
    for job in raw["jobs"]:
        job["utility"]["priority"] *= scale
    return raw


def _jobs(raw: dict[str, Any]) -> list[Job]:
    return list(trace_from_dict(raw).jobs)


def _admitted(raw: dict[str, Any], prior: Prior) -> int:
    """Jobs of ``raw`` admitted in a replay starting from ``prior``."""
    raw = copy.deepcopy(raw)
    raw["pricing"]["prior"] = prior.to_dict()
    return sum(r.decision.admitted for r in replay(trace_from_dict(raw)))


ALICE = _trace(1, 60)
CAROL = _trace(2, 60)
BOB = _trace(3, 180, scale=1e7)  # a tenant's slip of units, or a flood on purpose
CLUSTER: Cluster = trace_from_dict(ALICE).cluster
ORDINARY = _trace(4, 60)  # the jobs priced from the prior


def test_one_tenants_flood_in_another_unit_does_not_make_the_prior() -> None:
    """All jobs in one distribution (as ``calibrate --store`` did): the flood's values
    set the prior and ordinary jobs are priced out of an idle cluster. The median of
    the three submitters' priors admits about as many as the ordinary jobs' own."""
    own = _admitted(ORDINARY, calibrate(_jobs(ALICE) + _jobs(CAROL), CLUSTER))
    pooled = _admitted(ORDINARY, calibrate(_jobs(ALICE) + _jobs(BOB) + _jobs(CAROL), CLUSTER))
    priors = [calibrate(_jobs(t), CLUSTER) for t in (ALICE, BOB, CAROL)]
    median = _admitted(ORDINARY, median_prior(priors, 32, 40.0, "t"))
    assert own >= 10 and pooled <= own // 4, (own, pooled)  # the harm, as it was
    assert median >= 0.9 * own, (median, own)


def test_one_prior_is_itself_and_two_take_the_lower() -> None:
    alice = calibrate(_jobs(ALICE), CLUSTER, source="a")
    assert median_prior([alice], 32, 12.0, "s") == Prior(
        12.0, alice.best, alice.worker, alice.ps, "s"
    )
    bob = calibrate(_jobs(BOB), CLUSTER)
    two = median_prior([bob, alice], 32, 40.0, "s")
    start = BoundEstimate.start(CLUSTER, two).bounds()
    theirs = BoundEstimate.start(CLUSTER, alice).bounds()
    assert start is not None and theirs is not None
    np.testing.assert_allclose(start.floor1, theirs.floor1, atol=0.2)
    np.testing.assert_allclose(start.log_u1, theirs.log_u1, atol=0.2)
    assert prior_from_dict(two.to_dict()) == two  # a prior the daemon reads


_points = st.lists(
    st.tuples(st.floats(-50, 50), st.floats(0.01, 1.0)), min_size=1, max_size=12
).map(lambda pairs: tuple(sorted(dict(pairs).items())))


@given(st.lists(_points, min_size=2, max_size=5), st.integers(1, 40))
@settings(max_examples=150, deadline=None)
def test_the_median_of_quantile_functions(lists: list[Points], points: int) -> None:
    """At every sampled level the result's quantile is the lower median of the lists';
    shares are > 0 and sum to 1 (to the rounding of 6 digits); values ascend."""
    out = _median_points(lists, points)
    assert all(s > 0 for _x, s in out)
    assert abs(sum(s for _x, s in out) - 1.0) < 1e-5
    assert [x for x, _s in out] == sorted({x for x, _s in out})
    for k in range(points):
        level = (k + 0.5) / points
        values = sorted(_quantile(p, level) for p in lists)
        assert _quantile(out, level) == values[(len(values) - 1) // 2]


# -- oasis calibrate --store -----------------------------------------------------------


def _store(tmp_path: Path, tenants: dict[str, dict[str, Any]]) -> str:
    """A SQLite store whose daemon decided every tenant's jobs, in turns."""
    jobs = {
        name: [{**entry, "id": f"{name}-{entry['id']}"} for entry in raw["jobs"]]
        for name, raw in tenants.items()
    }
    return decided_store(tmp_path, ALICE, HORIZON, jobs).database_url


def test_calibrate_a_store_of_three_submitters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _store(tmp_path, {"alice": ALICE, "bob": BOB, "carol": CAROL})
    out = tmp_path / "prior.json"
    assert main(["calibrate", "--store", url, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "3 submitters' jobs (bob 180, alice 60, carol 60)" in err, err
    assert "combined by their median" in err and "even number" not in err
    made = prior_from_dict(json.loads(out.read_text()))
    own = _admitted(ORDINARY, calibrate(_jobs(ALICE) + _jobs(CAROL), CLUSTER))
    assert _admitted(ORDINARY, made) >= 0.9 * own

    # each submitter's newest: bob's 180 push none of alice's out
    assert main(["calibrate", "--store", url, "--newest", "150", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "(alice 50, bob 50, carol 50)" in err and "the newest 50 of each submitter" in err

    # one submitter's jobs alone, as its own calibration
    assert main(["calibrate", "--store", url, "--submitter", "alice", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "60 jobs -> a prior" in err and "submitters" not in err
    alone = calibrate(_jobs(ALICE), CLUSTER, source="oasis calibrate --store")
    assert prior_from_dict(json.loads(out.read_text())) == prior_from_dict(alone.to_dict())

    # two: the lower median, said
    assert main(["calibrate", "--store", url, "--submitter", "alice", "--submitter", "bob",
                 "-o", str(out)]) == 0  # fmt: skip
    assert "2 submitters, an even number" in capsys.readouterr().err
    assert main(["calibrate", "--store", url, "--submitter", "dave"]) == 2
    assert "holds no decided job of dave" in capsys.readouterr().err
    # a slip of a name among others is said, not calibrated without a word
    assert main(["calibrate", "--store", url, "--submitter", "alice", "--submitter", "alcie",
                 "--submitter", "-", "--to", "99", "-o", str(out)]) == 0  # fmt: skip
    assert (
        "note: --submitter: no decided job of - (no token's), 'alcie' up to slot 99; "
        "calibrated from the others'" in capsys.readouterr().err
    )


def test_calibrate_a_store_without_tokens_is_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Jobs of no submitter (no ``[auth]``): one prior of them all, ``-`` names them."""
    url = _store(tmp_path, {"": ALICE})
    with closing(sqlite3.connect(tmp_path / "oasis.db")) as db:
        assert db.execute("SELECT COUNT(*) FROM jobs WHERE submitter IS NULL").fetchone() == (60,)
    out = tmp_path / "prior.json"
    for extra in ([], ["--submitter", "-"]):
        assert main(["calibrate", "--store", url, *extra, "-o", str(out)]) == 0
        assert "60 jobs -> a prior" in capsys.readouterr().err
        made = calibrate(_jobs(ALICE), CLUSTER, source="oasis calibrate --store")
        assert prior_from_dict(json.loads(out.read_text())) == prior_from_dict(made.to_dict())


def test_calibrate_a_postgresql_store_as_its_sqlite_copy(
    tmp_path: Path, postgres: Postgres, capsys: pytest.CaptureFixture[str]
) -> None:
    """The submitters' newest read from PostgreSQL (its NULL submitter, its LIMITs)
    make the prior they make from SQLite."""
    url = _store(tmp_path, {"": ALICE, "bob": BOB, "carol": CAROL})
    pg = postgres.new_database()
    assert main(["store", "copy", "--from", url, "--to", pg, "--no-progress"]) == 0
    made: list[Any] = []
    for store in (url, pg):
        out = tmp_path / f"prior-{len(made)}.json"
        assert main(["calibrate", "--store", store, "--newest", "120", "-o", str(out)]) == 0
        assert "(- 40, bob 40, carol 40)" in capsys.readouterr().err
        made.append(json.loads(out.read_text()))
    assert made[0] == made[1]


def test_a_quantile_at_an_exact_share_is_the_value_that_reaches_it() -> None:
    """The quantile at level p is the smallest value whose cumulative share *reaches* p:
    at a share summing exactly to the level, that value, not the next."""
    points: Points = ((0.0, 0.25), (1.0, 0.75))
    assert _quantile(points, 0.25) == 0.0
    assert _quantile(points, 0.2500001) == 1.0
    picked = _median_points([points, points, ((0.0, 0.5), (2.0, 0.5))], 2)  # levels 1/4, 3/4
    assert picked == ((0.0, 0.5), (1.0, 0.5))


def test_floor_per_job_is_the_median_of_the_submitters_too() -> None:
    """Each submitter's mean weight per job in L's quantile (``floor_per_job``) is
    combined as the lists are: by the lower median, so one tenant of jobs worth far
    below its own reference (weight near 1e-6) cannot set how much the prior weighs."""
    alice = calibrate(_jobs(ALICE), CLUSTER)

    def per_job(*values: float) -> float:
        priors = [
            replace(alice, worker=replace(alice.worker, floor_per_job=v), ps=alice.ps)
            for v in values
        ]
        return median_prior(priors, 8, 40.0, "s").worker.floor_per_job

    assert per_job(0.9, 0.2, 0.5) == 0.5
    assert per_job(0.9, 1e-6) == 1e-6
    assert per_job(0.3, 0.9, 0.8, 0.1) == 0.3
