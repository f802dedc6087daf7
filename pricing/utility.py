"""Utility functions of the completion time ``d`` (slots): non-increasing, non-negative.

Every kind gives its value and its natural log, so price bounds stay finite when a
utility underflows (a time-critical job's sigmoid far past its target is ~1e-600).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pricing import fields
from pricing.errors import SpecError

__all__ = ["Sigmoid", "Table", "Utility", "utility_from_dict"]


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


def utility_from_dict(raw: Any, field: str) -> Utility:
    """Read a utility object (``{"kind": "sigmoid", ...}`` or ``{"kind": "table", ...}``)."""
    spec: Mapping[str, Any] = fields.mapping(raw, field)
    kind = fields.require(spec, "kind", field)
    if kind == "sigmoid":
        priority = fields.positive(fields.require(spec, "priority", field), f"{field}.priority")
        decay = fields.number(fields.require(spec, "decay", field), f"{field}.decay")
        if decay < 0:
            raise SpecError.one(
                f"{field}.decay",
                f"must be >= 0, got {decay!r}: a negative decay makes the utility increase "
                "with the completion time",
            )
        target = fields.number(fields.require(spec, "target", field), f"{field}.target")
        return Sigmoid(priority, decay, target)
    if kind == "table":
        raw_values = fields.require(spec, "values", field)
        if not isinstance(raw_values, list) or not raw_values:
            raise SpecError.one(f"{field}.values", "must be a non-empty list of numbers")
        values = [fields.non_negative(v, f"{field}.values[{i}]") for i, v in enumerate(raw_values)]
        for i in range(1, len(values)):
            if values[i] > values[i - 1]:
                raise SpecError.one(
                    f"{field}.values[{i}]",
                    f"utility must be non-increasing in the completion time: "
                    f"f({i + 1}) = {values[i]!r} > f({i}) = {values[i - 1]!r}",
                )
        if values[0] <= 0:
            raise SpecError.one(f"{field}.values[0]", "the best utility must be > 0")
        return Table(tuple(values))
    raise SpecError.one(f"{field}.kind", f"unknown utility kind {kind!r} (known: sigmoid, table)")
