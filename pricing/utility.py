"""Utility functions of the completion time ``d`` (slots): non-increasing, non-negative.

Every kind gives its value and its natural log, so price bounds stay finite when a
utility underflows (a time-critical job's sigmoid far past its target is ~1e-600).

Kinds: ``sigmoid`` (the paper's), ``table`` (any non-increasing list) and ``deadline``
(full value up to a completion time, then halving every ``half_life`` or 0). A time in
a utility (a sigmoid's ``target``, a deadline) is a number of slots, a duration such as
``"6h"`` (converted with the slot length), or ``{"slot": S}``: the start of slot ``S``,
which is how the daemon stores a wall-clock time (``controller/jobspec.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pricing import fields
from pricing.durations import DURATION_EXAMPLES, parse_duration, parse_time
from pricing.errors import Problem, SpecError

__all__ = [
    "KINDS",
    "UTILITY_KEYS",
    "WHEN_KEYS",
    "Deadline",
    "Sigmoid",
    "Table",
    "Utility",
    "utility_from_dict",
]

KINDS = ("sigmoid", "table", "deadline")
WHEN_KEYS = ("target", "deadline")
"""The keys of a utility object that hold a time (slots, a duration, or a slot's start)."""
_LN2 = math.log(2.0)


class Utility(Protocol):
    """A non-increasing, non-negative function of the completion time in slots (d >= 1)."""

    def values(self, d: ArrayLike) -> NDArray[np.float64]:
        """``f(d)`` for an array of completion times."""
        ...

    def log_values(self, d: ArrayLike) -> NDArray[np.float64]:
        """``log f(d)`` (``-inf`` where f is 0), exact where ``f`` underflows."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The trace-format object this utility was read from."""
        ...


@dataclass(frozen=True)
class Sigmoid:
    """``f(d) = priority / (1 + exp(decay * (d - target)))`` (the paper's gamma1..3).

    Attributes:
        priority: utility scale, > 0 (gamma1).
        decay: steepness per slot, >= 0; 0 is a time-insensitive job (gamma2).
        target: target completion time in slots (gamma3).
    """

    priority: float
    decay: float
    target: float

    def values(self, d: ArrayLike) -> NDArray[np.float64]:
        return np.exp(self.log_values(d))

    def log_values(self, d: ArrayLike) -> NDArray[np.float64]:
        x = self.decay * (np.asarray(d, dtype=np.float64) - self.target)
        # log(1 + e^x) without overflow
        return math.log(self.priority) - np.logaddexp(0.0, x)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "sigmoid",
            "priority": self.priority,
            "decay": self.decay,
            "target": self.target,
        }


@dataclass(frozen=True)
class Table:
    """``f(d) = values[d - 1]``; the last value holds for every later ``d``.

    Attributes:
        values: non-increasing, non-negative utilities for d = 1, 2, ...
    """

    values_: tuple[float, ...]

    def values(self, d: ArrayLike) -> NDArray[np.float64]:
        idx = np.clip(np.asarray(d, dtype=np.int64) - 1, 0, len(self.values_) - 1)
        return np.asarray(self.values_, dtype=np.float64)[idx]

    def log_values(self, d: ArrayLike) -> NDArray[np.float64]:
        with np.errstate(divide="ignore"):
            return np.log(self.values(d))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "table", "values": list(self.values_)}


@dataclass(frozen=True)
class Deadline:
    """``f(d) = value`` for ``d <= deadline``; after it ``value * 2 ** (-(d - deadline) /
    half_life)``, or 0 when ``half_life`` is None. Non-increasing, so the best-schedule
    search stays exact (an earlier completion never loses utility).

    Attributes:
        value: the full utility, > 0.
        deadline: the latest completion time in slots that earns the full value.
        half_life: slots over which the value halves after the deadline, > 0; None: the
            value drops to 0.
    """

    value: float
    deadline: float
    half_life: float | None = None

    def values(self, d: ArrayLike) -> NDArray[np.float64]:
        late = np.maximum(np.asarray(d, dtype=np.float64) - self.deadline, 0.0)
        if self.half_life is None:
            return np.where(late > 0, 0.0, self.value)
        return self.value * np.exp2(-late / self.half_life)  # exactly value up to the deadline

    def log_values(self, d: ArrayLike) -> NDArray[np.float64]:
        late = np.maximum(np.asarray(d, dtype=np.float64) - self.deadline, 0.0)
        if self.half_life is None:
            return np.where(late > 0, -np.inf, math.log(self.value))
        return math.log(self.value) - late / self.half_life * _LN2  # 0 on time, not 0 * inf

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "deadline", "value": self.value, "deadline": self.deadline}
        if self.half_life is not None:
            out["half_life"] = self.half_life
        return out


_KEYS = {
    "sigmoid": {"kind", "priority", "decay", "decay_per_hour", "target"},
    "table": {"kind", "values"},
    "deadline": {"kind", "value", "deadline", "half_life"},
}
UTILITY_KEYS = frozenset().union(*_KEYS.values())
"""Every key a utility object of some kind may have."""
_LIMIT = float(fields.MAX_INTEGER)
"""The largest magnitude of a utility's time or decay (slots, per slot): beyond it the
log-utility of a completion time leaves the range the price bounds can hold."""


class _Reader:
    """Reads one utility object, collecting every problem instead of stopping at the first."""

    def __init__(
        self, spec: Mapping[str, Any], field: str, slot_seconds: float | None, arrival: int | None
    ) -> None:
        self.spec = spec
        self.field = field
        self.slot_seconds = slot_seconds
        self.arrival = arrival
        self.problems: list[Problem] = []

    def get(self, key: str, parse: Any, *, required: bool = True) -> Any:
        sub = f"{self.field}.{key}"
        if key not in self.spec:
            if required:
                self.problems.append(Problem(sub, "is required"))
            return None
        try:
            return parse(self.spec[key], sub)
        except SpecError as err:
            self.problems.extend(err.problems)
            return None

    def when(self, value: Any, field: str) -> float:
        """A time in a utility as slots of completion time (see the module docstring)."""
        if isinstance(value, str):
            seconds = parse_duration(value)
            if seconds is None:
                try:
                    at = parse_time(value)
                except ValueError as err:
                    raise SpecError.one(field, str(err)) from None
                if at is not None:
                    raise SpecError.one(
                        field,
                        "a time needs the daemon's clock (submit the job to oasisd); here "
                        'give a duration or {"slot": S}',
                    )
                raise SpecError.one(
                    field,
                    f"must be a number of slots, a duration such as {DURATION_EXAMPLES}, or a "
                    f'time such as "2030-06-01T18:00:00Z"; got {fields.show(value)}',
                )
            if self.slot_seconds is None:
                raise SpecError.one(field, "a duration needs the slot length; give slots")
            slots = seconds / self.slot_seconds
        elif isinstance(value, Mapping):
            fields.check_no_problems(fields.unknown_keys(value, {"slot"}, field))
            start = fields.integer(
                fields.require(value, "slot", field), f"{field}.slot", minimum=-fields.MAX_INTEGER
            )
            if self.arrival is None:
                raise SpecError.one(field, "a slot's start needs the job's arrival")
            # finished by the start of slot S: its last slot is at most S - 1
            slots = float(start - self.arrival)
        else:
            slots = fields.number(value, field)
        if abs(slots) > _LIMIT:
            raise SpecError.one(field, f"must be at most 2**53 slots away, got {slots:g} slots")
        return slots

    def span(self, value: Any, field: str) -> float:
        """A length of time > 0 in slots: a number of slots or a duration."""
        if isinstance(value, Mapping):
            raise SpecError.one(field, f"must be a number of slots or a duration such as "
                                f"{DURATION_EXAMPLES}")  # fmt: skip
        if isinstance(value, str) and parse_duration(value) is None:
            # a length, never a time: "2026-11-28T06:00:00Z" was told to give {"slot": S}
            if value.strip().startswith("-") and parse_duration(value.strip()[1:]) is not None:
                raise SpecError.one(field, f"must be > 0, got {fields.show(value)}")
            try:
                is_time = parse_time(value) is not None
            except ValueError:
                is_time = False
            what = "is a length of time, not a time: give" if is_time else "must be"
            raise SpecError.one(field, f"{what} a number of slots or a duration such as "
                                f"{DURATION_EXAMPLES}; got {fields.show(value)}")  # fmt: skip
        slots = self.when(value, field)
        if slots <= 0:
            raise SpecError.one(field, f"must be > 0, got {fields.show(value)}")
        return slots

    def positive_when(self, value: Any, field: str) -> float:
        slots = self.when(value, field)
        if slots <= 0 and not isinstance(value, Mapping):  # a past {"slot": S}: worth 0
            what = "a duration > 0" if isinstance(value, str) else "a number of slots > 0"
            raise SpecError.one(field, f"must be after the arrival ({what}), got "
                                f"{fields.show(value)}")  # fmt: skip
        return slots


def utility_from_dict(
    raw: Any, field: str, *, slot_seconds: float | None = None, arrival: int | None = None
) -> Utility:
    """Read a utility object (``{"kind": "sigmoid" | "table" | "deadline", ...}``).

    Args:
        raw: the object.
        field: its path, prefixed to every problem.
        slot_seconds: the slot length, to read durations (``"6h"``); None: not allowed.
        arrival: the job's arrival slot, to read a slot's start (``{"slot": S}``).

    Raises:
        SpecError: every unknown key (with the closest known one) and every bad value.
    """
    spec: Mapping[str, Any] = fields.mapping(raw, field)
    kind = fields.require(spec, "kind", field)
    if kind not in KINDS:
        close = fields.closest(kind, KINDS) if isinstance(kind, str) else None
        hint = f"; did you mean {close!r}?" if close else ""
        raise SpecError.one(
            f"{field}.kind", f"unknown utility kind {fields.show(kind)} (known: "
            f"{', '.join(KINDS)}){hint}",
        )  # fmt: skip
    r = _Reader(spec, field, slot_seconds, arrival)
    r.problems.extend(fields.unknown_keys(spec, _KEYS[kind], field))
    if kind == "sigmoid":
        priority = r.get("priority", fields.positive)
        decay = _sigmoid_decay(r)
        target = r.get("target", r.when)
        fields.check_no_problems(r.problems)
        assert priority is not None and decay is not None and target is not None
        return Sigmoid(priority, decay, target)
    if kind == "table":
        values = r.get("values", _table_values)
        fields.check_no_problems(r.problems)
        return Table(tuple(values))
    value = r.get("value", fields.positive)
    deadline = r.get("deadline", r.positive_when)
    half_life = r.get("half_life", _half_life(r), required=False)
    fields.check_no_problems(r.problems)
    assert value is not None and deadline is not None
    return Deadline(value, deadline, half_life)


def _half_life(r: _Reader) -> Callable[[Any, str], float]:
    """Reads a half-life: a span of at least 2**-53 slots (a decay of at most 2**53 per
    slot, as a sigmoid's; a shorter one is a drop to 0, said as no half_life)."""

    def read(value: Any, field: str) -> float:
        slots = r.span(value, field)
        if slots < 1.0 / _LIMIT:
            raise SpecError.one(
                field, f"must be at least 2**-53 slots, got {slots:g} slots (for a value that "
                "drops to 0 at the deadline, give no half_life)",
            )  # fmt: skip
        return slots

    return read


def _sigmoid_decay(r: _Reader) -> float | None:
    """The decay per slot: ``decay``, or ``decay_per_hour`` converted with the slot length."""
    given = [k for k in ("decay", "decay_per_hour") if k in r.spec]
    if len(given) != 1:
        what = (
            "is required (or decay_per_hour)"
            if not given
            else "give decay or decay_per_hour, not both"
        )
        r.problems.append(Problem(f"{r.field}.decay", what))
        return None
    key = given[0]
    rate = r.get(key, fields.number)
    if rate is None:
        return None
    if rate < 0:
        r.problems.append(Problem(
            f"{r.field}.{key}", f"must be >= 0, got {rate!r}: a negative decay makes the "
            "utility increase with the completion time",
        ))  # fmt: skip
        return None
    if key == "decay_per_hour":
        if r.slot_seconds is None:
            r.problems.append(Problem(f"{r.field}.{key}", "needs the slot length; give decay"))
            return None
        rate *= r.slot_seconds / 3600.0
    if rate > _LIMIT:
        r.problems.append(Problem(f"{r.field}.{key}", f"must be at most 2**53, got {rate:g}"))
        return None
    return float(rate)


def _table_values(raw_values: Any, field: str) -> list[float]:
    if not isinstance(raw_values, list) or not raw_values:
        raise SpecError.one(field, "must be a non-empty list of numbers")
    problems: list[Problem] = []
    values: list[float] = []
    for i, v in enumerate(raw_values):
        try:
            values.append(fields.non_negative(v, f"{field}[{i}]"))
        except SpecError as err:
            problems.extend(err.problems)
            values.append(math.nan)
    fields.check_no_problems(problems)
    for i in range(1, len(values)):
        if values[i] > values[i - 1]:
            raise SpecError.one(
                f"{field}[{i}]",
                f"utility must be non-increasing in the completion time: "
                f"f({i + 1}) = {values[i]!r} > f({i}) = {values[i - 1]!r}",
            )
    if values[0] <= 0:
        raise SpecError.one(f"{field}[0]", "the best utility must be > 0")
    return values
