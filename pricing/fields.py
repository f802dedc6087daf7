"""Typed reads of plain JSON-like values, each failure naming the field and the reason."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping
from typing import Any, TypeGuard

from pricing.errors import Problem, SpecError
from pricing.text import label, printable_problem

__all__ = [
    "MAX_INTEGER",
    "MAX_UNKNOWN_KEYS",
    "DuplicateKeyError",
    "check_known_keys",
    "check_no_problems",
    "integer",
    "mapping",
    "name",
    "non_negative",
    "number",
    "optional_mapping",
    "positive",
    "positive_int",
    "require",
    "show",
    "text",
    "unknown_keys",
]


MAX_INTEGER = 2**53
"""The largest integer field accepted: every count enters float arithmetic (the work
``E N M m``, utilities of a completion time), which is exact only up to 2**53."""


MAX_UNKNOWN_KEYS = 10
"""An object with more unknown keys reports the first ten and how many more."""


_LOOKALIKE = str.maketrans({"O": "0", "o": "0", "I": "1", "l": "1", "|": "1"})


def closest(name: str, known: Collection[str]) -> str | None:
    """The known name ``name`` was most likely meant to be, or None: one that differs
    only in case or in characters that look alike (``O`` for ``0``, ``l`` or ``I`` for
    ``1``) first, else :func:`difflib.get_close_matches`' best (ratio >= 0.6). Among
    ``p2-8x-0`` and ``p2-8x-1``, ``p2-8x-O`` means the first; difflib alone took either."""
    name = name[:100]

    def folded(text: str) -> str:
        return text.casefold().translate(_LOOKALIKE)

    alike = sorted(k for k in known if folded(k) == folded(name))
    if alike:
        return alike[0]
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_keys(
    spec: Mapping[Any, Any], known: Collection[str], field: str, hint: str = ""
) -> list[Problem]:
    """A problem for each key of ``spec`` not in ``known``, with the closest known key
    as a suggestion (``job.epoch: unknown key; did you mean 'epochs'?``).

    ``hint`` is added to every problem's reason (e.g. why a key is not taken here)."""
    problems: list[Problem] = []
    extra = [k for k in spec if k not in known]
    for key in extra[:MAX_UNKNOWN_KEYS]:
        # a blank key, or one with control characters, is shown quoted and escaped
        name = label(key)
        close = closest(name, known)
        reason = "unknown key" + (f"; did you mean {close!r}?" if close else "")
        if isinstance(key, str) and name == key and key != key.strip():
            name = repr(key)  # shown as it is, "epochs " read as the "epochs" suggested
            reason += " (it has spaces around it)" if close else ""
        elif close and isinstance(key, str):
            reason += _not_ascii(key)
        if not close and not hint:
            reason += f" (known: {', '.join(sorted(known))})"
        problems.append(Problem(_join(field, _short(name)), reason + hint))
    if len(extra) > MAX_UNKNOWN_KEYS:
        more = len(extra) - MAX_UNKNOWN_KEYS
        problems.append(Problem(field, f"and {more} more unknown keys"))
    return problems


def _not_ascii(key: str) -> str:
    """`` (it holds 'е' (U+0435) at character 1, not ASCII)`` for a key whose first
    non-ASCII character may look like the ASCII one of the key suggested for it (a
    Cyrillic е pasted for an e); ``""`` for an ASCII key."""
    for i, char in enumerate(key):
        if not char.isascii():
            return f" (it holds {char!r} (U+{ord(char):04X}) at character {i + 1}, not ASCII)"
    return ""


class DuplicateKeyError(ValueError):
    """A JSON object that gives one key twice (:func:`unique_object`)."""


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``json.loads`` ``object_pairs_hook``: the object, or DuplicateKeyError for a key
    given twice. ``json`` keeps the last value without a word, other readers the first,
    so ``{"gpu": 1, ..., "gpu": 8}`` (a line copied and edited) would be admitted as a
    job other than the one its author or a reviewer's tool read."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    first: dict[str, Any] = {}
    for key, value in pairs:
        if key in first:
            raise DuplicateKeyError(
                f"the key {show(key)} is given twice in one object ({show(first[key])}, "
                f"then {show(value)}): JSON readers differ on which one counts; give it once"
            )
        first[key] = value
    raise AssertionError("unreachable: a shorter dict has a repeated key")


def check_no_problems(problems: list[Problem]) -> None:
    """Raise a SpecError listing ``problems``, if there are any."""
    if problems:
        raise SpecError(problems)


def check_known_keys(table: Mapping[Any, Any], known: Collection[str], where: str) -> None:
    """SpecError naming the first key of ``table`` (a config table, ``[where]``) not in
    ``known``, with the closest known key (:func:`unknown_keys`), as a config's other
    mistakes are named one at a time."""
    check_no_problems(unknown_keys(table, known, where)[:1])


def _short(name: str) -> str:
    """A key for a field path, shortened: a 10 kB key is not a readable name."""
    return name if len(name) <= 40 else f"{name[:30]}...({len(name)} characters)"


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    """``value`` as a JSON object."""
    if not isinstance(value, Mapping):
        raise SpecError.one(field, f"must be an object, got {_kind(value)}")
    return value


def optional_mapping(parent: Mapping[str, Any], key: str, prefix: str) -> Mapping[str, Any]:
    """``parent[key]`` as an object; an absent key reads as an empty object."""
    if key not in parent:
        return {}
    return mapping(parent[key], _join(prefix, key))


def require(parent: Mapping[str, Any], key: str, prefix: str) -> Any:
    """``parent[key]``, or a SpecError naming the missing field."""
    if key not in parent:
        raise SpecError.one(_join(prefix, key), "is required")
    return parent[key]


def is_integer(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool (JSON's ``true`` and a column SQLite
    kept as given are no count: ``isinstance(True, int)`` holds)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is an int or a float and not a bool (finite or not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(value: Any, field: str) -> float:
    """A finite real number (booleans are not numbers here)."""
    if not is_number(value):
        raise SpecError.one(field, f"must be a number, got {_kind(value)}")
    try:
        x = float(value)
    except OverflowError:  # an int past float64's range
        x = math.inf
    if not math.isfinite(x):
        raise SpecError.one(field, f"must be finite, got {show(value)}")
    return x


def positive(value: Any, field: str) -> float:
    """A finite number > 0."""
    x = number(value, field)
    if x <= 0:
        raise SpecError.one(field, f"must be > 0, got {show(value)}")
    return x


def non_negative(value: Any, field: str) -> float:
    """A finite number >= 0."""
    x = number(value, field)
    if x < 0:
        raise SpecError.one(field, f"must be >= 0, got {show(value)}")
    return x


def integer(value: Any, field: str, *, minimum: int) -> int:
    """An integer >= ``minimum``; an integral float such as ``4.0`` is accepted."""
    if not is_number(value):
        raise SpecError.one(field, f"must be an integer, got {_kind(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise SpecError.one(field, f"must be an integer, got {show(value)}")
    n = int(value)
    if n < minimum:
        raise SpecError.one(field, f"must be >= {minimum}, got {show(value)}")
    if n > MAX_INTEGER:
        raise SpecError.one(field, f"must be <= 2**53 = {MAX_INTEGER}, got {show(value)}")
    return n


def positive_int(value: Any, field: str) -> int:
    """An integer >= 1."""
    return integer(value, field, minimum=1)


def text(value: Any, field: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError.one(field, f"must be a non-empty string, got {_kind(value)}")
    return value


def name(value: Any, field: str) -> str:
    """A non-empty string that shows as it is written: a name people read in tables and
    logs, without control or invisible format characters (:mod:`pricing.text`)."""
    given = text(value, field)
    why = printable_problem(given)
    if why is not None:
        raise SpecError.one(field, why)
    return given


MAX_JOB_ID_CHARS = 128
_JOB_ID_CHAR = re.compile(r"[A-Za-z0-9._-]")


def job_id(value: Any, field: str) -> str:
    """A job id (SPEC 3): 1-128 characters of ``A-Z a-z 0-9 . _ -``, since it names an
    MQTT topic level; the message names the first character outside them."""
    if not isinstance(value, str):
        raise SpecError.one(field, f"must be a string, got {_kind(value)}")
    if not value or len(value) > MAX_JOB_ID_CHARS:
        raise SpecError.one(
            field, f"must be 1-{MAX_JOB_ID_CHARS} characters long, got {len(value)}"
        )
    bad = next((i for i, c in enumerate(value) if not _JOB_ID_CHAR.fullmatch(c)), None)
    if bad is not None:
        raise SpecError.one(
            field,
            f"must be characters of A-Z a-z 0-9 . _ - only (it names an MQTT topic), "
            f"got {value[bad]!r} at position {bad}",
        )
    return value


MAX_OWNER_CHARS = 200
"""The longest submitter name a job key may start with (a token's name, ``[auth]``)."""
MAX_JOB_KEY_CHARS = MAX_OWNER_CHARS + 1 + MAX_JOB_ID_CHARS
_OWNER = re.compile(rf"[A-Za-z0-9_.@-]{{1,{MAX_OWNER_CHARS}}}")


def job_key(value: Any, field: str) -> str:
    """A job as the daemon stores it: its id (:func:`job_id`), or, for a job submitted
    with a token, the token's name (1-200 characters of ``A-Z a-z 0-9 _ . @ -``), ``:``
    and its id, so each submitter's ids are its own. Traces take plain ids only."""
    if isinstance(value, str) and ":" in value:
        owner, _, rest = value.partition(":")
        if not _OWNER.fullmatch(owner):
            raise SpecError.one(
                field, f"must be NAME:ID with NAME 1-{MAX_OWNER_CHARS} characters of "
                f"A-Z a-z 0-9 _ . @ -, got {show(owner)} before the ':'"
            )  # fmt: skip
        job_id(rest, field)
        return value
    return job_id(value, field)


def show(value: Any) -> str:
    """``repr(value)``, shortened: a 400-digit integer is not a readable message."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value)[:40]
