"""Price bounds an operator pinned (``oasis bounds pin``): U and L over the estimate's.

A pin sets U (utility per unit of a resource) and/or L (utility per unit-resource-slot)
of one resource on one kind of server, in the units of the cluster's capacities. The
estimate goes on taking in jobs underneath, so ``unpin`` returns to an up-to-date one.
Where a pin would leave U below L (one of the two pinned, the other estimated), U is
raised to L, as :meth:`pricing.prices.PriceBounds.scaled` does.

Stored as the meta row ``bound_pins`` in this JSON form, and read back as untrusted::

    {"worker": {"gpu": {"U": 20.0, "L": 0.01}}, "ps": {"cpu": {"L": 0.002}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pricing import fields
from pricing.errors import Problem, SpecError
from pricing.prices import PriceBounds

__all__ = ["KINDS", "SIDES", "Pins", "pins_from_dict", "split_pins"]

KINDS = ("worker", "ps")
SIDES = ("U", "L")

_Table = Mapping[str, Mapping[str, Mapping[str, float]]]
"""kind -> resource -> ``"U"`` / ``"L"`` -> value."""


@dataclass(frozen=True)
class Pins:
    """Pinned bounds, ``table[kind][resource][side]`` (a value > 0, finite)."""

    table: _Table = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.table.values())

    def get(self, kind: str, resource: str, side: str) -> float | None:
        return self.table.get(kind, {}).get(resource, {}).get(side)

    def merged(self, other: Pins) -> Pins:
        """These pins with ``other``'s added (``other`` wins where both pin a value);
        SpecError if a resource would end with U below L."""
        out = {k: {r: dict(v) for r, v in self.table.get(k, {}).items()} for k in KINDS}
        for kind, per in other.table.items():
            for resource, sides in per.items():
                out[kind].setdefault(resource, {}).update(sides)
        pins = Pins(out)
        pins._check_order()
        return pins

    def without(self, kind: str | None, resource: str) -> Pins:
        """These pins with ``resource``'s removed on ``kind`` (None: on both)."""
        return Pins(
            {
                k: {r: dict(v) for r, v in per.items() if not (r == resource and kind in (None, k))}
                for k, per in self.table.items()
            }
        )

    def _check_order(self) -> None:
        problems = [
            Problem(f"{kind}.{r}", f"U = {s['U']:g} is below L = {s['L']:g}")
            for kind, per in self.table.items()
            for r, s in per.items()
            if "U" in s and "L" in s and s["U"] < s["L"]
        ]
        if problems:
            raise SpecError(problems)

    def apply(self, bounds: PriceBounds, resources: Sequence[str]) -> PriceBounds:
        """``bounds`` with the pinned values put in (U raised to L where below)."""
        if not self:
            return bounds
        logs = []
        for kind, log_u, floor in (
            ("worker", bounds.log_u1, bounds.floor1),
            ("ps", bounds.log_u2, bounds.floor2),
        ):
            u, lo = np.array(log_u, np.float64), np.array(floor, np.float64)
            for i, r in enumerate(resources):
                pinned_u, pinned_l = self.get(kind, r, "U"), self.get(kind, r, "L")
                if pinned_u is not None:
                    u[i] = math.log(pinned_u)
                if pinned_l is not None:
                    lo[i] = math.log(pinned_l)
            logs.append((np.maximum(u, lo), lo))
        (u1, l1), (u2, l2) = logs
        return PriceBounds(u1, u2, l1, l2, bounds.eta1, bounds.eta2)

    def to_dict(self) -> dict[str, Any]:
        return {k: {r: dict(s) for r, s in per.items() if s} for k, per in self.table.items()}


def split_pins(raw: Any, resources: Sequence[str]) -> tuple[Any, dict[str, dict[str, Any]]]:
    """The stored JSON form ``raw`` split in two: what names a resource of ``resources``
    (for :func:`pins_from_dict`) and the entries of other resources, as they are
    (``{kind: {resource: sides}}``): a resource taken out of ``[cluster] resources`` since
    it was pinned, whose pins are set aside, not read, and come back with it. A ``raw``
    that is not an object, or a kind whose value is not one, is left in the first part
    whole, for :func:`pins_from_dict` to name."""
    if not isinstance(raw, Mapping):
        return raw, {}
    known: dict[Any, Any] = {}
    aside: dict[str, dict[str, Any]] = {}
    for kind, per in raw.items():
        if kind not in KINDS or not isinstance(per, Mapping):
            known[kind] = per
            continue
        known[kind] = {r: sides for r, sides in per.items() if r in resources}
        other = {str(r): sides for r, sides in per.items() if r not in resources}
        if other:
            aside[kind] = other
    return known, aside


def pins_from_dict(raw: Any, resources: Sequence[str], field: str = "pins") -> Pins:
    """Validate pins in their JSON form against the cluster's ``resources``; SpecError
    names every bad field (values must be finite and > 0, U not below L)."""
    spec = fields.mapping(raw, field)
    problems: list[Problem] = []
    table: dict[str, dict[str, dict[str, float]]] = {k: {} for k in KINDS}
    for kind, per in spec.items():
        where = f"{field}.{kind}"
        if kind not in KINDS:
            problems.append(Problem(where, f"must be one of {list(KINDS)}"))
            continue
        if not isinstance(per, Mapping):
            problems.append(Problem(where, "must be an object of resources"))
            continue
        for resource, sides in per.items():
            at = f"{where}.{str(resource)[:64]}"
            if resource not in resources:
                problems.append(Problem(at, f"unknown resource (known: {', '.join(resources)})"))
                continue
            if not isinstance(sides, Mapping) or not sides or set(sides) - set(SIDES):
                problems.append(Problem(at, 'must be an object with "U" and/or "L"'))
                continue
            for side, value in sides.items():
                try:
                    table[kind].setdefault(resource, {})[side] = fields.positive(
                        value, f"{at}.{side}"
                    )
                except SpecError as err:
                    problems.extend(err.problems)
    if problems:
        raise SpecError(problems[:50])
    pins = Pins(table)
    pins._check_order()
    return pins
