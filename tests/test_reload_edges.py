"""A reload's edges, run in-process against a config file (the mutation audit of the
live reload: each of these was a slip no test caught)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from controller.config import load
from controller.limits import Limits
from controller.reload import MAX_NAMES_CHECKED, Reloader, limit_changes, reread
from controller.reload_status import (
    KEPT_ANSWERS,
    STATUS_NAME,
    Answer,
    ReloadStatus,
    Status,
    read_status,
    status_path,
)
from controller.reload_wait import (
    EXIT_APPLIED,
    EXIT_REFUSED,
    EXIT_USAGE,
    _not_oasisd,
    _report,
    main,
    wait_for_reload,
)
from tests.test_reload import config_file, tokens_file


def test_a_reload_counts_the_jobs_of_at_most_20_removed_tenants(tmp_path: Path) -> None:
    """Each removed tenant's jobs are a store count; a reload removing hundreds counts
    the first :data:`MAX_NAMES_CHECKED` and says how many it left unchecked."""
    tenants = {f"t{i:02d}": ("submitter", f"token-{i}") for i in range(MAX_NAMES_CHECKED + 5)}
    ops = {"ops": ("operator", "token-ops")}
    tokens = tokens_file(tmp_path / "tokens", {**tenants, **ops})
    running = load(config_file(tmp_path, tokens))
    tokens_file(tokens, ops)
    asked: list[list[str]] = []

    async def jobs_left(names: Sequence[str]) -> Mapping[str, Mapping[str, int]]:
        asked.append(list(names))
        return {}

    found = asyncio.run(Reloader(running, [], jobs_left=jobs_left).reload())
    assert found is not None and found.tokens.removed == tuple(sorted(tenants))
    assert asked == [sorted(tenants)[:MAX_NAMES_CHECKED]]


def test_a_storm_of_sighups_is_one_reload_more(tmp_path: Path) -> None:
    """SIGHUPs while a reload waits for its turn start no other: it reads the file after
    them anyway (a storm of signals is not a storm of reads of the tokens file)."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    status = ReloadStatus(None)
    applied: list[object] = []

    async def storm() -> None:
        reloader = Reloader(running, [applied.append], status=status)
        for _ in range(5):
            reloader.hangup()
        await asyncio.sleep(0)  # the signal's reload takes the lock; ours waits behind it
        assert await reloader.reload() is not None

    asyncio.run(storm())
    assert status.now.begun == 2 and len(applied) == 2


def test_keys_written_in_another_order_are_no_edit(tmp_path: Path) -> None:
    """A table's keys moved about (a tidy-up of the file) change no value: the reload
    names nothing as waiting for a restart."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    path = config_file(tmp_path, tokens)
    running = load(path)
    text = path.read_text()
    assert "slot_seconds = 3600\nwindow = 24\n" in text, text
    path.write_text(text.replace("slot_seconds = 3600\nwindow = 24\n",
                                 "window = 24\nslot_seconds = 3600\n"))  # fmt: skip
    found = reread(running, Path(running.source))
    assert found.restart == () and found.keys == (), (found.restart, found.keys)


def test_a_longest_wait_lowered_to_the_running_default_wait_applies_at_once() -> None:
    """``limits.max_wait_seconds`` equal to the running ``daemon.wait_seconds`` refuses
    nothing (the default wait is within it): applied; only below it waits."""
    running = Limits(max_wait_seconds=7200.0)
    limits, changed, restart = limit_changes(running, Limits(max_wait_seconds=3600.0), 3600.0)
    assert limits.max_wait_seconds == 3600 and restart == ()
    assert changed == ("max_wait_seconds: 7200 -> 3600",)
    limits, changed, restart = limit_changes(running, Limits(max_wait_seconds=3599.0), 3600.0)
    assert limits == running and changed == () and restart == ("limits.max_wait_seconds",)


def test_the_ledgers_cap_waits_for_a_restart() -> None:
    running = Limits()
    fresh = Limits(max_ledger_mb=running.max_ledger_mb / 2)
    limits, changed, restart = limit_changes(running, fresh)
    assert limits == running and changed == () and restart == ("limits.max_ledger_mb",)


def test_a_reload_names_the_tables_and_keys_that_wait_for_a_restart(tmp_path: Path) -> None:
    """An edit of [web] waits for a restart, named by key; a table added whole is named by
    itself; an unedited data_dir stays the running one (oasisd --data-dir's)."""
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    path = config_file(tmp_path, tokens)
    running = replace(load(path), data_dir=tmp_path / "elsewhere")
    text = path.read_text()
    assert 'listen = "127.0.0.1:0"\n' in text
    path.write_text(text + '[metrics]\nlisten = "127.0.0.1:0"\n')
    found = reread(running, Path(running.source))
    assert found.restart == ("metrics",) and found.keys == ("metrics",)
    assert found.fresh is not None and found.fresh.data_dir == tmp_path / "elsewhere"
    path.write_text(
        text.replace('[web]\nlisten = "127.0.0.1:0"\n', '[web]\nlisten = "127.0.0.1:1"\n')
    )
    found = reread(running, Path(running.source))
    assert found.restart == ("web",) and found.keys == ("web.listen",)


def test_a_sighup_while_the_daemon_stops_reads_nothing(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    status = ReloadStatus(None)

    async def late() -> None:
        reloader = Reloader(running, [], status=status)
        await reloader.stop()
        reloader.hangup()
        reloader.hangup()
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(late())
    assert status.now.begun == 0 and status.now.stopping


def test_the_next_reload_compares_with_what_the_last_one_applied(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    running = load(config_file(tmp_path, tokens))
    tokens_file(tokens, {"alice": ("submitter", "t-alice"), "bob": ("submitter", "t-bob")})

    async def twice() -> tuple[str, str]:
        reloader = Reloader(running, [])
        first, second = await reloader.reload(), await reloader.reload()
        assert first is not None and second is not None
        return first.tokens.words(), second.tokens.words()

    assert asyncio.run(twice()) == ("added bob", "no change")


def test_the_status_keeps_the_latest_answers_one_per_reload(tmp_path: Path) -> None:
    status = ReloadStatus(tmp_path / STATUS_NAME)
    for _ in range(KEPT_ANSWERS + 4):
        number = status.begin()
        status.answer(number, "applied", ["checking"], final=False)
        status.answer(number, "applied", ["done"])  # the same reload's, replaced
    read = read_status(tmp_path / STATUS_NAME)
    assert read is not None and read.begun == KEPT_ANSWERS + 4
    assert [a.number for a in read.answers] == list(range(5, KEPT_ANSWERS + 5))
    assert all(a.lines == ("done",) and a.final for a in read.answers)


def test_the_status_is_in_the_first_runtime_directory() -> None:
    assert status_path({"RUNTIME_DIRECTORY": "/run/oasis:/run/other"}) == Path(
        "/run/oasis/reload.json"
    )
    assert status_path({"RUNTIME_DIRECTORY": ""}) is None and status_path({}) is None


def test_a_reload_answer_other_than_applied_fails_and_errors_go_to_stderr() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert _report(Answer(1, "starting"), out, err) == EXIT_REFUSED
    assert out.getvalue() == "" and err.getvalue() == "reload starting\n"
    out, err = io.StringIO(), io.StringIO()
    applied = Answer(2, "applied", ("config reloaded: f", "error: a restart would fail"))
    assert _report(applied, out, err) == EXIT_APPLIED
    assert out.getvalue() == "config reloaded: f\n"
    assert err.getvalue() == "error: a restart would fail\n"


def test_a_process_that_is_not_oasisd_is_not_signalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _not_oasisd(os.getpid()).startswith(f"process {os.getpid()} is not oasisd (")
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path))
    assert main(["--pid", "1"]) == EXIT_USAGE  # init: never a daemon to signal


CHECKS_DONE_ON_SIGHUP = """
import json, signal, sys, time
path, number = sys.argv[1], int(sys.argv[2])
def done(*_):
    time.sleep(0.3)  # the waiter reads the answer not yet final first
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": __import__("os").getpid(), "begun": number, "stopping": False,
                   "answers": [{"number": number, "outcome": "applied",
                                "lines": ["checks done"], "final": True}]}, f)
    __import__("os").replace(path + ".tmp", path)
signal.signal(signal.SIGHUP, done)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_oasisd_reload_waits_for_the_checks_of_a_restart_to_finish(tmp_path: Path) -> None:
    """An answer whose checks of a restart still run (``final`` false) is not the
    verdict: the waiter reads on until the final one (or its timeout)."""
    path = tmp_path / STATUS_NAME
    child = subprocess.Popen(
        [sys.executable, "-c", CHECKS_DONE_ON_SIGHUP, str(path), "1"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        # begun 0 read before the SIGHUP: reload 1's answer is the one, checks running
        early = (Answer(1, "applied", ("checking",), final=False),)
        path.write_text(Status(child.pid, 0, early).to_json())
        out, err = io.StringIO(), io.StringIO()
        assert wait_for_reload(child.pid, path, 60, out, err) == EXIT_APPLIED
        assert out.getvalue() == "checks done\n" and err.getvalue() == ""
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
