"""Durations and times as people write them: ``"90m"``, ``"1h30m"``, ``"2030-06-01T18:00Z"``.

Pure text to numbers and back; no clock. A duration is one or more ``<number><unit>``
parts with units ``d``, ``h``, ``m``, ``s`` (``"2d"``, ``"1.5h"``, ``"1h 30m"``). A time is
ISO 8601 with a UTC offset (``Z`` or ``+02:00``): without one it would mean a different
moment on every machine.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

__all__ = [
    "DURATION_EXAMPLES",
    "format_duration",
    "format_time",
    "parse_duration",
    "parse_time",
    "slots_in_time",
]

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
# ASCII digits and blanks only: "2h\r\n\x0b\u2028" was taken, and stored as written
_PART = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*([dhms])")
_BLANKS = " \t"
_MAX_TEXT = 64
"""Longer strings are neither durations nor times (and are not worth a regex)."""

DURATION_EXAMPLES = '"90m", "6h", "1h30m" or "2d"'


def parse_duration(text: str) -> float | None:
    """Seconds of a duration such as ``"1h30m"``; None if ``text`` is not one."""
    if len(text) > _MAX_TEXT or not text.strip(_BLANKS):
        return None
    pos, total = 0, 0.0
    seen: set[str] = set()
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None:
            return None if text[pos:].strip(_BLANKS) else (total if seen else None)
        unit = m.group(2)
        if unit in seen:  # "1h2h" is a typo, not three hours
            return None
        seen.add(unit)
        total += float(m.group(1)) * _UNITS[unit]
        pos = m.end()
    return total if math.isfinite(total) else None


def parse_time(text: str) -> float | None:
    """Unix time of an ISO 8601 time with a UTC offset; None if ``text`` is not one.
    RFC 3339's lower-case ``t`` and ``z`` (``2030-01-01t18:00:00z``) are read too.

    Raises:
        ValueError: a time without a UTC offset (the message says what to add).
    """
    if len(text) > _MAX_TEXT or "-" not in text:
        return None
    given = text.strip()
    try:  # upper case changes only T, Z and ISO 8601's W: digits and signs have none
        when = datetime.fromisoformat(given.upper())
    except ValueError:
        return None
    if when.tzinfo is None:
        dated = "T" in given.upper() or " " in given
        utc = f"{given}Z" if dated else f"{given}T00:00:00Z"
        raise ValueError(
            f"the time {text!r} has no UTC offset: give one, as in {utc!r} (UTC) or +02:00"
        )
    return when.timestamp()


_EXACT_DAYS = 1e6
"""Days up to which :func:`format_duration` counts whole days and the rest; past it,
days to 4 significant digits (``1e308`` s printed 364 digits of days, the last 290 of
them the float's noise, in an error about ``--wait``)."""


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1h30m"``: days, hours, minutes and seconds, largest first; past a
    million days, days alone to 4 significant digits (``"1.157e+303d"``)."""
    if not math.isfinite(seconds):
        return str(seconds)
    sign, rest = ("-" if seconds < 0 else ""), abs(seconds)
    if rest >= _EXACT_DAYS * _UNITS["d"]:
        return f"{sign}{rest / _UNITS['d']:.4g}d"
    parts: list[str] = []
    for unit, size in _UNITS.items():
        if unit == "s":
            if rest > 0 or not parts:
                whole = round(rest, 3)
                parts.append(f"{whole:g}s")
            break
        n = math.floor(rest / size + 1e-9)
        if n:
            parts.append(f"{n}{unit}")
            rest = max(0.0, rest - n * size)
    return sign + "".join(parts)


def slots_in_time(n: int, slot_seconds: float) -> str:
    """``151 slots (6d7h)``: ``n`` slots, and the time they take (slots of
    ``slot_seconds``), for a user's messages."""
    return f"{n} slot{'' if n == 1 else 's'} ({format_duration(n * slot_seconds)})"


def format_time(unix: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the second: ``2030-06-01T18:00:00Z``.

    A fraction of a second is rounded up, so the start of a slot reads back as a time in
    that slot (not a moment before it), whatever the epoch's fraction."""
    try:
        when = datetime.fromtimestamp(math.ceil(unix), UTC)
    except (OverflowError, ValueError, OSError):  # beyond datetime's years 1..9999
        return f"{unix:.6g} s after 1970-01-01T00:00:00Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
