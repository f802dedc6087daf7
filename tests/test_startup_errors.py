"""Start-up failures are one line and exit 1 (2 where only an operator can mend them),
never a traceback or a hang: a data_dir that is a file or cannot be created, a file
system that refuses writes or is full, a store that never answers. A relative data_dir
is relative to the config file's folder, and a config with secrets that others may read
gets a warning."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.config import load
from tests.servers import ROOT, Daemon, Postgres, write_config

STORE_TIMEOUT = 2


def _oasisd(config: Path, shell_limit: str = "") -> subprocess.CompletedProcess[str]:
    """Run oasisd to its exit; ``shell_limit`` (e.g. ``"-f 1"``) is set by a shell
    that then runs it, not by a preexec_fn, whose fork() of this process gRPC's fork
    handler can abort (see tests.servers.Daemon.start)."""
    cmd = [sys.executable, "-m", "controller.daemon", "--config", str(config)]
    if shell_limit:
        cmd = ["/bin/sh", "-c", f'ulimit {shell_limit} && exec "$@"', "sh", *cmd]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )  # fmt: skip


def _one_line_error(out: subprocess.CompletedProcess[str], *parts: str, status: int = 1) -> None:
    assert out.returncode == status, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oasisd: "), out.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_text("not a directory")
    out = _oasisd(write_config(tmp_path / "c.toml", data))
    # exit 2: only an operator mends it; a restart loop would not (the CLI audit)
    _one_line_error(out, f"daemon.data_dir: {data} exists and is not a directory", status=2)


def test_a_data_dir_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    data = tmp_path / "file" / "data"
    out = _oasisd(write_config(tmp_path / "c.toml", data))
    _one_line_error(out, f"daemon.data_dir: cannot create {data}: Not a directory", status=2)
    # a file system that makes no directories: exit 1 had the unit restart it in a loop
    out = _oasisd(write_config(tmp_path / "p.toml", Path("/proc/oasis-data")))
    _one_line_error(out, "daemon.data_dir: cannot create /proc/oasis-data: No such file", status=2)


def test_a_file_system_that_refuses_writes(tmp_path: Path) -> None:
    """RLIMIT_FSIZE of one block (512 bytes to dash's ulimit, 1024 to bash's) makes
    every write past it fail (Python ignores SIGXFSZ: EFBIG): the error mapping of a
    full disk where a tmpfs cannot be mounted (not root)."""
    config = write_config(tmp_path / "c.toml", tmp_path / "data")
    out = _oasisd(config, "-f 1")
    _one_line_error(out, "cannot open the store ")


@contextlib.contextmanager
def _tmpfs(mount: Path, options: str) -> Iterator[Path]:
    """A tmpfs at ``mount`` (needs the right to mount, as root in CI)."""
    mount.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {out.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of 64 inodes."""
    with _tmpfs(tmp_path / "fs", "size=2m,nr_inodes=64") as mount:
        yield mount


def _fill(fs: Path) -> None:
    """Use up every block and every inode of ``fs``."""
    with open(fs / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:  # unbuffered: closing has nothing left to write
            f.write(b"\0" * 65536)
    with contextlib.suppress(OSError):
        for i in range(10_000):
            (fs / f"inode-{i}").touch()


def test_a_full_disk_at_start(tmp_path: Path, tiny_fs: Path) -> None:
    # a first start on a full disk: the data directory cannot be made
    full = tmp_path / "full.toml"
    write_config(full, tiny_fs / "new")
    store = tiny_fs / "data"
    config = write_config(tmp_path / "c.toml", store)
    log = tmp_path / "d.log"
    assert Daemon(config, log).start().stop() == 0, log.read_text()  # this store exists
    _fill(tiny_fs)
    _one_line_error(_oasisd(full), f"daemon.data_dir: cannot create {tiny_fs / 'new'}: No space")
    # "disk I/O error" before: SQLite's words, which point at the hardware
    _one_line_error(_oasisd(config), f"cannot open the store sqlite:///{store}/oasis.db",
                    "no space left on device: 0 bytes free on the file system of")  # fmt: skip
    for path in tiny_fs.glob("inode-*"):
        path.unlink()
    (tiny_fs / "filler").unlink()
    again = Daemon(config, log).start()  # room again: it starts
    assert again.stop() == 0, log.read_text()


def test_a_disk_that_fills_while_the_daemon_runs(tmp_path: Path) -> None:
    """The SQLite store's disk fills: the Admission service's health turns NOT_SERVING
    (the others serve the reads, as for PostgreSQL's refusals), submissions get
    UNAVAILABLE at once without a ledger rebuild each (every failed commit rebuilt it
    before, 150 ms at 3,000 jobs, as often as clients retried); reads go on; once
    space is freed the daemon is SERVING and admits again by itself."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from controller.convert import spec_to_proto
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc
    from tests.servers import SMALL_JOB, json_log, oasis

    with _tmpfs(tmp_path / "fs", "size=8m") as fs:
        log = tmp_path / "d.log"
        daemon = Daemon(write_config(tmp_path / "c.toml", fs / "data"), log).start()
        try:
            with grpc.insecure_channel(daemon.address) as channel:
                admission = pb_grpc.AdmissionStub(channel)
                health = health_pb2_grpc.HealthStub(channel)

                def submit(name: str) -> grpc.StatusCode:
                    spec = {**SMALL_JOB, "id": name}
                    try:
                        admission.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)),
                                            timeout=30)  # fmt: skip
                    except grpc.RpcError as err:
                        return err.code()
                    return grpc.StatusCode.OK

                def status(service: str) -> int:
                    request = health_pb2.HealthCheckRequest(service=service)
                    return int(health.Check(request, timeout=10).status)

                def status_within(want: int, seconds: float) -> None:
                    deadline = time.monotonic() + seconds
                    while True:
                        got = status("oasis.v1.Admission")
                        if got == want or time.monotonic() > deadline:
                            assert got == want
                            return
                        time.sleep(0.2)

                assert submit("before") == grpc.StatusCode.OK
                _fill(fs)
                status_within(health_pb2.HealthCheckResponse.NOT_SERVING, 10)
                # the writes' service only: reads are served (all of it was NOT_SERVING,
                # and a load balancer following "" dropped the reads too)
                for service in ("", "oasis.v1.Cluster"):
                    assert status(service) == health_pb2.HealthCheckResponse.SERVING, service
                # the operator's screen says why (it said "store up" once the store answered)
                screen = oasis("status", server=daemon.address).stdout.splitlines()
                assert screen[2].startswith(
                    "THE STORE REFUSES WRITES (no decision can be "
                    "stored; reads go on): no space left on device"
                )
                codes = {submit(f"full-{i}") for i in range(30)}
                assert codes == {grpc.StatusCode.UNAVAILABLE}
                job = admission.GetJob(pb.GetJobRequest(id="before"), timeout=10).job
                assert job.decision.admitted  # reads go on
                (fs / "filler").unlink()
                status_within(health_pb2.HealthCheckResponse.SERVING, 10)
                assert submit("after") == grpc.StatusCode.OK
        finally:
            assert daemon.stop() == 0
        rebuilds = [e for e in json_log(log) if e.get("event", "").startswith("ledger rebuilt")]
        assert len(rebuilds) <= 2, len(rebuilds)


def test_a_store_that_never_answers(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts TCP (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        url = f"postgresql+psycopg://oasis:s3cret@127.0.0.1:{port}/oasis"
        config = write_config(tmp_path / "c.toml", tmp_path / "d", url,
                              extra=f"store_timeout = {STORE_TIMEOUT}")  # fmt: skip
        config.chmod(0o600)  # it holds a password: no warning of it
        out = _oasisd(config)
    # the store as shown: its password masked, in the error as in any log line
    shown = f"postgresql+psycopg://oasis:***@127.0.0.1:{port}/oasis"
    _one_line_error(out, f"cannot open the store {shown}", "timeout")
    assert "s3cret" not in out.stderr + out.stdout


def test_a_relative_data_dir_is_relative_to_the_config_file(tmp_path: Path) -> None:
    name = f"rel-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "etc"
    folder.mkdir()
    config = write_config(folder / "c.toml", Path(name))  # data_dir = "rel-..."
    log = tmp_path / "d.log"
    daemon = Daemon(config, log).start()  # its working directory is the repository
    try:
        assert (folder / name / "oasis.db").exists()
        assert not (ROOT / name).exists()
    finally:
        daemon.stop()
        shutil.rmtree(ROOT / name, ignore_errors=True)


def test_secrets_readable_by_others_get_a_warning(tmp_path: Path, postgres: Postgres) -> None:
    url = postgres.new_database().replace("oasis@", "oasis:s3cret@")  # trust: any password
    config = write_config(tmp_path / "c.toml", tmp_path / "data", url)
    config.chmod(0o644)
    warned = load(config).warnings
    assert len(warned) == 1 and "daemon.store_url's password" in warned[0] and "0644" in warned[0]
    config.chmod(0o600)
    assert load(config).warnings == ()
    config.chmod(0o640)
    os.chown(config, -1, os.getegid())  # group-readable by the daemon's own group: fine
    assert load(config).warnings == ()
    no_secret = write_config(tmp_path / "n.toml", tmp_path / "data")
    no_secret.chmod(0o644)
    assert load(no_secret).warnings == ()

    config.chmod(0o604)
    log = tmp_path / "d.log"
    daemon = Daemon(config, log).start()
    assert daemon.stop() == 0
    text = log.read_text()
    assert (
        '"event": "config problem"' in text
        and "others may read it" in text
        and "s3cret" not in text
    )


def test_slots_other_than_the_stored_jobs_are_refused_with_exit_2(
    tmp_path: Path, store_url: str
) -> None:
    """Another slot_seconds or epoch than the store's jobs were planned with would move
    every stored plan to another time: refused in one line, exit 2 (which the systemd
    unit does not restart), the store untouched; set back, the daemon starts with its
    jobs. A store without jobs takes new settings."""
    from controller.convert import spec_to_proto
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc
    from controller.tls import client_channel
    from pricing.durations import format_time
    from tests.servers import SMALL_JOB

    # half a slot ago: no slot boundary (which moves the job on) falls within the test
    epoch = float(int(time.time()) - 1800)
    config = write_config(tmp_path / "c.toml", tmp_path / "data", store_url, epoch=epoch)
    empty = write_config(tmp_path / "e.toml", tmp_path / "empty", "", epoch=epoch)
    log = tmp_path / "d.log"
    with_empty = store_url.startswith("sqlite")  # the empty store's check: once is enough
    if with_empty:
        Daemon(empty, log).start().stop()  # it records its slots, and holds no job
    daemon = Daemon(config, log).start()
    with client_channel(daemon.address) as channel:
        job = (
            pb_grpc.AdmissionStub(channel)
            .SubmitJob(
                pb.SubmitJobRequest(job=spec_to_proto({**SMALL_JOB, "id": "kept"})), timeout=60
            )
            .job
        )
    assert daemon.stop() == 0
    original = config.read_text()
    for old, new, says in (
        ("slot_seconds = 3600", "slot_seconds = 1800",
         "daemon.slot_seconds is 1800 s, but the store's jobs were planned in slots of 3600 s"),
        (f"epoch = {epoch}", f"epoch = {epoch + 7200}",
         f"slot 0 begins at {format_time(epoch + 7200)} (daemon.epoch), but the store's "
         f"jobs were planned from {format_time(epoch)}"),
    ):  # fmt: skip
        config.write_text(original.replace(old, new))
        out = _oasisd(config)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("oasisd: cannot use the store"), lines
        assert says in lines[0] and "meta row 'settings'" in lines[0], lines[0]
        empty.write_text(empty.read_text().replace(old, new))
    if with_empty:  # no jobs there: both new settings are taken
        assert Daemon(empty, log).start().stop() == 0
    # a resource the job demands taken out (or renamed): before, the daemon started and
    # failed every such job for good, and putting it back brought none back (restore audit)
    for edit in (lambda t: re.sub(r'"disk", |disk=\d+, ', "", t),
                 lambda t: re.sub(r"\bmem\b", "memory", t)):  # fmt: skip
        config.write_text(edit(original))
        out = _oasisd(config)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("oasisd: cannot use the store"), lines
        gone = "'disk'" if "disk" not in config.read_text() else "'mem'"
        assert (
            f"[cluster] resources lacks {gone}, which 1 admitted, running or pending job(s) demand"
            in lines[0]
        ), lines[0]
        assert "kept" in lines[0] and "Put the resource back" in lines[0], lines[0]
    config.write_text(original)
    daemon = Daemon(config, log).start()
    try:
        with client_channel(daemon.address) as channel:
            got = pb_grpc.AdmissionStub(channel).GetJob(pb.GetJobRequest(id="kept"), timeout=30)
        assert got.job.state == job.state and got.job.decision == job.decision
    finally:
        daemon.stop()
    unit = (ROOT / "config" / "oasisd.service").read_text()
    assert "RestartPreventExitStatus=2" in unit


def test_listen_given_on_the_command_line_is_checked_as_in_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``oasisd --listen 127.0.0.1:99999`` listened on port 34463 (99999 - 65536),
    and ``--listen 127.0.0.1`` was refused as "not a loopback address"."""
    from controller.daemon import main

    for wrong in ("127.0.0.1:99999", "127.0.0.1", "127.0.0.1:abc", ":50051"):
        assert main(["--listen", wrong, "--data-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"oasisd: --listen: must be host:port (a port 0 .. 65535), got {wrong!r}" in err
    assert not (tmp_path / "oasis.db").exists()  # refused before anything opened


def test_a_store_url_beside_a_data_dir_holding_jobs_is_warned_of(
    tmp_path: Path, postgres: Postgres
) -> None:
    """The restore audit: setting ``store_url`` (a move to PostgreSQL) with the SQLite
    store's jobs still in ``data_dir`` started an empty cluster without a word."""
    from controller.convert import spec_to_proto
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc
    from controller.tls import client_channel
    from tests.servers import SMALL_JOB, json_log

    data = tmp_path / "data"
    daemon = Daemon(write_config(tmp_path / "s.toml", data), tmp_path / "s.log").start()
    with client_channel(daemon.address) as channel:
        request = pb.SubmitJobRequest(job=spec_to_proto({**SMALL_JOB, "id": "left"}))
        assert pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=60).job.decision.admitted
    assert daemon.stop() == 0
    url = postgres.new_database()
    for where, log, says in (
        (data, tmp_path / "p.log", 1),
        (tmp_path / "new", tmp_path / "n.log", 0),
    ):
        config = write_config(tmp_path / "p.toml", where, url)
        assert Daemon(config, log).start().stop() == 0
        said = [e for e in json_log(log) if "SQLite store holds" in e.get("event", "")]
        assert len(said) == says, said
        if says:
            assert said[0]["jobs"] == 1 and said[0]["live"] == 1 and said[0]["level"] == "warning"
            assert "moves no job" in said[0]["event"] and str(data) in said[0]["path"]


def test_a_relative_data_dir_holding_jobs_beside_a_store_url_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README audit: ``oasisd --config oasisd.toml`` (a config named relative to the
    working directory) with ``store_url`` set and a relative ``data_dir`` holding a
    SQLite store ended the start with a traceback (``ValueError: relative path can't be
    expressed as a file URI``) instead of the warning."""
    import sqlite3

    from structlog.testing import capture_logs

    from controller.startup import _left_behind

    (tmp_path / "data").mkdir()
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "oasis.db")) as db:
        db.execute("CREATE TABLE jobs (id TEXT, state TEXT)")
        db.execute("INSERT INTO jobs VALUES ('left', 'admitted')")
        db.commit()
    monkeypatch.chdir(tmp_path)
    with capture_logs() as logs:
        _left_behind(Path("data"), "postgresql+psycopg://oasis@db/oasis")
    said = [e for e in logs if "SQLite store holds" in e["event"]]
    assert len(said) == 1 and said[0]["jobs"] == 1 and said[0]["live"] == 1, logs


def test_a_data_dir_holding_only_finished_jobs_beside_a_store_url_is_warned_of(
    tmp_path: Path,
) -> None:
    """A history with no job admitted, running or pending is still the tenants' record
    (their decisions, the ledger's past): left behind, it is warned of, live 0."""
    import sqlite3

    from structlog.testing import capture_logs

    from controller.startup import _left_behind

    (tmp_path / "data").mkdir()
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "oasis.db")) as db:
        db.execute("CREATE TABLE jobs (id TEXT, state TEXT)")
        db.execute("INSERT INTO jobs VALUES ('done', 'finished'), ('no', 'rejected')")
        db.commit()
    with capture_logs() as logs:
        _left_behind(tmp_path / "data", "postgresql+psycopg://oasis@db/oasis")
    said = [e for e in logs if "SQLite store holds" in e["event"]]
    assert len(said) == 1 and said[0]["jobs"] == 2 and said[0]["live"] == 0, logs
    assert "holds 2 job(s), 0 of them admitted" in said[0]["event"]


def test_a_daemon_stopped_while_starting_is_never_announced_ready(tmp_path: Path) -> None:
    """The CLI audit: SIGTERM during start-up (migrations, the kernels' compile) was
    held until the store had opened, then the daemon printed 'oasisd listening' (and
    told systemd READY=1) before it drained: a script waiting for it saw a daemon that
    was already stopping. ``serve`` with its stop event set while starting."""
    import asyncio

    from controller.daemon import serve

    config = load(write_config(tmp_path / "c.toml", tmp_path / "data"))
    announced: list[str] = []

    async def run() -> None:
        stop = asyncio.Event()
        stop.set()  # as the SIGTERM handler does, before the store has opened
        await asyncio.wait_for(serve(config, stop=stop, on_ready=announced.append), 120)

    asyncio.run(run())
    assert announced == []
    assert (tmp_path / "data" / "oasis.db").exists()  # it did start, then stopped


def test_a_store_restored_without_its_revision_is_refused_with_exit_2(tmp_path: Path) -> None:
    """It exited 1 with "cannot open the store ...: table servers already exists", and
    the unit restarted it every 2 s, failing each time."""
    import sqlite3

    from controller.store import Database, migrate

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = Database(f"sqlite:///{data / 'oasis.db'}")
    try:
        migrate(db)
    finally:
        db.dispose()
    with contextlib.closing(sqlite3.connect(data / "oasis.db")) as conn:
        conn.execute("DROP TABLE alembic_version")
        conn.commit()
    out = _oasisd(write_config(tmp_path / "c.toml", data))
    _one_line_error(out, "cannot use the store sqlite:///", "holds oasis tables (allocations, ",
                    "but no schema revision", "Restore the whole backup", status=2)  # fmt: skip
