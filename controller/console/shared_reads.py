"""The console's costly reads of the ledger, shared by every tab for a time in proportion
to their cost.

The overview's use over the window and the price heatmap read every server x slot of
the ledger in the decision thread, ahead of the tenants' waiting decisions (a daemon's
own read, :meth:`~controller.admission.AdmissionController.read`). Each open tab reads
them again at every event, at most every 0.7 s: at 10,000 servers x 300 slots one read
took 30-60 ms (the operator's scale audit), so ten tabs kept the decision thread busy
for most of every second, and every tenant's decision waited behind them.

A read here is reused by every reader until it is :data:`AGE_PER_READ_SECOND` times its
own duration old (timed in the decision thread; 1 ms of work: reused for 20 ms; 50 ms:
for 1 s), and readers who ask while it runs wait for that one read: whatever the tabs,
one kind of read takes at most ``1 / AGE_PER_READ_SECOND`` of the decision thread, and
a view is at most that much older than the ledger. All on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["AGE_PER_READ_SECOND", "SharedReads", "timed"]

AGE_PER_READ_SECOND = 20.0
"""Seconds a read is reused per second of the decision thread it took."""

_T = TypeVar("_T")


def timed(fn: Callable[[], _T]) -> Callable[[], tuple[_T, float]]:
    """``fn`` returning also its own duration in seconds (to time it where it runs: in
    the decision thread, not counting its wait for a turn)."""

    def run() -> tuple[_T, float]:
        started = time.perf_counter()
        value = fn()
        return value, time.perf_counter() - started

    return run


@dataclass(frozen=True)
class _Read:
    value: Any
    done: float  # monotonic seconds when it was read
    max_age: float  # seconds it is reused


class SharedReads:
    """Reads keyed by what they read, each reused for :data:`AGE_PER_READ_SECOND` times
    its duration (see the module docstring). Keys are few and fixed by the console
    (the overview's use; the heatmap of each resource, or of the costliest)."""

    def __init__(
        self,
        age_per_second: float = AGE_PER_READ_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.age_per_second = age_per_second
        self.clock = clock
        self._done: dict[Hashable, _Read] = {}
        self._running: dict[Hashable, asyncio.Future[Any]] = {}  # reads under way
        self.reads = 0  # reads run (not reused), for tests and benchmarks

    async def get(self, key: Hashable, read: Callable[[], Awaitable[tuple[_T, float]]]) -> _T:
        """The value of ``read`` under ``key``: reused while fresh enough, else read once
        for every reader asking meanwhile. ``read`` returns the value and the seconds it
        took (:func:`timed`). It runs as a task of its own, so a reader that goes away
        (its tab closed) does not cancel it for the others; a read that fails fails the
        readers waiting for it and is not kept."""
        last = self._done.get(key)
        if last is not None and self.clock() - last.done < last.max_age:
            value: _T = last.value
            return value
        task = self._running.get(key)
        if task is None:
            task = asyncio.ensure_future(read())
            self._running[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        value, _seconds = await asyncio.shield(task)
        return value

    def _finished(self, key: Hashable, task: asyncio.Future[Any]) -> None:
        del self._running[key]
        if task.cancelled() or task.exception() is not None:  # retrieved: logged by waiters
            return
        value, seconds = task.result()
        self.reads += 1
        self._done[key] = _Read(value, self.clock(), self.age_per_second * seconds)
