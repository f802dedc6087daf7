"""A job's utility in words for ``oasis job``: what its spec said, each time in local
time as the tables show times, and a duration with the time it ends at.

The spec comes back from the daemon in the form ``submit`` reads (a time as UTC, at the
start of the slot it was counted to), so a deadline given as ``13:30+02:00`` with hour
slots shows here as the local time of 11:00 UTC: the one the job is held to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.clock import SlotTimes
from controller.commands.records import local_time
from pricing.durations import parse_duration, parse_time

__all__ = ["utility_line"]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _when(value: Any, arrival: int, times: SlotTimes | None) -> str:
    """A deadline or target: a time (local), or a length after the arrival and the time
    it ends at (``6h after its arrival, Tue 13:00``)."""
    if isinstance(value, str):
        try:
            at = parse_time(value)
        except ValueError:
            at = None
        if at is not None:
            return local_time(at)
        seconds = parse_duration(value)
        if seconds is None or times is None:
            return value
        return f"{local_time(times.start(arrival) + seconds)} ({value} after its arrival)"
    slots = _number(value)
    if slots is None:
        return str(value)
    if times is None:
        return f"{slots:g} slots after its arrival"
    end = local_time(times.start(arrival) + slots * times.slot_seconds)
    return f"{end} ({slots:g} slots after its arrival)"


def _span(value: Any) -> str:
    slots = _number(value)
    return f"{slots:g} slots" if slots is not None else str(value)


def _shown(value: Any) -> str:
    number = _number(value)
    return f"{number:.6g}" if number is not None else str(value)


def utility_line(spec: Mapping[str, Any], arrival: int, times: SlotTimes | None) -> str:
    """``utility: 100 if done by Tue 11:00, then halving every 2h``, or a sigmoid's or a
    table's terms; "" for a utility that is not an object (an edited row)."""
    u = spec.get("utility")
    if not isinstance(u, Mapping):
        return ""
    kind = u.get("kind")
    if kind == "deadline":
        after = (f"then halving every {_span(u['half_life'])}" if "half_life" in u
                 else "0 after it")  # fmt: skip
        due = _when(u.get("deadline"), arrival, times)
        return f"utility: {_shown(u.get('value'))} if done by {due}, {after}"
    if kind == "sigmoid":
        decay = (f"decay {_shown(u.get('decay'))} per slot" if "decay" in u
                 else f"decay {_shown(u.get('decay_per_hour'))} per hour")  # fmt: skip
        return (
            f"utility: sigmoid, priority {_shown(u.get('priority'))}, target "
            f"{_when(u.get('target'), arrival, times)}, {decay}"
        )
    values = u.get("values")
    if kind == "table" and isinstance(values, list) and values:
        return (
            f"utility: a table of {len(values)} values per slot of completion time, "
            f"f(1) = {_shown(values[0])} .. f({len(values)}) = {_shown(values[-1])}"
        )
    return ""
