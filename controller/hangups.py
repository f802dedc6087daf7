"""SIGHUP for the whole life of ``oasisd``: a reload while it serves, and never the end of
the process before or after.

SIGHUP's default action ends a process. The daemon reloaded on it through its event
loop's handler (``loop.add_signal_handler``), which exists only while the loop runs: a
``kill -HUP`` in the first second (the imports and the config's read), or while the
stopped loop closed (its close gives SIGHUP its default action back), ended ``oasisd``
with nothing in its log, by a signal that systemd counts as a clean exit, so
``Restart=on-failure`` left it down. Here one Python handler, set by the ``oasisd``
command before its imports (:mod:`controller.oasisd`), holds SIGHUP until the daemon
has stopped (then it is ignored: :func:`ignore`), and sends each one to where it
belongs now (:func:`route`): counted while there is no loop, handed to the loop while
there is one.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["held", "hold", "ignore", "route"]

_Route = tuple[asyncio.AbstractEventLoop, Callable[[], None]]
_route: list[_Route | None] = [None]  # where each SIGHUP goes now
_held = [0]  # SIGHUPs that came with nowhere to go, since the last route()


def hold() -> None:
    """Take SIGHUP from now on (again): each is counted, or handed to the loop of
    :func:`route`. A no-op off the main thread (Python sets handlers there only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, _hangup)


def ignore() -> None:
    """Ignore SIGHUP from now on: for the daemon's last moments, once it has stopped.
    Python's exit gives the signals it handles their default action back (here, for the
    hundreds of milliseconds its threads and libraries take to end), but not the ones
    ignored. A no-op off the main thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def route(to: _Route | None) -> int:
    """Send each SIGHUP from now on to ``to``: ``(loop, callback)``, the callback called on
    that loop (``call_soon_threadsafe``: a signal handler may interrupt the loop's own
    code), or, with None, only counted. Returns the count of those that came since the
    last call and went nowhere (a reload asked for while the daemon started)."""
    _route[0] = to
    count, _held[0] = _held[0], 0
    return count


def held() -> int:
    """The SIGHUPs that came since the last :func:`route` and went nowhere."""
    return _held[0]


def _hangup(signum: int, frame: FrameType | None) -> None:
    now = _route[0]
    if now is not None:
        loop, callback = now
        try:
            loop.call_soon_threadsafe(callback)
            return
        except RuntimeError:  # that loop is closed: nowhere to go
            pass
    _held[0] += 1
