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
that finds a bug cannot be repeated into gigabytes of log.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

import structlog

__all__ = ["LIBRARY_BURST", "TRACEBACK_BURST", "configure"]

LIBRARY_BURST = 20
"""Records of one throttled library logger let through a minute."""

TRACEBACK_BURST = 10
"""Whole tracebacks of the daemon's own log events written a minute."""

_THROTTLED = ("aiohttp", "grpc")
"""Loggers whose records a remote client can cause: throttled and cut to one line."""


class _Tracebacks:
    """A structlog processor: of the events that carry an exception, the first ``burst``
    in each ``seconds`` keep it for the traceback; later ones get ``error`` (its type
    and message, cut to 300 characters) and ``traceback: "cut"`` instead."""

    def __init__(self, burst: int = TRACEBACK_BURST, seconds: float = 60.0) -> None:
        self.burst, self.seconds = burst, seconds
        self.started, self.passed = -seconds, 0
        self._lock = threading.Lock()  # events come from several threads

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        exc = event.get("exc_info")
        if not exc:
            return event
        with self._lock:
            now = time.monotonic()
            if now - self.started >= self.seconds:
                self.started, self.passed = now, 0
            self.passed += 1
            whole = self.passed <= self.burst
        if whole:
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
    """Of the records of the :data:`_THROTTLED` loggers (and their children), at most
    ``burst`` per ``seconds``; the first one after a drop says how many were dropped.
    Their tracebacks are cut to the error itself. Other records pass as they are."""

    def __init__(self, burst: int = LIBRARY_BURST, seconds: float = 60.0) -> None:
        super().__init__()
        self.burst, self.seconds = burst, seconds
        self.started, self.passed, self.dropped = 0.0, 0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_THROTTLED):
            return True
        now = time.monotonic()
        if now - self.started >= self.seconds:
            self.started, self.passed = now, 0
        if self.passed >= self.burst:
            self.dropped += 1
            return False
        self.passed += 1
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(err).__name__}: {str(err)[:300]}"
            record.args, record.exc_info, record.exc_text = None, None, None
        if self.dropped:
            record.msg = f"{record.getMessage()} ({self.dropped} like it dropped before)"
            record.args, self.dropped = None, 0
        return True


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


def configure(level: str = "info") -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _Tracebacks(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if not any(isinstance(h.formatter, _JsonLines) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_JsonLines())
        handler.addFilter(_Throttle())
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
