"""The marks an agent's worker processes carry in their environment, read from ``/proc``.

Every process a worker command starts inherits ``OASIS_AGENT`` (the agent's session),
``OASIS_AGENT_KEY``, ``OASIS_JOB`` and ``OASIS_WORKER``: the agent knows by them a
worker's processes that left its group, and an earlier agent's leftovers
(:mod:`controller.plane.workers`). Reading them costs a read of the process's whole
environment, which its owner chooses: before, the agent read up to 1 MiB of it per
process, for every process of the machine at each worker's exit and for every child of
its own each second, in its event loop. One tenant's worker that forked 1,000 children
with a 1 MiB environment (shared pages: cheap for it) stalled the agent 2.7 s at each
such scan, its heartbeats, plans and the other tenants' workers with it (the isolation
audit). Now at most :data:`ENVIRON_BYTES` of an environment are read, and once per
process (:class:`Marks` remembers them by pid and start time).
"""

from __future__ import annotations

from collections.abc import Callable

from controller.procfs import stat_fields

__all__ = ["ENVIRON_BYTES", "MARKS", "MAX_KNOWN", "Marks", "environment_of"]

ENVIRON_BYTES = 64 << 10
"""The most bytes of a process's environment read for its marks; a mark past them is not
seen (the agent's own environment and the marks are a few KiB)."""

MARKS = ("OASIS_AGENT", "OASIS_AGENT_KEY", "OASIS_JOB", "OASIS_WORKER")
"""The variables a worker's processes are known by."""

MAX_KNOWN = 1 << 16
"""The most processes :class:`Marks` remembers; past it, it starts afresh."""

_START_TIME = 19
"""Index of ``starttime`` (clock ticks since boot) in :func:`~controller.procfs.stat_fields`."""


def environment_of(pid: int, limit: int = ENVIRON_BYTES) -> dict[str, str]:
    """``pid``'s environment as its program started, from its first ``limit`` bytes (a
    variable cut there is left out); {} if it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(limit + 1)
    except OSError:
        return {}
    items = raw.split(b"\0")
    if len(raw) > limit:
        items = items[:-1]  # cut at the limit: not a whole variable
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


class Marks:
    """The :data:`MARKS` of processes, each process's read once: remembered by pid and
    start time (a pid the kernel gives to another process is read again; one whose start
    time cannot be read is read each time).

    Args:
        read: reads a process's environment ({} if it cannot): :func:`environment_of`.
    """

    def __init__(self, read: Callable[[int], dict[str, str]] = environment_of) -> None:
        self.read = read
        self._known: dict[int, tuple[bytes, dict[str, str]]] = {}

    def of(self, pid: int) -> dict[str, str]:
        """``pid``'s marks ({} for none, or a process that cannot be read)."""
        try:
            start: bytes | None = stat_fields(pid)[_START_TIME]
        except (OSError, IndexError):
            start = None
        known = self._known.get(pid)
        if known is not None and known[0] == start:
            return known[1]
        env = self.read(pid)
        marks = {k: env[k] for k in MARKS if k in env}
        if start is None:
            return marks
        if len(self._known) >= MAX_KNOWN:
            self._known.clear()
        self._known[pid] = (start, marks)
        return marks

    def keep(self, alive: set[int]) -> None:
        """Forget the processes not in ``alive`` (those a scan of ``/proc`` saw)."""
        for pid in [p for p in self._known if p not in alive]:
            del self._known[pid]
