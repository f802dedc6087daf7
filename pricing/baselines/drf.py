"""Dominant Resource Fairness (paper V-A (ii); Ghodsi et al., NSDI 2011): every job is
admitted; on each event the workers and PS of all unfinished jobs are recomputed by
progressive filling to max-min fair dominant shares.

Reading:
- one unit of a job is one worker plus the PS it adds (``z(y+1) - z(y)``, 0 or 1);
- a job's dominant share is its largest fraction of the cluster's total capacity of
  one resource, over worker and PS servers (each server kind's totals counted apart);
- progressive filling: repeatedly the unfinished job with the lowest dominant share
  (ties: the earlier arrival) gets one more unit, placed round-robin, until it reaches
  ``min(N, remaining work)`` workers or its unit fits nowhere; then it stops growing and
  the others go on (the discrete form of DRF with per-server placement);
- every job is re-placed from scratch on each event (moves cost nothing).
"""

from __future__ import annotations

import heapq

from pricing.baselines.simulator import Simulator

__all__ = ["Drf"]


class Drf:
    """Max-min fair dominant shares, recomputed on every arrival and completion."""

    def replan(self, sim: Simulator) -> None:
        for task in sim.arrivals:
            sim.admit(task)
        active = sim.active
        for task in active:
            sim.release(task)
        heap = [(0.0, task.order) for task in active if task.cap > 0]
        by_order = {task.order: task for task in active}
        heapq.heapify(heap)
        while heap:
            _, order = heapq.heappop(heap)
            task = by_order[order]
            if task.y < task.cap and sim.grow(task):
                heapq.heappush(heap, (sim.share(task, task.y), order))
