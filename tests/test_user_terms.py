"""What users give and read in their own terms (the user's-terms audit): numbers on the
command line, durations and sizes in job specs, and the times and lengths the CLI and
the console show, against a daemon of 15-minute slots whose slot 0 is not on the hour.

Each test names what it checks; the daemon's are end to end (``oasis`` subprocesses).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main
from controller.clock import SlotTimes
from controller.jobspec import check_worth, prepare
from pricing import SpecError
from pricing.durations import format_duration, format_time, parse_duration
from tests.browser import needed, opened
from tests.servers import ROOT, Daemon, json_log, oasis, write_config
from tests.test_jobspec import CLUSTER, PEOPLE, SLOT, problems

NOWHERE = ["--server", "127.0.0.1:9"]  # nothing listens: a flag refused never gets there


# -- numbers on the command line ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # past what the request's int64 / int32 field holds: a ValueError traceback before
        (["prices", "--from", "99999999999999999999"], "argument --from: must be at most"),
        (["prices", "--slots", "99999999999"], "argument --slots: must be at most 2147483647"),
        (["status", "--slots", "99999999999"], "argument --slots: must be at most 2147483647"),
        (["jobs", "--limit", "99999999999"], "argument --limit: must be at most 2147483647"),
        (["watch", "--from", "99999999999999999999"], "argument --from: must be at most"),
        (["cordon", "w0", "--from", "99999999999999999999"], "argument --from: must be at most"),
        (["cordon", "w0", "--until", "99999999999999999999"], "argument --until: must be at"),
        # other scripts' digits and "_": Python's int() and float() read them, no one else
        (["prices", "--from", "٣"], "argument --from: not an integer: '٣'"),
        (["prices", "--slots", "1_000"], "argument --slots: not an integer: '1_000'"),
        (["status", "--limit", "３"], "argument --limit: not an integer"),
        (["watch", "--from", "٣"], "argument --from: not an integer"),
        # a whole number written otherwise is named as the integer to give (it was told
        # "e.g. 13", whatever it wrote)
        (["gen", "--jobs", "1e3"], "argument --jobs: not an integer: '1e3' (write it as 1000)"),
        (["jobs", "--limit", "20.0"], "argument --limit: not an integer: '20.0' (write it as 20)"),
        (["gen", "--jobs", "2.5"], "not an integer: '2.5' (give ASCII digits, e.g. 13)"),
        (["gen", "--jobs=-1e3"], "not an integer: '-1e3' (give ASCII digits, e.g. 13)"),
        (["submit", "job.json", "--wait", "٣"], "argument --wait: not a duration >= 0: '٣'"),
        (["submit", "job.json", "--wait", "1_0"], "argument --wait: not a duration >= 0"),
        (["cordon", "w0", "--from", "٣"], "argument --from: not a time or a slot: '٣'"),
        (["cordon", "w0", "--until", "²"], "argument --until: not a time or a slot: '²'"),
        (["cordon", "w0", "--for", "٣h"], "argument --for: not a duration >= 0"),
        (["status", "--timeout", "٣"], "argument --timeout: not seconds or a duration"),
    ],
)
def test_a_number_on_the_command_line_is_ascii_and_fits_its_request(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([*argv, *NOWHERE])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err


def test_a_duration_past_a_million_days_is_not_printed_to_the_last_digit() -> None:
    """``submit --wait 1e308`` was told ``--wait: 1157407407...`` (364 characters of days,
    the last 290 of them noise) ``exceeds limits.max_wait_seconds``."""
    assert format_duration(1e308) == "1.157e+303d"
    assert format_duration(8.64e27) == "1e+23d"
    assert format_duration(-1e20) == "-1.157e+15d"
    exact = 999_999 * 86400 + 5400
    assert format_duration(exact) == "999999d1h30m"
    assert parse_duration(format_duration(exact)) == exact


# -- job specs: each field's unit and form --------------------------------------------


def test_a_size_with_a_unit_is_told_the_unit_the_field_takes() -> None:
    said = problems({**PEOPLE, "grad_mb": "100MB"})
    assert said == [
        "job.grad_mb: must be a number of megabytes (MB, 10^6 bytes; 1 GiB is 1073.741824 "
        "MB), got the string '100MB'"
    ]


def test_a_deadline_not_after_the_arrival_says_in_what_unit() -> None:
    """A number is slots, a string a duration: ``"deadline": 0`` was told "must be after
    the arrival, got 0.0", in no unit."""
    for given, said in (
        (0, "must be after the arrival (a number of slots > 0), got 0"),
        (-1, "must be after the arrival (a number of slots > 0), got -1"),
        ("0h", "must be after the arrival (a duration > 0), got '0h'"),
    ):
        utility = {"kind": "deadline", "value": 5, "deadline": given}
        assert problems({**PEOPLE, "utility": utility}) == [f"job.utility.deadline: {said}"]


def test_a_deadline_of_part_of_a_slot_says_that_only_whole_slots_count() -> None:
    """The specs audit: ``"deadline": "30m"`` with hour slots was told it "leaves 0 slots
    (0s) after the job's arrival", which read as a contradiction of the 30 minutes given."""
    utility = {"kind": "deadline", "value": 5, "deadline": "90m"}
    spec = {**PEOPLE, "utility": utility, "epochs": 4}  # needs 3 slots
    with pytest.raises(SpecError) as err:
        check_worth(spec, cluster=CLUSTER, slot_seconds=SLOT, window=48, arrival=5)
    assert err.value.problems[0].reason.startswith(
        "leaves 1 slot (1h) after the job's arrival (1h30m is 1.5 slots: a job ends with a "
        "slot, so only whole slots count), but it needs at least 3 slots (3h)"
    ), err.value.problems[0].reason


def test_a_deadline_before_the_arrival_is_said_to_be_before_it() -> None:
    """A date in the past (a year mistyped) was told it "leaves 0 slots (0s) after the
    job's arrival", as if it were merely too close."""
    times = SlotTimes(1767222450.0, SLOT)  # slot 0 at 00:07:30 (+01:00)
    arrival = 100

    def refusal(deadline: str) -> str:
        utility = {"kind": "deadline", "value": 5, "deadline": deadline}
        spec = prepare({**PEOPLE, "utility": utility}, times)
        with pytest.raises(SpecError) as err:
            check_worth(spec, cluster=CLUSTER, slot_seconds=SLOT, window=48, arrival=arrival)
        return err.value.problems[0].reason

    day_before = format_time(times.start(arrival - 24))
    assert refusal(day_before).startswith(
        "is 24 slots (1d) before the job's arrival (is the date right?), but the job needs "
        "at least 2 slots (2h) even on an empty cluster, and its value after the deadline is 0"
    )
    assert refusal(format_time(times.start(arrival))).startswith(
        "is at the job's arrival (is the date right?), but the job needs at least"
    )


# -- a daemon of 15-minute slots, slot 0 at 00:07:30 ----------------------------------

SLOT_SECONDS = 900.0
EPOCH = 1767222450.0  # 2026-01-01T00:07:30+01:00


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("terms")
    extra = '[metrics]\nlisten = "127.0.0.1:0"\n'
    config = write_config(d / "oasisd.toml", d / "data", epoch=EPOCH, extra=extra)
    text = config.read_text().replace("slot_seconds = 3600", f"slot_seconds = {SLOT_SECONDS:g}")
    config.write_text(text.replace("window = 24", "window = 96"))
    daemon = Daemon(config, d / "oasisd.log").start()
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0


def _job(job_id: str, deadline: str) -> dict[str, Any]:
    """4 workers for 4 slots of 15 minutes: W = 16 worker-slots, d_min = 4 slots (1h)."""
    return {
        "id": job_id, "epochs": 1, "chunks": 4, "minibatches": 1,
        "minibatch_seconds": "59m59s", "grad_mb": 1,
        "worker": {"gpu": 1, "cpu": 1, "bandwidth": 1}, "ps": {"cpu": 1, "bandwidth": 1},
        "utility": {"kind": "deadline", "value": 100, "deadline": deadline},
    }  # fmt: skip


def test_a_deadline_on_a_slot_boundary_is_met_and_one_second_less_is_refused(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A deadline an hour after the arrival's boundary, in another offset than UTC, is
    admitted to complete exactly by it; a second earlier, it cannot be met and says by
    how much (what the audit found right, kept so)."""
    server = ["--server", daemon.address]
    for _ in range(3):  # a quote taken just before a boundary arrives a slot later
        slot = json.loads(oasis("status", "--json", *server).stdout)["current_slot"]
        arrival = slot + 1
        due = time.strftime(
            "%Y-%m-%dT%H:%M:%S-05:00", time.gmtime(EPOCH + (arrival + 4) * SLOT_SECONDS - 5 * 3600)
        )
        spec = tmp_path / "job.json"
        spec.write_text(json.dumps(_job("on-time", due)))
        quoted = json.loads(oasis("quote", str(spec), "--json", *server, check=False).stdout)
        if quoted["decision"]["arrival_slot"] == arrival:
            break
    decision = quoted["decision"]
    assert decision["admitted"] and decision["jct"] == 4
    assert decision["completes_by"] == format_time(EPOCH + (arrival + 4) * SLOT_SECONDS)
    early = tmp_path / "early.json"
    early_due = due.replace(":30-05:00", ":29-05:00")
    assert early_due != due
    early.write_text(json.dumps(_job("early", early_due)))
    refused = oasis("quote", str(early), *server, check=False)
    assert refused.returncode == 2
    assert "leaves 3 slots (45m) after the job's arrival, but it needs at least 4 slots (1h)" in (
        refused.stderr
    )


def test_a_cordons_span_names_its_option_and_fits_a_request(daemon: Daemon) -> None:
    """The daemon's refusal of an end named the request's field, ``until_slot``; a
    ``--for`` past any slot was a ValueError traceback; one slot was "1 slots"."""
    server = ["--server", daemon.address]
    out = oasis("cordon", "w0", "--until", "2", *server, check=False)
    assert out.returncode == 2
    assert "  --until: must be after the slot the cordon starts in (" in out.stderr
    assert "until_slot" not in out.stderr
    out = oasis("cordon", "w0", "--for", "100000000h", *server, check=False)
    assert out.returncode == 2 and "  --for: must be after the slot the cordon starts in" in (
        out.stderr
    )
    assert ", got slot " in out.stderr and ", 400000000 slots after it" in out.stderr
    out = oasis("cordon", "w0", "--for", "99999999999999999999999d", *server, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--for: 8.64e+27 s ends past the last slot there can be" in out.stderr
    trial = oasis("cordon", "w0", "--for", "10m", "--dry-run", *server).stdout
    assert "(1 slot, 15m)" in trial  # rounded up to whole slots, and said so


def test_the_metrics_say_what_a_slot_and_a_price_are_in(daemon: Daemon) -> None:
    """``oasis_slot`` was "The current slot." and ``oasis_unit_price_peak`` named no
    unit, where the other price metrics say "utility per unit per slot"."""
    line = next(x for x in json_log(daemon.log_path) if x.get("event") == "metrics listening")
    with urllib.request.urlopen(f"http://{line['address']}/metrics", timeout=30) as r:
        helps = {
            parts[2]: parts[3]
            for parts in (x.split(" ", 3) for x in r.read().decode().splitlines())
            if parts[:2] == ["#", "HELP"]
        }
    prices = [name for name in helps if name.startswith("oasis_unit_price")]
    assert len(prices) >= 2, sorted(helps)
    for name in prices:
        assert "(utility per unit per slot" in helps[name], (name, helps[name])
    assert "daemon.epoch + s * daemon.slot_seconds" in helps["oasis_slot"]


# -- the console's lengths and times --------------------------------------------------


def _function(source: str, name: str) -> str:
    """The text of ``function name(...) {...}`` in ``source``."""
    start = source.index(f"  function {name}(")
    depth, i = 0, source.index("{", start)
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[start : j + 1]
    raise AssertionError(f"no end to {name}")


@pytest.fixture(scope="module")
def new_york_browser() -> Iterator[Any]:
    """Chromium in America/New_York."""
    needed()
    with opened("America/New_York") as driver:
        yield driver


def test_the_console_shows_a_length_whole_and_a_time_across_a_clock_change_with_its_zone(
    new_york_browser: Any,
) -> None:
    """The console's lengths kept two units and cut the rest: 101 slots of 15 minutes
    (1d1h15m, as ``oasis jobs`` says) read "1d1h", a slot short; a slot length of
    1h30m30s read "1h30m". And a time across a clock change showed no zone, so the hour
    repeated in autumn read alike twice (the CLI names its zone)."""
    script = (ROOT / "controller" / "console" / "static" / "console.js").read_text()
    names = ("duration", "roughly", "slotStart", "when", "localTime")
    body = "".join(_function(script, n) for n in names)
    browser = new_york_browser
    browser.get("about:blank")
    run = f"{body}\nreturn [arguments[0].map(duration), arguments[0].map(roughly)];"
    lengths = [101 * 900, 5430, 1.5, 0, 3599.6]
    exact, rough = browser.execute_script(run, lengths)
    assert exact == ["1d1h15m", "1h30m30s", "1.5s", "0s", "59m59.6s"]
    assert exact == [format_duration(x) for x in lengths]
    assert rough == ["1d1h", "1h31m", "2s", "0s", "1h"]  # estimates: two units, rounded
    # 2027-11-07, New York: 01:30 EDT, then 01:30 EST an hour later; now, in November
    # 2026 or later, one of them is in another offset than now
    first = 1825565400.0  # 2027-11-07T05:30:00Z = 01:30 EDT
    shown = browser.execute_script(
        f"{body}\nreturn [when({{epoch: arguments[0], slot_seconds: 3600}}, 0), "
        "when({epoch: arguments[0], slot_seconds: 3600}, 1)];",
        first,
    )
    assert shown[0] != shown[1], shown
    assert all(re.search(r"01:30", s) for s in shown), shown


def test_the_console_counts_one_worker_slot_in_the_singular(new_york_browser: Any) -> None:
    """A job's page and the plans' labels said "1 worker-slots" (the README audit's note)."""
    script = (ROOT / "controller" / "console" / "static" / "console.js").read_text()
    new_york_browser.get("about:blank")
    each = "function (n) { return counted(n, 'worker-slot'); }"
    run = f"{_function(script, 'counted')}\nreturn arguments[0].map({each});"
    said = new_york_browser.execute_script(run, [1, 2, 0, 16])
    assert said == ["1 worker-slot", "2 worker-slots", "0 worker-slots", "16 worker-slots"]
    assert 'counted(dec.work, "worker-slot")' in script  # the job page's Work line uses it


@pytest.mark.parametrize("item", ["gpu=١٠٠", "gpu=1_0", "gpu=", "gpu"])
def test_a_pinned_bound_is_an_ascii_number(item: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``oasis bounds pin --upper gpu=١٠٠`` pinned U at 100: float() reads other scripts'
    digits and ``_`` (refused before any call: the daemon is nowhere)."""
    assert main(["bounds", "pin", "--upper", item, *NOWHERE]) == 2
    assert f"--upper: {item!r} must be R=NUMBER" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "item"),
    [("--upper", "gpu=-1"), ("--lower", "gpu=0"), ("--upper", "gpu=inf"), ("--lower", "cpu=nan")],
)
def test_a_pinned_bound_out_of_range_is_named_by_its_flag(
    flag: str, item: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any call, naming the flag: the daemon's answer named its own
    fields, ``pins.worker.gpu.U`` and ``pins.ps.gpu.U`` (the README audit's note)."""
    assert main(["bounds", "pin", flag, item, *NOWHERE]) == 2
    assert f"{flag}: {item!r}: a bound must be a finite number > 0" in capsys.readouterr().err
