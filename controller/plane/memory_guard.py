"""The agent's optional memory guard (``oasis agent --memory-resource mem=GB``): a worker
command whose resident memory is over its job's demand of that resource is stopped.

Before, nothing on the node knew a job's memory demand: a tenant's worker using 60 GB
where its job declared 8 got the node's OOM killer to kill other tenants' workers on the
same server. A site whose launcher enforces the demand itself (``systemd-run -p
MemoryMax=...``, from ``OASIS_DEMAND_MEM``: :mod:`controller.plane.demand`) needs no
guard; without the flag nothing changes.

- **What is measured.** Every :data:`SAMPLE_SECONDS`, the resident memory (RSS) of each
  running worker that has a limit: the sum over the processes of its process group
  (each worker command leads one), from ``/proc/<pid>/stat``, bytes. One pass over
  ``/proc`` a sample, whatever the number of workers. Processes that left the group
  (``setsid``) are not counted; memory shared between processes is counted in each.
- **The limit.** The task's demand of the resource times the unit's bytes
  (:data:`UNITS`), times :data:`MARGIN` (1.10), plus :data:`START_UP_BYTES` (64 MiB,
  for an interpreter's start-up: a demand of 0.01 GB would stop every Python worker).
  A task whose demand does not name the resource (an older daemon's plan, or a cluster
  without it) gives its workers no limit; one whose demand of it is 0 (a job that
  declared no memory) holds them to the start-up bytes alone.
- **Over it.** The worker is stopped as a departing one is (SIGTERM, then SIGKILL after
  the grace), logged once as an error (``worker over its memory demand: stopped``, with
  job, worker, pid, RSS and demand), and counts as a failure for the restart back-off
  (:mod:`controller.plane.workers`): started again after it, 1 s doubling to 60 s, so a
  job that always overruns is tried once a minute, not in a loop.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from controller.plane.demand import MAX_NAME_LENGTH, NAME_CHARACTERS, Demand, carried
from controller.procfs import pids, stat_fields

__all__ = [
    "MARGIN",
    "SAMPLE_SECONDS",
    "START_UP_BYTES",
    "UNITS",
    "MemoryGuard",
    "group_rss",
    "parse_memory_resource",
]

UNITS: dict[str, int] = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}  # fmt: skip
"""Bytes per unit of the memory resource, by the unit's name (``--memory-resource``)."""

MARGIN = 1.10
"""A worker may use this many times its demand (measurement and allocator slack)."""

START_UP_BYTES = 64 << 20
"""Bytes a worker may use past its demand's :data:`MARGIN`: an interpreter's start-up."""

SAMPLE_SECONDS = 1.0
"""How often the workers' resident memory is read, seconds."""

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def parse_memory_resource(flag: str) -> MemoryGuard:
    """``NAME=UNIT`` (``mem=GB``) as a guard; ValueError saying what is wrong: no
    ``=``, a name no plan carries (:func:`~controller.plane.demand.carried`), or a unit
    not of :data:`UNITS` (its case aside: ``gb`` is ``GB``, ``gib`` is ``GiB``)."""
    name, sep, unit = flag.partition("=")
    name, unit = name.strip(), unit.strip()
    if not sep or not name or not unit:
        raise ValueError(f"must be NAME=UNIT, such as mem=GB, got {flag[:80]!r}")
    if not carried(name):
        raise ValueError(f"{name[:80]!r} is no resource a plan carries: names are 1-"
                         f"{MAX_NAME_LENGTH} of {NAME_CHARACTERS}")  # fmt: skip
    known = {u.lower(): u for u in UNITS}
    if unit.lower() not in known:
        raise ValueError(f"unknown unit {unit[:80]!r}: one of {', '.join(UNITS)}")
    return MemoryGuard(name, known[unit.lower()])


@dataclass(frozen=True)
class MemoryGuard:
    """Which resource is memory, and in which unit (see the module docstring).

    Attributes:
        resource: the resource's name in plans' ``demand`` (``mem``).
        unit: its unit, a key of :data:`UNITS` (the unit of the cluster's capacities).
    """

    resource: str
    unit: str

    def amount(self, demand: Demand) -> float | None:
        """The demand's amount of the resource, in its unit; None: not named."""
        return demand.get(self.resource)

    def limit(self, demand: Demand) -> int | None:
        """The most resident bytes a worker of ``demand`` may use; None: no limit."""
        amount = self.amount(demand)
        if amount is None:
            return None
        return int(amount * UNITS[self.unit] * MARGIN) + START_UP_BYTES


def group_rss(groups: set[int]) -> dict[int, int]:
    """Resident bytes of each process group of ``groups``: the sum over its processes
    (``/proc/<pid>/stat``: ``pgrp`` and ``rss`` in pages), one pass over ``/proc``. A
    group with no process readable is left out; a process that goes meanwhile is
    skipped."""
    out: dict[int, int] = {}
    if not groups:
        return out
    for pid in pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat_fields(pid)
            group = int(fields[2])
            if group in groups:
                out[group] = out.get(group, 0) + int(fields[21]) * _PAGE_BYTES
    return out
