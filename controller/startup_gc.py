"""Python's garbage collector during a process's start-up: run rarely while the imports
and the store's rebuild make their long-lived objects, then set back, with what start-up
made frozen out of every later collection.

A daemon's start leaves about 200,000 objects the collector tracks, and they live as long
as it does (numba's typing registries, SQLAlchemy's mappers, the protobuf descriptors, the
ledger). With the collector's default first threshold (700 allocations), a collection ran
every 700 of them, a larger one every tenth, and each of the larger ones that came late
walked most of what was made so far: 0.23-0.54 s in the collector before the daemon
listened (``gc.callbacks``, ``oasisd`` on SQLite and the test suite's cluster), against
0.18-0.19 s with :data:`STARTUP_THRESHOLD`. Start-up makes little cyclic garbage
(about 5,000 objects collected in all), and cycles are still collected, only less often.

:func:`hold` before the imports; :func:`release` once started: one full collection,
:func:`gc.freeze` (what is left is start-up's, kept for good: no later collection walks
it), and the thresholds :func:`hold` found. Used by ``oasisd`` (:mod:`controller.oasisd`,
:mod:`controller.daemon`) and by its commit process (:mod:`controller.store.commit_process`).
"""

from __future__ import annotations

import gc

__all__ = ["STARTUP_THRESHOLD", "hold", "release"]

STARTUP_THRESHOLD = 10_000
"""Allocations (less deallocations) between the young generation's collections while
starting; Python's default is 700. Collecting not at all saved little more (one run:
1.26 s of CPU a start with either, 1.61 s with the default), and left cycles made
meanwhile to the end of start-up."""

_found: list[tuple[int, int, int]] = []  # the thresholds before hold(), once held


def hold() -> None:
    """Collect rarely from now on until :func:`release` (again: a no-op)."""
    if not _found:
        _found.append(gc.get_threshold())
    first, second, third = _found[0]
    gc.set_threshold(max(first, STARTUP_THRESHOLD), second, third)


def release() -> None:
    """Start-up is over: collect once, freeze what is left, and set the thresholds back to
    what :func:`hold` found (the current ones if it was not called)."""
    gc.collect()
    gc.freeze()
    if _found:
        gc.set_threshold(*_found.pop())
