"""A connection pooler (pgbouncer) between oasisd and PostgreSQL: refused at start, in words.

Found by the pooler audit (pgbouncer 1.18, transaction mode, in front of a store): by
default pgbouncer refused the connection with PostgreSQL's "unsupported startup
parameter: options", which named nothing to do; told to ignore ``options`` (the usual
advice), the daemon started with no statement or lock timeout, its first submission
failed ``INTERNAL`` (``prepared statement "_pg3_0" already exists``), and its writer
lock stayed on a server connection pgbouncer kept after the daemon stopped: the next
daemon was refused as "in use by another oasisd", naming the stopped one. Now each start
through a pooler exits 2 (the operator's to mend: systemd does not restart it) naming the
pooler and the remedy, before the writer lock is taken or any table made; ``oasis
offline --store`` says the same of its ``--store``.

The pooler is a real pgbouncer (Debian's ``pgbouncer``) in front of the test cluster;
skipped without one, unless ``OASIS_REQUIRE_PGBOUNCER=1`` (CI), where it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.servers import ROOT, Postgres, accepts, free_port, write_config

_BINARY = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
)
pytestmark = pytest.mark.skipif(
    _BINARY is None and os.environ.get("OASIS_REQUIRE_PGBOUNCER") != "1",
    reason="pgbouncer not installed (CI sets OASIS_REQUIRE_PGBOUNCER=1: then it fails)",
)

REMEDY = "point daemon.store_url at PostgreSQL itself"


@contextlib.contextmanager
def _pgbouncer(postgres: Postgres, ignore: str) -> Iterator[int]:
    """A pgbouncer in transaction mode on a loopback port in front of ``postgres``,
    ignoring the startup parameters ``ignore``; yields its port."""
    assert _BINARY is not None, "pgbouncer not installed"
    folder = Path(tempfile.mkdtemp(prefix="oasis-pgbouncer-"))
    port = free_port()
    (folder / "users.txt").write_text('"oasis" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={postgres.port} user=oasis\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\npool_mode = transaction\n"
        f"ignore_startup_parameters = {ignore}\nunix_socket_dir =\n"
        f"logfile = {folder / 'log'}\npidfile = {folder / 'pid'}\n"
    )
    command = [_BINARY, "-d", str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer will not run as root
        for path in (folder, *folder.iterdir()):
            shutil.chown(path, "postgres", "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=30)
    try:
        assert accepts(port, 30), "pgbouncer did not listen"
        yield port
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((folder / "pid").read_text()), signal.SIGTERM)
        shutil.rmtree(folder, ignore_errors=True)


def _refused_start(store: str, tmp_path: Path, words: str) -> None:
    """``oasisd`` on ``store`` must exit 2 at start (not 1: systemd would restart it in a
    loop), its last line ``oasisd: cannot ... the store STORE: `` then ``words``, naming
    the remedy."""
    out = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config",
         str(write_config(tmp_path / "d.toml", tmp_path / "data", store))],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("oasisd: cannot ") and f" the store {store}: {words}" in last, last
    assert REMEDY in last, last


def _oasis(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip


def _pooled(url: str, port: int) -> str:
    """``url`` (the test cluster's) reached through the pooler on ``port``."""
    host, database = url.rsplit("/", 1)
    return f"{host.rsplit(':', 1)[0]}:{port}/{database}"


def test_a_pooler_that_refuses_the_session_settings_is_named_with_the_remedy(
    postgres: Postgres, tmp_path: Path
) -> None:
    """pgbouncer as installed: it refuses ``options`` at connect."""
    url = postgres.new_database()
    with _pgbouncer(postgres, ignore="extra_float_digits") as port:
        store = _pooled(url, port)
        _refused_start(store, tmp_path, "a connection pooler between oasisd and PostgreSQL "
                       "refused the session settings oasisd connects with (unsupported "
                       "startup parameter: options); pgbouncer does that")  # fmt: skip
        offline = _oasis("offline", "--store", store)
        assert offline.returncode == 2, offline.stderr
        assert "refused the session settings" in offline.stderr, offline.stderr
        assert "point --store at PostgreSQL itself" in offline.stderr, offline.stderr


def test_a_pooler_that_drops_the_session_settings_gets_no_lock_and_no_table(
    postgres: Postgres, tmp_path: Path
) -> None:
    """pgbouncer told to ignore ``options``: the sessions it hands over have no statement
    or lock timeout. The daemon exits 2 before it takes the writer lock (which would
    stay behind on pgbouncer's server connection) or migrates anything."""
    url = postgres.new_database()
    database = url.rsplit("/", 1)[1]
    with _pgbouncer(postgres, ignore="options,extra_float_digits") as port:
        store = _pooled(url, port)
        _refused_start(store, tmp_path, "its sessions do not hold the settings oasisd "
                       "connects with (statement_timeout is 0, not the 3 s it asked): a "
                       "connection pooler between oasisd and PostgreSQL drops them")  # fmt: skip
        # oasis store copy takes the writer lock too: refused the same, naming --to
        copy = _oasis("store", "copy", "--from", postgres.new_database(), "--to", store)
        assert copy.returncode != 0, copy.stderr
        assert ("oasis store copy: destination: its sessions do not hold the settings "
                "oasisd connects with") in copy.stderr, copy.stderr  # fmt: skip
        assert "point --to at PostgreSQL itself" in copy.stderr, copy.stderr
        dsn = f"host=127.0.0.1 port={postgres.port} user=oasis dbname={database}"
        with psycopg.connect(dsn, autocommit=True) as direct:
            locks = direct.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            tables = direct.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone()
            assert (locks.fetchone(), tables) == ((0,), (0,))


def test_a_direct_session_holds_the_settings(postgres: Postgres) -> None:
    """The check's other side: a session straight to PostgreSQL passes it (every
    PostgreSQL test's daemon does too), so the refusal above is the pooler's."""
    from controller.store import Database
    from controller.store.poolers import check_session

    db = Database(postgres.new_database(), timeout=3)
    try:
        check_session(db)
    finally:
        db.dispose()
