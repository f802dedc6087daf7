"""What Linux's ``/proc`` says of processes, read in one place.

The agent's worker supervision (:mod:`controller.plane.workers`), its memory guard
(:mod:`controller.plane.memory_guard`) and ``oasis reload``'s wait
(:mod:`controller.reload_wait`) each read a process's ``stat`` line (the benchmarks its
``status``: :func:`status`), whose second field
(the command's name, in parentheses) may itself hold spaces and ``)``: the fields are
those after its last ``)``. Elsewhere than Linux every read fails with ``OSError``.
"""

from __future__ import annotations

import os

__all__ = ["ZOMBIE_STATES", "pids", "stat_fields", "status"]

ZOMBIE_STATES = frozenset({b"Z", b"X"})
"""``stat`` states of a process that has ended: a zombie awaiting its parent, dead."""


def stat_fields(pid: int | str) -> list[bytes]:
    """Fields 3 onwards of ``/proc/<pid>/stat`` (proc(5)): ``[state, ppid, pgrp,
    session, ...]``, so ``rss`` (pages) is index 21.

    Raises ``OSError`` if it cannot be read (``FileNotFoundError``: no such process) and
    ``IndexError`` if the line has no name in parentheses."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read(4096)
    return raw.rsplit(b")", 1)[1].split()


def status(pid: int | str, keys: tuple[str, ...] = ("VmRSS",)) -> dict[str, int]:
    """The numbers of ``/proc/<pid>/status`` named ``keys`` (proc(5)): ``VmRSS``,
    ``VmHWM`` and the like in kB, ``Threads`` a count; ``pid`` may be ``"self"``. A key
    the file lacks is left out, and so is every key if it cannot be read (the process
    has ended)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def pids() -> list[int]:
    """Every process's id, as ``/proc`` lists them; [] where it cannot be read."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]
