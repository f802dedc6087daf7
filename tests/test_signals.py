"""Signals as an operator sends them (an audit of reloads and signals): a SIGHUP to every
process of the unit, while the daemon starts and while it stops, and reload storms. None
of them may end the daemon or its commit process, or cost a tenant an answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path

import grpc

from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from tests.servers import ROOT, Daemon, commit_processes, json_log, write_config
from tests.test_daemon_e2e import job
from tests.test_reload import reloads

EPOCH = 1_700_000_000.0


def _submitting(address: str, name: str, codes: Counter[str], done: threading.Event) -> None:
    """Submit jobs ``name-0``, ``name-1``, ... until ``done``, counting the answers."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdmissionStub(channel)
        i = 0
        while not done.is_set():
            request = pb.SubmitJobRequest(job=spec_to_proto(job(f"{name}-{i}", chunks=1 + i % 4)))
            try:
                stub.SubmitJob(request, timeout=30)
                codes["OK"] += 1
            except grpc.RpcError as err:
                codes[f"{err.code().name}: {err.details()}"] += 1
            i += 1


def test_a_sighup_to_every_process_of_the_unit_spares_the_commit_process(
    tmp_path: Path,
) -> None:
    """``systemctl kill -s HUP oasisd`` signals every process of the unit, the commit
    process too, which SIGHUP's default action ended: each such reload cost the decisions
    being committed their answer (UNAVAILABLE) and the daemon a rebuild of its ledger.
    The child ignores it now, as it ignores SIGINT and SIGTERM."""
    log = tmp_path / "oasisd.log"
    daemon = Daemon(write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH),
                    log).start()  # fmt: skip
    assert daemon.proc is not None
    codes: Counter[str] = Counter()
    done = threading.Event()
    clients = [
        threading.Thread(target=_submitting, args=(daemon.address, f"c{k}", codes, done))
        for k in range(2)
    ]
    try:
        for client in clients:
            client.start()
        deadline = time.monotonic() + 30
        while not codes["OK"] and time.monotonic() < deadline:
            time.sleep(0.05)
        [child] = commit_processes(daemon.proc.pid)
        for seen in range(3):
            for pid in (daemon.proc.pid, child):  # as systemctl kill does: the whole unit
                os.kill(pid, signal.SIGHUP)
            reloads(log, "config reloaded", seen)
            time.sleep(0.3)  # decisions committed meanwhile, through the child
            assert commit_processes(daemon.proc.pid) == [child], f"reload {seen + 1}"
        done.set()
        for client in clients:
            client.join(60)
        assert set(codes) == {"OK"}, codes
        events = {e.get("event") for e in json_log(log)}
        assert "commit process lost" not in events
    finally:
        done.set()
        assert daemon.stop() == 0, log.read_text()[-3000:]


def _oasisd_command() -> list[str]:
    """What the installed ``oasisd`` runs: the entry point of ``pyproject.toml``."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["oasisd"].partition(":")
    return [
        sys.executable,
        "-c",
        f"import sys; from {module} import {function} as f; sys.exit(f())",
    ]


def _catches_sighup(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGHUP (``SigCgt``, Linux)."""
    with contextlib.suppress(FileNotFoundError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False


def _start_oasisd(tmp_path: Path, log: Path) -> subprocess.Popen[str]:
    """The installed ``oasisd`` command on a config in ``tmp_path``, its log to ``log``
    and its standard output a pipe (where it says "listening on")."""
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH)
    with open(log, "w") as err:
        proc = subprocess.Popen([*_oasisd_command(), "--config", str(config)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip
    return proc


def test_a_sighup_while_oasisd_starts_is_held_not_its_end(tmp_path: Path) -> None:
    """SIGHUP's default action ends a process, and the daemon took SIGHUP only once its
    event loop ran, after a second of imports: a ``kill -HUP`` then (logrotate, a config
    tool) ended it with an empty log, and systemd, counting an end by SIGHUP as clean,
    did not restart it. The ``oasisd`` command takes SIGHUP before its imports now: the
    reloads sent while it starts are said to be too early, and it starts."""
    log = tmp_path / "oasisd.log"
    proc = _start_oasisd(tmp_path, log)
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not _catches_sighup(proc.pid):  # sent before, it would be the test's doing
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.001)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "_multiarray_umath" not in maps, "SIGHUP taken only after numpy's import"
        sent = 0
        while not any("listening on" in line for line in lines):
            assert proc.poll() is None, f"ended by SIGHUP {sent}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline + 60, "oasisd did not start"
            proc.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(0.02)
        assert sent > 10  # the whole start-up long
        early = [e for e in json_log(log) if e.get("event", "").startswith("reload: still")]
        assert early and early[0]["level"] == "warning", log.read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        reader.join(10)
        proc.stdout.close()
        assert code == 0, log.read_text()[-3000:]


def test_a_sighup_during_the_imports_alone_is_said_to_be_too_early(tmp_path: Path) -> None:
    """One SIGHUP, sent as soon as ``oasisd`` takes it (its imports, before any event
    loop): counted then, and said once the daemon starts to be too early, as those that
    come while it starts. The mutation audit: the count left unread at the start passed
    the test above, whose SIGHUPs go on all start-up long. (Were the SIGHUP late, the
    loop would say it the same: this test cannot fail on the daemon as it is.)"""
    log = tmp_path / "oasisd.log"
    proc = _start_oasisd(tmp_path, log)
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 30
        while not _catches_sighup(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.001)
        proc.send_signal(signal.SIGHUP)
        for line in proc.stdout:  # to its end, should it exit instead
            if "listening on" in line:
                break
        early = [e for e in json_log(log) if e.get("event", "").startswith("reload: still")]
        assert len(early) == 1, log.read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        proc.stdout.close()
        assert code == 0, log.read_text()[-3000:]


def test_sighups_while_oasisd_stops_neither_reload_nor_end_it(tmp_path: Path) -> None:
    """SIGHUPs sent from SIGTERM to the exit: reloads went on during the drain, each
    waiting one was destroyed pending when the loop closed (``Task was destroyed but it
    is pending!``, one line each), and one sent once the loop had closed, or while Python
    exited, ended the daemon by SIGHUP (exit -1, not 0). Now the stop cancels the
    reloads, says once that later ones read nothing, and the daemon exits 0."""
    log = tmp_path / "oasisd.log"
    daemon = Daemon(write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH),
                    log).start()  # fmt: skip
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGTERM)
    sent = 0
    with contextlib.suppress(ProcessLookupError):
        while daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(0.003)
    assert daemon.stop() == 0, f"after {sent} SIGHUPs: {log.read_text()[-3000:]}"
    text = log.read_text()
    assert "Task was destroyed" not in text, text[-3000:]
    events = [e.get("event", "") for e in json_log(log)]
    after = events[events.index("drained") :]
    assert "config reloaded" not in after, events
    assert events.count("reload: the daemon is stopping; nothing read") <= 1, events


def test_a_storm_of_sighups_is_one_reload_not_one_per_signal(tmp_path: Path) -> None:
    """Fifty SIGHUPs in a burst (a config tool that reloads per file it writes) read the
    file fifty times, one after another, each recording the config's marks in the store
    through the decision thread, between tenants' decisions. A SIGHUP while a reload
    waits for its turn adds nothing now (that one reads the file after it anyway); one
    after a reload began its read brings one more, so the last edit is applied."""
    from controller.config import Config, load
    from controller.reload import Reloader
    from tests.test_reload import config_file, tokens_file

    tokens = tokens_file(tmp_path / "tokens", {"alice": ("submitter", "t-alice")})
    applied: list[Config] = []
    reloader = Reloader(load(config_file(tmp_path, tokens)), [applied.append])

    async def storm() -> None:
        for _ in range(50):
            reloader.hangup()
        await asyncio.wait(list(reloader._tasks), timeout=30)
        tokens_file(tokens, {"bob": ("submitter", "t-bob")})
        reloader.hangup()
        await asyncio.wait(list(reloader._tasks), timeout=30)

    asyncio.run(storm())
    assert len(applied) == 2
    assert {c.name for c in (applied[-1].tokens or {}).values()} == {"bob"}


def test_a_reload_names_each_key_that_waits_for_a_restart_and_why(tmp_path: Path) -> None:
    """The reload named tables only (``changed: ["[cluster]"]``), so an operator who
    shrank a server, moved the window and retuned the estimate learned neither which
    edit waits nor why. The warning now names each key edited and says why its table
    is read at start only."""
    log = tmp_path / "oasisd.log"
    extra = "[pricing]\ntrim = 0.3\n[limits]\nmax_page_jobs = 100\n"
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=EPOCH, extra=extra)
    daemon = Daemon(config, log).start()
    assert daemon.proc is not None
    try:
        text = config.read_text()
        config.write_text(
            text.replace("window = 24", "window = 12")
            .replace("trim = 0.3", "trim = 0.2")
            .replace("max_page_jobs = 100", "max_page_jobs = 50\nmax_message_bytes = 2000000")
            .replace("gpu=8, cpu=64, mem=488", "gpu=2, cpu=16, mem=64")
        )
        daemon.proc.send_signal(signal.SIGHUP)
        said = reloads(log, "config changes that apply only at a restart", 0)
        assert said["changed"] == ["[cluster]", "[daemon]", "limits.max_message_bytes",
                                   "[pricing]"]  # fmt: skip
        assert said["keys"] == [
            "cluster.servers", "daemon.window", "limits.max_message_bytes", "pricing.trim"
        ]  # fmt: skip
        why = dict(line.split(": ", 1) for line in said["why"])
        assert why["[cluster]"].startswith("the ledger, its prices and every plan are built")
        assert why["limits.max_message_bytes"] == (
            "gRPC's largest request is set when its server starts"
        )
        assert reloads(log, "config reloaded", 0)["limits"] == ["max_page_jobs: 100 -> 50"]
    finally:
        assert daemon.stop() == 0, log.read_text()[-3000:]


def test_each_sighup_is_counted_with_nowhere_to_go_and_handed_to_the_loop_once_routed() -> None:
    """``controller/hangups.py`` in this process: a SIGHUP with no loop to go to (the
    daemon's imports, a loop closed) is counted, and the count is handed over, once, to
    the first route; one with a loop goes to it and is not counted too; after the stop
    SIGHUP is ignored, not given back its default action (the end of the process). The
    mutation audit: SIGHUPs before the loop lost, their count never reset, ignore()
    giving SIGHUP its default action: the daemon tests, which send SIGHUPs all start-up
    long, passed."""
    from controller import hangups

    before = signal.getsignal(signal.SIGHUP)
    called: list[int] = []
    try:
        hangups.hold()
        hangups.route(None)
        signal.raise_signal(signal.SIGHUP)  # its handler runs before the next statement
        signal.raise_signal(signal.SIGHUP)
        assert hangups.held() == 2

        async def routed() -> None:
            assert hangups.route((asyncio.get_running_loop(), lambda: called.append(1))) == 2
            assert hangups.held() == 0
            signal.raise_signal(signal.SIGHUP)
            await asyncio.sleep(0)  # the loop runs what the handler gave it
            assert called == [1] and hangups.held() == 0

        asyncio.run(routed())
        closed = asyncio.new_event_loop()
        closed.close()
        assert hangups.route((closed, lambda: called.append(2))) == 0
        signal.raise_signal(signal.SIGHUP)
        assert hangups.held() == 1 and called == [1]
        hangups.ignore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        hangups.route(None)
        signal.signal(signal.SIGHUP, before)
