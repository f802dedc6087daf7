"""FIFO (paper V-A (i), the default of Hadoop and Spark): every job is admitted, and jobs
start in arrival order with a fixed number of workers and PS.

Reading (favourable to FIFO where the paper is silent):
- a job's workers are fixed when it arrives (:func:`~pricing.baselines.sizing.fixed_workers`)
  and never change while it runs (in its last slot only those its remaining work needs);
- strict head-of-line: the first waiting job starts as soon as its whole fixed
  allocation (``y`` workers and ``z(y)`` PS, placed round-robin) fits, and no later job
  starts before it;
- a waiting job that can no longer finish by the horizon is dropped (simulator rule),
  so it stops blocking the queue;
- running jobs are never paused or moved.
"""

from __future__ import annotations

from collections import deque

from pricing.baselines.simulator import Simulator, Status, Task
from pricing.baselines.sizing import fixed_workers

__all__ = ["Fifo"]


class Fifo:
    """First in, first out, head-of-line blocking, fixed allocations."""

    def __init__(self) -> None:
        self.queue: deque[Task] = deque()
        """Admitted tasks that have not started, in arrival order."""

    def replan(self, sim: Simulator) -> None:
        for task in sim.arrivals:
            sim.admit(task, limit=fixed_workers(task))
            self.queue.append(task)
        while self.queue:
            head = self.queue[0]
            if head.status is not Status.ACTIVE:  # dropped while waiting
                self.queue.popleft()
                continue
            if not sim.place(head, head.cap):
                break
            self.queue.popleft()
