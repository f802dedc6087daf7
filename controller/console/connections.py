"""The console's connections below HTTP: the caps on open connections (all together and
per peer host, ``web.max_connections`` and ``web.max_connections_per_host``), their idle
and TLS handshake timeouts, and the TLS context of HTTPS.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from controller.auth import refusals
from controller.holds import Holds
from controller.tls import TlsConfig, is_loopback

IDLE_SECONDS = 75.0
"""A console connection with no request for this long is closed (aiohttp's default keeps
one an hour, so idle connections would hold the ``web.max_connections`` places)."""

HANDSHAKE_SECONDS = 10.0
"""A TLS handshake must finish within this (it holds a descriptor before it counts)."""

_BUSY = b"the console has too many connections open (web.max_connections); try again later\n"


class _Refused(asyncio.Protocol):
    """A connection past ``web.max_connections``: answered 503 at once and closed, so a
    flood of connections costs one descriptor each for a moment, never the daemon's
    descriptors (which its gRPC clients and the store need)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 5\r\nConnection: close\r\nContent-Length: "
            + str(len(_BUSY)).encode()
            + b"\r\n\r\n"
            + _BUSY
        )
        transport.close()


class _PerHost(asyncio.Protocol):
    """A console connection, counted against its peer's host (off loopback) while open:
    past ``web.max_connections_per_host`` it is answered 503 and closed as
    :class:`_Refused` does; else it is served by ``serve()``'s protocol, to which this
    one hands every call of the transport."""

    def __init__(self, serve: Callable[[], asyncio.Protocol], hosts: Holds, cap: int):
        self._serve, self._hosts, self._cap = serve, hosts, cap
        self._inner: asyncio.Protocol | None = None
        self._host = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if host and not is_loopback(host):
            if self._hosts.of(host) >= self._cap:
                refusals(host, "console connections", "console connection refused",
                         per_host=self._cap)  # fmt: skip
                _Refused().connection_made(transport)
                return
            self._hosts.take(host)
            self._host = host
        self._inner = self._serve()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._host:
            self._hosts.give_back(self._host)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


def _ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """HTTPS with the daemon's certificate; client certificates required if ``[tls]``
    has ``client_ca`` (as for gRPC)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.load_verify_locations(cafile=tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
