"""What the parts of the console share: the attributes :class:`.app.Console` sets up
(declared here, so that each part type-checks on its own), the refusal a handler raises,
and the type of the handlers the middlewares wrap.

The parts are mixins of :class:`.app.Console`: :class:`.login.Login` (who sends a
request), :class:`.middleware.Middleware` (what every request and answer goes through),
:class:`.views.Views` (the pages and their JSON twins) and :class:`.streams.EventStreams`
(server-sent events).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from controller.admission import AdmissionController
from controller.auth import Caller
from controller.config import Config
from controller.console.data import ConsoleData
from controller.console.sessions import Sessions
from controller.limits import RateLimiter

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _RefusedError(Exception):
    """A request the console refuses with ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ConsoleState:
    """The attributes :meth:`.app.Console.__init__` sets (and describes) that the parts
    read: declarations only, no values and no behaviour."""

    config: Config
    c: AdmissionController
    data: ConsoleData
    tokens: Mapping[str, Caller] | None
    limiter: RateLimiter | None
    sessions: Sessions
    version: str
    static: dict[str, bytes]
    static_gzip: dict[str, bytes]
    anonymous_csrf: str
    closing: asyncio.Event
    streams: dict[str, int]
    owners: dict[str, str | None]
    _learned_at: dict[str, int]
    _reading: dict[str, tuple[asyncio.Future[dict[str, str | None]], int]]
    loopback: bool
    hosts: set[str]
    prefix: str
    public_hosts: frozenset[str]
    secure_cookie: bool
