"""``oasisd`` with a sampler of its own event loop, for ``bench/soak.py`` only.

Run as ``python -m bench.soak_hook --config FILE`` (the daemon's own arguments), with
``OASIS_SOAK_HOOK`` naming a file: every ``OASIS_SOAK_HOOK_SECONDS`` (default 10) the
daemon's event loop appends one JSON line to it: the time (Unix seconds), the number of
asyncio tasks and the 12 commonest task names (a coroutine's qualified name where the task
has no name of its own), the number of Python threads, and every ``OASIS_SOAK_CENSUS``-th
sample (default 6; 0: never) a census of the objects the garbage collector tracks, the 25
commonest types, its largest containers, and the longest containers the project's own
objects hold.

Memory, behind a flag: every sample also records the process's resident memory, glibc's
``mallinfo2`` (bytes malloc holds from the system, in use, free in its heaps), SQLite's
``sqlite3_memory_used`` and, with
``OASIS_SOAK_TRACEMALLOC`` set to a number of frames (e.g. 10), :mod:`tracemalloc`'s
traced total (tracing starts ``OASIS_SOAK_TRACEMALLOC_DELAY`` seconds, default 60, after
the loop does: traced from the start, the daemon's start-up takes minutes). Then every
``OASIS_SOAK_TRACEMALLOC_MINUTES`` (default 5) minutes a snapshot is taken, dumped beside
the hook's file (``tracemalloc-MM.snap``), and compared, by ``lineno`` and by
``traceback``, with the first one and with the previous one: the top 20 by growth in size
are written to ``tracemalloc-MM.txt``. ``OASIS_SOAK_MALLOC_TRIM=1`` calls glibc's
``malloc_trim(0)`` after each sample and records the resident memory after it.

Nothing of the daemon is changed: ``asyncio.run`` is wrapped so that
the sampler runs beside ``serve()`` in the same loop, and cancelled when it returns.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import json
import linecache
import os
import sys
import threading
import time
import tracemalloc
import types
from collections import Counter, deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from controller import procfs

__all__ = ["main"]


def _task_name(task: asyncio.Task[Any]) -> str:
    name = task.get_name()
    if not name.startswith("Task-"):
        return name
    coro = task.get_coro()
    return getattr(coro, "__qualname__", type(coro).__name__)


_CONTAINERS = (dict, set, list, deque, frozenset)


def _owner(container: object) -> str:
    """Where ``container`` is held: ``Type.attribute`` of an instance, ``key`` of a
    dict, or the holder's type."""
    for holder in gc.get_referrers(container):
        if isinstance(holder, types.ModuleType) and vars(holder) is container:
            return f"module {holder.__name__}"
        if isinstance(holder, dict):
            key = next((k for k, v in holder.items() if v is container), None)
            if key is None:
                continue
            for owner in gc.get_referrers(holder):
                if getattr(owner, "__dict__", None) is holder:
                    return f"{type(owner).__qualname__}.{key}"
            return f"dict[{key!r}]"[:80]
        if type(holder).__module__ not in ("builtins", "gc") and not isinstance(holder, type):
            for name in getattr(type(holder), "__slots__", ()):
                if getattr(holder, name, None) is container:
                    return f"{type(holder).__qualname__}.{name}"
            return type(holder).__qualname__
    return "?"


def _largest_containers(objects: list[object], top: int = 40) -> list[tuple[str, str, int]]:
    """The ``top`` largest dicts, sets, lists and deques the collector tracks: (where
    held, type, length)."""
    sized = [(len(o), id(o), o) for o in objects if type(o) in _CONTAINERS]  # type: ignore[arg-type]
    sized.sort(key=lambda x: x[0], reverse=True)
    return [(_owner(o), type(o).__name__, n) for n, _, o in sized[:top]]


def _project_containers(objects: list[object], top: int = 25) -> list[tuple[str, int]]:
    """The ``top`` longest containers held as attributes of the project's own objects
    (types of ``controller`` and ``pricing``): (``Type.attribute``, length), the
    longest of each. These are found through their holders, not the collector's list:
    CPython does not track a dict of strings and numbers (the caches most likely to
    grow), so :func:`gc.get_objects` leaves them out."""
    longest: dict[str, int] = {}
    for o in objects:
        kind = type(o)
        module = kind.__dict__.get("__module__") if isinstance(kind, type) else None
        if not (isinstance(module, str) and module.startswith(("controller.", "pricing."))):
            continue
        try:
            attributes = dict(vars(o))
        except TypeError:
            attributes = {n: getattr(o, n, None) for n in getattr(kind, "__slots__", ())}
        except Exception:  # an object whose attributes cannot be read: not counted
            continue
        for name, value in attributes.items():
            if type(value) in _CONTAINERS:
                key = f"{kind.__qualname__}.{name}"
                longest[key] = max(longest.get(key, 0), len(value))
    return sorted(longest.items(), key=lambda kv: kv[1], reverse=True)[:top]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]  # fmt: skip


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallinfo2.restype = _Mallinfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError, TypeError):  # not glibc, or older than 2.33
        return None
    return libc


_LIBC = _libc()


def _libsqlite3() -> ctypes.CDLL | None:
    """The SQLite library ``sqlite3`` uses (loaded once: the same counters)."""
    import sqlite3  # noqa: F401  (loads it first)

    name = ctypes.util.find_library("sqlite3")
    try:
        lib = ctypes.CDLL(name) if name else None
        if lib is not None:
            lib.sqlite3_memory_used.restype = ctypes.c_int64
    except (OSError, AttributeError):
        return None
    return lib


_SQLITE = _libsqlite3()


def _rss_kb() -> int:
    return procfs.status("self").get("VmRSS", 0)


def _memory() -> dict[str, Any]:
    """Resident memory, malloc's heaps, and what tracemalloc traces (KB)."""
    row: dict[str, Any] = {"rss_kb": _rss_kb()}
    if _LIBC is not None:
        info = _LIBC.mallinfo2()
        # arena: heap bytes from sbrk/mmap'd arenas; hblkhd: big mmap'd blocks;
        # uordblks: in use; fordblks: free but kept
        row["malloc_kb"] = {
            k: getattr(info, k) // 1024 for k in ("arena", "hblkhd", "uordblks", "fordblks")
        }
    if _SQLITE is not None:  # SQLite's own allocations (page caches, statements)
        row["sqlite_kb"] = _SQLITE.sqlite3_memory_used() // 1024
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        row["traced_kb"] = current // 1024
        row["traced_peak_kb"] = peak // 1024
        row["tracemalloc_own_kb"] = tracemalloc.get_tracemalloc_memory() // 1024
    return row


_SNAPSHOT_FILTERS = [
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
    tracemalloc.Filter(False, "<unknown>"),
]


def _compare(
    out: Path, label: str, snap: tracemalloc.Snapshot, first: tracemalloc.Snapshot | None,
    previous: tracemalloc.Snapshot | None,
) -> None:  # fmt: skip
    """Top 20 by growth in size, by line and by traceback, against ``first`` and
    ``previous``, written to ``out`` (run in a thread: it takes seconds)."""
    lines = [f"# tracemalloc at {label}: {sum(s.size for s in snap.statistics('filename'))} B"]
    for name, base in (("first", first), ("previous", previous)):
        if base is None:
            continue
        for key in ("lineno", "traceback"):
            diff = snap.compare_to(base, key)
            diff.sort(key=lambda d: d.size_diff, reverse=True)
            lines.append(f"\n## against the {name} snapshot, by {key}: top 20 by growth")
            for stat in diff[:20]:
                lines.append(
                    f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} blocks "
                    f"(now {stat.size / 1024:.1f} KiB in {stat.count})"
                )
                frames = (
                    stat.traceback.format()
                    if key == "traceback"
                    else [f"  {stat.traceback[0].filename}:{stat.traceback[0].lineno}"]
                )
                lines.extend("    " + f for f in frames)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    # formatting the tracebacks read the sources into linecache: 4.8 MB, which the next
    # snapshot counted as the daemon's growth
    linecache.clearcache()


async def _snapshots(directory: Path, frames: int, delay: float, minutes: float) -> None:
    """Tracing from ``delay`` seconds on, a snapshot every ``minutes``, dumped and
    compared (see the module)."""
    first: tracemalloc.Snapshot | None = None
    previous: tracemalloc.Snapshot | None = None
    started = time.monotonic()
    await asyncio.sleep(delay)
    tracemalloc.start(frames)
    while True:
        await asyncio.sleep(minutes * 60)
        label = f"{(time.monotonic() - started) / 60:05.1f}"
        snap = tracemalloc.take_snapshot().filter_traces(_SNAPSHOT_FILTERS)
        await asyncio.to_thread(snap.dump, str(directory / f"tracemalloc-{label}.snap"))
        out = directory / f"tracemalloc-{label}.txt"
        await asyncio.to_thread(_compare, out, label, snap, first, previous)
        first = first or snap
        previous = snap


async def _sample(path: Path, every: float, census_every: int) -> None:
    n = 0
    trim = os.environ.get("OASIS_SOAK_MALLOC_TRIM") == "1" and _LIBC is not None
    while True:
        await asyncio.sleep(every)
        n += 1
        tasks = asyncio.all_tasks()
        row: dict[str, Any] = {
            "t": time.time(),
            "tasks": len(tasks),
            "task_names": Counter(_task_name(t) for t in tasks).most_common(12),
            "threads": threading.active_count(),
            **_memory(),
        }
        if trim:
            assert _LIBC is not None
            _LIBC.malloc_trim(0)
            row["rss_trimmed_kb"] = _rss_kb()
        if census_every and n % census_every == 0:
            try:
                row |= _census()
            except Exception as err:  # the sampling goes on without it
                row["census_error"] = f"{type(err).__name__}: {err}"[:300]
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _census() -> dict[str, Any]:
    """The collector's objects by type, its largest containers, and the project's."""
    objects = gc.get_objects()
    try:
        return {
            "objects": len(objects),
            "census": Counter(type(o).__qualname__ for o in objects).most_common(25),
            "containers": _largest_containers(objects),
            "project_containers": _project_containers(objects),
        }
    finally:
        del objects


def main() -> int:
    from controller import daemon

    path = Path(os.environ["OASIS_SOAK_HOOK"])
    every = float(os.environ.get("OASIS_SOAK_HOOK_SECONDS", "10"))
    census_every = int(os.environ.get("OASIS_SOAK_CENSUS", "6"))
    frames = int(os.environ.get("OASIS_SOAK_TRACEMALLOC", "0"))
    delay = float(os.environ.get("OASIS_SOAK_TRACEMALLOC_DELAY", "60"))
    snapshot_minutes = float(os.environ.get("OASIS_SOAK_TRACEMALLOC_MINUTES", "5"))
    real_run = asyncio.run

    def run(main: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
        async def beside() -> Any:
            samplers = [asyncio.create_task(_sample(path, every, census_every), name="soak-hook")]
            if frames:
                snapshots = _snapshots(path.parent, frames, delay, snapshot_minutes)
                samplers.append(asyncio.create_task(snapshots, name="soak-tracemalloc"))
            try:
                return await main
            finally:
                for sampler in samplers:
                    sampler.cancel()

        return real_run(beside(), **kwargs)

    asyncio.run = run
    return daemon.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
