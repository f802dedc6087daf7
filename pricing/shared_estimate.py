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

One job still moves the bounds away from the prior by at most ``e^STEP``: it moves one
voter by at most that much, and a median of values one of which moves by ``d`` moves by
at most ``d``; a job that brings a new voter (a submitter's first, which also adds or
drops the prior's vote) can move the median by a rank at once, so the bounds in use
*follow* the median, away from the prior by at most ``STEP`` per job (the gap,
:attr:`SharedEstimate.lag`, is stored with the state), toward it at once.
The median of voters each with ``U >= L`` has ``U >= L`` (order statistics keep the
order), and so does the followed value (U is raised to L if a lag would cross them).
A new tenant's estimate is the prior until it has sent jobs, so a tenant's vote departs
from the prior only as fast as its own jobs move it.

A tenant that has gone keeps its vote until an operator drops it (``oasis bounds reset
--submitter NAME``, :meth:`SharedEstimate.without`) or resets every estimate. A store
keeps :meth:`SharedEstimate.head` (names, lag) and each submitter's
:meth:`SharedEstimate.state` (about 18 KB of JSON) apart, so a decision rewrites only
its submitter's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pricing.bound_estimate import STEP, BoundEstimate, bounds_by_kind
from pricing.cluster import Cluster
from pricing.job import Job
from pricing.prices import PriceBounds

__all__ = ["ANONYMOUS", "SharedEstimate", "submitter_key"]

ANONYMOUS = ""
"""The key of the submitter without a name (no ``[auth]``; a replay's jobs)."""

_FORMAT = "per-submitter"
_VERSION = 2


def _prior_share(estimate: BoundEstimate) -> float:
    """The prior's share of the weight behind ``estimate``, 0..1."""
    total = estimate.best.total
    return min(1.0, estimate.prior_mass / total) if total > 0 else 0.0


_PRIOR = "\0prior"
"""The prior's name among the voters (no submitter's name holds a NUL)."""
_SLACK = 1e-9
"""A move of the median within ``STEP`` plus this (rounding in the logs' sums) is taken
whole, so that one submitter's bounds are its estimate's, bit for bit."""


def _stacked(bounds: PriceBounds) -> np.ndarray:
    """``(4, R)``: ``log U1, log U2, log L1, log L2`` per resource."""
    return np.stack([bounds.log_u1, bounds.log_u2, bounds.floor1, bounds.floor2])


def _logs(bounds: PriceBounds | None) -> np.ndarray | None:
    """:func:`_stacked`, or None for None."""
    return None if bounds is None else _stacked(bounds)


class _Voter:
    """A voter's bounds and, once asked for, their :func:`_stacked` logs (one voter's
    bounds are used as they are: no median to take)."""

    __slots__ = ("_logs", "bounds")

    def __init__(self, bounds: PriceBounds) -> None:
        self.bounds = bounds
        self._logs: np.ndarray | None = None

    @property
    def logs(self) -> np.ndarray:
        """``(4, R)``: :func:`_stacked` of the bounds (computed once)."""
        if self._logs is None:
            self._logs = _stacked(self.bounds)
        return self._logs


_Memo = tuple[float, float, float | None]
"""The arguments of :meth:`BoundEstimate.bounds` a voter's bounds are taken at: the
margins ``(l_margin, u_margin)`` and ``trim``."""

_STALE_REBUILT = 64
"""A table (:class:`_Table`) more than this many rows out of date is built again from
every voter rather than mended row by row."""


@dataclass(frozen=True)
class _Table:
    """The submitters' votes at one :data:`_Memo`, stacked: ``logs`` ``(4, R, V)``, the
    :func:`_stacked` logs of each submitter whose estimate has bounds (its vote the last
    axis, which the median is taken along), ``rows`` its index there by name
    (``names[i]`` is vote i's). Immutable: a new state mends a copy of its
    predecessor's (only the submitter a job moved changes), so a decision costs one copy
    of the array, not a pass over every voter in Python (2,000 submitters: 4 ms)."""

    rows: Mapping[str, int]
    names: Sequence[str]
    logs: np.ndarray


_CACHE_LOCK = threading.Lock()
"""Guards the voters' caches (:class:`_Entry`), which states share and two threads fill
(the decision thread's bounds, the writer thread's :meth:`SharedEstimate.state`)."""


class _Entry:
    """What is cached of one voter's ``estimate``: its bounds by :data:`_Memo` and its
    :meth:`BoundEstimate.to_dict` (a state is written after every batch of decisions,
    and only one submitter's changed)."""

    __slots__ = ("estimate", "state", "voters")

    def __init__(self, estimate: BoundEstimate) -> None:
        self.estimate = estimate
        self.voters: dict[_Memo, _Voter | None] = {}
        self.state: dict[str, Any] | None = None


def submitter_key(submitter: str | None) -> str:
    """The name a submitter's estimate is kept under (:data:`ANONYMOUS` for None)."""
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
    _entries: dict[str, _Entry] = field(default_factory=dict, repr=False)
    """Each voter's cached bounds and state (:class:`_Entry`), by name; carried over to
    the next state for the voters it leaves unchanged (every estimate is immutable), in
    one copy of this dict. Filled in the writer thread too (:meth:`state`) while the
    decision thread may copy it: under :data:`_CACHE_LOCK`."""
    lag: np.ndarray | None = None
    """``(4, R)``: how far the bounds in use lie from the voters' median, in logs, per
    ``log U1, log U2, log L1, log L2`` and resource; None: at it. See :meth:`observe`."""
    _tables: dict[_Memo, tuple[_Table, frozenset[str]]] = field(default_factory=dict, repr=False)
    """The submitters' votes stacked, by (margins, trim), each with the names whose rows
    are out of date (a predecessor's table, carried over: mended when first used)."""
    _medians: dict[_Memo, PriceBounds | None] = field(default_factory=dict, init=False, repr=False)
    """:meth:`bounds` by its arguments (the state is immutable; the lag is its own, so
    this is not carried over)."""
    _names: list[tuple[str, ...]] = field(default_factory=list, repr=False)
    """The submitters' names sorted, once asked for (:meth:`head`): carried over while
    the names stay the same (one list shared by the states of those names)."""

    @classmethod
    def start(cls, fresh: BoundEstimate) -> SharedEstimate:
        """No job seen: the bounds are ``fresh``'s."""
        return cls(fresh)

    def of(self, submitter: str | None) -> BoundEstimate:
        """``submitter``'s estimate (the fresh one before its first job)."""
        return self.submitters.get(submitter_key(submitter), self.fresh)

    def observe(self, job: Job, submitter: str | None = None) -> SharedEstimate:
        """A new state with ``job`` folded into ``submitter``'s estimate.

        The bounds in use follow the voters' median, but away from the prior by at most
        ``STEP`` (in logs) per job: a job moves its submitter's estimate by at most that,
        and so the median, unless it brings a new voter (a submitter's first job, which
        also adds or drops the prior's vote), which can move the median by a rank at
        once. A move away from the prior then walks over the next jobs (:attr:`lag`); a
        move toward it (a second tenant arriving after one flooded alone) is taken at
        once. With one submitter the median is its estimate and there is never a lag."""
        key = submitter_key(submitter)
        after = self._dropping(
            key, {**self.submitters, key: self.of(submitter).observe(job)}, moved=True
        )
        alone = not self.submitters or (len(self.submitters) == 1 and key in self.submitters)
        if self.lag is None and alone:
            return after  # one voter before and after: it moves by at most STEP itself
        before = _logs(self.bounds())
        target = _logs(after.bounds())
        if before is None or target is None:
            return after
        move = target - before
        close = np.abs(move) <= STEP + _SLACK  # the median itself, exactly, when in reach
        prior = after._voter_bounds(_PRIOR, self.fresh, 1.0, 1.0, None)  # memoized
        home = None if prior is None else prior.logs
        if home is not None:  # toward the prior (the operator's reference) it goes at once
            close |= np.abs(target - home) <= np.abs(before - home)
        held = np.where(close, target, before + np.clip(move, -STEP, STEP))
        lag = np.where(close, 0.0, held - target)
        return replace(after, lag=lag if lag.any() else None)

    def without(self, name: str) -> SharedEstimate:
        """This state with submitter ``name``'s estimate dropped (an operator's reset of
        one tenant): it votes no more until its next job, from the prior. The bounds go
        to the median of the others at once (an operator's choice, not a job's)."""
        others = {k: e for k, e in self.submitters.items() if k != name}
        return self._dropping(name, others, moved=False)

    def _dropping(
        self, name: str, submitters: Mapping[str, BoundEstimate], moved: bool
    ) -> SharedEstimate:
        """This state with ``submitters``, without the lag, and without ``name``'s cached
        bounds and state (the others' carry over: their estimates are unchanged). With
        ``moved``, ``name``'s estimate changed (or came): the stacked votes carry over
        with its row marked out of date; else it left, and they are stacked afresh."""
        with _CACHE_LOCK:
            entries = dict(self._entries)
        entries.pop(name, None)
        tables = {}
        if moved:
            # a snapshot: a read thread may add a table meanwhile (oasis bounds)
            for memo, (table, stale) in list(self._tables.items()):
                if len(stale) < _STALE_REBUILT:
                    tables[memo] = (table, stale | {name})
        same_names = moved and name in self.submitters
        names = self._names if same_names else []
        return SharedEstimate(self.fresh, submitters, entries, lag=None,
                              _tables=tables, _names=names)  # fmt: skip

    def cached_as(self, other: SharedEstimate) -> SharedEstimate:
        """This state, taking ``other``'s cached bounds and states for the estimates the
        two share (a standby's estimate read again in part: the submitters it kept are
        not priced anew)."""
        with _CACHE_LOCK:
            entries = {**other._entries, **self._entries}
        return replace(self, _entries=entries)

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
            out.append((_PRIOR, self.fresh))
        return out

    def _voter_bounds(
        self, key: str, estimate: BoundEstimate, l_margin: float, u_margin: float,
        trim: float | None,
    ) -> _Voter | None:  # fmt: skip
        """A voter's bounds, their :func:`_stacked` logs made when first asked for (None:
        no bounds yet)."""
        voters = self._entry(key, estimate).voters
        memo = (l_margin, u_margin, trim)
        if memo not in voters:
            found = estimate.bounds(l_margin, u_margin, trim)
            voters[memo] = None if found is None else _Voter(found)
        return voters[memo]

    def _entry(self, key: str, estimate: BoundEstimate) -> _Entry:
        """Voter ``key``'s cache, for ``estimate`` (a new one if it held another's)."""
        with _CACHE_LOCK:
            entry = self._entries.get(key)
            if entry is None or entry.estimate is not estimate:
                entry = self._entries[key] = _Entry(estimate)
            return entry

    def _own_bounds(self, key: str, estimate: BoundEstimate) -> PriceBounds | None:
        """A voter's own bounds, at the default margins and trim (None: none yet)."""
        voter = self._voter_bounds(key, estimate, 1.0, 1.0, None)
        return None if voter is None else voter.bounds

    def bounds(
        self, l_margin: float = 1.0, u_margin: float = 1.0, trim: float | None = None
    ) -> PriceBounds | None:
        """The median, per bound and resource in logs, of the voters' bounds
        (:meth:`pricing.bound_estimate.BoundEstimate.bounds` with these arguments);
        None before any job and prior. Computed once per state and arguments, from the
        votes stacked (:meth:`_table`)."""
        memo = (l_margin, u_margin, trim)
        if memo not in self._medians:
            self._medians[memo] = self._median(memo)
        return self._medians[memo]

    def _median(self, memo: _Memo) -> PriceBounds | None:
        """:meth:`bounds` at ``memo``, computed: the voters are those of :meth:`voters`
        (the prior joining an even number of submitters) that have bounds."""
        table = self._table(memo)
        n = len(self.submitters)
        prior = self._voter_bounds(_PRIOR, self.fresh, *memo) if n == 0 or n % 2 == 0 else None
        count = len(table.names) + (prior is not None)
        if count == 0:
            return None
        if count == 1 and self.lag is None:  # the one voter's own bounds, as they are
            if prior is not None:
                return prior.bounds
            voter = self._voter_bounds(table.names[0], self.submitters[table.names[0]], *memo)
            assert voter is not None
            return voter.bounds
        logs = table.logs
        if prior is not None:
            logs = np.concatenate([logs, prior.logs[..., None]], axis=-1)
        middle = count // 2  # an odd count's median is a voter's value, exactly
        if count % 2:
            median = np.partition(logs, middle, axis=-1)[..., middle]
        else:
            ranked = np.partition(logs, (middle - 1, middle), axis=-1)
            median = (ranked[..., middle - 1] + ranked[..., middle]) / 2
        if self.lag is not None:
            median = median + self.lag
        u1, u2, l1, l2 = median
        return PriceBounds(np.maximum(u1, l1), np.maximum(u2, l2), l1, l2, 1.0, 1.0)

    def _table(self, memo: _Memo) -> _Table:
        """The submitters' votes at ``memo`` stacked (:class:`_Table`): a predecessor's
        mended in the rows of the submitters whose estimates changed since, else built
        from every submitter (the first time, and after a submitter is dropped)."""
        carried = self._tables.get(memo)
        if carried is not None and not carried[1]:
            return carried[0]
        table = None if carried is None else self._mended(memo, *carried)
        if table is None:
            names, rows = [], []
            for name, estimate in sorted(self.submitters.items()):
                voter = self._voter_bounds(name, estimate, *memo)
                if voter is not None:
                    names.append(name)
                    rows.append(voter.logs)
            n = len(self.fresh.worker.top)
            logs = np.stack(rows, axis=-1) if rows else np.zeros((4, n, 0))
            table = _Table({name: i for i, name in enumerate(names)}, names, logs)
        self._tables[memo] = (table, frozenset())
        return table

    def _mended(self, memo: _Memo, table: _Table, stale: frozenset[str]) -> _Table | None:
        """``table`` with the rows of ``stale`` taken from this state's estimates (a new
        submitter's appended); None if a row would have to go (built afresh then)."""
        logs, rows, names = table.logs.copy(), table.rows, table.names
        for name in sorted(stale):
            estimate = self.submitters.get(name)
            voter = None if estimate is None else self._voter_bounds(name, estimate, *memo)
            if voter is None:
                if name in rows:
                    return None
                continue
            if name in rows:
                logs[..., rows[name]] = voter.logs
            else:
                rows = {**rows, name: len(names)}
                names = [*names, name]
                logs = np.concatenate([logs, voter.logs[..., None]], axis=-1)
        return _Table(rows, names, logs)

    def fits(self, cluster: Cluster) -> bool:
        """True if every submitter's estimate was started for ``cluster``."""
        return all(e.fits(cluster) for e in self.submitters.values())

    def refit(self) -> SharedEstimate | None:
        """Every submitter's estimate over the resources of :attr:`fresh` (the configured
        cluster's), by name (:meth:`BoundEstimate.refit`): a reorder keeps every
        resource's bounds, an added one starts from the prior, a removed one drops only
        its own. Itself if every one fits already; None if one cannot be (start afresh).
        The :attr:`lag` is by name already (:meth:`from_parts`)."""
        submitters = {}
        for name, estimate in self.submitters.items():
            refitted = estimate.refit(self.fresh)
            if refitted is None:
                return None
            submitters[name] = refitted
        if all(submitters[k] is e for k, e in self.submitters.items()):
            return self
        return SharedEstimate(self.fresh, submitters, lag=self.lag)

    def describe(self, resources: Sequence[str]) -> dict[str, Any]:
        """What ``oasis bounds`` shows (:meth:`BoundEstimate.describe`), for the median
        in use, with the voters: each submitter (``-``: no name), its jobs and its own
        bounds (:func:`~pricing.bound_estimate.bounds_by_kind`)."""
        voters = self.voters()
        one = len(voters) == 1
        out = (voters[0][1] if one else self.fresh).describe(resources)
        out.update(bounds_by_kind(self.bounds(), resources))
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
            {
                "name": name or "-",
                "jobs": e.jobs,
                "prior_share": shares[name],
                # its own vote, so an operator can tell whose estimate went astray (as
                # the median was taken of: the same memo)
                "bounds": bounds_by_kind(self._own_bounds(name, e), resources),
            }
            for name, e in sorted(self.submitters.items())
        ]
        return out

    def state(self, name: str) -> dict[str, Any]:
        """Submitter ``name``'s estimate as :meth:`BoundEstimate.to_dict` (cached)."""
        entry = self._entry(name, self.submitters[name])
        with _CACHE_LOCK:
            if entry.state is None:
                entry.state = entry.estimate.to_dict()
            return entry.state

    def _sorted_names(self) -> tuple[str, ...]:
        """The submitters' names, sorted (computed once for the states of these names)."""
        with _CACHE_LOCK:
            if not self._names:
                self._names.append(tuple(sorted(self.submitters)))
            return self._names[0]

    def head(self) -> dict[str, Any]:
        """JSON-safe state but the submitters' estimates: their names and the lag. A
        store keeps each submitter's :meth:`state` apart, so a decision rewrites one."""
        lag = None if self.lag is None else [[float(x) for x in row] for row in self.lag]
        resources = self.fresh.resources
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "submitters": list(self._sorted_names()),
            "lag": lag,
            "resources": None if resources is None else list(resources),  # the lag's
        }

    def to_dict(self) -> dict[str, Any]:
        """:meth:`head` with every submitter's :meth:`state` in it (one JSON object)."""
        return {**self.head(), "states": {k: self.state(k) for k in sorted(self.submitters)}}

    @staticmethod
    def is_head(data: Any) -> bool:
        """Whether ``data`` is a :meth:`head` without the states in it (they are stored
        apart: :meth:`from_parts`)."""
        return isinstance(data, dict) and data.get("format") == _FORMAT and "states" not in data

    @classmethod
    def from_parts(
        cls,
        head: Any,
        states: Mapping[str, Any],
        fresh: BoundEstimate,
        known: Mapping[str, BoundEstimate] | None = None,
    ) -> tuple[SharedEstimate | None, list[str]]:
        """The state of a :meth:`head` and the submitters' states by name; None for a
        head that is not one. A submitter named in the head whose state is missing or
        does not read back starts afresh from the prior: those are returned too. A
        submitter of ``known`` whose state is not given keeps that estimate (a standby
        reads again only the states that changed)."""
        if not isinstance(head, dict) or head.get("format") != _FORMAT:
            return None, []
        names = head.get("submitters")
        if head.get("version") != _VERSION or not isinstance(names, list):
            return None, []
        submitters, lost = {}, []
        for name in names:
            if not isinstance(name, str) or len(name) > 200:
                return None, []
            if known is not None and name not in states and name in known:
                submitters[name] = known[name]
                continue
            estimate = BoundEstimate.from_dict(states.get(name))
            if estimate is None:
                lost.append(name)
                estimate = fresh
            submitters[name] = estimate
        try:
            lag = _lag_from(head.get("lag"), _lag_names(head, submitters.values()), fresh)
        except ValueError:
            return None, []
        return cls(fresh, submitters, lag=lag), lost

    @classmethod
    def from_dict(cls, data: Any, fresh: BoundEstimate) -> SharedEstimate | None:
        """The state :meth:`to_dict` wrote, or a lone :class:`BoundEstimate`'s (the
        format before: the submitter without a name); None for anything else, or a
        submitter's estimate that does not read back (the caller starts afresh)."""
        if isinstance(data, dict) and data.get("format") == _FORMAT:
            states = data.get("states")
            found, lost = cls.from_parts(data, states if isinstance(states, dict) else {}, fresh)
            return None if lost else found
        lone = BoundEstimate.from_dict(data)
        return None if lone is None else cls(fresh, {ANONYMOUS: lone})


def _lag_names(head: dict[str, Any], estimates: Iterable[BoundEstimate]) -> list[str] | None:
    """The resources a stored :attr:`SharedEstimate.lag`'s columns are of: the head's
    (written since the lag is kept by name), else those of the submitters' estimates if
    they agree (a head written before); None if neither says."""
    named = head.get("resources")
    if isinstance(named, list) and all(isinstance(r, str) for r in named):
        return named
    found = {e.resources for e in estimates if e.resources is not None}
    return list(found.pop()) if len(found) == 1 else None


def _lag_from(raw: Any, names: list[str] | None, fresh: BoundEstimate) -> np.ndarray | None:
    """A stored :attr:`SharedEstimate.lag` over the resources of ``fresh``: None, or a
    finite ``(4, R)`` array. Its columns are taken by resource name (``names``: the
    stored ones), a resource added getting 0 (at the median); without names, by position.

    Raises:
        ValueError: anything else, or columns that match neither names nor positions."""
    if raw is None:
        return None
    try:
        lag = np.array(raw, dtype=np.float64)
    except (TypeError, OverflowError) as err:
        raise ValueError("lag: not numbers") from err
    n = len(fresh.worker.top)
    if lag.ndim != 2 or lag.shape[0] != 4 or not np.isfinite(lag).all():
        raise ValueError("lag: not a finite (4, R) array")
    if names is not None and fresh.resources is not None and len(names) == lag.shape[1]:
        at = {r: j for j, r in enumerate(names)}
        out = np.zeros((4, n))
        for i, r in enumerate(fresh.resources):
            if r in at:
                out[:, i] = lag[:, at[r]]
        lag = out
    elif lag.shape != (4, n):
        raise ValueError("lag: not a finite (4, R) array")
    return lag if lag.any() else None
