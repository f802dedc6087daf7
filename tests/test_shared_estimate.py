"""The per-submitter estimate (pricing/shared_estimate.py): one submitter decides as the
lone estimate (replays), one tenant's flood of jobs worth 1e9 moves the bounds no further
than the other voters allow, one job still moves them by at most e^STEP, and the state
reads back (the lone estimate's stored format too)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pricing import trace_from_dict
from pricing.bound_estimate import STEP, BoundEstimate
from pricing.default_prior import default_prior
from pricing.prices import PriceBounds
from pricing.shared_estimate import SharedEstimate, _stacked
from pricing.trace import Trace
from pricing.utility import Sigmoid
from tests.test_bound_estimate import CLUSTER, _job, _logs, _trace, job_specs


def _ordinary(seed: int, n_jobs: int = 60) -> Trace:
    return trace_from_dict(_trace(seed, n_jobs=n_jobs, prior="default"))


def _inflated(seed: int, n_jobs: int, priority: float = 1e9) -> Trace:
    """A tenant's jobs with every priority set to ``priority`` (a slip of units)."""
    raw = _trace(seed, n_jobs=n_jobs, prior="default")
    for job in raw["jobs"]:
        job["utility"] = {**job["utility"], "priority": priority}
    return trace_from_dict(raw)


def _fresh() -> BoundEstimate:
    return BoundEstimate.start(CLUSTER, default_prior())


def test_one_submitter_is_the_lone_estimate() -> None:
    """Every replay, and a daemon without [auth], has one submitter: its bounds are the
    lone estimate's, bit for bit, after every job."""
    lone, shared = _fresh(), SharedEstimate.start(_fresh())
    first, alone = shared.bounds(), lone.bounds()
    assert first is not None and alone is not None and first.same_as(alone)
    for job in _ordinary(3).jobs:
        lone, shared = lone.observe(job), shared.observe(job, "alice")
        a, b = lone.bounds(0.8, 1.2, 0.25), shared.bounds(0.8, 1.2, 0.25)
        assert a is not None and b is not None and a.same_as(b)
    assert shared.jobs == lone.jobs == 60


def _between(x: PriceBounds, lo: PriceBounds, hi: PriceBounds) -> bool:
    """Every log bound of ``x`` lies within those of ``lo`` and ``hi`` (either order)."""
    a, b, c = _logs(x), _logs(lo), _logs(hi)
    return bool((x.log_u1 >= x.floor1).all()) and bool(
        (a >= np.minimum(b, c) - 1e-12).all() and (a <= np.maximum(b, c) + 1e-12).all()
    )


def test_a_tenants_flood_moves_the_bounds_no_further_than_the_others_allow() -> None:
    """Bob sends 300 jobs worth 1e9 amid alice's 60 ordinary ones: his own estimate
    walks up to his values (the lone estimate would, for everyone), but the bounds in
    use stay between alice's estimate and the prior; with a third tenant, between the
    two honest ones."""
    shared = SharedEstimate.start(_fresh())
    lone = _fresh()
    alice, bob = _ordinary(5).jobs, _inflated(6, 300).jobs
    for i, job in enumerate(bob):
        if i < len(alice):
            shared, lone = shared.observe(alice[i], "alice"), lone.observe(alice[i])
        shared, lone = shared.observe(job, "bob"), lone.observe(job)
    used, mine, prior = shared.bounds(), shared.of("alice").bounds(), _fresh().bounds()
    flooded, bobs = lone.bounds(), shared.of("bob").bounds()
    assert used is not None and mine is not None and prior is not None
    assert flooded is not None and bobs is not None
    assert _between(used, mine, prior)
    # the flood would have raised L by a factor of thousands for everyone
    assert (bobs.floor1 - mine.floor1).min() > 5 and (flooded.floor1 - mine.floor1).min() > 5
    assert (used.floor1 - np.maximum(mine.floor1, prior.floor1)).max() <= 1e-12

    carol = SharedEstimate.start(_fresh())
    for job in _ordinary(7).jobs:
        shared = shared.observe(job, "carol")
        carol = carol.observe(job, "carol")
    used = shared.bounds()
    assert used is not None and _between(used, mine, carol.bounds())  # type: ignore[arg-type]
    assert [v for v, _ in shared.voters()] == ["alice", "bob", "carol"]


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), job_specs()), max_size=12))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_job_moves_the_bounds_from_the_prior_by_more_than_e_to_the_step(
    steps: list[tuple[str, dict[str, Any]]],
) -> None:
    """Whoever sends it, one job moves every bound in use away from the prior's by at
    most e^STEP (toward it, a newcomer's vote may take them at once), all stay finite,
    and U >= L."""
    shared = SharedEstimate.start(_fresh())
    before = shared.bounds()
    assert before is not None
    home = _logs(before)
    for i, (who, spec) in enumerate(steps):
        job = _job(spec, i)
        if job is None:
            continue
        shared = shared.observe(job, who)
        after = shared.bounds()
        assert after is not None
        a, b = _logs(before), _logs(after)
        assert np.isfinite(b).all()
        away = np.abs(b - home) - np.abs(a - home)
        assert away.max() <= STEP + 1e-9, (who, spec, b - a)
        assert np.abs(b - a).max() <= STEP + 1e-9 or shared.lag is None
        assert (after.log_u1 >= after.floor1).all() and (after.log_u2 >= after.floor2).all()
        before = after


def test_the_state_reads_back_and_the_lone_format_is_the_nameless_submitter() -> None:
    shared = SharedEstimate.start(_fresh())
    jobs = _ordinary(9, n_jobs=12).jobs
    for i, job in enumerate(jobs):
        shared = shared.observe(job, (None, "alice", "bob")[i % 3])
    back = SharedEstimate.from_dict(copy.deepcopy(shared.to_dict()), _fresh())
    assert back is not None and back.fits(CLUSTER)
    assert back.to_dict() == shared.to_dict() and back.jobs == 12
    a, b = shared.bounds(), back.bounds()
    assert a is not None and b is not None and a.same_as(b)
    lone = _fresh()
    for job in jobs:
        lone = lone.observe(job)
    old = SharedEstimate.from_dict(lone.to_dict(), _fresh())
    assert old is not None and old.of(None).to_dict() == lone.to_dict()
    wrong = {"format": "per-submitter", "version": 9, "submitters": []}
    unreadable = {"format": "per-submitter", "version": 2, "submitters": ["x"], "states": {}}
    bad: Any
    for bad in (wrong, unreadable, [], None):
        assert SharedEstimate.from_dict(bad, _fresh()) is None
    described = shared.describe(CLUSTER.resources)
    assert described["jobs"] == 12
    assert [(v["name"], v["jobs"]) for v in described["submitters"]] == [
        ("-", 4),
        ("alice", 4),
        ("bob", 4),
    ]
    assert all(0 < v["prior_share"] < 1 for v in described["submitters"])
    assert "median of 3 in use (3 submitters)" in described["method"]


def _of(bounds: PriceBounds | None) -> np.ndarray:
    assert bounds is not None
    return _stacked(bounds)


def test_a_new_voter_moves_the_bounds_toward_the_prior_at_once() -> None:
    """A submitter's first job adds a voter (and the prior's vote), which can move the
    median by a rank at once. Toward the prior it is taken at once: bob arriving after
    alice flooded alone brings the bounds back with his first job. (Away from the prior
    they follow by at most e^STEP a job: the property test above.)"""
    shared = SharedEstimate.start(_fresh())
    home = _of(_fresh().bounds())
    for job in _inflated(11, 80).jobs:  # alice alone, far above the prior
        shared = shared.observe(job, "alice")
    alone = _of(shared.bounds())
    assert shared.lag is None
    shared = shared.observe(_ordinary(12).jobs[0], "bob")
    back = _of(shared.bounds())
    assert shared.lag is None
    assert (np.abs(back - home) <= np.abs(alone - home) + 1e-12).all()
    assert (alone - back).max() > 1  # a jump, by far more than a step


def test_the_head_and_the_submitters_states_are_kept_apart() -> None:
    """A store keeps the head (names, lag) in one row and each submitter's state in its
    own, so a decision rewrites one submitter's; a missing state starts afresh."""
    shared = SharedEstimate.start(_fresh())
    for i, job in enumerate(_ordinary(17, n_jobs=9).jobs):
        shared = shared.observe(job, ("alice", "bob", "carol")[i % 3])
    head = shared.head()
    assert head["submitters"] == ["alice", "bob", "carol"] and "states" not in head
    states = {name: shared.state(name) for name in head["submitters"]}
    back, lost = SharedEstimate.from_parts(head, states, _fresh())
    assert back is not None and lost == [] and back.to_dict() == shared.to_dict()
    partial, lost = SharedEstimate.from_parts(head, {"alice": states["alice"]}, _fresh())
    assert partial is not None and lost == ["bob", "carol"]
    assert partial.of("bob").jobs == 0 and partial.of("alice").jobs == 3


def test_a_lag_is_kept_with_the_state() -> None:
    """The gap between the bounds in use and the median is part of the stored state, so
    a restarted daemon prices as the stopped one did."""
    shared = SharedEstimate.start(_fresh())
    for i, job in enumerate(_ordinary(16, n_jobs=6).jobs):
        shared = shared.observe(job, ("alice", "bob")[i % 2])
    lag = np.full((4, len(CLUSTER.resources)), 0.05)
    lagging = SharedEstimate(shared.fresh, shared.submitters, lag=lag)
    state = SharedEstimate.from_dict(lagging.to_dict(), _fresh())
    assert state is not None and state.lag is not None and np.array_equal(state.lag, lag)
    a, b, plain = lagging.bounds(), state.bounds(), shared.bounds()
    assert a is not None and b is not None and plain is not None and a.same_as(b)
    assert np.allclose(_stacked(a), _stacked(plain) + 0.05)
    bad = {**lagging.to_dict(), "lag": [[float("nan")] * 5] * 4}
    assert SharedEstimate.from_dict(bad, _fresh()) is None


def _plain_median(shared: SharedEstimate, *args: Any) -> np.ndarray | None:
    """The median of :meth:`SharedEstimate.voters`' bounds computed the plain way (every
    voter's bounds, sorted), with the lag: what :meth:`SharedEstimate.bounds` must give."""
    found = [b for _, e in shared.voters() if (b := e.bounds(*args)) is not None]
    if not found:
        return None
    if len(found) == 1 and shared.lag is None:
        return _stacked(found[0])
    ranked = np.sort(np.stack([_stacked(b) for b in found]), axis=0)
    mid = len(found) // 2
    logs = ranked[mid] if len(found) % 2 else (ranked[mid - 1] + ranked[mid]) / 2
    if shared.lag is not None:
        logs = logs + shared.lag
    return np.stack([np.maximum(logs[0], logs[2]), np.maximum(logs[1], logs[3]), *logs[2:]])


def test_the_median_is_the_plain_median_of_the_voters_as_they_come_and_go() -> None:
    """The votes are kept stacked and mended per job (a decision does not pass over every
    voter): the bounds equal, bit for bit, the plain median of every voter's bounds,
    as submitters come, send jobs, and are dropped by an operator, at two sets of
    margins, with the prior's vote and without a prior."""
    jobs = _ordinary(11, n_jobs=120).jobs
    for prior in (default_prior(), None):
        shared = SharedEstimate.start(BoundEstimate.start(CLUSTER, prior))
        rng = np.random.default_rng(4)
        for i, job in enumerate(jobs):
            shared = shared.observe(job, f"t{int(rng.integers(0, 2 + i // 10))}")
            if i % 17 == 9:
                shared = shared.without(sorted(shared.submitters)[int(rng.integers(0, 3))])
            for args in ((1.0, 1.0, None), (0.8, 1.2, 0.25)):
                got, want = shared.bounds(*args), _plain_median(shared, *args)
                assert (got is None) == (want is None)
                if got is not None and want is not None:
                    assert np.array_equal(_stacked(got), want), (i, args)


def test_a_decision_does_not_look_at_every_submitters_vote(monkeypatch: Any) -> None:
    """With 300 submitters voting, a job and the bounds after it take one submitter's
    bounds anew, not every voter's in Python: before, every decision stacked all the
    voters' bounds three times (4 ms a decision at 2,000 submitters,
    bench/many_tenants.py)."""
    jobs = _ordinary(12, n_jobs=60).jobs
    shared = SharedEstimate.start(_fresh())
    for i in range(300):
        shared = shared.observe(jobs[i % len(jobs)], f"tenant{i}")
        shared.bounds()
    calls = 0
    real = SharedEstimate._voter_bounds

    def counted(self: SharedEstimate, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(self, *args)

    monkeypatch.setattr(SharedEstimate, "_voter_bounds", counted)
    for k in range(5):
        shared = shared.observe(jobs[k], f"tenant{7 * k}")
        shared.bounds()
    assert calls <= 5 * 10, calls


def test_a_lag_that_would_cross_u_below_l_raises_u_to_l() -> None:
    """The bounds in use are the median plus the lag; a lag that lowers U and raises L
    past each other leaves U at L, never below it (prices need U >= L)."""
    shared = SharedEstimate.start(_fresh())
    for i, job in enumerate(_ordinary(18, n_jobs=6).jobs):
        shared = shared.observe(job, ("alice", "bob")[i % 2])
    n = len(CLUSTER.resources)
    lag = np.concatenate([np.full((2, n), -30.0), np.full((2, n), 30.0)])
    b = SharedEstimate(shared.fresh, shared.submitters, lag=lag).bounds()
    assert b is not None
    assert np.array_equal(b.log_u1, b.floor1) and np.array_equal(b.log_u2, b.floor2)


def test_without_a_prior_a_new_voter_moves_the_bounds_by_at_most_a_step() -> None:
    """Without a prior there is no reference to return to at once: a second submitter's
    first job (its estimate that job's own values) moves the median by a rank, and the
    bounds in use follow it by at most e^STEP per job."""
    jobs = _ordinary(19, n_jobs=40).jobs
    for factor in (1.2, 1.3, 1.4, 1.6, 2.0):
        shared = SharedEstimate.start(BoundEstimate.start(CLUSTER, None))
        for job in jobs[:30]:
            shared = shared.observe(job, "alice")
        for job in jobs[30:]:
            before = _of(shared.bounds())
            utility = job.utility
            assert isinstance(utility, Sigmoid)
            dearer = replace(job, utility=replace(utility, priority=utility.priority * factor))
            shared = shared.observe(dearer, "bob")
            assert np.abs(_of(shared.bounds()) - before).max() <= STEP + 1e-9, factor


def test_a_state_cached_as_an_older_one_prices_its_own_estimates() -> None:
    """A standby reads again the states that changed and takes the older state's cached
    bounds for the rest (:meth:`SharedEstimate.cached_as`): a submitter whose estimate
    changed is priced from its new estimate, not the cached bounds of its old one."""
    jobs = _ordinary(20, n_jobs=30).jobs
    old = SharedEstimate.start(_fresh())
    for i, job in enumerate(jobs[:9]):
        old = old.observe(job, ("alice", "bob", "carol")[i % 3])
    old.bounds()  # fills the caches
    old.describe(CLUSTER.resources)
    new = old
    for job in jobs[9:]:
        new = new.observe(job, "alice")
    head = new.head()
    read, lost = SharedEstimate.from_parts(head, {"alice": new.state("alice")}, _fresh(),
                                           known=old.submitters)  # fmt: skip
    assert read is not None and lost == []
    got, want = read.cached_as(old).bounds(), new.bounds()
    assert got is not None and want is not None and got.same_as(want)
