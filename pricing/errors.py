"""Errors raised by the numeric core.

The hierarchy::

    OasisError                 base of everything this project raises on purpose
    ├── SpecError              bad input: names each offending field and why
    ├── CapacityError          an allocation would exceed a capacity (a bug, never input)
    └── LedgerError            a slot outside the ledger's window, an unknown job
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["CapacityError", "LedgerError", "OasisError", "Problem", "SpecError", "check_all"]


class OasisError(Exception):
    """Base class of the project's own errors."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: the field's path (``jobs[3].tau``) and the reason."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" if self.field else self.reason


class SpecError(OasisError, ValueError):
    """Invalid job, cluster, pricing or trace input. Carries every problem found, or,
    for an input with very many, the first ones and how many ``more`` were found."""

    def __init__(self, problems: Iterable[Problem], more: int = 0) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.more = more
        if not self.problems:
            raise ValueError("SpecError needs at least one problem")
        tail = [f"and {more} more problems"] if more > 0 else []
        super().__init__("; ".join([*(str(p) for p in self.problems), *tail]))

    @classmethod
    def one(cls, field: str, reason: str) -> SpecError:
        """A SpecError with a single problem."""
        return cls([Problem(field, reason)])

    @property
    def field(self) -> str:
        """The first offending field."""
        return self.problems[0].field

    @property
    def reason(self) -> str:
        """Why the first offending field is wrong."""
        return self.problems[0].reason


def check_all(*checks: Callable[[], object]) -> None:
    """Run every one of ``checks`` (independent checks of one input) and raise one
    SpecError with the problems of all that failed: of the class they share (a
    JobTooLargeError stays one), else a SpecError."""
    failed: list[SpecError] = []
    for check in checks:
        try:
            check()
        except SpecError as err:
            failed.append(err)
    if len(failed) == 1:
        raise failed[0]
    if failed:
        kind = type(failed[0]) if all(type(e) is type(failed[0]) for e in failed) else SpecError
        raise kind([p for e in failed for p in e.problems])


class CapacityError(OasisError):
    """An allocation would exceed a server's capacity."""


class LedgerError(OasisError):
    """A request the ledger cannot serve: a slot outside its window or an unknown job."""
