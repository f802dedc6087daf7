"""Blocking work handed to a thread that never holds the daemon's exit.

``asyncio.to_thread``'s threads are joined when the loop closes, so a read that never
returns (a hung mount), or a long one that is no longer wanted (every active job's
plans, built while the daemon stops), held a stopped ``oasisd`` from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["in_daemon_thread"]

_T = TypeVar("_T")


def in_daemon_thread(fn: Callable[..., _T], *args: object, name: str) -> asyncio.Future[_T]:
    """``fn(*args)`` in a daemon thread of its own (named ``name``), as a future of the
    running loop: cancelling the future, or the loop closing, abandons the result; the
    thread runs on to its end, holding nothing up."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, error: BaseException | None) -> None:
        if future.done():  # given up on (a timeout, a cancel)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result, error = fn(*args), None
        except Exception as err:
            result, error = None, err
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (a stop)
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
