"""A quantile of a stream of log values that no single value can move far.

The price-bound estimate (:mod:`pricing.bound_estimate`) follows a few quantiles of
per-job values. Each is a :class:`Tracker`: a histogram of the values seen, in bins of
``BIN_WIDTH`` (natural log), whose old weight decays by a factor per observation, and a
*followed value* that moves toward the histogram's quantile by at most ``step`` per
observation.

Why both:

- the quantile ignores outliers: a value far above (or below) the bulk moves it by one
  rank at most, so a few extreme jobs among many ordinary ones leave it where it was;
- the step bound holds for *any* stream, also while the histogram is sparse (at the
  start, or when a gap separates two groups of values): one observation moves the
  followed value by at most ``step``, ``k`` observations by at most ``k * step``;
- a dead band of one bin either way keeps the followed value still while its quantile
  only jitters between neighbouring bins (each move makes every price stale; the ledger
  derives them again as searches read them).

``move(value, target) = clip(target, value - step, value + step)`` is monotone in both
arguments and commutes with adding a constant to both, so it never widens a difference:
two trackers fed the same stream except for one extra value differ, after it, by at most
``step`` plus however far that value moved the histogram's quantile.

Bounded: the histogram covers only ``REACH`` either side of the followed value; a value
further out (and old weight the window has moved away from) is counted at the window's
edge, which is all a quantile inside the window asks of it. So a histogram holds at most
``2 * REACH / BIN_WIDTH + 2`` bins, whatever the stream. Every value is clipped to
``[-LOG_LIMIT, LOG_LIMIT]`` first (``-inf``, the log of a utility that underflows, and
``nan`` read as ``-LOG_LIMIT``), so everything computed from it stays finite.

Pure Python over short lists (a histogram has at most ~120 bins): at this size it is
several times faster than numpy, whose per-call cost dominates. Decay is kept as one
scale factor, so an observation touches O(1) bins but the quantile scan.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import itertools
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pricing.fields import is_integer, is_number

__all__ = ["BIN_WIDTH", "DEAD_BAND", "LOG_LIMIT", "MAX_BINS", "REACH", "Tracker", "clip_log"]

BIN_WIDTH = 0.05
"""Width of a histogram bin of a natural log: a quantile is exact to ``exp(0.05)``."""

REACH = 3.0
"""The histogram covers the followed value +- 3 (a factor e^3 = 20 either side)."""

LOG_LIMIT = 1000.0
"""Log values are clipped to ``[-1000, 1000]`` (float64 spans about ``[-745, 710]``)."""

MAX_BINS = int(2 * REACH / BIN_WIDTH) + 2
"""Most bins a histogram holds (the window, plus one at each edge for rounding)."""

DEAD_BAND = 1.5 * BIN_WIDTH
"""A settled value stays put while its quantile is within this (one bin either way):
prices are not recomputed for a quantile that only jitters between neighbouring bins."""

_RESCALE = 1e-150
"""When the decay scale falls below this, weights are folded in and it is reset to 1."""

_PRUNE = 1e-12
"""At a rescale, bins under this share of the total weight are dropped."""


def clip_log(x: float) -> float:
    """``x`` clipped to ``[-LOG_LIMIT, LOG_LIMIT]``; ``nan`` reads as ``-LOG_LIMIT``."""
    if math.isnan(x):
        return -LOG_LIMIT
    return min(max(x, -LOG_LIMIT), LOG_LIMIT)


def _key(x: float) -> int:
    return math.floor(x / BIN_WIDTH)


@dataclass(frozen=True, eq=False)
class Tracker:
    """A decayed, bounded histogram of log values and the quantile it follows.

    Immutable: :meth:`observe` returns a new tracker.

    Attributes:
        keys: sorted bin indices ``floor(x / BIN_WIDTH)``.
        raw: the weight of each bin divided by ``scale``, each > 0.
        scale: the decay applied to every ``raw`` weight (weights are ``raw * scale``).
        value: the followed quantile (natural log), None before any weight.
        seeded: started from a prior (:meth:`of`): settled from the start.
    """

    keys: tuple[int, ...] = ()
    raw: tuple[float, ...] = ()
    scale: float = 1.0
    value: float | None = None
    seeded: bool = False

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]], level: float, edge: float) -> Tracker:
        """A tracker holding ``(log value, weight)`` points (a prior), following their
        quantile at ``level`` from the start (no step bound: nothing came before); the
        window is applied at its first observation."""
        bins: dict[int, float] = {}
        for x, w in points:
            if w > 0:
                k = _key(clip_log(x))
                bins[k] = bins.get(k, 0.0) + w
        keys = tuple(sorted(bins))
        out = cls(keys, tuple(bins[k] for k in keys))
        return cls(out.keys, out.raw, 1.0, out.target(level, edge), bool(keys))

    @property
    def total(self) -> float:
        """Sum of the weights."""
        return math.fsum(self.raw) * self.scale

    def target(self, level: float, edge: float) -> float | None:
        """The quantile at ``level`` in [0, 1): the bin where the weight at and below it
        first exceeds ``level`` of the total, read at ``edge`` (0: its lower edge, 1: its
        upper edge); None when the histogram weighs nothing."""
        if not self.raw:
            return None
        cumulative = list(itertools.accumulate(self.raw))
        i = bisect.bisect_right(cumulative, level * cumulative[-1])
        return (self.keys[min(i, len(self.keys) - 1)] + edge) * BIN_WIDTH

    def observe(
        self,
        x: float,
        weight: float,
        *,
        level: float,
        edge: float,
        decay: float,
        step: float,
        settle: float = 0.0,
    ) -> Tracker:
        """Decay every bin by ``decay``, add ``weight`` at ``x`` (clipped to the window),
        and move the followed value toward the new quantile by at most ``step``.

        Unless it started from a prior, while the histogram held less than ``settle``
        weight before this value, the followed value is the quantile itself: one early
        outlier is then outvoted by the next few values instead of being walked back
        step by step."""
        settled = self.seeded or self.total >= settle
        keys, raw = list(self.keys), list(self.raw)
        scale = self.scale * decay
        x = clip_log(x)
        value = self.value
        if value is not None and settled:
            lo, hi = value - REACH, value + REACH
            x = min(max(x, lo), hi)
            _fold_edges(keys, raw, _key(lo), _key(hi))
        if weight > 0:
            key = _key(x)
            i = bisect.bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                raw[i] += weight / scale
            else:
                keys.insert(i, key)
                raw.insert(i, weight / scale)
        if scale < _RESCALE:
            raw = [w * scale for w in raw]
            scale = 1.0
            floor = _PRUNE * math.fsum(raw)
            kept = [(k, w) for k, w in zip(keys, raw, strict=True) if w > floor]
            keys, raw = [k for k, _ in kept], [w for _, w in kept]
        if raw:
            cumulative = list(itertools.accumulate(raw))
            i = min(bisect.bisect_right(cumulative, level * cumulative[-1]), len(keys) - 1)
            target = (keys[i] + edge) * BIN_WIDTH
            if value is None or not settled:
                value = target
            elif abs(target - value) > DEAD_BAND:
                value = min(max(target, value - step), value + step)
        return Tracker(tuple(keys), tuple(raw), scale, value, self.seeded)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state; floats round-trip exactly. The weights are one base64 string
        of little-endian float64 (``raw64``): the daemon stores its estimate with every
        batch of decisions, and a list of ~120 floats per tracker made that JSON cost
        0.5 ms a batch (``raw``, a list, is still read)."""
        packed = _packer(len(self.raw)).pack(*self.raw)
        return {
            "keys": list(self.keys),
            "raw64": binascii.b2a_base64(packed, newline=False).decode(),  # base64.b64encode
            "scale": self.scale,
            "value": self.value,
            "seeded": self.seeded,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Tracker:
        """The state :meth:`to_dict` wrote; ValueError if it is not one."""
        if not isinstance(data, dict):
            raise ValueError("a tracker must be an object")
        keys, raw = data.get("keys"), data.get("raw")
        if "raw64" in data:
            raw = _unpack_weights(data["raw64"])
        if not (isinstance(keys, list) and isinstance(raw, list)):
            raise ValueError("tracker keys and raw must be lists")
        if len(keys) != len(raw) or len(keys) > MAX_BINS:
            raise ValueError("tracker keys and raw differ in length or are too many")
        limit = LOG_LIMIT / BIN_WIDTH + 1
        for k in keys:
            if not is_integer(k) or abs(k) > limit:
                raise ValueError("tracker keys must be bin indices")
        if any(b <= a for a, b in itertools.pairwise(keys)):
            raise ValueError("tracker keys must increase")
        weights = [_finite(w, positive=True) for w in raw]
        scale = _finite(data.get("scale"), positive=True)
        value = data.get("value")
        seeded = data.get("seeded", False)
        if not isinstance(seeded, bool):
            raise ValueError("tracker seeded must be a boolean")
        value = None if value is None else clip_log(_finite(value))
        return cls(tuple(keys), tuple(weights), scale, value, seeded)


def _fold_edges(keys: list[int], raw: list[float], lo: int, hi: int) -> None:
    """Move the weight of bins outside ``lo .. hi`` into those two edge bins, in place."""
    if keys and keys[0] < lo:
        n = bisect.bisect_left(keys, lo)
        moved = math.fsum(raw[:n])
        del keys[:n], raw[:n]
        if keys and keys[0] == lo:
            raw[0] += moved
        else:
            keys.insert(0, lo)
            raw.insert(0, moved)
    if keys and keys[-1] > hi:
        n = bisect.bisect_right(keys, hi)
        moved = math.fsum(raw[n:])
        del keys[n:], raw[n:]
        if keys and keys[-1] == hi:
            raw[-1] += moved
        else:
            keys.append(hi)
            raw.append(moved)


@functools.lru_cache(maxsize=MAX_BINS + 1)
def _packer(n: int) -> struct.Struct:
    """The packing of ``n`` weights: little-endian float64 (compiled once per ``n``)."""
    return struct.Struct(f"<{n}d")


def _unpack_weights(text: Any) -> list[float]:
    """The weights :meth:`Tracker.to_dict` packed; ValueError if ``text`` is not such."""
    if not isinstance(text, str) or len(text) > 4 * 8 * (MAX_BINS + 1) // 3 + 4:
        raise ValueError("tracker raw64 must be a short base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError("tracker raw64 is not base64") from err
    if len(data) % 8:
        raise ValueError("tracker raw64 is not a whole number of float64")
    return list(struct.unpack(f"<{len(data) // 8}d", data))


def _finite(x: Any, positive: bool = False) -> float:
    if not is_number(x) or not math.isfinite(x):
        raise ValueError("expected a finite number")
    if positive and not x > 0:
        raise ValueError("expected a number > 0")
    return float(x)
