"""A job's mini-batch time, re-estimated from its reported progress.

Bayesian linear regression of time on work done, as Lotaru (Bader et al., "Lotaru:
Locally predicting workflow task runtimes for resource management on heterogeneous
infrastructures", FGCS 2024) predicts task runtimes with uncertainty bounds from few
data points. Here an observation is a progress report of one job: ``x`` mini-batches
done so far (summed over its workers) and ``y`` worker-seconds spent on it so far. The
model is ``y = b0 + b1 x + e`` with ``e ~ N(0, s^2)``: ``b1`` is the time of one
mini-batch on one worker (seconds), ``b0`` a fixed start-up cost (seconds).

Prior (conjugate normal-inverse-gamma): ``s^2 ~ InvGamma(a0, c0)`` and
``b | s^2 ~ N(mu0, s^2 V0)``, centred on the planned mini-batch time. The posterior is
again normal-inverse-gamma with

    Vn^-1 = V0^-1 + X'X,  mun = Vn (V0^-1 mu0 + X'y),
    an = a0 + n / 2,      cn = c0 + (y'y + mu0' V0^-1 mu0 - mun' Vn^-1 mun) / 2,

the marginal of ``b`` is a Student t with ``2 an`` degrees of freedom, location ``mun``
and scale ``(cn / an) Vn``, and the time at ``x*`` is predicted by a Student t with the
same degrees of freedom, location ``[1, x*] mun`` and scale
``(cn / an) (1 + [1, x*] Vn [1, x*]')``.

Pure numerics: no clocks, no I/O. Cumulative reports are not independent draws; the
interval is the model's, a guide for re-planning, not a guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import stdtrit

__all__ = ["Interval", "RuntimePosterior", "RuntimePrior", "fit"]


@dataclass(frozen=True)
class RuntimePrior:
    """The prior belief about a job's timing, from its plan.

    Attributes:
        minibatch_seconds: planned time of one mini-batch on one worker, seconds (> 0).
        relative_sd: prior standard deviation of the mini-batch time as a fraction of it
            (default 1: the plan may be off by its own size).
        startup_seconds_sd: prior standard deviation of the start-up cost, seconds
            (default: 10 planned mini-batches).
        noise_fraction: prior guess of the noise standard deviation as a fraction of
            the planned mini-batch time times ``noise_scale_minibatches``.
        noise_scale_minibatches: mini-batches whose time sets the noise scale.
        strength: prior pseudo-observations for the noise (``a0 = strength / 2``).
    """

    minibatch_seconds: float
    relative_sd: float = 1.0
    startup_seconds_sd: float | None = None
    noise_fraction: float = 0.1
    noise_scale_minibatches: float = 10.0
    strength: float = 2.0

    def __post_init__(self) -> None:
        if not self.minibatch_seconds > 0:
            raise ValueError(f"minibatch_seconds: must be > 0, got {self.minibatch_seconds}")
        for name in ("relative_sd", "noise_fraction", "noise_scale_minibatches", "strength"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Interval:
    """A point estimate and a central credible interval around it.

    Attributes:
        mean: the posterior (or predictive) mean.
        low, high: the interval's ends; ``low`` is at least 0 for a time, which cannot be
            negative (the Student t reaches below 0 before any report, and cutting that
            off leaves the probability of the interval at least ``level``).
        level: its probability, in (0, 1).
    """

    mean: float
    low: float
    high: float
    level: float


@dataclass(frozen=True)
class RuntimePosterior:
    """The normal-inverse-gamma posterior of ``(b0, b1, s^2)``.

    Attributes:
        mean: ``(2,)`` float64, ``mun``: start-up seconds, seconds per mini-batch.
        cov_unscaled: ``(2, 2)`` float64, ``Vn`` (covariance per unit of ``s^2``).
        a, c: ``an`` and ``cn`` of the inverse-gamma on ``s^2`` (``c`` in seconds^2).
        observations: ``n``, reports used.
    """

    mean: NDArray[np.float64]
    cov_unscaled: NDArray[np.float64]
    a: float
    c: float
    observations: int

    @property
    def dof(self) -> float:
        """Degrees of freedom of the Student t marginals, ``2 an``."""
        return 2.0 * self.a

    def minibatch_seconds(self, level: float = 0.9) -> Interval:
        """The time of one mini-batch on one worker, seconds, with its credible interval."""
        scale = math.sqrt(self.c / self.a * float(self.cov_unscaled[1, 1]))
        return _t_interval(float(self.mean[1]), scale, self.dof, level)

    def seconds_at(self, minibatches: float, level: float = 0.9) -> Interval:
        """Predicted worker-seconds spent when ``minibatches`` are done, with the
        predictive interval of a new observation there."""
        x = np.array([1.0, float(minibatches)])
        loc = float(x @ self.mean)
        scale = math.sqrt(self.c / self.a * (1.0 + float(x @ self.cov_unscaled @ x)))
        return _t_interval(loc, scale, self.dof, level)


def _t_interval(loc: float, scale: float, dof: float, level: float) -> Interval:
    """The central interval of a Student t of seconds, cut off at 0 (see :class:`Interval`)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must be in (0, 1), got {level}")
    # Student's t quantile: what scipy.stats.t.ppf computes, from scipy.special, whose
    # import takes a fifth of scipy.stats' (0.27 s against 1.2 s: every daemon with
    # [mqtt] imported scipy.stats at start for this one call)
    q = float(stdtrit(dof, 0.5 + level / 2.0))
    return Interval(loc, max(0.0, loc - q * scale), max(0.0, loc + q * scale), level)


def fit(minibatches: ArrayLike, worker_seconds: ArrayLike, prior: RuntimePrior) -> RuntimePosterior:
    """The posterior after observing ``worker_seconds[i]`` spent when ``minibatches[i]``
    were done.

    Args:
        minibatches: ``(n,)`` mini-batches done, cumulative, >= 0.
        worker_seconds: ``(n,)`` worker-seconds spent, cumulative, >= 0.
        prior: the planned timing (see :class:`RuntimePrior`).
    """
    x = np.asarray(minibatches, dtype=np.float64).reshape(-1)
    y = np.asarray(worker_seconds, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"minibatches and worker_seconds differ in length: {x.size} != {y.size}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("minibatches and worker_seconds must be finite")
    m = prior.minibatch_seconds
    mu0 = np.array([0.0, m])
    startup_sd = prior.startup_seconds_sd or 10.0 * m
    noise = prior.noise_fraction * m * prior.noise_scale_minibatches
    a0 = prior.strength / 2.0
    c0 = a0 * noise**2  # prior mean of s^2 is c0 / (a0 - 1); its mode c0 / (a0 + 1)
    # V0 is per unit of s^2: the prior sds are given in seconds, so divide by noise^2
    v0_inv = np.diag([noise**2 / startup_sd**2, noise**2 / (prior.relative_sd * m) ** 2])
    design = np.column_stack([np.ones_like(x), x])
    precision = v0_inv + design.T @ design
    cov = np.asarray(np.linalg.inv(precision), dtype=np.float64)
    mean = cov @ (v0_inv @ mu0 + design.T @ y)
    a = a0 + x.size / 2.0
    # = c0 + (y'y + mu0' V0^-1 mu0 - mun' Vn^-1 mun) / 2, without its cancellation
    resid = y - design @ mean
    shift = mean - mu0
    c = c0 + 0.5 * float(resid @ resid + shift @ v0_inv @ shift)
    return RuntimePosterior(mean, cov, a, max(c, 1e-300), int(x.size))
