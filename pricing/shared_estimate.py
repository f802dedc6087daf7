"""Price bounds estimated per submitter and combined by their median: no one tenant moves
them past the others (the daemon's estimate).

:mod:`pricing.bound_estimate` bounds what one job does to the estimate (a factor
``e^STEP``), but not what one tenant's many jobs do: a submitter that sends hundreds of
jobs worth ``1e9`` (by a slip of units, or on purpose, cancelling each at once) walks U
and L up to its own values, and every other tenant's ordinary jobs are priced out, even
on an idle cluster, until an operator resets the estimate.

So the daemon keeps one :class:`~pricing.bound_estimate.BoundEstimate` per submitter
(the name of its token; one for all callers without ``[auth]``), each started from the
prior and moved only by that submitter's jobs, and prices with their **median**, per
bound and resource (in logs). The voters are the submitters seen, plus the prior (the
fresh estimate) when they are even in number, so the median is always one of them:

- one submitter (every replay, and a daemon without ``[auth]``): its estimate, exactly
  as before (the rule ``{"bounds": "estimate"}`` in a trace follows);
- two: the median of the two and the prior. A tenant alone cannot move the bounds past
  the other tenant's estimate or the prior, whichever lies between;
- more: one tenant, whatever it sends, moves each bound by at most one rank among the
  voters, between the values of the others.

One job still moves the bounds by at most ``e^STEP`` (it moves one voter by that much,
and a median of values one of which moves by ``d`` moves by at most ``d``), and the
median of voters each with ``U >= L`` has ``U >= L`` (order statistics keep the order).
A new tenant's estimate is the prior until it has sent jobs, so a tenant's vote departs
from the prior only as fast as its own jobs move it.

A tenant that has gone keeps its vote until an operator resets the estimate
(``oasis bounds reset``); the stored state grows by one estimate (about 18 KB of JSON)
per submitter.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pricing.bound_estimate import BoundEstimate
from pricing.cluster import Cluster
from pricing.job import Job
from pricing.prices import PriceBounds

__all__ = ["ANONYMOUS", "SharedEstimate"]

ANONYMOUS = ""
"""The key of the submitter without a name (no ``[auth]``; a replay's jobs)."""

_FORMAT = "per-submitter"
_VERSION = 1


def _prior_share(estimate: BoundEstimate) -> float:
    """The prior's share of the weight behind ``estimate``, 0..1."""
    total = estimate.best.total
    return min(1.0, estimate.prior_mass / total) if total > 0 else 0.0


def _key(submitter: str | None) -> str:
    return ANONYMOUS if submitter is None else submitter


@dataclass(frozen=True, eq=False)
class SharedEstimate:
    """Per-submitter estimates and their median; see the module docstring. Immutable:
    :meth:`observe` returns a new one.

    Attributes:
        fresh: the estimate before any job (the prior): where each submitter starts,
            and a voter when the submitters are even in number.
        submitters: each submitter's estimate, by name (:data:`ANONYMOUS`: no name).
    """

    fresh: BoundEstimate
    submitters: Mapping[str, BoundEstimate] = field(default_factory=dict)
    _bounds: dict[tuple[str, float, float, float | None], PriceBounds | None] = field(
        default_factory=dict, repr=False
    )
    """Each voter's bounds, by (name, margins, trim); carried over to the next state for
    the voters it leaves unchanged (every estimate is immutable)."""
    _states: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    """Each submitter's :meth:`BoundEstimate.to_dict`, carried over likewise: a state is
    written after every batch of decisions, and only one submitter's changed. Filled by
    :meth:`to_dict` in the writer thread while the decision thread may copy it: under
    ``_lock``."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def start(cls, fresh: BoundEstimate) -> SharedEstimate:
        """No job seen: the bounds are ``fresh``'s."""
        return cls(fresh)

    def of(self, submitter: str | None) -> BoundEstimate:
        """``submitter``'s estimate (the fresh one before its first job)."""
        return self.submitters.get(_key(submitter), self.fresh)

    def observe(self, job: Job, submitter: str | None = None) -> SharedEstimate:
        """A new state with ``job`` folded into ``submitter``'s estimate."""
        key = _key(submitter)
        kept = {k: b for k, b in self._bounds.items() if k[0] != key}
        with self._lock:
            states = {k: d for k, d in self._states.items() if k != key}
        return replace(
            self,
            submitters={**self.submitters, key: self.of(submitter).observe(job)},
            _bounds=kept,
            _states=states,
        )

    @property
    def jobs(self) -> int:
        """Jobs folded in, all submitters together."""
        return sum(e.jobs for e in self.submitters.values())

    @property
    def prior(self) -> str:
        """Where the prior came from (``"none"`` without one)."""
        return self.fresh.prior

    def voters(self) -> list[tuple[str, BoundEstimate]]:
        """The estimates whose median is taken: the submitters' (the fresh one before any
        job), and the fresh one (named "\\0prior") when they are even in number."""
        out: list[tuple[str, BoundEstimate]] = sorted(self.submitters.items())
        if not out or len(out) % 2 == 0:
            out.append(("\0prior", self.fresh))
        return out

    def _voter_bounds(
        self, key: str, estimate: BoundEstimate, l_margin: float, u_margin: float,
        trim: float | None,
    ) -> PriceBounds | None:  # fmt: skip
        memo = (key, l_margin, u_margin, trim)
        if memo not in self._bounds:
            self._bounds[memo] = estimate.bounds(l_margin, u_margin, trim)
        return self._bounds[memo]

    def bounds(
        self, l_margin: float = 1.0, u_margin: float = 1.0, trim: float | None = None
    ) -> PriceBounds | None:
        """The median, per bound and resource in logs, of the voters' bounds
        (:meth:`pricing.bound_estimate.BoundEstimate.bounds` with these arguments);
        None before any job and prior."""
        found = [
            b
            for key, e in self.voters()
            if (b := self._voter_bounds(key, e, l_margin, u_margin, trim)) is not None
        ]
        if not found:
            return None
        if len(found) == 1:
            return found[0]

        def median(arrays: Sequence[np.ndarray]) -> np.ndarray:
            return np.asarray(np.median(np.stack(arrays), axis=0), np.float64)

        return PriceBounds(
            median([b.log_u1 for b in found]),
            median([b.log_u2 for b in found]),
            median([b.floor1 for b in found]),
            median([b.floor2 for b in found]),
            1.0,
            1.0,
        )

    def fits(self, cluster: Cluster) -> bool:
        """True if every submitter's estimate was started for ``cluster``."""
        return all(e.fits(cluster) for e in self.submitters.values())

    def describe(self, resources: Sequence[str]) -> dict[str, Any]:
        """What ``oasis bounds`` shows (:meth:`BoundEstimate.describe`), for the median
        in use, with the voters: each submitter and its jobs (``-``: no name)."""
        voters = self.voters()
        one = len(voters) == 1
        out = (voters[0][1] if one else self.fresh).describe(resources)
        b = self.bounds()
        for kind, top, floor in (
            ("worker", None if b is None else b.log_u1, None if b is None else b.floor1),
            ("ps", None if b is None else b.log_u2, None if b is None else b.floor2),
        ):
            out[kind] = {
                r: None
                if top is None or floor is None
                else {"U": float(np.exp(top[i])), "L": float(np.exp(floor[i]))}
                for i, r in enumerate(resources)
            }
        out["jobs"] = self.jobs
        shares = {name: _prior_share(e) for name, e in self.submitters.items()}
        if not one:
            out["prior_share"] = float(np.mean(list(shares.values())))
            out["method"] += (
                f"; one estimate per submitter, the median of {len(voters)} in use "
                f"({len(self.submitters)} submitters"
                + (" and the prior" if len(voters) > len(self.submitters) else "")
                + ")"
            )
        out["submitters"] = [
            {"name": name or "-", "jobs": e.jobs, "prior_share": shares[name]}
            for name, e in sorted(self.submitters.items())
        ]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state: each submitter's estimate (:meth:`BoundEstimate.to_dict`)."""
        with self._lock:
            for key, estimate in self.submitters.items():
                if key not in self._states:
                    self._states[key] = estimate.to_dict()
            states = {k: self._states[k] for k in sorted(self.submitters)}
        return {"format": _FORMAT, "version": _VERSION, "submitters": states}

    @classmethod
    def from_dict(cls, data: Any, fresh: BoundEstimate) -> SharedEstimate | None:
        """The state :meth:`to_dict` wrote, or a lone :class:`BoundEstimate`'s (the
        format before: the submitter without a name); None for anything else, or a
        submitter's estimate that does not read back (the caller starts afresh)."""
        if isinstance(data, dict) and data.get("format") == _FORMAT:
            if data.get("version") != _VERSION or not isinstance(data.get("submitters"), dict):
                return None
            submitters = {}
            for name, state in data["submitters"].items():
                estimate = BoundEstimate.from_dict(state)
                if estimate is None or not isinstance(name, str) or len(name) > 200:
                    return None
                submitters[name] = estimate
            return cls(fresh, submitters)
        lone = BoundEstimate.from_dict(data)
        return None if lone is None else cls(fresh, {ANONYMOUS: lone})
