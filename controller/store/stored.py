"""What the store holds, read back as untrusted input: a row an operator, a bad migration
or a half-restored backup edited gives a :class:`~pricing.errors.SpecError` naming the
row and what is wrong with it, never another exception, a hang or unbounded memory, so
the caller can take that one row out and say so (README, "Security and limits")."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pricing.errors import SpecError
from pricing.fields import is_integer

__all__ = ["MAX_STORED_SPEC", "count_problem", "stored_spec", "utc"]

MAX_STORED_SPEC = 1 << 22
"""Characters of a stored spec read back (4 Mi): 64 times the default
``limits.max_spec_bytes``, so no spec the daemon stored is refused, and a row blown up by
hand is not parsed."""


def stored_spec(text: Any, job_id: str) -> Any:
    """The JSON value of job ``job_id``'s stored ``spec`` column (``job_from_dict`` then
    checks it is a job). SpecError if it is not JSON text of at most
    :data:`MAX_STORED_SPEC` characters (nested too deeply for the parser included), or if
    it is an object whose ``id`` is not ``job_id``: every path acts on the spec's id, and
    an edit that gave one job's row another job's id would otherwise act on that job
    (another tenant's included)."""
    where = f"the stored spec of job {job_id[:128]!r}"
    if not isinstance(text, str):
        raise SpecError.one(where, f"must be JSON text, got {type(text).__name__}")
    if len(text) > MAX_STORED_SPEC:
        raise SpecError.one(where, f"is {len(text)} characters, over {MAX_STORED_SPEC}")
    try:
        value = json.loads(text)
    except RecursionError:
        raise SpecError.one(where, "is JSON nested too deeply to read") from None
    except ValueError as err:  # JSONDecodeError, and a str too long to convert to an int
        raise SpecError.one(where, f"is not valid JSON: {str(err)[:200]}") from None
    if isinstance(value, dict) and value.get("id") != job_id:
        named = value.get("id")
        shown = repr(named[:128]) if isinstance(named, str) else "no id"
        raise SpecError.one(where, f"names {shown}, not the job it is stored as")
    return value


def count_problem(name: str, value: Any, chunks: int) -> str:
    """What is wrong with an allocation row's stored count ``name`` (``"workers"`` or
    ``"ps"``) of a job of ``chunks`` chunks: "" if it is an integer from 0 to ``chunks``,
    else ``"workers: must be 0 .. 8 (its chunks), got 1000"`` (the rebuild at a start
    and the plans a running daemon sends both refuse such a row)."""
    if is_integer(value) and 0 <= value <= chunks:
        return ""
    shown = "no integer" if value is None else str(value)[:24]
    return f"{name}: must be 0 .. {chunks} (its chunks), got {shown}"


def utc(at: datetime) -> datetime:
    """A stored time, zone-aware: SQLite keeps no zone, and the daemon stores UTC."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at
