"""What the client commands make of their input before any call to the daemon: job
files (one job, a list, what ``jobs --json`` or ``job --json`` printed), their errors
named by item, and standard input read only so far (the client's mutation audit)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controller.cli import main
from controller.commands.client import _specs

NOWHERE = ["--server", "127.0.0.1:1", "--timeout", "1"]  # nothing is asked of it here


def _write(tmp_path: Path, data: Any, name: str = "jobs.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_what_jobs_json_printed_reads_back_as_its_jobs(tmp_path: Path) -> None:
    """``oasis jobs --json > f; oasis submit f`` submits each job listed, by its spec (an
    operator's listing names a tenant's job by its key: its id is the part after it)."""
    listed = {"jobs": [
        {"id": "a1", "state": "admitted", "spec": {"id": "a1", "epochs": 1}, "decision": {}},
        {"id": "bob:b2", "state": "rejected", "spec": {"id": "bob:b2", "epochs": 2},
         "decision": {}},
    ]}  # fmt: skip
    assert _specs(_write(tmp_path, listed)) == [
        {"id": "a1", "epochs": 1},
        {"id": "b2", "epochs": 2},
    ]


def test_a_list_names_the_item_that_is_no_job_object_by_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, [{"epochs": 1}, 5, {"epochs": 2}])
    assert main(["submit", path, *NOWHERE]) == 2
    assert f"{path}: item 2: a job must be a JSON object" in capsys.readouterr().err
    assert main(["submit", path, "--json", *NOWHERE]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert error["message"] == f"{path}: item 2: a job must be a JSON object"
    one = _write(tmp_path, "7", "one.json")  # not a list: no item number
    assert main(["quote", one, *NOWHERE]) == 2
    assert capsys.readouterr().err.endswith(f"{one}: a job must be a JSON object\n")


@pytest.mark.parametrize("empty", [[], {"jobs": []}], ids=["list", "listing"])
def test_a_file_without_jobs_is_bad_input_not_nothing_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], empty: Any
) -> None:
    """An empty list submitted nothing and exited 0, read by a script as every job
    admitted: it is refused, exit 2."""
    path = _write(tmp_path, empty)
    assert main(["submit", path, *NOWHERE]) == 2
    assert f"{path}: no jobs in it" in capsys.readouterr().err


class _Endless:
    """Standard input that never ends (``yes | oasis submit -``): bytes for any bounded
    read; an unbounded read is a test failure, not a machine out of memory."""

    def read(self, size: int = -1) -> bytes:
        assert size >= 0, "standard input read without a bound"
        return b" " * size


def test_standard_input_is_read_only_so_far(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-`` reads standard input up to ``MAX_INPUT_BYTES`` (1 MiB here), as a file is
    read, then refuses it naming standard input, exit 2."""
    from controller.commands import common

    monkeypatch.setattr(common, "MAX_INPUT_BYTES", 1 << 20)
    monkeypatch.setattr("sys.stdin", SimpleNamespace(buffer=_Endless()))
    for command in ("submit", "quote"):
        assert main([command, "-", *NOWHERE]) == 2
        err = capsys.readouterr().err
        assert "-: more than 1,048,576 bytes, the most read" in err, err


def test_submit_wait_takes_zero_and_durations_and_nothing_else() -> None:
    """``--wait 0`` rejects at once, as its help says (not refused as no duration); a
    negative, endless or non-ASCII one is refused by argparse."""
    import argparse

    from controller.commands.client import wait_duration

    assert [wait_duration(t) for t in ("0", "0s", "90s", "1h30m", "2.5")] == [0, 0, 90, 5400, 2.5]
    for text in ("-1", "-1s", "inf", "nan", "\u0663", "1_0", "5x"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a duration >= 0"):
            wait_duration(text)


def test_an_integer_option_takes_both_ends_of_its_range() -> None:
    """``jobs --limit 0`` lists every job and ``--limit 2147483647`` is the most an int32
    holds: both ends are taken, one past either refused (the mutation audit: ``<=`` for
    ``<`` and ``>=`` for ``>`` survived every test)."""
    import argparse

    from controller.commands.common import INT32_MAX, int_at_least

    parse = int_at_least(0, INT32_MAX)
    assert (parse("0"), parse(str(INT32_MAX))) == (0, INT32_MAX)
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 0, got -1"):
        parse("-1")
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be at most {INT32_MAX}, got"):
        parse(str(INT32_MAX + 1))
    assert int_at_least(-1)("-1") == -1  # watch --from -1: none before


def test_a_call_timeout_takes_up_to_a_day_and_no_more() -> None:
    """``--timeout 86400`` (a day) is taken and a second more refused, as the help says
    (the client audit's M10: a cap of a week passed every test; ``1e9`` was the only
    value over it tried)."""
    import argparse

    from controller.commands.common import call_timeout

    assert (call_timeout("86400"), call_timeout("0.5")) == (86400.0, 0.5)
    with pytest.raises(argparse.ArgumentTypeError, match=r"at most 86400 seconds \(a day\), got"):
        call_timeout("86401")
