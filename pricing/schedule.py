"""A job's allocation: workers and PS per server in consecutive slots."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Schedule"]


@dataclass(frozen=True, eq=False)
class Schedule:
    """Workers and PS per server in consecutive slots from ``start``.

    Attributes:
        start: the absolute slot of row 0.
        workers: ``(n, H)`` int32, workers per worker server and slot.
        ps: ``(n, K)`` int32, PS per PS server and slot.
    """

    start: int
    workers: NDArray[np.int32]
    ps: NDArray[np.int32]

    @property
    def slots(self) -> int:
        """Rows in the schedule."""
        return int(self.workers.shape[0])

    @property
    def end(self) -> int:
        """The last absolute slot with at least one worker (``start - 1`` if none)."""
        used = np.flatnonzero(self.workers.sum(axis=1))
        return self.start + int(used[-1]) if used.size else self.start - 1

    def worker_counts(self) -> NDArray[np.int64]:
        """``(n,)`` workers per slot."""
        return np.asarray(self.workers.sum(axis=1), dtype=np.int64)

    def work(self) -> int:
        """Worker-slots in the schedule."""
        return int(self.workers.sum())

    def after(self, slot: int) -> Schedule:
        """The part of the schedule from ``slot`` on (empty if ``slot`` is past its end)."""
        cut = min(max(slot - self.start, 0), self.slots)
        return Schedule(max(slot, self.start), self.workers[cut:], self.ps[cut:])

    def before(self, slot: int) -> Schedule:
        """The part of the schedule strictly before ``slot``."""
        cut = min(max(slot - self.start, 0), self.slots)
        return Schedule(self.start, self.workers[:cut], self.ps[:cut])
