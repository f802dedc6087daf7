"""What every ``oasis`` command shares: exit codes, input errors, reading a trace."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pricing.errors import Problem

if TYPE_CHECKING:  # the client commands never read traces: no numpy at their start
    from pricing.trace import Trace

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILURE",
    "EXIT_OK",
    "InputError",
    "fmt",
    "int_at_least",
    "load_prior_file",
    "load_trace",
    "positive_seconds",
    "read_json",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Input the command cannot use; the message is shown as is.

    Attributes:
        problems: the bad fields, when the input is a job or a trace.
    """

    def __init__(self, message: str, problems: Iterable[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


def read_json(path: str, what: str = "") -> Any:
    """A JSON file (``-``: standard input); InputError saying why not."""
    name = what or path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{name}: cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{name}: not UTF-8 text: {err.reason}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{name}: not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from err


def load_prior_file(path: Path, what: str) -> Any:
    """The JSON of a prior file (``oasis calibrate`` writes one), size-checked."""
    from pricing.bound_prior import MAX_PRIOR_BYTES  # numpy: not for every client command

    try:
        size = path.stat().st_size
    except OSError as err:
        raise InputError(f"{what}: cannot read {path}: {err.strerror or err}") from err
    if size > MAX_PRIOR_BYTES:
        raise InputError(f"{what}: {path} is {size} bytes, more than a prior ({MAX_PRIOR_BYTES})")
    return read_json(str(path), f"{what} ({path})")


def load_trace(path: str) -> Trace:
    """Read and validate a trace file (``-`` reads standard input).

    A ``pricing.prior`` that names a file (not ``"default"`` or ``"none"``) is read from
    there, relative to the trace's directory (the working directory for stdin)."""
    from pricing.errors import SpecError
    from pricing.trace import trace_from_dict

    data = read_json(path)
    pricing = data.get("pricing") if isinstance(data, dict) else None
    prior = pricing.get("prior") if isinstance(pricing, dict) else None
    if isinstance(pricing, dict) and isinstance(prior, str) and prior not in ("default", "none"):
        base = Path.cwd() if path == "-" else Path(path).parent
        data = {
            **data,
            "pricing": {
                **pricing,
                "prior": load_prior_file(base / prior, f"{path}: pricing.prior"),
            },
        }
    try:
        return trace_from_dict(data)
    except SpecError as err:
        lines = "\n".join(f"  {p}" for p in err.problems)
        raise InputError(f"{path}: invalid trace:\n{lines}", err.problems) from err


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= low``, or an error saying which."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def fmt(x: float | None, digits: int = 4) -> str:
    """A number for a table cell; ``-`` for None."""
    return "-" if x is None else f"{x:.{digits}g}"
