"""What every ``oasis`` command shares: exit codes, input errors, reading a trace."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

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
    "load_trace",
    "positive_seconds",
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


def load_trace(path: str) -> Trace:
    """Read and validate a trace file (``-`` reads standard input)."""
    from pricing.errors import SpecError
    from pricing.trace import trace_from_dict

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{path}: not JSON: {err.msg} at line {err.lineno} column {err.colno}"
        ) from err
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
