"""The fixed number of workers FIFO and RRH give a job (paper V-A: "fixed to a number
within [...]"; the range was lost in extraction)."""

from __future__ import annotations

from pricing.baselines.simulator import Task

__all__ = ["fixed_workers"]


def fixed_workers(task: Task) -> int:
    """Workers per slot ``task`` keeps for its whole run: ``y_max``, the most it can use
    on the empty cluster (``min(N, what fits with its PS)``).

    The reading most favourable to FIFO and RRH among those we measured: on generated
    traces at 50 + 50 servers, T = 300, 100 and 300 jobs, ``y_max`` gave RRH 1.3 to 1.8
    times the total utility of ``ceil(y_max / 2)`` or of the fewest workers meeting the
    utility's half-value time, and FIFO about the same as either (within noise).
    """
    return task.y_max
