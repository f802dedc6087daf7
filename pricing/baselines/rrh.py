"""Risk-Reward Heuristic (paper V-A (iii); Irwin, Grit, Chase, HPDC 2004): admit a job
if its utility minus the delay cost its admission causes exceeds a threshold; on each
event every unfinished job continues (same workers and PS) or pauses, by its future
utility gain minus cost.

Reading (the paper gives no formulas; Irwin et al.'s FirstReward, made concrete):
- each job runs with a fixed number of workers ``y`` (the FIFO rule,
  :func:`~pricing.baselines.sizing.fixed_workers`) and ``z(y)`` PS whenever it runs;
  its remaining run time is ``RPT = ceil(remaining / y)`` slots;
- gain: ``f(t - a + RPT)``, its utility if it runs from the current slot ``t`` on;
- delay cost of running job i: it holds a dominant share ``s_i`` of the cluster for
  ``RPT_i`` slots, which delays the other unfinished jobs by about
  ``D_i = ceil(s_i RPT_i)`` slots; its cost is the utility they lose,
  ``sum_{j != i} f_j(e_j) - f_j(e_j + D_i)`` with ``e_j = t - a_j + RPT_j``; it is 0
  when the dominant shares of all unfinished jobs (arrivals included) sum to at most 1
  (no one waits);
- admission: an arrival is admitted iff gain - cost > ``THRESHOLD`` (1e-9, as OASiS);
- continue or pause: the admitted unfinished jobs are ranked by reward density
  ``(gain - cost) / (s RPT)`` (FirstReward divides by run time; dividing by the share
  too accounts for several resources), ties to the earlier arrival, and started in
  that order while they fit: a running job keeps its servers if they are free, else is
  placed round-robin; a job that does not fit pauses (and keeps its progress). Jobs
  with gain - cost <= 0 rank last but still take what is left, so no resource idles
  while an admitted job could use it.
"""

from __future__ import annotations

import numpy as np

from pricing.baselines.simulator import Simulator, Task
from pricing.baselines.sizing import fixed_workers

__all__ = ["THRESHOLD", "Rrh", "RrhNoPreemption"]

THRESHOLD = 1e-9
"""An arrival is admitted iff its gain minus delay cost exceeds this (utility units)."""


def _below_threshold(net: float) -> str:
    """A rejected arrival's reason."""
    return (
        f"RRH: its utility minus the delay cost its admission causes the other jobs is "
        f"{net:.6g}, not above the threshold {THRESHOLD:g}"
    )


class Rrh:
    """Reward-density ranking with delay costs; fixed allocations; pause and resume."""

    def replan(self, sim: Simulator) -> None:
        arrivals = list(sim.arrivals)
        limits = {task.order: fixed_workers(task) for task in arrivals}
        candidates = sim.active + arrivals
        net, density = _net_rewards(sim, candidates, limits)
        for task in arrivals:
            if net[task.order] > THRESHOLD:
                sim.admit(task, limit=limits[task.order])
            else:
                sim.reject(task, _below_threshold(net[task.order]))
        active = sim.active
        held = {task.order: (task.workers, task.ps) for task in active if task.y}
        for task in active:
            sim.release(task)
        for task in sorted(active, key=lambda x: (-density[x.order], x.order)):
            before = held.get(task.order)
            same = before is not None and int(before[0].sum()) == task.cap
            if not (same and before is not None and sim.assign(task, *before)):
                sim.place(task, task.cap)


class RrhNoPreemption:
    """RRH without the free pause and resume: the same admission and ranking, but a job
    that has started keeps its workers, PS and servers until it completes (or can no
    longer finish and is dropped); only jobs that have not started are placed, in
    ranking order, into what is free. OASiS commits a job's whole schedule at arrival
    and never preempts it either, so this is the fair comparison of that one trait."""

    def replan(self, sim: Simulator) -> None:
        arrivals = list(sim.arrivals)
        limits = {task.order: fixed_workers(task) for task in arrivals}
        net, density = _net_rewards(sim, sim.active + arrivals, limits)
        for task in arrivals:
            if net[task.order] > THRESHOLD:
                sim.admit(task, limit=limits[task.order])
            else:
                sim.reject(task, _below_threshold(net[task.order]))
        waiting = [task for task in sim.active if not task.y]
        for task in sorted(waiting, key=lambda x: (-density[x.order], x.order)):
            sim.place(task, task.cap)


def _net_rewards(
    sim: Simulator, tasks: list[Task], limits: dict[int, int]
) -> tuple[dict[int, float], dict[int, float]]:
    """Per task order: gain minus delay cost, and that per unit of share-time."""
    t = sim.slot
    y = [min(limits.get(x.order, x.limit), x.remaining) for x in tasks]
    rpt = np.array([-(-x.remaining // n) for x, n in zip(tasks, y, strict=True)])
    share = np.array([sim.share(x, n) for x, n in zip(tasks, y, strict=True)])
    done_at = np.array([t - x.job.arrival for x in tasks]) + rpt  # e_j
    gain = np.array([float(x.job.utility.values(e)) for x, e in zip(tasks, done_at, strict=True)])
    cost = np.zeros(len(tasks))
    if share.sum() > 1.0:
        delay = np.ceil(share * rpt - 1e-9)
        # utilities near the float range (priority 1e308) sum past it: such a cost is
        # inf, the net -inf, and the job is rejected, without numpy's warning on stderr
        with np.errstate(over="ignore"):
            for j, x in enumerate(tasks):
                # loss[i]: what job j loses if job i delays it by delay[i]
                loss = gain[j] - x.job.utility.values(done_at[j] + delay)
                loss[j] = 0.0
                cost += loss
    net = gain - cost
    with np.errstate(over="ignore"):  # net near the float range over a share below 1: inf
        dens = net / np.maximum(share * rpt, 1e-12)
    orders = [x.order for x in tasks]
    return dict(zip(orders, net.tolist(), strict=True)), dict(
        zip(orders, dens.tolist(), strict=True)
    )
