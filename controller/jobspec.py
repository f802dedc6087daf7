"""Job specs as the daemon takes them: JSON in people's units, ids it makes, times it
resolves, and a check that the job can be worth anything.

A submitted spec goes through :func:`read_json` (when sent as JSON), :func:`prepare`
(an id if it has none; each wall-clock time in its utility becomes ``{"slot": S}``, the
start of the slot it falls in, so a retried submission stores the same spec at any
later moment) and :func:`check_worth`, then to the admission controller, which reads it
with :func:`pricing.job.job_from_dict` (durations there are converted with the slot
length). :func:`for_display` turns the stored ``{"slot": S}`` back into a time, and
:func:`spec_differences` tells a retry (the same job, however its numbers and durations
are written) from another job under the same id.
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller.clock import SlotTimes
from pricing.durations import (
    format_duration,
    format_time,
    parse_duration,
    parse_time,
    slots_in_time,
)
from pricing.errors import Problem, SpecError
from pricing.fields import DuplicateKeyError, is_integer, is_number, show, unique_object
from pricing.json_mistakes import json_problem
from pricing.utility import WHEN_KEYS

__all__ = [
    "ID_PREFIX",
    "check_job_worth",
    "check_worth",
    "comparable",
    "for_display",
    "has_times",
    "new_id",
    "prepare",
    "read_json",
    "spec_differences",
]

ID_PREFIX = "job-"


def new_id() -> str:
    """A fresh job id: ``job-`` and 16 random hex digits (64 bits: no collision in any
    store's lifetime), inside the safe alphabet of SPEC 3."""
    return ID_PREFIX + secrets.token_hex(8)


def read_json(text: str, field: str = "job") -> dict[str, Any]:
    """The JSON object in ``text``; SpecError (not a parser's exception) otherwise, a key
    given twice in one object included (:func:`pricing.fields.unique_object`)."""
    try:
        data = json.loads(text, object_pairs_hook=unique_object)
    except DuplicateKeyError as err:  # json alone keeps the last value without a word
        raise SpecError.one(field, str(err)) from None
    except json.JSONDecodeError as err:
        raise SpecError.one(field, f"not JSON: {json_problem(err)}") from None
    except RecursionError:
        raise SpecError.one(field, "not a job: nested too deeply") from None
    except ValueError:  # an integer past Python's digit limit (its message tells a
        # programmer to call sys.set_int_max_str_digits: not the user's remedy)
        digits = sys.get_int_max_str_digits()
        raise SpecError.one(
            field, f"not JSON that can be read: an integer of more than {digits} digits"
        ) from None
    if not isinstance(data, dict):
        raise SpecError.one(field, "must be a JSON object")
    return data


_REALS = ("tau", "minibatch_seconds", "grad_mb")
_COUNTS = ("epochs", "chunks", "minibatches")
_SPANS = (*WHEN_KEYS, "half_life")
"""The keys of a utility object that hold a time or a length of time."""


def _real(value: Any) -> Any:
    """An int as the float it stands for (what the typed JobSpec fields carry); anything
    else as it is, for the parser to judge."""
    if is_integer(value):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def _count(value: Any) -> Any:
    """An integral float (``8.0``, ``1e1``) as the int the parser reads it as (what the
    typed JobSpec fields carry); anything else as it is, for the parser to judge."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def _numbers_as_typed(spec: dict[str, Any]) -> None:
    """Counts as ints, demands, times and utilities as floats, in place: a job sent as
    JSON (``"gpu": 1``, ``"chunks": 8.0``) is then stored as the same job sent as typed
    fields (``gpu = 1.0``, ``chunks = 8``), so either retries the other."""
    for key in _COUNTS:
        if key in spec:
            spec[key] = _count(spec[key])
    for key in _REALS:
        if key in spec:
            spec[key] = _real(spec[key])
    for side in ("worker", "ps"):
        if isinstance(spec.get(side), Mapping):
            spec[side] = {k: _real(v) for k, v in spec[side].items()}
    utility = spec.get("utility")
    if isinstance(utility, Mapping):
        spec["utility"] = {
            k: [_real(x) for x in v] if isinstance(v, list) else _real(v)
            for k, v in utility.items()
        }


def prepare(spec: dict[str, Any], times: SlotTimes) -> dict[str, Any]:
    """``spec`` with an id (made with :func:`new_id` when absent or empty), its numbers
    as the typed fields carry them (:func:`_numbers_as_typed`), and each wall-clock time
    in its utility replaced by ``{"slot": S}``, S the slot it falls in (a job done by the
    start of slot S ends by that time at the latest).

    A time the parser cannot read (no UTC offset, say) is left as it is: the job's
    parser names it with every other problem of the spec.
    """
    out = dict(spec)
    if out.get("id", "") == "":
        out["id"] = new_id()
    _numbers_as_typed(out)

    def at_slot(value: Any) -> Any:
        if not isinstance(value, str):
            return _KEEP
        try:
            at = parse_time(value)
        except ValueError:
            return _KEEP  # no UTC offset: the job's parser says so
        return _KEEP if at is None else {"slot": times.slot_at(at)}  # None: a duration

    return _utility_mapped(out, WHEN_KEYS, at_slot)


def has_times(spec: Mapping[str, Any]) -> bool:
    """True if the spec's utility holds a slot's start (a resolved wall-clock time): its
    meaning then depends on when the job arrives."""
    utility = spec.get("utility")
    return isinstance(utility, Mapping) and any(
        isinstance(utility.get(k), Mapping) for k in WHEN_KEYS
    )


def for_display(spec: Mapping[str, Any], times: SlotTimes) -> dict[str, Any]:
    """``spec`` with each ``{"slot": S}`` of its utility shown as the time slot S starts
    (ISO 8601, UTC): the form people wrote, which :func:`prepare` reads back to S."""

    def shown(value: Any) -> Any:
        if isinstance(value, Mapping) and isinstance(value.get("slot"), int):
            return format_time(times.start(value["slot"]))
        return _KEEP

    return _utility_mapped(dict(spec), WHEN_KEYS, shown)


def comparable(spec: Mapping[str, Any], slot_seconds: float) -> dict[str, Any]:
    """``spec`` as the daemon reads it, to tell whether two submissions are one job: its
    numbers as :func:`_numbers_as_typed` makes them, and each duration in its utility in
    slots (``"120m"`` and ``"2h"`` are 2 slots of an hour, as is ``2``). Anything the
    parser would refuse stays as it is."""
    out = dict(spec)
    _numbers_as_typed(out)
    given = out.get("minibatch_seconds")  # "1.5s" and 1.5 are one job
    seconds = parse_duration(given) if isinstance(given, str) else None
    if seconds is not None:
        out["minibatch_seconds"] = seconds

    def in_slots(value: Any) -> Any:
        seconds = parse_duration(value) if isinstance(value, str) else None
        return _KEEP if seconds is None else seconds / slot_seconds

    return _utility_mapped(out, _SPANS, in_slots)


_KEEP = object()
"""What a :func:`_utility_mapped` conversion gives for a value it leaves as it is."""


def _utility_mapped(
    spec: dict[str, Any], keys: Iterable[str], convert: Callable[[Any], Any]
) -> dict[str, Any]:
    """``spec`` with each of ``keys`` in its utility (an object; else nothing changes)
    replaced by ``convert(value)``, unless that is :data:`_KEEP`; the utility is copied."""
    utility = spec.get("utility")
    if isinstance(utility, Mapping):
        resolved = dict(utility)
        for key in keys:
            if key in utility:
                new = convert(utility[key])
                if new is not _KEEP:
                    resolved[key] = new
        spec["utility"] = resolved
    return spec


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    """Equal values, numbers to a relative 1e-9 (``"0.1h"`` is 6 minutes to rounding)."""
    if is_number(a) and is_number(b):
        try:
            return math.isclose(a, b, rel_tol=1e-9)
        except OverflowError:  # an int past float64's range
            return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def _is_span(path: str) -> bool:
    """Whether ``path`` names a time or length of time in a utility."""
    return path.startswith("utility.") and path.removeprefix("utility.") in _SPANS


def _compare(there: Any, here: Any, path: str, out: list[tuple[str, Any, Any]]) -> None:
    if isinstance(there, Mapping) and isinstance(here, Mapping) and not _is_span(path):
        for key in sorted({*there, *here}, key=str):
            name = str(key) if len(str(key)) <= 40 else f"{str(key)[:30]}..."
            sub = f"{path}.{name}" if path else name
            _compare(there.get(key, _ABSENT), here.get(key, _ABSENT), sub, out)
    elif isinstance(there, list) and isinstance(here, list) and len(there) == len(here):
        for i, (a, b) in enumerate(zip(there, here, strict=True)):
            _compare(a, b, f"{path}[{i}]", out)
    elif not _same(there, here):
        out.append((path, there, here))


def _shown(path: str, value: Any, slot_seconds: float, times: SlotTimes | None) -> str:
    if value is _ABSENT:
        return "none"
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # as the spec has it: null, true
    if _is_span(path):
        if isinstance(value, float):
            return f"{value:.10g} slots ({format_duration(value * slot_seconds)})"
        if isinstance(value, Mapping) and isinstance(value.get("slot"), int) and times:
            return format_time(times.start(value["slot"]))
    if isinstance(value, float):
        return f"{value:.10g}"
    return show(value)


def spec_differences(
    there: Mapping[str, Any],
    here: Mapping[str, Any],
    *,
    slot_seconds: float,
    times: SlotTimes | None = None,
) -> list[str]:
    """How spec ``here`` differs from the stored ``there``, read alike (:func:`comparable`),
    one field a line: ``chunks: stored 8, sent 16``. Empty: the same job (a retry).

    A spec stored by an older version compares too: it may hold ints where floats are
    stored now, or a duration where a number of slots is given."""
    found: list[tuple[str, Any, Any]] = []
    _compare(comparable(there, slot_seconds), comparable(here, slot_seconds), "", found)
    return [
        f"{path}: stored {_shown(path, a, slot_seconds, times)}, "
        f"sent {_shown(path, b, slot_seconds, times)}"
        for path, a, b in found
    ]


def check_worth(
    spec: Mapping[str, Any],
    *,
    cluster: Any,
    slot_seconds: float,
    window: int,
    arrival: int,
    field: str = "job",
) -> None:
    """Refuse a job whose utility is 0 at the fewest slots it can take: no schedule can
    pay off, and its price bounds would have no floor. The message says by how much a
    deadline is too close.

    Raises:
        SpecError: that, or any problem of the spec itself (as the admission would).
    """
    from pricing.job import job_from_dict  # numpy: the daemon's side only

    job = job_from_dict(
        spec,
        cluster,
        slot_seconds=slot_seconds,
        slots_available=lambda _a: window,
        arrival=arrival,
        field=field,
    )
    check_job_worth(job, spec, slot_seconds=slot_seconds, field=field)


def past_times(spec: Mapping[str, Any], arrival: int, times: SlotTimes) -> str:
    """A note on the times of ``spec``'s utility (resolved, ``{"slot": S}``) that lie at or
    before the start of its arrival slot, for the reason of a rejection: such a job is
    valid (a late job may still be worth something), but a mistyped date reads as its
    prices being too high. Empty if there is none."""
    utility = spec.get("utility")
    if not isinstance(utility, Mapping):
        return ""
    past = []
    for key in WHEN_KEYS:
        value = utility.get(key)
        slot = value.get("slot") if isinstance(value, Mapping) else None
        if isinstance(slot, int) and slot <= arrival:
            past.append(f"utility.{key} {format_time(times.start(slot))}")
    if not past:
        return ""
    return (
        f"; note: {' and '.join(past)} {'is' if len(past) == 1 else 'are'} not after the "
        f"job's arrival ({format_time(times.start(arrival))}), so its utility has decayed "
        "before it can run: is the date right?"
    )


def check_job_worth(
    job: Any, spec: Mapping[str, Any], *, slot_seconds: float, field: str = "job"
) -> None:
    """:func:`check_worth` of ``job``, already parsed from ``spec`` (the admission's)."""
    from pricing.job import work_in_words  # numpy: the daemon's side only

    d_min = job.min_slots
    if float(job.utility.log_values(d_min)) > -math.inf:
        return
    need = slots_in_time(d_min, slot_seconds)
    raw = spec.get("utility")
    due = getattr(job.utility, "deadline", None)
    if isinstance(raw, Mapping) and raw.get("kind") == "deadline" and due is not None:
        if due > 0:
            whole = max(0, math.floor(due + 1e-9))
            left = slots_in_time(whole, slot_seconds)
            part = ""
            if due - whole > 1e-9:  # "30m" of hour slots: "leaves 0 slots (0s)" alone
                # read as a contradiction of what the user wrote
                part = (f" ({format_duration(due * slot_seconds)} is {due:.6g} slots: a job "
                        "ends with a slot, so only whole slots count)")  # fmt: skip
            where = f"leaves {left} after the job's arrival{part}, but it needs"
        else:  # a time at or before the arrival ({"slot": S}): a mistyped date, likely
            early = math.ceil(-due - 1e-9)
            when = f"is {slots_in_time(early, slot_seconds)} before" if early else "is at"
            where = f"{when} the job's arrival (is the date right?), but the job needs"
        raise SpecError([
            Problem(f"{field}.utility.deadline",
                    f"{where} at least {need} even on an empty cluster, and its value "
                    "after the deadline is 0: give a later deadline, or a half_life"),
            Problem(f"{field}.work", work_in_words(job, slot_seconds)),
        ])  # fmt: skip
    raise SpecError.one(
        f"{field}.utility",
        f"is 0 at {need}, the fewest the job can take even on an empty cluster: no "
        "schedule can pay off",
    )
