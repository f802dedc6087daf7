"""A real Mosquitto broker for tests, on a free 127.0.0.1 port with a generated config.

``mosquitto`` comes from the machine (Debian's package; ``.ci/run`` installs it). The
system service is never used: each broker runs in the foreground of a temporary
directory, in-memory (no persistence), so a restart is a broker that lost everything,
retained plans included -- the hard case for the daemon's republishing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.servers import accepts, free_port

__all__ = ["NEEDS_MOSQUITTO", "Mosquitto", "mosquitto_binary"]


def mosquitto_binary() -> str | None:
    """The mosquitto executable, or None if it is not installed."""
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()),
        None,
    )


NEEDS_MOSQUITTO = pytest.mark.skipif(
    mosquitto_binary() is None and os.environ.get("OASIS_REQUIRE_MOSQUITTO") != "1",
    reason="mosquitto not installed (CI sets OASIS_REQUIRE_MOSQUITTO=1: then it fails)",
)
"""The mark of a test that starts a broker: skipped without ``mosquitto``, unless
``OASIS_REQUIRE_MOSQUITTO=1`` (CI), where it fails instead."""


def _passwd_binary() -> str:
    """``mosquitto_passwd`` (same package as the broker)."""
    found = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
    if not Path(found).exists():
        raise FileNotFoundError("mosquitto_passwd not found (apt-get install -y mosquitto)")
    return found


class Mosquitto:
    """``mosquitto -c <generated config>`` on ``127.0.0.1:port``; ``url`` for clients.

    ``users`` (name: password): only they may connect (``mosquitto_passwd`` makes the
    file); ``tls`` (certificate, key): the listener speaks TLS only (``mqtts://``);
    ``acl``: an ACL file (``acl_file``), e.g. the shipped ``config/mosquitto.acl``;
    ``extra``: more lines of configuration (``max_packet_size 6000\n``).
    """

    def __init__(
        self,
        port: int = 0,
        users: dict[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
        acl: Path | None = None,
        extra: str = "",
    ) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise FileNotFoundError("mosquitto not found (apt-get install -y mosquitto)")
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="oasis-mqtt-"))
        self.port = port or free_port()
        self.conf = self.dir / "mosquitto.conf"
        self.tls = tls is not None
        security = "allow_anonymous true\n"
        if users:
            passwords = self.dir / "passwords"
            for i, (name, password) in enumerate(users.items()):
                create = ["-c"] if i == 0 else []
                subprocess.run([_passwd_binary(), "-b", *create, str(passwords), name, password],
                               check=True, capture_output=True)  # fmt: skip
            security = f"allow_anonymous false\npassword_file {passwords}\n"
        if tls is not None:
            for source, name in zip(tls, ("server.crt", "server.key"), strict=True):
                shutil.copyfile(source, self.dir / name)
            security += f"certfile {self.dir / 'server.crt'}\nkeyfile {self.dir / 'server.key'}\n"
        if acl is not None:
            shutil.copyfile(acl, self.dir / "acl")
            security += f"acl_file {self.dir / 'acl'}\n"
        # started as root, mosquitto reads its files as the unprivileged "mosquitto" user
        self.dir.chmod(0o755)
        for path in self.dir.iterdir():
            path.chmod(0o644)
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"{security}"
            "persistence false\n"
            "max_queued_messages 100000\n"
            f"{extra}"
            f"log_dest file {self.dir / 'mosquitto.log'}\n"
            "log_type error\nlog_type warning\nlog_type notice\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        """Start (or restart) the broker on the same port; returns once it accepts."""
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc
        if accepts(self.port, timeout, lambda: proc.poll() is None):
            return
        if proc.poll() is not None:
            log = self.dir / "mosquitto.log"
            raise RuntimeError(f"mosquitto exited: {log.read_text() if log.exists() else ''}")
        raise TimeoutError(f"mosquitto did not listen on port {self.port}")

    def kill(self) -> None:
        """Stop the broker abruptly (SIGKILL); its retained messages are gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def close(self) -> None:
        try:
            self.kill()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
