"""``oasisd reload --pid PID`` (the unit's ``ExecReload=``): ``systemctl reload oasisd``
waits for the daemon's verdict and fails when the file is refused. With ``kill -HUP`` it
returned success at once while the refusal went to the journal alone, and the operator
took the edit for live (controller/reload_wait.py, controller/reload_status.py).

One daemon serves the module's tests (each writes the files it needs), run as systemd
runs it: ``$RUNTIME_DIRECTORY`` set."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.servers import ROOT, Daemon, write_config
from tests.test_reload import code_of, tokens_file
from tests.test_signals import _oasisd_command

EPOCH = 1_700_000_000.0


@dataclass
class Served:
    daemon: Daemon
    pid: int
    config: Path
    tokens: Path
    run: Path  # $RUNTIME_DIRECTORY

    def write(self, tokens: dict[str, str], limits: str = "rate = 20\n") -> None:
        """The tokens file (``{name: token}``, each a submitter, ops an operator) and
        the config with ``limits`` as its ``[limits]`` table."""
        tokens_file(self.tokens, {"ops": ("operator", "t-ops"),
                                  **{n: ("submitter", t) for n, t in tokens.items()}})  # fmt: skip
        extra = f'[auth]\ntokens_file = "{self.tokens}"\n[limits]\n{limits}'
        write_config(self.config, self.config.parent / "data", epoch=EPOCH, extra=extra)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("reloadwait")
    run = d / "run"
    run.mkdir(mode=0o700)
    s = Served(Daemon(d / "oasisd.toml", d / "oasisd.log"), 0, d / "oasisd.toml",
               d / "tokens", run)  # fmt: skip
    s.write({"alice": "t-alice"})
    s.daemon = Daemon(s.config, d / "oasisd.log", env={"RUNTIME_DIRECTORY": str(run)}).start()
    assert s.daemon.proc is not None
    s.pid = s.daemon.proc.pid
    try:
        yield s
    finally:
        assert s.daemon.stop() == 0, (d / "oasisd.log").read_text()[-3000:]


def waiter(pid: int, run: Path | None) -> subprocess.Popen[str]:
    """``oasisd reload --pid PID`` started, as the unit's ``ExecReload=`` runs it."""
    env = {k: v for k, v in os.environ.items() if k != "RUNTIME_DIRECTORY"}
    if run is not None:
        env["RUNTIME_DIRECTORY"] = str(run)
    return subprocess.Popen([*_oasisd_command(), "reload", "--pid", str(pid)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def reload_and_wait(pid: int, run: Path | None) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``oasisd reload --pid PID``."""
    proc = waiter(pid, run)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_a_good_edit_waits_for_the_reload_says_what_changed_and_is_live(served: Served) -> None:
    """systemctl reload returned before the daemon had read the file; now it returns
    once the reload is applied, with what it changed."""
    served.write({"alice": "t-alice", "bob": "t-bob"}, limits="rate = 40\n")
    code, out, err = reload_and_wait(served.pid, served.run)
    assert code == 0, (out, err)
    assert "tokens: added bob" in out and "limits: rate: 20 -> 40" in out, out
    assert code_of(served.daemon.address, "t-bob") == grpc.StatusCode.OK


def test_a_bad_edit_fails_the_reload_naming_the_mistake_and_changes_nothing(
    served: Served,
) -> None:
    """A file with a mistake was refused in the journal while systemctl reload returned
    success: the operator took carol's new token for live. Now the reload fails (exit
    1) and says why, on stderr."""
    served.write({"alice": "t-alice", "carol": "t-carol"}, limits="rate = 40\nrat = 50\n")
    try:
        code, out, err = reload_and_wait(served.pid, served.run)
        assert code == 1, (out, err)
        assert "reload refused" in err and "limits.rat: unknown key" in err, err
        assert code_of(served.daemon.address, "t-carol") == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(served.daemon.address, "t-alice") == grpc.StatusCode.OK
    finally:
        served.write({"alice": "t-alice"})
        assert reload_and_wait(served.pid, served.run)[0] == 0


def test_two_reloads_at_once_each_get_an_answer_of_a_reload_after_their_edit(
    served: Served,
) -> None:
    """SIGHUPs at once are one reload more, not one each: each waiter still gets the
    answer of a reload that began after it read the count, so after the edit."""
    served.write({"alice": "t-alice", "dave": "t-dave"})
    procs = [waiter(served.pid, served.run) for _ in range(2)]
    answers = [(p.wait(120), *p.communicate()) for p in procs]
    for code, out, err in answers:
        assert code == 0 and "config reloaded" in out, (code, out, err)
    assert any("added dave" in out for _, out, _ in answers), answers
    assert code_of(served.daemon.address, "t-dave") == grpc.StatusCode.OK


def test_no_oasisd_at_the_pid_is_said_and_nothing_else_is_signalled(served: Served) -> None:
    """A pid of no process, or of another program (a wrong ``--pid``), gets exit 4 and a
    message; the other program is not sent SIGHUP (which would have ended it)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    code, _, err = reload_and_wait(gone.pid, served.run)
    assert code == 4 and f"no process {gone.pid}: oasisd is not running" in err, err
    other = subprocess.Popen(["sleep", "600"])
    try:
        code, _, err = reload_and_wait(other.pid, served.run)
        assert code == 4 and f"process {other.pid} is not oasisd" in err, err
        assert other.poll() is None  # SIGHUP would have ended it
    finally:
        other.kill()
        other.wait(10)


def test_without_a_runtime_directory_the_reload_is_not_sent_and_says_why(served: Served) -> None:
    """Outside a unit with ``RuntimeDirectory=`` the daemon writes no outcome to wait on:
    exit 2, pointing at ``kill -HUP``."""
    code, _, err = reload_and_wait(served.pid, None)
    assert code == 2 and "RUNTIME_DIRECTORY is not set" in err, err


def test_each_reload_is_numbered_as_it_begins_and_its_answer_kept_until_the_stop(
    tmp_path: Path,
) -> None:
    """In process: the file a waiter reads has each reload numbered before it reads the
    config (a refused one too), its answer beside its number, and the stop marked, so
    a waiter whose reload the stop cancelled is told, not left to time out."""
    import asyncio

    from controller.config import load
    from controller.reload import Reloader
    from controller.reload_status import ReloadStatus, read_status
    from tests.test_reload import config_file

    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    config = config_file(tmp_path, tokens)
    status = ReloadStatus(tmp_path / "reload.json")
    reloader = Reloader(load(config), [], status=status)

    async def reloads() -> None:
        tokens_file(tokens, {"bob": ("submitter", "t-bob")})
        await reloader.reload()
        config.write_text(config.read_text() + "\n[limits]\nrat = 5\n")
        await reloader.reload()
        await reloader.stop()

    asyncio.run(reloads())
    now = read_status(tmp_path / "reload.json")
    assert now is not None and now.pid == os.getpid() and now.begun == 2 and now.stopping
    first, second = now.first_after(0), now.first_after(1)
    assert first is not None and first.outcome == "applied" and first.final
    assert "tokens: added bob; removed alice" in first.lines
    assert second is not None and second.outcome == "refused"
    assert any("limits.rat: unknown key" in line for line in second.lines), second.lines
    assert now.first_after(2) is None
