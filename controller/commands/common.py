"""What every ``oasis`` command shares: exit codes, input errors, reading a trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pricing import SpecError, Trace, trace_from_dict

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILURE", "EXIT_OK", "InputError", "fmt", "load_trace"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Input the command cannot use; the message is shown as is."""


def load_trace(path: str) -> Trace:
    """Read and validate a trace file (``-`` reads standard input)."""
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
        raise InputError(f"{path}: invalid trace:\n{lines}") from err


def fmt(x: float | None, digits: int = 4) -> str:
    """A number for a table cell; ``-`` for None."""
    return "-" if x is None else f"{x:.{digits}g}"
