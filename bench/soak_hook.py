"""``oasisd`` with a sampler of its own event loop, for ``bench/soak.py`` only.

Run as ``python -m bench.soak_hook --config FILE`` (the daemon's own arguments), with
``OASIS_SOAK_HOOK`` naming a file: every ``OASIS_SOAK_HOOK_SECONDS`` (default 10) the
daemon's event loop appends one JSON line to it: the time (Unix seconds), the number of
asyncio tasks and the 12 commonest task names (a coroutine's qualified name where the task
has no name of its own), the number of Python threads, and every ``OASIS_SOAK_CENSUS``-th
sample (default 6; 0: never) a census of the objects the garbage collector tracks, the 25
commonest types, its largest containers, and the longest containers the project's own
objects hold. Nothing of the daemon is changed: ``asyncio.run`` is wrapped so that
the sampler runs beside ``serve()`` in the same loop, and cancelled when it returns.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
import types
from collections import Counter, deque
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

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


async def _sample(path: Path, every: float, census_every: int) -> None:
    n = 0
    while True:
        await asyncio.sleep(every)
        n += 1
        tasks = asyncio.all_tasks()
        row: dict[str, Any] = {
            "t": time.time(),
            "tasks": len(tasks),
            "task_names": Counter(_task_name(t) for t in tasks).most_common(12),
            "threads": threading.active_count(),
        }
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
    real_run = asyncio.run

    def run(main: Coroutine[Any, Any, Any], **kwargs: Any) -> Any:
        async def beside() -> Any:
            sampler = asyncio.create_task(_sample(path, every, census_every), name="soak-hook")
            try:
                return await main
            finally:
                sampler.cancel()

        return real_run(beside(), **kwargs)

    asyncio.run = run
    return daemon.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
