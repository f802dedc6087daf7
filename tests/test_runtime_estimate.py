"""The Bayesian runtime estimate: conjugate updates against a direct computation, its
intervals' coverage on simulated progress, and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pricing.runtime_estimate import RuntimePrior, fit


def test_posterior_matches_the_textbook_update() -> None:
    x = np.array([10.0, 20.0, 35.0, 50.0])
    y = np.array([12.0, 21.5, 37.0, 52.5])
    prior = RuntimePrior(1.0, relative_sd=0.5, startup_seconds_sd=4.0, noise_fraction=0.2,
                         noise_scale_minibatches=5.0, strength=4.0)  # fmt: skip
    post = fit(x, y, prior)
    noise = 0.2 * 1.0 * 5.0
    v0_inv = np.diag([noise**2 / 16.0, noise**2 / 0.25])
    mu0 = np.array([0.0, 1.0])
    X = np.column_stack([np.ones(4), x])
    vn_inv = v0_inv + X.T @ X
    mun = np.linalg.solve(vn_inv, v0_inv @ mu0 + X.T @ y)
    an = 2.0 + 2.0
    cn = 2.0 * noise**2 + 0.5 * (y @ y + mu0 @ v0_inv @ mu0 - mun @ vn_inv @ mun)
    assert np.allclose(post.mean, mun)
    assert np.allclose(post.cov_unscaled, np.linalg.inv(vn_inv))
    assert post.a == an and post.c == pytest.approx(cn)
    slope = post.minibatch_seconds(0.95)
    half = stats.t.ppf(0.975, 2 * an) * np.sqrt(cn / an * np.linalg.inv(vn_inv)[1, 1])
    assert slope.mean == pytest.approx(mun[1])
    assert slope.high - slope.mean == pytest.approx(half)


def test_no_data_gives_the_prior_and_data_narrow_it() -> None:
    prior = RuntimePrior(2.0)
    empty = fit([], [], prior)
    assert empty.minibatch_seconds().mean == pytest.approx(2.0)
    rng = np.random.default_rng(7)
    x = np.cumsum(rng.integers(20, 40, 30)).astype(float)
    y = 3.0 * x + 5.0 + rng.normal(0, 2.0, x.size)
    post = fit(x, y, prior)
    wide, narrow = empty.minibatch_seconds(), post.minibatch_seconds()
    assert narrow.high - narrow.low < (wide.high - wide.low) / 10
    sure = post.minibatch_seconds(0.999)
    assert sure.low < 3.0 < sure.high


def test_predictive_intervals_cover_at_about_their_level() -> None:
    rng = np.random.default_rng(3)
    hits = 0
    trials = 300
    for _ in range(trials):
        slope = rng.uniform(0.5, 3.0)
        x = np.sort(rng.uniform(0, 200, 12))
        y = 4.0 + slope * x + rng.normal(0, 3.0, x.size)
        post = fit(x, y, RuntimePrior(1.0, noise_fraction=0.3))
        interval = post.seconds_at(400.0, 0.9)
        hits += interval.low <= 4.0 + slope * 400.0 + rng.normal(0, 3.0) <= interval.high
    assert 0.84 <= hits / trials <= 0.97


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="minibatch_seconds"):
        RuntimePrior(0.0)
    with pytest.raises(ValueError, match="differ in length"):
        fit([1.0, 2.0], [1.0], RuntimePrior(1.0))
    with pytest.raises(ValueError, match="finite"):
        fit([1.0, float("nan")], [1.0, 2.0], RuntimePrior(1.0))
    with pytest.raises(ValueError, match="level"):
        fit([1.0], [1.0], RuntimePrior(1.0)).minibatch_seconds(1.5)


def test_a_time_interval_is_cut_off_at_0_and_keeps_its_level() -> None:
    # before any report the prior's t reaches below 0: the low end is cut to 0, the high
    # end is the t's own (worked out here from scipy.stats)
    prior = RuntimePrior(1.0)
    empty = fit([], [], prior)
    noise = 0.1 * 1.0 * 10.0
    a0, c0, v11 = 1.0, 1.0 * noise**2, 1.0 / noise**2 * noise**2  # V0[1, 1] = (sd / noise)^2
    wide = empty.minibatch_seconds(0.99)
    half = stats.t.ppf(0.995, 2 * a0) * np.sqrt(c0 / a0 * v11)
    assert half > 1.0  # the uncut low end would be below 0
    assert wide.low == 0.0
    assert wide.high == pytest.approx(1.0 + half)
    assert wide.level == 0.99
    assert empty.seconds_at(50.0, 0.5).level == 0.5
    # reports whose time falls as work grows (a clock reset): a negative slope, whose
    # interval is [0, 0], never high below low or below 0
    x = np.arange(10.0, 110.0, 10.0)
    post = fit(x, 1000.0 - 5.0 * x, prior)
    for interval in (post.minibatch_seconds(0.9), post.seconds_at(1000.0, 0.9)):
        assert interval.mean < 0
        assert 0.0 == interval.low <= interval.high == 0.0


@pytest.mark.parametrize("level", [0.0, 1.0])
def test_a_level_of_0_or_1_is_refused(level: float) -> None:
    post = fit([1.0], [1.0], RuntimePrior(1.0))
    with pytest.raises(ValueError, match="level"):
        post.minibatch_seconds(level)
    with pytest.raises(ValueError, match="level"):
        post.seconds_at(10.0, level)


@pytest.mark.parametrize(
    "name", ["relative_sd", "noise_fraction", "noise_scale_minibatches", "strength"]
)
def test_a_prior_setting_of_0_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RuntimePrior(1.0, **{name: 0.0})
