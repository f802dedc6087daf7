"""Records of the libraries that log through the standard ``logging`` module: JSON lines,
and those a remote client can cause (aiohttp's refusals of malformed HTTP) throttled and
cut to one line each."""

from __future__ import annotations

import io
import json
import logging

from controller.logs import LIBRARY_BURST, _JsonLines, _Throttle


def _handler() -> tuple[logging.Handler, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(_JsonLines())
    handler.addFilter(_Throttle())
    return handler, out


def _log_raised(logger: logging.Logger, err: Exception, message: str) -> None:
    """Log ``message`` with ``err`` raised and caught, as a library's handler does."""
    try:
        raise err
    except type(err):
        logger.exception(message)


def test_a_flood_of_bad_requests_logs_a_bounded_number_of_one_line_records() -> None:
    """Before: each malformed request (a request line over 8 KiB, too many headers) made
    aiohttp print a multi-line traceback, before any token or rate limit: 3,000 such
    requests from one client wrote 2 MB of log in 2 s."""
    handler, out = _handler()
    server = logging.getLogger("aiohttp.server")
    server.addHandler(handler)
    try:
        for _ in range(3000):
            bad = ValueError("Got more than 8190 bytes when reading Status line")
            _log_raised(server, bad, "Error handling request")
    finally:
        server.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert len(lines) == LIBRARY_BURST
    for line in lines:
        record = json.loads(line)
        assert record["logger"] == "aiohttp.server" and record["level"] == "error"
        assert record["event"] == (
            "Error handling request: ValueError: Got more than 8190 bytes when reading Status line"
        )
        assert "exception" not in record


def test_other_libraries_keep_their_records_and_tracebacks() -> None:
    handler, out = _handler()
    other = logging.getLogger("tests.some_library")
    other.addHandler(handler)
    other.propagate = False
    try:
        for i in range(LIBRARY_BURST + 5):
            other.warning("warned %d", i)
        _log_raised(other, KeyError("k"), "failed")
    finally:
        other.removeHandler(handler)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records[:-1]] == [f"warned {i}" for i in range(LIBRARY_BURST + 5)]
    assert "Traceback" in records[-1]["exception"] and "KeyError" in records[-1]["exception"]


def test_grpc_records_are_throttled_too_on_a_budget_of_their_own() -> None:
    """An exception that escapes a handler is logged by grpc with its traceback, once per
    call: a client repeating the call could fill the disk. Its budget is its own (a
    flood of bad HTTP to the console must not hide these, a bug's), and within it the
    tracebacks are kept."""
    handler, out = _handler()
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    grpc_log.addHandler(handler)
    grpc_log.propagate = False
    http = logging.getLogger("aiohttp.server")
    http.addHandler(handler)
    http.propagate = False
    try:
        for _ in range(100):
            _log_raised(http, ValueError("bad request line"), "Error handling request")
        for _ in range(500):
            _log_raised(grpc_log, UnicodeEncodeError("utf-8", "\ud800", 0, 1, "no"), "Unexpected")
    finally:
        grpc_log.removeHandler(handler)
        grpc_log.propagate = True
        http.removeHandler(handler)
        http.propagate = True
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    grpc_records = [r for r in records if r["logger"].startswith("grpc")]
    assert len(records) == 2 * LIBRARY_BURST and len(grpc_records) == LIBRARY_BURST
    assert all("UnicodeEncodeError" in r["exception"] for r in grpc_records)


def test_the_daemons_own_tracebacks_are_bounded_per_minute() -> None:
    """The first TRACEBACK_BURST events with an exception in a minute keep it whole;
    later ones keep its type and message on one line, until the minute is over."""
    from controller.logs import TRACEBACK_BURST, _Tracebacks

    cut = _Tracebacks(seconds=3600.0)
    events = []
    for i in range(TRACEBACK_BURST + 5):
        try:
            raise KeyError(f"k{i}")
        except KeyError:
            events.append(cut(None, "exception", {"event": "failed", "exc_info": True}))
    assert all(e["exc_info"] is True for e in events[:TRACEBACK_BURST])
    late = events[TRACEBACK_BURST]
    assert "exc_info" not in late and late["error"] == f"KeyError: 'k{TRACEBACK_BURST}'"
    assert late["traceback"] == f"cut (over {TRACEBACK_BURST} a minute)"
    assert cut(None, "info", {"event": "fine"}) == {"event": "fine"}
    cut.budget.started -= 3600.0  # the minute is over: whole again
    err = ValueError("v")
    assert cut(None, "error", {"event": "x", "exc_info": err})["exc_info"] is err


def test_a_long_value_is_cut_and_complaints_forget_quiet_pairs() -> None:
    from controller.logs import MAX_VALUE_CHARS, Complaints, _bounded

    event = _bounded(None, "warning", {"event": "x", "path": "/a" * 4000, "n": 3})
    assert len(event["path"]) < MAX_VALUE_CHARS and event["path"].endswith("(cut: 8000 characters)")
    # a cordon's moved jobs: one line of 364 KB before (observability audit)
    ids = {f"alice:{'j' * 120}{i}": "replaced" for i in range(2440)}
    event = _bounded(None, "warning", {"event": "x", "moved": ids, "replaced": list(ids),
                                       "few": ("a", 1), "long": ["x" * 5000]})  # fmt: skip
    assert len(json.dumps(event)) < 30_000
    assert len(event["moved"]) == 51 and event["moved"]["..."] == "2390 more"
    assert event["replaced"][:50] == list(ids)[:50] and event["replaced"][50] == "...(2390 more)"
    assert event["few"] == ["a", 1] and event["long"][0].endswith("(cut: 5000 characters)")
    info = (ValueError, ValueError("x"), None)  # structlog reads these as they are (review)
    assert _bounded(None, "error", {"event": "x", "exc_info": info})["exc_info"] is info
    now = [0.0]
    complaints = Complaints(10.0, lambda: now[0], field="peer")
    complaints.max_keys = 3
    assert [complaints(f"p{i}", "r", "refused") for i in range(3)] == [True, True, True]
    assert not complaints("p0", "r", "refused")  # within 10 s: held back, counted
    now[0] = 11.0
    assert complaints("p9", "r", "refused")  # a fourth pair: the quiet ones are forgotten
    assert set(complaints._last) == {("p9", "r")}


def test_the_watchdog_is_not_pinged_once_a_periodic_task_has_ended() -> None:
    """A slot clock whose task ended (the first failed log write did it) kept the daemon
    answering with no tick; now systemd's watchdog restarts it."""
    import asyncio

    from controller.daemon import _ping

    class Notifier:
        pings = 0

        def watchdog(self) -> bool:
            self.pings += 1
            return True

    class Log:
        def __init__(self) -> None:
            self.errors: list[str] = []

        def error(self, event: str, **_kw: object) -> None:
            self.errors.append(event)

    async def go() -> tuple[int, list[str]]:
        notifier, log = Notifier(), Log()
        tasks: list[asyncio.Task[None]] = []
        ping = _ping(notifier, tasks, log)  # type: ignore[arg-type]
        tasks.append(asyncio.create_task(asyncio.sleep(3600)))
        await ping()
        ended = asyncio.create_task(asyncio.sleep(0))
        tasks.append(ended)
        await ended
        await ping()
        await ping()
        for task in tasks:
            task.cancel()
        return notifier.pings, log.errors

    pings, errors = asyncio.run(go())
    assert pings == 1 and len(errors) == 1
