"""Real servers for tests: a throwaway PostgreSQL cluster and the daemon as a subprocess.

PostgreSQL: ``initdb``/``pg_ctl`` from the machine (``pg_config --bindir`` or
/usr/lib/postgresql/*/bin), in a temporary directory, on a free loopback port; as root it
runs as the ``postgres`` user (PostgreSQL refuses to run as root). If the binaries are
missing the PostgreSQL tests are skipped, unless ``OASIS_REQUIRE_POSTGRES=1`` (CI sets
it), where that is a failure.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


_PORT_BAND = 1000
"""Ports each test process picks from (:func:`free_port`), below Linux's ephemeral range
(32768-60999), from 20000: one band per pytest-xdist worker."""
_next_port: list[int] = []


def free_port() -> int:
    """A loopback TCP port free now, for a server a test starts (its ``listen``).

    Not one the kernel hands out (port 0): between this check and the server's bind,
    another test's daemon or client could be given the same one, and a full run here
    failed once so ("metrics.listen: cannot listen on 127.0.0.1:40505: Address already
    in use"). Below the ephemeral range no port-0 bind or outgoing connection takes it,
    and each xdist worker has its own band, taken in turn from a random start."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low = 20000 + (index % 12) * _PORT_BAND
    if not _next_port:
        _next_port.append(random.randrange(_PORT_BAND))
    for _ in range(_PORT_BAND):
        port = low + _next_port[0] % _PORT_BAND
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{low + _PORT_BAND - 1}")


def accepts(port: int, timeout: float, running: Callable[[], bool] = lambda: True) -> bool:
    """True once a server a test started accepts connections on 127.0.0.1:``port``;
    False if ``timeout`` seconds pass first, or ``running()`` says its process ended."""
    deadline = time.monotonic() + timeout
    while running():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
    return False


def _pg_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        cand = Path(out.stdout.strip())
        if (cand / "initdb").exists():
            return cand
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(d, "initdb").exists():
            return Path(d)
    return None


class Postgres:
    """A PostgreSQL server in a temporary directory on 127.0.0.1."""

    def __init__(self) -> None:
        bindir = _pg_bindir()
        if bindir is None:
            raise FileNotFoundError("initdb not found")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="oasis-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "oasis", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, cwd=self.dir)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"),
                  "-w", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def processes(self) -> list[int]:
        """The postmaster's pid, then its children's (backends, background workers)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
            if ppid == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every backend: the server accepts TCP connections
        (the kernel does) and answers nothing."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):  # a child reaped meanwhile
                os.kill(pid, sig)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://oasis@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=oasis dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


SMALL_JOB: dict[str, Any] = {
    "epochs": 2,
    "chunks": 8,
    "minibatches": 50,
    "tau": 0.01,
    "grad_mb": 100,
    "worker": {"gpu": 1, "cpu": 4, "mem": 8, "disk": 5, "bandwidth": 1},
    "ps": {"cpu": 2, "mem": 8, "disk": 5, "bandwidth": 5},
    "utility": {"kind": "sigmoid", "priority": 50, "decay": 0.5, "target": 3},
}
"""A job without an id in SPEC 3's form that the cluster of :data:`CLUSTER_TOML` admits
when empty (two slots of work)."""

# TOML inline tables cannot span lines
CLUSTER_TOML = """
[cluster]
resources = ["gpu", "cpu", "mem", "disk", "bandwidth"]
servers = [
  {name="w0", kind="worker", capacity={gpu=4, cpu=32, mem=244, disk=250, bandwidth=25}},
  {name="w1", kind="worker", capacity={gpu=4, cpu=32, mem=244, disk=250, bandwidth=25}},
  {name="w2", kind="worker", capacity={gpu=8, cpu=64, mem=488, disk=500, bandwidth=40}},
  {name="p0", kind="ps", capacity={cpu=36, mem=60, disk=500, bandwidth=25}},
  {name="p1", kind="ps", capacity={cpu=16, mem=30, disk=250, bandwidth=20}},
]
"""


def postgres_or_skip() -> Iterator[Postgres]:
    """A throwaway PostgreSQL for a fixture to yield, closed afterwards; the test is
    skipped if the binaries are missing, unless ``OASIS_REQUIRE_POSTGRES=1``."""
    try:
        server = Postgres()
    except (FileNotFoundError, OSError) as err:
        if os.environ.get("OASIS_REQUIRE_POSTGRES") == "1":
            raise
        pytest.skip(f"PostgreSQL binaries unavailable: {err}")
    try:
        yield server
    finally:
        server.close()


def write_config(
    path: Path, data_dir: Path, store_url: str = "", epoch: float | None = None, extra: str = ""
) -> Path:
    epoch = time.time() if epoch is None else epoch
    path.write_text(
        f"""
[daemon]
listen = "127.0.0.1:0"
data_dir = "{data_dir}"
store_url = "{store_url}"
slot_seconds = 3600
window = 24
epoch = {epoch}
tick_seconds = 0.2
log_level = "info"
{extra}
{CLUSTER_TOML}
"""
    )
    return path


class Daemon:
    """``oasisd --config FILE`` as a subprocess; ``address`` once it listens."""

    def __init__(
        self, config: Path, log: Path, env: dict[str, str] | None = None, nofile: int = 0
    ) -> None:
        self.config = config
        self.log_path = log
        self.env = env  # added to the environment (e.g. NOTIFY_SOCKET)
        self.nofile = nofile  # > 0: the daemon's descriptor limit (soft and hard)
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self, timeout: float = 60.0) -> Daemon:
        self.log = open(self.log_path, "a")  # noqa: SIM115
        # the oasisd command's own entry: SIGHUP held and the collector eased before the
        # imports (controller.oasisd); -m controller.daemon does both only after
        cmd = [sys.executable, "-m", "controller.oasisd", "--config", str(self.config)]
        if self.nofile:
            # the limit set by a shell that then runs oasisd, not by a preexec_fn: that
            # makes Popen fork() this process, whose gRPC client threads (a test's
            # channels) gRPC's fork handler restarted in the child, where close_fds then
            # closed their epoll descriptor before the exec: the child aborted
            # ("epoll_wait error: Bad file descriptor", status -6), in 2 of 4 runs here of
            # test_connections, test_security and test_metrics together
            cmd = ["/bin/sh", "-c", 'ulimit -n "$0" && exec "$@"', str(self.nofile), *cmd]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=ROOT,
            env={**os.environ, **self.env} if self.env else None,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                line = self.proc.stdout.readline()
                if not line:
                    status = self.proc.wait(10)  # -9: killed (by whom, the log cannot say)
                    raise RuntimeError(
                        f"oasisd exited early, status {status}:\n{self.log_path.read_text()}"
                    )
                m = re.search(r"listening on (\S+)", line)
                if m:
                    self.address = m.group(1)
                    return self
            raise TimeoutError("oasisd did not start")
        except BaseException:
            self.proc.kill()
            self.proc.wait(10)
            self._close()
            raise

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close()
        return int(self.proc.returncode)

    def _close(self) -> None:
        assert self.proc is not None
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def example_config(directory: Path, text: str | None = None) -> Path:
    """``config/oasisd.example.toml`` (or ``text``) written to ``directory``, with the
    tokens file its ``[auth]`` names next to it (one operator); its path."""
    from controller.auth import hash_token

    (directory / "tokens").write_text(f"ops operator {hash_token('ops-token')}\n")
    path = directory / "oasisd.toml"
    path.write_text(text if text is not None else EXAMPLE_CONFIG.read_text())
    return path


EXAMPLE_CONFIG = ROOT / "config" / "oasisd.example.toml"


def commit_processes(pid: int) -> list[int]:
    """The commit processes (``controller.store.commit_process``) process ``pid`` started
    and that still run (Linux ``/proc``)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    if b"controller.store.commit_process" in f.read():
                        found.append(kid)
            except FileNotFoundError:
                continue
    return found


def ended(pid: int, timeout: float = 10.0) -> bool:
    """True once process ``pid`` is gone or a zombie (ended, not yet reaped), within
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def json_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a daemon's or agent's log (other lines skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def console_address(log: Path) -> str:
    """``host:port`` of the console a daemon's log says it listens on (the last
    start's)."""
    return str([e["address"] for e in json_log(log) if e.get("event") == "console listening"][-1])


def oasis(*args: str, server: str = "", check: bool = True) -> subprocess.CompletedProcess[Any]:
    """Run the ``oasis`` CLI as a subprocess."""
    cmd = [sys.executable, "-m", "controller.cli", *args]
    if server:
        cmd += ["--server", server]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def newest_event(store_url: str) -> int:
    """The number of the newest event the store at ``store_url`` holds (0: none)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(store_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT max(sequence) FROM events")).scalar() or 0)
    finally:
        engine.dispose()


def events_through(stub: Any, last: int) -> list[Any]:
    """A daemon's events (``stub``: its AdmissionStub), replayed from the first up to
    event ``last`` (the stream is cancelled there: no fixed wait; 60 s at most)."""
    from controller.rpc import oasis_pb2 as pb

    out: list[Any] = []
    if not last:
        return out
    stream = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0), timeout=60)
    for event in stream:
        out.append(event)
        if event.sequence >= last:
            stream.cancel()
            break
    return out


TENANT_TOKENS = {"alice": "a-token", "bob": "b-token"}
"""The two submitters of :func:`tenants_daemon`, by name: their tokens."""


@contextlib.contextmanager
def tenants_daemon(directory: Path, extra: str = "") -> Iterator[tuple[Daemon, Any, Any]]:
    """A daemon with ``[auth]`` and two submitters (:data:`TENANT_TOKENS`), ``extra``
    added to its config (``[limits]``, say), in ``directory``: ``(daemon, alice's
    channel, bob's channel)``; stopped after, its exit status 0 asserted."""
    from controller.auth import hash_token
    from controller.tls import client_channel

    tokens = directory / "tokens"
    tokens.write_text("".join(f"{n} submitter {hash_token(t)}\n" for n, t in TENANT_TOKENS.items()))
    config = write_config(
        directory / "oasisd.toml",
        directory / "data",
        extra=f'[auth]\ntokens_file = "{tokens}"\n{extra}',
    )
    daemon = Daemon(config, directory / "oasisd.log").start()
    alice = client_channel(daemon.address, token=TENANT_TOKENS["alice"])
    bob = client_channel(daemon.address, token=TENANT_TOKENS["bob"])
    try:
        yield daemon, alice, bob
    finally:
        alice.close()
        bob.close()
        assert daemon.stop() == 0, (directory / "oasisd.log").read_text()
