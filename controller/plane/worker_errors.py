"""A worker command's standard error, in the agent's log: each line an event
(``worker stderr``, with the job, the worker's index and pid), at most
:data:`STDERR_LINES_PER_SECOND` a second per worker, the others counted and said
(``worker stderr lines not logged``), and read no faster than its standard output is
(:class:`~controller.plane.workers.OutputBudget`).

Before, a worker's standard error was the agent's own: a worker writing it as fast as it
could filled the agent's log (a file on the server's disk, or the journal, whose rate
limit then dropped the agent's own warnings), its lines were not JSON and named no job,
and a line of it could split one of the agent's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["MAX_LINE_CHARS", "STDERR_BURST", "STDERR_LINES_PER_SECOND", "log_errors"]

STDERR_LINES_PER_SECOND = 10.0
"""The most lines of one worker's standard error logged a second, past a burst."""

STDERR_BURST = 100.0
"""Lines of one worker's standard error logged at once before the rate holds (a
traceback whole)."""

MAX_LINE_CHARS = 1000
"""The longest part of a line logged, in characters; the rest is cut (the line says so)."""

_LINE_LIMIT = 1 << 16
"""The longest line read whole, in bytes; a longer one is logged cut, its rest dropped."""

DROPPED_EVERY = 10.0
"""Seconds between two ``worker stderr lines not logged`` of one worker."""


async def log_errors(
    stream: asyncio.StreamReader,
    log: Any,
    spend: Any,
    monotonic: Any = time.monotonic,
    **about: Any,
) -> None:
    """Log ``stream`` (a worker's standard error) to its end, a line an event tagged with
    ``about`` (job, worker, pid), within the rate; ``await spend(bytes)`` paces the
    reading (the worker waits on its pipe). Lines over the rate are counted, and said at
    most every :data:`DROPPED_EVERY` seconds and at the end."""
    tokens, at = STDERR_BURST, monotonic()
    dropped, said = 0, at
    skip_rest = False  # the rest of a line over _LINE_LIMIT, its start logged
    try:
        while True:
            cut = False
            try:
                raw = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:  # the end: a last line, or none
                raw = end.partial
                if not raw or skip_rest:  # none, or the tail of a line logged cut
                    break
            except asyncio.LimitOverrunError as over:  # a line over the limit: its start
                raw = await stream.readexactly(over.consumed)
                cut, was_cut, skip_rest = True, skip_rest, True
                if was_cut:  # more of a line already logged cut
                    await spend(len(raw))
                    continue
            else:
                if skip_rest:  # the tail of a line already logged cut
                    skip_rest = False
                    await spend(len(raw))
                    continue
            await spend(len(raw))
            now = monotonic()
            tokens, at = min(STDERR_BURST, tokens + (now - at) * STDERR_LINES_PER_SECOND), now
            if tokens >= 1:
                tokens -= 1
                log.info("worker stderr", line=_text(raw, cut), **about)
            else:
                dropped += 1
            if dropped and now - said >= DROPPED_EVERY:
                _said(log, dropped, about)
                dropped, said = 0, now
    finally:
        if dropped:
            _said(log, dropped, about)


def _said(log: Any, dropped: int, about: dict[str, Any]) -> None:
    log.warning("worker stderr lines not logged: over the rate", lines=dropped,
                per_second=STDERR_LINES_PER_SECOND, **about)  # fmt: skip


def _text(raw: bytes, cut: bool) -> str:
    """A line's text, its end of line off, cut to :data:`MAX_LINE_CHARS` (``cut``: it
    was already, at :data:`_LINE_LIMIT` bytes)."""
    text = raw.decode(errors="replace").rstrip("\r\n")
    if cut or len(text) > MAX_LINE_CHARS:
        return text[:MAX_LINE_CHARS] + " [cut]"
    return text
