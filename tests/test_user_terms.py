"""What users give and read in their own terms (the user's-terms audit): numbers on the
command line, durations and sizes in job specs, and the times and lengths the CLI and
the console show, against a daemon of 15-minute slots whose slot 0 is not on the hour.

Each test names what it checks; the daemon's are end to end (``oasis`` subprocesses).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.cli import main
from pricing.durations import format_duration, parse_duration
from tests.servers import Daemon, oasis, write_config

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


# -- a daemon of 15-minute slots, slot 0 at 00:07:30 ----------------------------------

SLOT_SECONDS = 900.0
EPOCH = 1767222450.0  # 2026-01-01T00:07:30+01:00


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = tmp_path_factory.mktemp("terms")
    config = write_config(d / "oasisd.toml", d / "data", epoch=EPOCH)
    text = config.read_text().replace("slot_seconds = 3600", f"slot_seconds = {SLOT_SECONDS:g}")
    config.write_text(text.replace("window = 24", "window = 96"))
    daemon = Daemon(config, d / "oasisd.log").start()
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0


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
