"""The console's HTTP server: an aiohttp application on the daemon's own event loop.

Routes (each page has its JSON twin under ``/api/``, with the same query parameters):

    GET  /                  /api/overview          use, jobs per state, health, clock
    GET  /prices            /api/prices            ?resource=gpu (default: the costliest)
                            /api/prices/cell       ?resource=&r0=&r1=&s0=&s1= (hover)
    GET  /plans             /api/plans             ?page=N&job=ID (Gantt per server)
    GET  /jobs              /api/jobs              ?state=&q=ID-prefix&after=SEQUENCE
    GET  /jobs/{id}         /api/jobs/{id}
    POST /jobs/{id}/cancel  /api/jobs/{id}/cancel  operators, or the job's submitter (as CancelJob)
    GET  /job?id=ID         /api/job?id=ID         the same, for the ids "." and ".." (a browser
    POST /job/cancel?id=ID  /api/job/cancel?id=ID  takes them out of a path as dot segments)
    GET  /api/events        server-sent events from the controller's event bus
    GET/POST /login, POST /logout

Who may see what follows :mod:`controller.auth`: with ``[auth]``, a page needs a session
(from ``/login``) or, for scripts, ``Authorization: Bearer TOKEN``; a submitter sees its
own jobs only (another's is 404, as ``GetJob`` says NOT_FOUND), and the prices and plans
are for operators (as ``GetPrices`` and ``ListServers``). A submitter's event stream
carries its own jobs' events only, and a user may hold at most
``web.max_event_streams_per_user`` streams at once (429 past it), everyone together
``web.max_event_streams`` (503). Without ``[auth]`` everyone is an operator, as over
gRPC, and one user. A cancel from a browser must carry the session's CSRF token (a form
field or the ``X-CSRF-Token`` header) and, if the browser sends one, a same-origin
``Origin``; the cookie is ``SameSite=Strict`` besides. On a loopback address only
loopback ``Host`` names are answered (a page of another site cannot reach it by DNS
rebinding).

Here: :class:`Console` (its state, routes, listening and closing) and
:func:`start_console`. Its parts are mixins, each in its own module: :mod:`.login` (who
sends a request: tokens, sessions, rates, form tokens), :mod:`.middleware` (the ``Host``
check, refusals, authentication, compression, security headers), :mod:`.views` (the
pages and their JSON twins), :mod:`.streams` (server-sent events); :mod:`.connections`
caps the connections below HTTP, and :mod:`.state` declares what the parts share.
"""

from __future__ import annotations

import asyncio
import gzip
import secrets
import ssl
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from controller.admission import AdmissionController
from controller.config import Config
from controller.console import pages
from controller.console.connections import (
    HANDSHAKE_SECONDS,
    IDLE_SECONDS,
    _PerHost,
    _Refused,
    _ssl_context,
)
from controller.console.data import ConsoleData
from controller.console.login import _safe_next, mask, unmask
from controller.console.middleware import Middleware, _secure_headers
from controller.console.public_url import parse, public
from controller.console.sessions import Sessions
from controller.console.state import _Handler
from controller.console.streams import EventStreams
from controller.console.views import Views, _int
from controller.holds import Holds
from controller.limits import RateLimiter
from controller.tls import TlsConfig, is_loopback, loopback_names

# Console and start_console; the rest were defined here before the console was split
# into parts, and are still importable from here
__all__ = [
    "HANDSHAKE_SECONDS",
    "IDLE_SECONDS",
    "Console",
    "_PerHost",
    "_int",
    "_safe_next",
    "mask",
    "start_console",
    "unmask",
]


class Console(Middleware, Views, EventStreams):
    """The running console; :meth:`close` stops it (open event streams end first)."""

    def __init__(
        self,
        config: Config,
        controller: AdmissionController,
        limiter: RateLimiter | None,
        broker: Callable[[], bool | None] | None,
    ) -> None:
        self.config = config
        self.c = controller
        self.data = ConsoleData(controller, broker)
        self.tokens = config.tokens
        self.limiter = limiter
        self.sessions = Sessions(config.web.session_seconds)
        self._tls: ssl.SSLContext | None = None  # the newest certificate's (HTTPS only)
        self.version = pages.static_version()
        self.static = {
            name: resources.files("controller.console").joinpath("static", name).read_bytes()
            for name in pages.STATIC
        }
        # gzipped once here, not per request on the event loop the gRPC calls share
        self.static_gzip = {name: gzip.compress(data, 9) for name, data in self.static.items()}
        # without [auth] there are no sessions: one token per process guards the forms
        self.anonymous_csrf = secrets.token_urlsafe(32)
        self.closing = asyncio.Event()
        self.streams: dict[str, int] = {}  # open event streams per user (token name)
        # who submitted each job (it never changes while the job is stored), shared by the
        # streams that filter by it: 32 streams of one submitter replaying 1,000 events
        # each made a store query per event and stream, in the thread pool gRPC's reads
        # use too. A job retention deletes is forgotten: its id may come back as
        # another submitter's, whose events must not show in the first one's streams.
        self.owners: dict[str, str | None] = {}
        self._learned_at: dict[str, int] = {}  # the event sequence each owner was read at
        # the reads of owners under way, with the sequence each reads at: every stream
        # that meets a new job's event at once waits for one read, not one each (32
        # streams made 32 queries a decision of another tenant)
        self._reading: dict[str, tuple[asyncio.Future[dict[str, str | None]], int]] = {}
        if controller is not None:
            controller.prune_hooks.append(self._forget_owners)
        self.runner: web.AppRunner | None = None
        self.listener: asyncio.Server | None = None
        self.address = ""
        host, _, port = config.web.listen.rpartition(":")
        self.loopback = is_loopback(host)
        self.hosts = loopback_names(host, port)
        # behind a reverse proxy: the path its pages are under ("/oasis"), the host
        # names users reach it by (a browser's Origin, the Host a proxy may send)
        public = parse(config.web.public_url)
        self.prefix = public.prefix if public is not None else ""
        self.public_hosts = public.hosts if public is not None else frozenset()
        self.hosts |= self.public_hosts
        self.secure_cookie = config.tls is not None or (public is not None and public.secure)

    # -- lifecycle ---------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._headers, self._guard, self._authenticate],
            client_max_size=64 * 1024,
        )
        get, post = "GET", "POST"
        routes: list[tuple[str, str, _Handler]] = [
            (get, "/login", self.login_form),
            (post, "/login", self.login),
            (post, "/logout", self.logout),
            (get, "/static/{name}", self.static_file),
            (get, "/", self.page("overview", "Overview", self.overview)),
            (get, "/api/overview", self.api(self.overview)),
            (get, "/servers", self.page("servers", "Servers", self.servers)),
            (get, "/api/servers", self.api(self.servers)),
            (get, "/prices", self.page("prices", "Prices", self.prices)),
            (get, "/api/prices", self.api(self.prices)),
            (get, "/api/prices/cell", self.api(self.price_cell)),
            (get, "/plans", self.page("plans", "Plans", self.plans)),
            (get, "/api/plans", self.api(self.plans)),
            (get, "/jobs", self.page("jobs", "Jobs", self.jobs)),
            (get, "/api/jobs", self.api(self.jobs)),
            (get, "/jobs/{id}", self.page("job", "Job", self.job)),
            (get, "/api/jobs/{id}", self.api(self.job)),
            (post, "/jobs/{id}/cancel", self.cancel),
            (post, "/api/jobs/{id}/cancel", self.cancel),
            (get, "/job", self.page("job", "Job", self.job)),
            (get, "/api/job", self.api(self.job)),
            (post, "/job/cancel", self.cancel),
            (post, "/api/job/cancel", self.cancel),
            (get, "/api/events", self.events),
        ]
        # under a path prefix, each route is served with it (a proxy passing the path on)
        # and without it (one stripping it); the prefix alone goes to its overview
        for base in ("", self.prefix) if self.prefix else ("",):
            for method, path, handler in routes:
                app.router.add_route(method, base + path, handler)
        if self.prefix:
            app.router.add_get(self.prefix, self._to_overview)
        app.on_response_prepare.append(_secure_headers)
        return app

    async def _to_overview(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPMovedPermanently(public("/", self.prefix))

    async def start(self) -> str:
        """Listen on ``[web] listen``; returns the ``host:port`` it listens on.

        Raises:
            OSError: the address is taken or not this machine's (the message names
                ``web.listen``).
        """
        listen = self.config.web.listen
        host, _, port = listen.rpartition(":")
        self.runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=IDLE_SECONDS
        )
        await self.runner.setup()
        tls = _ssl_context(self.config.tls) if self.config.tls is not None else None
        if tls is not None:  # each handshake takes the newest certificate (``renew``)
            self._tls = tls
            tls.sni_callback = self._newest_certificate
        server, cap = self.runner.server, self.config.web.max_connections
        assert server is not None  # set up above

        per_host, hosts = self.config.web.max_connections_per_host, Holds()

        def accept() -> asyncio.BaseProtocol:
            # past the cap the connection is answered 503 and closed, not served
            if len(server.connections) >= cap:
                return _Refused()
            return _PerHost(server, hosts, per_host)

        try:
            self.listener = await asyncio.get_running_loop().create_server(
                accept,
                host.strip("[]") or None,
                int(port),
                ssl=tls,
                ssl_handshake_timeout=HANDSHAKE_SECONDS if tls is not None else None,
                reuse_address=True,
            )
        except OSError as err:
            await self.runner.cleanup()
            raise OSError(f"web.listen: cannot listen on {listen}: {err.strerror or err}") from err
        bound = self.listener.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        self.hosts |= loopback_names(host, bound[1])
        return self.address

    def renew(self, tls: TlsConfig) -> None:
        """Serve the certificate of ``tls`` to new connections (renewed in place:
        :mod:`controller.tls_renewal`); raises ``ssl.SSLError`` (an OSError) if its files
        do not load, and nothing changes."""
        self._tls = _ssl_context(tls)

    def _newest_certificate(self, connection: Any, server_name: str | None, context: Any) -> None:
        if context is not self._tls:  # the listener's own context: switch to the newest
            connection.context = self._tls

    async def close(self) -> None:
        """End the event streams, then stop serving."""
        self.closing.set()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def start_console(
    config: Config,
    controller: AdmissionController,
    limiter: RateLimiter | None = None,
    broker: Callable[[], bool | None] | None = None,
) -> Console:
    """Start the console on ``config.web.listen`` (see :meth:`Console.start`)."""
    console = Console(config, controller, limiter, broker)
    await console.start()
    return console
