"""systemd's service notification protocol (``sd_notify(3)``), for ``Type=notify`` units.

systemd passes ``NOTIFY_SOCKET``: the path of a datagram Unix socket, or an abstract one
written with a leading ``@``. Each notification is one datagram of ``KEY=VALUE`` lines
(``READY=1``, ``STATUS=...``, ``WATCHDOG=1``, ``STOPPING=1``, ``MAINPID=...``). With
``WatchdogSec=`` set, systemd also passes ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, the
process meant to ping) and restarts the service if no ``WATCHDOG=1`` arrives within that
time; the daemon pings at half of it, as ``sd_watchdog_enabled(3)`` recommends.

Outside systemd (``NOTIFY_SOCKET`` unset) every call is a no-op, so the daemon runs the
same way under ``make run``, in tests, or in a container.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

__all__ = ["Notifier"]

log = structlog.get_logger("oasisd")


class Notifier:
    """Sends notifications to the service manager named by ``NOTIFY_SOCKET``, if any.

    Args:
        env: the environment to read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and
            ``WATCHDOG_PID`` from (default ``os.environ``).
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + raw[1:] if raw.startswith("@") else raw
        self._watchdog_usec = _watchdog_usec(env)

    @property
    def enabled(self) -> bool:
        """True if a service manager listens (``NOTIFY_SOCKET`` is set to a Unix socket)."""
        return self.address.startswith(("/", "\0"))

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or None if the
        watchdog is off or meant for another process."""
        if self._watchdog_usec is None or not self.enabled:
            return None
        return self._watchdog_usec / 2e6

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"KEY=VALUE"`` each) as one datagram; True if sent.

        A manager that went away is logged, never raised: notification is advisory."""
        if not self.enabled:
            return False
        for f in fields:
            if "=" not in f or "\n" in f:
                raise ValueError(f"notification field must be one KEY=VALUE line, got {f!r}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as err:
            log.warning("sd_notify failed", socket=self.address.replace("\0", "@"), error=str(err))
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """Start-up is complete (``Type=notify`` units leave "activating" only now)."""
        return self.notify("READY=1", f"MAINPID={os.getpid()}", *_status(status))

    def status(self, status: str) -> bool:
        """A one-line status shown by ``systemctl status``."""
        return self.notify(*_status(status))

    def watchdog(self) -> bool:
        """Keep-alive: the daemon's event loop is still turning."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        """Shutdown has begun."""
        return self.notify("STOPPING=1", *_status(status))


def _status(status: str) -> tuple[str, ...]:
    line = " ".join(status.split())  # one line
    return (f"STATUS={line}",) if line else ()


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):  # inherited by a child: not ours to ping
        return None
    return int(usec)
