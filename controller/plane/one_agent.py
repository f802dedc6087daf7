"""One ``oasis agent`` per server on a machine.

A second agent for the same server, broker and topic prefix (a unit started twice, a
copy run by hand beside the service) would run every planned worker twice, on the
same GPUs, and each would take the other's workers for those of an earlier agent and
stop them at its start (:meth:`~controller.plane.workers.Commands._stop_leftovers`):
the server's tenants saw their workers killed and restarted in turn. The agent holds
an abstract Unix socket named after the three while it runs; a second one finds the
name taken and stops with the first one's pid. The kernel frees the name when the
holder exits, however it exits (``kill -9`` included), so there is no stale lock to
clean up. Agents of different brokers or prefixes (two deployments, a test's broker)
do not meet, and neither stops the other's workers (the audit: an agent of another
prefix took the running agent's workers for leftovers and stopped them).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import socket
import struct

__all__ = ["AgentRunningError", "agent_key", "hold_server"]


class AgentRunningError(Exception):
    """Another agent of this server, broker and prefix runs on this machine."""


def agent_key(host: str, port: int, prefix: str, server: str) -> str:
    """What names one agent's place on a machine: a digest of the broker's address (its
    host resolved, so ``localhost`` and ``127.0.0.1`` are one broker), the topic prefix
    and the server. Its workers carry it (``OASIS_AGENT_KEY``): the next agent of the
    same place stops those an earlier one left, and no other agent's."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        address = sorted({_plain(str(info[4][0])) for info in found})[0]
    except (OSError, UnicodeError, IndexError):  # not resolvable now: its name
        address = host.lower()
    return hashlib.sha256(f"{address}:{port}/{prefix}/{server}".encode()).hexdigest()[:40]


def _plain(text: str) -> str:
    """One name for one address: an IPv4-mapped IPv6 address as its IPv4 one, and every
    loopback address (``127.0.0.1``, ``::1``) as ``loopback`` (the re-audit:
    ``[::ffff:127.0.0.1]`` let a second agent of the same broker run every worker)."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return text
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return "loopback" if address.is_loopback else str(address)


def _address(key: str) -> bytes:
    """The abstract socket's name for ``key`` (:func:`agent_key`)."""
    return b"\0oasis-agent-" + key.encode()


def hold_server(
    key: str, host: str, port: int, prefix: str, server: str
) -> tuple[socket.socket | None, str]:
    """Take this machine's one place ``key`` (:func:`agent_key`) for the agent of
    ``server`` on broker ``host:port`` under ``prefix`` (named in the error): keep the
    returned socket open while the agent runs. ``(None, why)`` when a process of
    another user (not root) holds the name: abstract names have no permissions, so a
    tenant's worker run as its own user could take it and keep the server's agent from
    starting (the review); then the agent goes on without the guard, and says so.

    Raises:
        AgentRunningError: a process of this user or root holds it (its pid in the
            message, when the kernel says).
    """
    address = _address(key)
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        held.bind(address)
    except OSError:
        held.close()
        pid, uid = _holder(address)
        if uid is not None and uid not in (0, os.getuid()):
            return None, (f"the one-agent guard's name is held by pid {pid} of user {uid}, "
                          "not an agent of this user: going on without the guard")  # fmt: skip
        who = f" (pid {pid})" if pid else ""
        raise AgentRunningError(
            f"another oasis agent for server {server!r} on broker {host}:{port} (topic prefix "
            f"{prefix!r}) runs on this machine{who}: two would run every worker twice and "
            f"stop each other's; stop it first (the service: systemctl stop "
            f"oasis-agent@{server})"
        ) from None
    held.listen(1)  # a second agent connects, to learn the pid (never accepted)
    held.set_inheritable(False)  # the workers must not hold it after the agent
    return held, ""


def _holder(address: bytes) -> tuple[int, int | None]:
    """``(pid, uid)`` of the process listening on ``address``; ``(0, None)`` if they
    cannot be told."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.closing(probe):
        probe.settimeout(1.0)
        try:
            probe.connect(address)
            raw = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return 0, None
        pid, uid, _gid = struct.unpack("3i", raw)
        return int(pid), int(uid)
