"""Records of the libraries that log through the standard ``logging`` module: JSON lines,
and those a remote client can cause (aiohttp's refusals of malformed HTTP) throttled and
cut to one line each."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

from controller.logs import LIBRARY_BURST, _JsonLines, _Throttle
from tests.servers import ROOT


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


def test_a_long_library_traceback_keeps_its_end_where_the_error_is() -> None:
    """A traceback over 4,000 characters keeps its last ones: the error raised, and the
    frame it was raised in, not the head of a long chained cause; a message is cut to
    its first 2,000."""
    try:
        try:
            raise KeyError("k" * 5000)
        except KeyError as cause:
            raise ValueError("the last words") from cause
    except ValueError:
        record = logging.LogRecord("grpc", logging.ERROR, __file__, 1, "failed", None, None)
        record.exc_info = sys.exc_info()
    record.msg = "failed " * 1000  # and a long message keeps its first 2,000 characters
    line = json.loads(_JsonLines().format(record))
    assert len(line["exception"]) == 4000 and line["event"] == ("failed " * 1000)[:2000]
    assert line["exception"].endswith("ValueError: the last words"), line["exception"][-200:]


def test_library_records_below_warning_reach_no_log() -> None:
    """aiohttp logs each request it serves at INFO (``aiohttp.access``): as the daemon
    configures its log (in a process of its own), those stay out, its warnings get in,
    and the daemon's own INFO lines too."""
    script = (
        "import logging, structlog\n"
        "from controller.logs import configure, flush\n"
        "configure('info')\n"
        "logging.getLogger('aiohttp.access').info('GET / 200')\n"
        "logging.getLogger('aiohttp.server').warning('bad request')\n"
        "structlog.get_logger('oasisd').info('daemon line')\n"
        "flush()\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    events = [json.loads(line)["event"] for line in out.stderr.splitlines()]
    assert sorted(events) == ["bad request", "daemon line"], out.stderr


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


def test_events_without_an_exception_spend_none_of_the_traceback_budget() -> None:
    """Only events that carry an exception count: a busy minute of plain lines must not
    cut the traceback of the one bug in it."""
    from controller.logs import TRACEBACK_BURST, _Tracebacks

    cut = _Tracebacks(seconds=3600.0)
    for i in range(3 * TRACEBACK_BURST):
        assert cut(None, "info", {"event": "fine", "i": i}) == {"event": "fine", "i": i}
    err = ValueError("v")
    assert cut(None, "error", {"event": "x", "exc_info": err})["exc_info"] is err


def test_the_first_library_record_after_a_drop_says_how_many_were_dropped() -> None:
    """The budget's next window begins with a record saying how many of its library's
    were dropped in the last one (else a flood that was cut leaves no trace of its size)."""
    handler, out = _handler()
    server = logging.getLogger("aiohttp.server")
    server.addHandler(handler)
    server.propagate = False
    throttle = next(f for f in handler.filters if isinstance(f, _Throttle))
    try:
        for i in range(LIBRARY_BURST + 7):
            server.warning("bad request %d", i)
        throttle._budgets["aiohttp"].started -= 3600.0  # the minute is over
        server.warning("bad request %d", 99)
        server.warning("bad request %d", 100)
    finally:
        server.removeHandler(handler)
        server.propagate = True
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert len(events) == LIBRARY_BURST + 2
    assert events[-2:] == ["bad request 99 (7 like it dropped before)", "bad request 100"]


def test_a_value_of_exactly_the_items_allowed_is_kept_whole_and_long_keys_are_cut() -> None:
    """50 items are 50 items (no "0 more" marker); a mapping's long keys (a client's job
    ids) are cut as its long values are."""
    from controller.logs import MAX_ITEM_CHARS, MAX_VALUE_ITEMS, _bounded

    whole = [f"j{i}" for i in range(MAX_VALUE_ITEMS)]
    event = _bounded(None, "info", {"event": "x", "ids": whole, "by": dict.fromkeys(whole, 1)})
    assert event["ids"] == whole and event["by"] == dict.fromkeys(whole, 1)
    event = _bounded(None, "info", {"event": "x", "moved": {"k" * 5000: "v" * 5000}})
    ((key, value),) = event["moved"].items()
    cut = "...(cut: 5000 characters)"
    assert (key, value) == ("k" * MAX_ITEM_CHARS + cut, "v" * MAX_ITEM_CHARS + cut)


def test_a_complaint_after_those_held_back_says_how_many() -> None:
    from structlog.testing import capture_logs

    from controller.logs import Complaints

    now = [0.0]
    with capture_logs() as logs:
        complaints = Complaints(10.0, lambda: now[0], field="peer")
        assert complaints("p", "r", "refused", n=1)
        assert not complaints("p", "r", "refused") and not complaints("p", "r", "refused")
        now[0] = 10.0
        assert complaints("p", "r", "refused", n=2)
        now[0] = 20.0
        assert complaints("p", "r", "refused", n=3)
    assert [(e["peer"], e["suppressed"], e["n"]) for e in logs] == [
        ("p", 0, 1),
        ("p", 2, 2),
        ("p", 0, 3),
    ]


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
