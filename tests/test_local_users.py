"""Other users of the head node (the secrets and permissions audit): the store is the
daemon's alone, a data_dir or lock another user could plant is refused, the files that
decide who may do what are warned of when others may change them, passwords are not
shown, and a tenant's worker command does not get the agent's broker password."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from controller.commands.agent import broker_settings
from controller.commands.common import check_store_url
from controller.config import ConfigError, load
from controller.plane.agent import Agent, worker_environment
from controller.plane.settings import MqttConfig
from controller.store.urls import has_password, shown, unusable
from tests.servers import ROOT, Daemon, write_config
from tests.test_mqtt_units import plan

NOBODY = 65534


def _oasisd(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(config)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip


def test_the_store_is_the_daemons_alone_under_a_umask_of_022(tmp_path: Path) -> None:
    """Before: under umask 022 data_dir was 0755 and oasis.db 0644, and any local user
    read every tenant's jobs with sqlite3."""
    old = os.umask(0o022)
    try:
        daemon = Daemon(write_config(tmp_path / "c.toml", tmp_path / "data"),
                        tmp_path / "d.log").start()  # fmt: skip
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
        files = [p for p in (tmp_path / "data").iterdir() if p.is_file()]
        assert any(p.name == "oasis.db" for p in files), files
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    finally:
        assert daemon.stop() == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_data_dir_another_user_owns_or_anyone_may_write_is_refused(tmp_path: Path) -> None:
    """Another user who made the data_dir first (a relative ./data started from /tmp)
    could read, swap or delete the store: refused with exit 2 (not restarted)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    out = _oasisd(write_config(tmp_path / "c.toml", data))
    assert out.returncode == 2, out.stderr
    assert f"daemon.data_dir: {data} belongs to uid {NOBODY}" in out.stderr
    assert "not to the daemon's user (uid 0 (root))" in out.stderr
    os.chown(data, 0, 0)
    data.chmod(0o1777)  # sticky or not: another user could make oasis.db first
    out = _oasisd(write_config(tmp_path / "c.toml", data))
    assert out.returncode == 2 and "anyone may write in" in out.stderr, out.stderr
    assert list(data.iterdir()) == []


def test_the_lock_file_is_never_opened_through_a_link(tmp_path: Path) -> None:
    """Before: a link planted as oasis.db.lock had the daemon overwrite its target."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("the daemon's user's file\n")
    (data / "oasis.db.lock").symlink_to(victim)
    out = _oasisd(write_config(tmp_path / "c.toml", data))
    assert out.returncode == 1 and "oasis.db.lock" in out.stderr, out.stderr
    assert victim.read_text() == "the daemon's user's file\n"


def test_files_that_decide_who_may_do_what_are_warned_of(tmp_path: Path) -> None:
    """A tokens file others may write (a line added makes its writer an operator at
    the next reload), a TLS key others may read."""
    from tests.test_security import make_pki

    pki = make_pki(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text("ops operator " + "ab" * 32 + "\n")
    extra = (f'[auth]\ntokens_file = "{tokens}"\n'
             f'[tls]\ncert = "{pki.server_cert}"\nkey = "{pki.server_key}"\n')  # fmt: skip
    config = write_config(tmp_path / "c.toml", tmp_path / "data", extra=extra)
    config.chmod(0o600)
    tokens.chmod(0o640)
    pki.server_key.chmod(0o600)
    assert load(config).warnings == ()
    tokens.chmod(0o666)
    pki.server_key.chmod(0o644)
    warned = load(config).warnings
    assert len(warned) == 2, warned
    assert warned[0].startswith(f"auth.tokens_file {tokens}: mode 0666: another user may change")
    assert warned[1].startswith(f"tls.key {pki.server_key}: mode 0644: others may read")
    config.chmod(0o666)
    assert load(config).warnings[0].startswith(f"the config {config}: mode 0666")


def test_a_password_in_a_store_url_is_never_shown() -> None:
    for url in ("postgresql+psycopg://oasis:PW@db/oasis",
                "postgresql+psycopg://oasis@db/oasis?password=PW&sslmode=require",
                "postgresql+psycopg://oasis@db/oasis?sslpassword=PW"):  # fmt: skip
        assert has_password(url) and "PW" not in shown(url), shown(url)
    assert shown("postgresql+psycopg://oasis@db/oasis?password=PW") == (
        "postgresql+psycopg://oasis@db/oasis?password=***"
    )
    assert not has_password("postgresql+psycopg://oasis@db/oasis")
    assert shown("postgresql://oasis:PW@db:notaport/x") == "<unreadable URL>"
    # one SQLAlchemy cannot parse is read as a plain URL: its user part, its query
    assert has_password("postgresql://oasis:PW@db:notaport/x")
    assert has_password("postgresql://oasis@db:notaport/x?sslpassword=PW")
    assert not has_password("postgresql://oasis@db:notaport/x")


def test_an_unusable_store_url_is_one_line_naming_the_key(tmp_path: Path) -> None:
    """Before: a port that is not a number, or postgres://, gave a traceback."""
    assert unusable("postgresql+psycopg://oasis@db/oasis") is None
    assert "no SQLAlchemy dialect or driver 'postgres'" in str(unusable("postgres://a:PW@h/x"))
    for url in ("postgresql+psycopg://oasis:PW@db:notaport/oasis", "postgres://a:PW@h/x"):
        config = write_config(tmp_path / "c.toml", tmp_path / "data", url)
        with pytest.raises(ConfigError, match=r"^daemon\.store_url: ") as err:
            load(config)
        assert "PW" not in str(err.value)
        out = _oasisd(config)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr and "PW" not in out.stderr


def test_a_password_on_the_command_line_is_warned_of(capsys: pytest.CaptureFixture[str]) -> None:
    check_store_url("postgresql+psycopg://oasis:PW@db/oasis")
    assert "--store holds a password, which every user of this machine can read" in (
        capsys.readouterr().err
    )
    args = argparse.Namespace(broker="mqtt://w0:PW@127.0.0.1:1883", config=None,
                              mqtt_username=None, mqtt_password_file=None, mqtt_tls_ca=None,
                              topic_prefix=None)  # fmt: skip
    assert broker_settings(args).password == "PW"
    err = capsys.readouterr().err
    assert "--broker holds a password" in err and "$OASIS_MQTT_PASSWORD" in err


def test_a_worker_command_does_not_get_the_agents_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a tenant's worker command got $OASIS_MQTT_PASSWORD, logged in to the
    broker as the agent, and reported another tenant's job on the server as done."""
    for name in ("OASIS_MQTT_PASSWORD", "OASIS_BROKER", "OASIS_TOKEN", "PGPASSWORD"):
        monkeypatch.setenv(name, "PW")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    env = worker_environment()
    assert "PW" not in env.values() and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # the same through a real command: it counts 7 only if it sees none of them
    now = [100.0]
    check = '[ -z "$OASIS_MQTT_PASSWORD$OASIS_BROKER$OASIS_TOKEN$PGPASSWORD" ] && echo 7'
    agent = Agent("w0", MqttConfig("localhost"), command=f"{check}; sleep 30",
                  wall=lambda: now[0])  # fmt: skip
    agent.accept(plan(1, workers=1))

    async def go() -> None:
        await agent._commands(0.0)
        for _ in range(200):
            await asyncio.sleep(0.02)
            if agent.tasks["j1"].workers.running[0].count[0] > 0:
                break
        now[0] = 111.0  # the next slot has no task: the command is stopped
        await agent._commands(0.02)
        assert agent.commands is not None
        [worker] = agent.commands.departing
        await asyncio.wait_for(worker.proc.wait(), 10)
        assert worker.count[0] == 7

    asyncio.run(go())


def test_a_broker_password_in_the_clear_off_loopback_is_warned_of(tmp_path: Path) -> None:
    def warnings(url: str) -> tuple[str, ...]:
        extra = f'[mqtt]\nurl = "{url}"\nusername = "oasisd"\npassword = "PW"\n'
        config = write_config(tmp_path / "c.toml", tmp_path / "data", extra=extra)
        config.chmod(0o600)
        return load(config).warnings

    (warned,) = warnings("mqtt://10.1.2.3:1883")
    assert warned.startswith("mqtt: the broker 10.1.2.3:1883 is not on loopback and TLS is off")
    assert "PW" not in warned
    assert warnings("mqtts://10.1.2.3:8883") == ()
    assert warnings("mqtt://127.0.0.1:1883") == ()


def test_a_data_dir_the_daemons_user_may_not_write_names_the_chown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example config run once as root left /var/lib/oasis root's; the daemon run as
    its own user then failed with 'Permission denied (oasis.db.lock)', exit 1 (which
    systemd restarts), not saying what to do. (The daemon's user is played by the
    checks' view of it: root may write anything.)"""
    from controller.startup import StartupError, _data_dir

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "oasis.db").write_bytes(b"")
    db = data / "oasis.db"
    monkeypatch.setattr(os, "access", lambda path, mode: mode == os.F_OK or Path(path) != db)
    with pytest.raises(StartupError) as err:
        _data_dir(data)
    assert err.value.status == 2
    assert f"may not write {db}" in str(err.value) and f"chown -R root: {data}" in str(err.value)
    # the folder itself (root's 0700, the daemon's user may not enter it): probing the
    # files in it raised PermissionError, exit 1 with 'Permission denied'
    monkeypatch.setattr(os, "access", lambda path, _mode: Path(path) != data)
    with pytest.raises(StartupError, match=f"may not write {data} .*chown -R root: {data}"):
        _data_dir(data)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running the check as another user needs root and setpriv",
)
def test_a_data_dir_under_a_folder_the_daemons_user_may_not_enter_names_it(tmp_path: Path) -> None:
    """A first start as root with data_dir /srv/oasis/data made /srv/oasis too, 0700 under
    the daemon's umask; the daemon then run as its own user failed with 'cannot open the
    store ...: Permission denied (/srv/oasis/data)', exit 1, which the unit restarts every
    2 s, naming neither the folder in the way nor what to do. Now exit 2 naming it."""
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is 0700: nobody may enter
    try:
        top.chmod(0o755)
        closed = top / "srv"
        (closed / "data").mkdir(parents=True)
        closed.chmod(0o700)
        check = (
            "import sys\nfrom pathlib import Path\nfrom controller.startup import StartupError, "
            "_data_dir\ntry:\n    _data_dir(Path(sys.argv[1]))\nexcept StartupError as e:\n"
            "    print(e.status, e)\n"
        )
        as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        out = subprocess.run(
            [*as_nobody, sys.executable, "-c", check, str(closed / "data")],
            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"2 daemon.data_dir: the daemon's user (uid {NOBODY}"), out
        assert f"may not enter {closed} (uid 0 (root)'s, mode 0700)" in out.stdout, out
        assert f"chmod o+x {closed}" in out.stdout, out
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=True)


def test_a_numba_cache_dir_the_daemons_user_may_not_write_names_the_chown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's by-hand start run once as root left NUMBA_CACHE_DIR root's; the
    daemon run as its own user then logged 'fix: set NUMBA_CACHE_DIR to a folder this
    user may write (the systemd unit sets /var/cache/oasis/numba)', of the very folder it
    was given, and compiled its kernels at every start. (The daemon's user is played by
    the check's view of it, as above: root may write anything.)"""
    from controller.daemon import numba_cache_fix

    cache = tmp_path / "cache" / "oasis"
    cache.mkdir(parents=True)
    assert numba_cache_fix("").startswith("set NUMBA_CACHE_DIR to a folder")
    assert "chown" not in numba_cache_fix(str(cache / "numba"))  # writable: no chown
    monkeypatch.setattr(os, "access", lambda path, _mode: Path(path) != cache)
    fix = numba_cache_fix(str(cache / "numba"))  # not made yet: its parent is in the way
    assert fix.startswith(f"NUMBA_CACHE_DIR={cache / 'numba'}: this user (uid "), fix
    assert f"may not write {cache} (root's; a start as root" in fix, fix
    assert fix.endswith(f"chown -R root: {cache}"), fix
