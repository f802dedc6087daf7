"""structlog set-up: JSON lines on stderr, one per event, with job ids and decisions.

Libraries that log through the standard ``logging`` module (aiohttp, aiomqtt, grpc's
Python side) get JSON lines too, at WARNING and above. aiohttp's server logs every
malformed HTTP request it refuses with a full traceback, before any token or rate
limit: those records are cut to one line and at most :data:`LIBRARY_BURST` a minute
get through (then one line says how many were dropped), so a client sending bad
requests cannot fill the disk the logs are on. grpc's records (an exception that
escaped a handler) are throttled the same way. The daemon's own tracebacks are bounded
too: at most :data:`TRACEBACK_BURST` a minute are written whole; past that an event
keeps its error's type and message on one line (:class:`_Tracebacks`), so a request
that finds a bug cannot be repeated into gigabytes of log. A value longer than
:data:`MAX_VALUE_CHARS` (a request's path, say) is cut. What a client or an agent can
repeat is logged through :class:`Complaints`: one line per ``(who, reason)`` in each
interval, the next one saying how many were held back.

Logging never fails or waits for its caller (:class:`_Lines`): lines go through a
bounded queue to a writer thread. A log whose disk is full, a pipe whose reader has
gone (``oasisd 2>&1 | head``, journald restarted) or stalled drops lines, counted and
reported once writing works again, instead of raising ``OSError`` into whatever was
logging: before, that ended the slot clock's task for good, failed a committed cancel
with ``UNKNOWN`` and skipped the drain at SIGTERM; a stalled pipe blocked the commit.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

import structlog

__all__ = [
    "LIBRARY_BURST",
    "MAX_VALUE_CHARS",
    "QUEUE_LINES",
    "TRACEBACK_BURST",
    "Complaints",
    "configure",
    "flush",
    "sync",
]

LIBRARY_BURST = 20
"""Records of one throttled library logger let through a minute."""

TRACEBACK_BURST = 10
"""Whole tracebacks of the daemon's own log events written a minute."""

MAX_VALUE_ITEMS = 50
"""Items of a list or mapping a log line gives; the rest are counted."""
MAX_ITEM_CHARS = 200
"""... and characters of each text item."""
MAX_VALUE_CHARS = 1000
"""Characters of one value of a log event (a traceback excepted): the rest is cut."""

QUEUE_LINES = 10_000
"""Lines waiting for the log's stream; past that, new ones are dropped and counted."""

_THROTTLED = {"aiohttp": False, "grpc": True}
"""Loggers whose records a remote client can cause, each throttled on its own budget,
and whether their tracebacks are kept (within the budget): aiohttp's are about malformed
requests, cut to one line; grpc's about an exception that escaped a handler, a bug."""


class _Budget:
    """At most ``burst`` of something in each window of ``seconds``: :meth:`take` says
    whether one more fits, and counts those that did not (:meth:`dropped`). Thread safe:
    log records come from several threads."""

    def __init__(self, burst: int, seconds: float) -> None:
        self.burst, self.seconds = burst, seconds
        self.started, self.passed, self._dropped = -seconds, 0, 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self.started >= self.seconds:
                self.started, self.passed = now, 0
            if self.passed >= self.burst:
                self._dropped += 1
                return False
            self.passed += 1
            return True

    def dropped(self) -> int:
        """How many did not fit since the last call."""
        with self._lock:
            count, self._dropped = self._dropped, 0
            return count


class _Tracebacks:
    """A structlog processor: of the events that carry an exception, the first ``burst``
    in each ``seconds`` keep it for the traceback; later ones get ``error`` (its type
    and message, cut to 300 characters) and ``traceback: "cut"`` instead."""

    def __init__(self, burst: int = TRACEBACK_BURST, seconds: float = 60.0) -> None:
        self.burst = burst
        self.budget = _Budget(burst, seconds)

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        exc = event.get("exc_info")
        if not exc or self.budget.take():
            return event
        if exc is True:
            exc = sys.exc_info()
        err = exc if isinstance(exc, BaseException) else exc[1] if isinstance(exc, tuple) else None
        del event["exc_info"]
        if err is not None:
            event["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        event["traceback"] = f"cut (over {self.burst} a minute)"
        return event


class _Throttle(logging.Filter):
    """Of the records of each of the :data:`_THROTTLED` libraries (and their children),
    at most ``burst`` per ``seconds``, each library on its own budget (a flood of bad
    HTTP must not hide grpc's records); the first one after a drop says how many were
    dropped. Tracebacks are cut to the error itself unless the library's are kept.
    Other records pass as they are."""

    def __init__(self, burst: int = LIBRARY_BURST, seconds: float = 60.0) -> None:
        super().__init__()
        self._budgets = {name: _Budget(burst, seconds) for name in _THROTTLED}

    def filter(self, record: logging.LogRecord) -> bool:
        library = record.name.split(".", 1)[0]
        budget = self._budgets.get(library)
        if budget is None:
            return True
        if not budget.take():
            return False
        if record.exc_info and record.exc_info[1] is not None and not _THROTTLED[library]:
            err = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(err).__name__}: {str(err)[:300]}"
            record.args, record.exc_info, record.exc_text = None, None, None
        dropped = budget.dropped()
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} like it dropped before)"
            record.args = None
        return True


class Complaints:
    """Warnings about what a client or an agent may repeat, at most one per ``every``
    seconds for each ``(who, reason)``; the next one says how many were held back
    (``suppressed``). ``who`` is logged as ``field`` (``server``, ``peer``). At most
    :attr:`max_keys` pairs are remembered: past that the quiet ones are forgotten (a pass
    at most once per :attr:`PURGE_SECONDS`).

    With ``max_lines`` (0: none), at most that many lines of each reason are written in
    each ``every`` seconds, whoever they are about: a client that changes its name or
    its address at each call (a host with many addresses, an IPv6 prefix) made one
    line per name, 4,981 lines (940 KB) of console logins from 5,000 loopback addresses
    in 4 s (the cardinality audit). Past it, the line that reaches the budget says so
    (``more_held_back``), the complaints after it are counted and the next line of that
    reason gives the count (``others_held_back``); nor are their callers remembered, so
    :attr:`max_keys` holds too. Who is not remembered is not held to ``every``."""

    max_keys = 4096
    PURGE_SECONDS = 1.0
    """The quiet pairs are looked for at most once in this many seconds: a pass looks at
    every pair, and over :attr:`max_keys` with every pair recent each new caller made one
    (0.75 ms a complaint at 4,096 pairs)."""

    def __init__(
        self,
        every: float,
        monotonic: Callable[[], float] = time.monotonic,
        field: str = "server",
        max_lines: int = 0,
    ) -> None:
        self.every = every
        self.monotonic = monotonic
        self.field = field
        self.max_lines = max_lines
        self.log = structlog.get_logger("oasisd")
        self._last: dict[tuple[str, str], tuple[float, int]] = {}
        # reason -> [start of its window, lines written in it, complaints held back]
        self._lines: dict[str, list[float]] = {}
        self._purge_after = -math.inf  # no pass over _last before (monotonic seconds)

    def __call__(self, who: str, reason: str, event: str, **details: object) -> bool:
        """Log ``event`` as a warning unless ``(who, reason)`` was logged within
        ``every`` seconds (or ``reason``'s lines are over ``max_lines``); True if logged."""
        key = (who[:200], reason)
        now = self.monotonic()
        last, since = self._last.get(key, (-self.every, 0))
        if now - last < self.every:
            self._last[key] = (last, since + 1)
            return False
        budget = self._lines.setdefault(reason, [now, 0, 0])
        if now - budget[0] >= self.every:
            budget[0], budget[1] = now, 0
        if self.max_lines and budget[1] >= self.max_lines:  # counted before any other work
            budget[2] += 1
            return False
        if key not in self._last and len(self._last) >= self.max_keys:
            if now >= self._purge_after:  # a pass looks at every pair: at most once a second
                self._purge_after = now + self.PURGE_SECONDS
                self._last = {k: v for k, v in self._last.items() if now - v[0] < self.every}
            # with a budget, callers past max_keys are counted, not remembered (ever new
            # peers); without one (the plane's, keyed by the config's servers) all are
            # logged
            if self.max_lines and len(self._last) >= self.max_keys:
                budget[2] += 1
                return False
        budget[1] += 1
        extra: dict[str, object] = {}
        if budget[2]:
            extra["others_held_back"], budget[2] = int(budget[2]), 0
        if self.max_lines and budget[1] >= self.max_lines:
            extra["more_held_back"] = (
                f"{self.max_lines} lines of this reason within {self.every:g} s: the next "
                "are counted, and the count given by the next line written"
            )
        self._last[key] = (now, 0)
        self.log.warning(event, **{self.field: key[0]}, suppressed=since, **details, **extra)
        return True


def _bounded(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: every text value over :data:`MAX_VALUE_CHARS` cut, and
    every list or mapping over :data:`MAX_VALUE_ITEMS` items cut to that many (its text
    items to :data:`MAX_ITEM_CHARS`), the rest counted. A cordon of a server holding a
    tenant's 2,440 jobs logged their ids in one line of 364 KB (observability audit):
    journald splits a line over 48 KiB into pieces that are not JSON."""
    for key, value in event.items():
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            event[key] = f"{value[: MAX_VALUE_CHARS - 40]}...(cut: {len(value)} characters)"
        elif isinstance(value, list | tuple | set | frozenset | dict) and key not in _RAW:
            event[key] = _fewer(value)
    return event


_RAW = frozenset({"exc_info", "stack_info"})
"""Keys structlog's later processors read as they are (an ``exc_info`` tuple)."""


def _fewer(value: Any) -> Any:
    """``value`` (a list, tuple, set or dict) as a list (a dict: a dict) of at most
    :data:`MAX_VALUE_ITEMS` items, text items cut to :data:`MAX_ITEM_CHARS`."""

    def item(x: Any) -> Any:
        if isinstance(x, str) and len(x) > MAX_ITEM_CHARS:
            return f"{x[:MAX_ITEM_CHARS]}...(cut: {len(x)} characters)"
        return x

    more = len(value) - MAX_VALUE_ITEMS
    if isinstance(value, dict):
        out: Any = {item(k): item(v) for k, v in itertools.islice(value.items(), MAX_VALUE_ITEMS)}
        if more > 0:
            out["..."] = f"{more} more"
        return out
    items = [item(x) for x in itertools.islice(value, MAX_VALUE_ITEMS)]
    if more > 0:
        items.append(f"...({more} more)")
    return items


class _Lines:
    """Where the log's lines go: a queue of at most :data:`QUEUE_LINES` that a writer
    thread empties into ``stream``. :meth:`put` never blocks or raises. A line that
    finds the queue full, or whose write fails (``OSError``: a full disk, a closed
    pipe), is dropped and counted; the first line written after says how many."""

    def __init__(self, stream: Any, capacity: int = QUEUE_LINES) -> None:
        self.stream = stream
        # a line; None: the end; an Event: set once everything before it is written
        self._queue: queue.Queue[str | threading.Event | None] = queue.Queue(capacity)
        self._lock = threading.Lock()
        self.dropped = 0
        self.closed = False  # once closed, put writes in place (what is logged at exit)
        self._thread = threading.Thread(target=self._write, name="log writer", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def put(self, line: str) -> None:
        if self.closed:
            self._write_lines([line])
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            with self._lock:
                self.dropped += 1

    def sync(self, timeout: float = 2.0) -> bool:
        """Wait (at most ``timeout`` seconds) until every line put before is written or
        dropped; True if so. oasisd does at the line saying it listens, so a reader of
        that line finds the log lines before it (the console's address, say)."""
        if self.closed:
            return True
        deadline = time.monotonic() + timeout
        written = threading.Event()
        try:
            self._queue.put(written, timeout=timeout)
        except queue.Full:
            return False
        return written.wait(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds: a stream nobody reads
        must not hold the exit), then stop."""
        if self.closed:
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self.closed = True

    def _write(self) -> None:
        while True:
            item: str | threading.Event | None = self._queue.get()
            lines: list[str] = []
            while isinstance(item, str):  # with what came meanwhile, in one write
                lines.append(item)
                if len(lines) >= 256:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if lines:
                self._write_lines(lines)
            if isinstance(item, threading.Event):
                item.set()
            elif item is None:
                return

    def _write_lines(self, lines: list[str]) -> None:
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        if dropped:
            lines.insert(0, _dropped_line(dropped))
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except Exception:  # a full disk, a closed pipe or file: never the thread's end
            with self._lock:
                self.dropped += len(lines) - (1 if dropped else 0) + dropped


def _dropped_line(count: int) -> str:
    return json.dumps({
        "event": "log lines dropped", "level": "warning", "dropped": count,
        "why": "the log's stream refused them or fell behind (a full disk, a closed or "
        "stalled pipe)", "timestamp": datetime.now(UTC).isoformat(),
    }, sort_keys=True)  # fmt: skip


class _LineLogger:
    """A structlog logger that hands its rendered lines to :class:`_Lines`."""

    def __init__(self, lines: _Lines) -> None:
        self._lines = lines

    def msg(self, message: str) -> None:
        self._lines.put(message)

    log = debug = info = warn = warning = err = error = critical = fatal = exception = msg


class _LinesHandler(logging.Handler):
    """A standard ``logging`` handler that hands its formatted records to :class:`_Lines`."""

    def __init__(self, lines: _Lines) -> None:
        super().__init__()
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.put(self.format(record))
        except Exception:  # a record that cannot be formatted: not the caller's failure
            self.handleError(record)


class _JsonLines(logging.Formatter):
    """A standard ``logging`` record as one JSON line, as structlog writes its own."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "event": record.getMessage()[:2000],
            "level": record.levelname.lower(),
            "logger": record.name,
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)[-4000:]
        return json.dumps(line, sort_keys=True)


_WRITERS: dict[int, _Lines] = {}
"""One :class:`_Lines` per stream (by ``id``): a second :func:`configure` reuses it."""


def configure(level: str = "info") -> None:
    """Log JSON lines at ``level`` and above to stderr, through :class:`_Lines`."""
    lines = _WRITERS.get(id(sys.stderr))
    if lines is None or lines.stream is not sys.stderr:
        lines = _WRITERS[id(sys.stderr)] = _Lines(sys.stderr)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _Tracebacks(),
            _bounded,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=lambda *_args: _LineLogger(lines),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if not any(isinstance(h.formatter, _JsonLines) for h in root.handlers):
        handler = _LinesHandler(lines)
        handler.setFormatter(_JsonLines())
        handler.addFilter(_Throttle())
        root.addHandler(handler)
        root.setLevel(logging.WARNING)


def sync(timeout: float = 2.0) -> None:
    """Wait until the lines logged so far are written (:meth:`_Lines.sync`)."""
    for lines in list(_WRITERS.values()):
        lines.sync(timeout)


def flush(timeout: float = 2.0) -> None:
    """Write what every log writer has queued (at most ``timeout`` seconds each), and
    stop them: before a last line printed straight to stderr (oasisd's exit message),
    so it comes after the log lines that led to it."""
    for lines in list(_WRITERS.values()):
        lines.close(timeout)
    _WRITERS.clear()
