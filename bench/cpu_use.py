"""CPU time spent by processes and by the whole machine over a stretch of a benchmark
(Linux ``/proc``), so a rate can be read against what the machine's cores allow.

A rate bounded by one process's interpreter lock shows that process near one core; a
rate bounded by the machine shows every core busy, and then the CPU time each decision
costs, summed over every process that serves it (clients included), caps the rate at
``cores / seconds per decision`` whatever the split between processes.

Usage::

    before = CpuUse.take({"daemon": [pid], "all": [pid]}, alone=["daemon"])
    ...  # the stretch measured
    spent = before.since()  # {"daemon": s, "all": s, "this process": s, "machine": s, "wall": s}
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["CpuUse", "tree_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (which may hold spaces);
    None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _children() -> dict[int, list[int]]:
    """Every live process's children, by parent pid."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None:
            out.setdefault(int(fields[1]), []).append(int(name))  # fields[1]: ppid
    return out


def tree_seconds(roots: Iterable[int], descend: bool = True) -> float:
    """User + system CPU seconds of the live processes ``roots`` and (``descend``) their
    descendants (a descendant that has exited, and was not waited for, is not counted)."""
    children = _children() if descend else {}
    seen: set[int] = set()
    todo = list(roots)
    total = 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        fields = _stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime (ticks)
        todo.extend(children.get(pid, ()))
    return total / _TICKS


def _machine_busy_seconds() -> float:
    """CPU seconds every core spent other than idle or waiting, since boot."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle, iowait
    return (sum(values[:8]) - idle) / _TICKS


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds of named process trees, this process and the machine, at one moment."""

    trees: Mapping[str, tuple[int, ...]]
    alone: frozenset[str]
    seconds: Mapping[str, float]
    wall: float

    @classmethod
    def take(cls, trees: Mapping[str, Iterable[int]], alone: Iterable[str] = ()) -> CpuUse:
        """Now; the trees named in ``alone`` count their roots only, not descendants."""
        roots = {name: tuple(pids) for name, pids in trees.items()}
        solo = frozenset(alone)
        seconds = {name: tree_seconds(pids, name not in solo) for name, pids in roots.items()}
        own = os.times()
        seconds["this process"] = own.user + own.system
        seconds["machine"] = _machine_busy_seconds()
        return cls(roots, solo, seconds, time.monotonic())

    def since(self) -> dict[str, float]:
        """CPU seconds spent since :meth:`take`, by name, and ``"wall"``: the seconds
        passed."""
        now = CpuUse.take(self.trees, self.alone)
        out = {name: now.seconds[name] - self.seconds[name] for name in self.seconds}
        out["wall"] = now.wall - self.wall
        return out
