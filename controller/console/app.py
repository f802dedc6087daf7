"""The console's HTTP server: an aiohttp application on the daemon's own event loop.

Routes (each page has its JSON twin under ``/api/``, with the same query parameters):

    GET  /                  /api/overview          use, jobs per state, health, clock
    GET  /prices            /api/prices            ?resource=gpu (default: the costliest)
                            /api/prices/cell       ?resource=&r0=&r1=&s0=&s1= (hover)
    GET  /plans             /api/plans             ?page=N&job=ID (Gantt per server)
    GET  /jobs              /api/jobs              ?state=&q=ID-prefix&after=SEQUENCE
    GET  /jobs/{id}         /api/jobs/{id}
    POST /jobs/{id}/cancel  /api/jobs/{id}/cancel  operators, or the job's submitter (as CancelJob)
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
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
import secrets
import ssl
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

import structlog
from aiohttp import web

from controller.admission import AdmissionController
from controller.auth import ANONYMOUS, Caller, Role, hash_token, holds, refusals
from controller.commands.records import job_record
from controller.config import Config
from controller.console import pages
from controller.console.data import ConsoleData
from controller.console.sessions import COOKIE, Session, Sessions
from controller.convert import job_to_proto
from controller.errors import (
    TENANT_UNAVAILABLE,
    BusyError,
    ConflictError,
    DrainingError,
    NotFoundError,
    PreconditionError,
)
from controller.events import Event
from controller.holds import Holds
from controller.job_keys import as_named, key_for, shown, shown_view
from controller.limits import RateLimiter
from controller.store import StoreUnavailableError
from controller.tls import TlsConfig, is_loopback, loopback_names
from pricing import fields
from pricing.errors import SpecError

__all__ = ["Console", "start_console"]

log = structlog.get_logger("oasisd")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN = ("/login", "/static/")
_ERRORS: tuple[tuple[type[BaseException], int], ...] = (
    (SpecError, 400),
    (NotFoundError, 404),
    (ConflictError, 409),
    (PreconditionError, 409),
    (BusyError, 429),
    (StoreUnavailableError, 503),
    (DrainingError, 503),
)
_HEARTBEAT_SECONDS = 15.0
_BACKFILL_MAX = 1000  # events replayed to a stream that reconnects (Last-Event-ID)
_OWNER_CACHE = 10_000  # job owners remembered, for every submitter's stream together
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

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


class _RefusedError(Exception):
    """A request the console refuses with ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Console:
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

    # -- lifecycle ---------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._headers, self._guard, self._authenticate],
            client_max_size=64 * 1024,
        )
        r = app.router
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/static/{name}", self.static_file)
        r.add_get("/", self.page("overview", "Overview", self.overview))
        r.add_get("/api/overview", self.api(self.overview))
        r.add_get("/prices", self.page("prices", "Prices", self.prices))
        r.add_get("/api/prices", self.api(self.prices))
        r.add_get("/api/prices/cell", self.api(self.price_cell))
        r.add_get("/plans", self.page("plans", "Plans", self.plans))
        r.add_get("/api/plans", self.api(self.plans))
        r.add_get("/jobs", self.page("jobs", "Jobs", self.jobs))
        r.add_get("/api/jobs", self.api(self.jobs))
        r.add_get("/jobs/{id}", self.page("job", "Job", self.job))
        r.add_get("/api/jobs/{id}", self.api(self.job))
        r.add_post("/jobs/{id}/cancel", self.cancel)
        r.add_post("/api/jobs/{id}/cancel", self.cancel)
        r.add_get("/api/events", self.events)
        app.on_response_prepare.append(_secure_headers)
        return app

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

    async def close(self) -> None:
        """End the event streams, then stop serving."""
        self.closing.set()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # -- middlewares -------------------------------------------------------------------

    @web.middleware
    async def _headers(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        response = await handler(request)
        if response.prepared:  # an event stream: its headers are sent (set in events)
            return response
        body = response.body if isinstance(response, web.Response) else None
        encoded = "Content-Encoding" in response.headers
        caller: Caller | None = request.get("caller")
        charged = caller is not None and caller.owner is not None and self.limiter is not None
        if charged and isinstance(body, bytes | bytearray):
            # a submitter's large answer costs its rate as over gRPC (_charge_answer)
            assert caller is not None and self.limiter is not None
            self.limiter.charge_bytes(caller.name, len(body))
        if isinstance(body, bytes | bytearray) and len(body) > 1024 and not encoded:
            # gzip if the browser asks; the form token in a page is masked afresh in each
            # response (:func:`mask`), so compression cannot leak it (BREACH)
            response.enable_compression()
        return response

    @web.middleware
    async def _guard(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Refusals and domain errors as a page or JSON, never a traceback."""
        if self.loopback and request.host not in self.hosts:
            return self._refusal(request, 421, f"this console answers to loopback names only, "
                                 f"not {request.host[:100]!r}")  # fmt: skip
        try:
            return await handler(request)
        except _RefusedError as err:
            return self._refusal(request, err.status, str(err))
        except web.HTTPException:
            raise
        except Exception as err:
            status = next((s for kind, s in _ERRORS if isinstance(err, kind)), None)
            if status is None:
                log.exception("console: request failed", path=request.path)
                return self._refusal(request, 500, "internal error (logged by the daemon)")
            caller: Caller | None = request.get("caller")
            if isinstance(err, StoreUnavailableError) and (
                caller is None or caller.role is not Role.OPERATOR
            ):  # the database's host and port are the operator's to read
                return self._refusal(request, status, TENANT_UNAVAILABLE)
            return self._refusal(request, status, str(err)[:2000])

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path.startswith(_OPEN):
            # no caller yet, and no bucket taken: the login page and the static files
            # cost no more to serve than a 429 does, and the peer's bucket is shared by
            # everyone behind its address (loopback, an SSH tunnel, a proxy), so an
            # unauthenticated flood of them refused every user's login. A login takes
            # from its token's rate, or the peer's if the token is unknown (:meth:`login`)
            return await handler(request)
        caller, session = self._caller(request)
        if caller is None:
            if request.path.startswith("/api/") or request.method != "GET":
                raise _RefusedError(
                    401, "log in first (/login), or send Authorization: Bearer TOKEN"
                )
            target = request.path_qs if request.path != "/" else "/"
            raise web.HTTPSeeOther(f"/login?next={quote(target, safe='/')}")
        # a request of the console costs its caller's rate as a gRPC call does (the same
        # bucket: the console shares the daemon's event loop, threads and store)
        self._throttle(request, caller.name or f"web:{request.remote}")
        request["caller"] = caller
        request["session"] = session
        return await handler(request)

    def set_tokens(self, tokens: Mapping[str, Caller] | None) -> int:
        """Take the tokens a reload read (:mod:`controller.reload`): the sessions of a
        token removed, rotated or given another role end; returns how many. Their open
        event streams end at their next event or heartbeat."""
        self.tokens = tokens
        return self.sessions.retain(lambda session: holds(tokens, session.caller))

    def _caller(self, request: web.Request) -> tuple[Caller | None, Session | None]:
        """Who sends ``request``: anonymous without ``[auth]``; else its bearer token
        (refused if unknown) or its session cookie; None: nobody logged in."""
        if self.tokens is None:
            return ANONYMOUS, None
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            bearer = scheme.lower() == "bearer"
            caller = self.tokens.get(hash_token(token.strip())) if bearer else None
            if caller is None:
                self._throttle(request)
                refusals(request.remote or "", "console bad token", "unauthenticated",
                         console=True, path=request.path[:200], why="bad token")  # fmt: skip
                raise _RefusedError(401, "unknown token")
            return caller, None
        session = self.sessions.get(request.cookies.get(COOKIE, ""))
        return (session.caller, session) if session else (None, None)

    def _throttle(self, request: web.Request, client: str = "") -> None:
        """Take one request from ``client``'s rate (``[limits] rate``; by default the
        peer's, as for a refused token), or refuse it with 429."""
        if self.limiter is not None and self.limiter.take(client or f"web:{request.remote}") > 0:
            raise _RefusedError(429, self.limiter.words)

    def _csrf_of(self, request: web.Request) -> str:
        """The form token of ``request``'s session (or of this daemon, without
        ``[auth]``), as a page carries it: masked afresh each time."""
        return mask(self._csrf_secret(request))

    def _csrf_secret(self, request: web.Request) -> str:
        session: Session | None = request.get("session")
        return session.csrf if session is not None else self.anonymous_csrf

    def _refusal(self, request: web.Request, status: int, message: str) -> web.Response:
        if request.path.startswith("/api/") or "json" in request.headers.get("Accept", "")[:100]:
            error = {"error": {"status": status, "message": message}}
            return web.json_response(error, status=status)
        caller = request.get("caller")
        html = pages.error_page(
            self.version, status, message, caller, auth=self.tokens is not None,
            csrf=self._csrf_of(request) if caller else "",
        )  # fmt: skip
        return web.Response(text=html, status=status, content_type="text/html")

    # -- login -------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self.tokens is None:
            raise web.HTTPSeeOther("/")
        html = pages.login_page(self.version, _safe_next(request.query.get("next", "/")))
        return web.Response(text=html, content_type="text/html")

    async def login(self, request: web.Request) -> web.StreamResponse:
        if self.tokens is None:
            raise web.HTTPSeeOther("/")
        # another site's page must not log a visitor in as someone else (login CSRF:
        # the visitor would then submit and read as the attacker's token)
        _same_origin(request)
        form = await request.post()
        token = str(form.get("token", "")).strip()
        target = _safe_next(str(form.get("next", "/")))
        caller = self.tokens.get(hash_token(token)) if token else None
        if caller is None:
            self._throttle(request)  # guesses: the peer's rate
            refusals(request.remote or "", "console login", "unauthenticated", console=True,
                     path="/login", why="bad token")  # fmt: skip
            html = pages.login_page(self.version, target, "Unknown token: not logged in.")
            return web.Response(text=html, status=401, content_type="text/html")
        self._throttle(request, caller.name)  # its own rate, as its requests after it
        session = self.sessions.open(caller)
        log.info("console login", caller=caller.name, role=caller.role.value)
        response = _see_other(target)
        response.set_cookie(
            COOKIE, session.id, max_age=int(self.sessions.lifetime), path="/", httponly=True,
            samesite="Strict", secure=self.config.tls is not None,
        )  # fmt: skip
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        session: Session | None = request.get("session")
        if session is not None:
            await self._check_csrf(request)
            self.sessions.close(session.id)
        response = _see_other("/login" if self.tokens is not None else "/")
        response.del_cookie(COOKIE, path="/")
        return response

    async def _check_csrf(self, request: web.Request) -> None:
        """A browser's state-changing request must come from a page of this console."""
        _same_origin(request)
        sent = request.headers.get("X-CSRF-Token", "")
        if not sent:
            form = await request.post()
            sent = str(form.get("csrf", ""))
        expected = self._csrf_secret(request)
        if not secrets.compare_digest(unmask(sent).encode(), expected.encode()):
            raise _RefusedError(403, "missing or stale form token: reload the page and try again")

    # -- pages and their JSON twins ----------------------------------------------------

    def page(
        self, name: str, title: str, read: Callable[[web.Request], Awaitable[Any]]
    ) -> _Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            data = await read(request)
            caller: Caller = request["caller"]
            heading = f"Job {request.match_info['id']}" if name == "job" else title
            api = "/api" + (request.path if request.path != "/" else "/overview")
            if request.query_string:
                api += "?" + request.query_string
            html = pages.page(
                name, heading, api, data, caller, auth=self.tokens is not None,
                csrf=self._csrf_of(request), version=self.version,
            )  # fmt: skip
            return web.Response(text=html, content_type="text/html")

        return handler

    @staticmethod
    def api(read: Callable[[web.Request], Awaitable[Any]]) -> _Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.json_response(await read(request), dumps=_dumps)

        return handler

    @staticmethod
    def _operators_only(request: web.Request, what: str) -> None:
        caller: Caller = request["caller"]
        if caller.role is not Role.OPERATOR:
            raise _RefusedError(403, f"{caller.name} ({caller.role.value}) may not see {what}: "
                           "operators only")  # fmt: skip

    async def overview(self, request: web.Request) -> Any:
        return await self.data.overview(request["caller"])

    async def prices(self, request: web.Request) -> Any:
        self._operators_only(request, "the prices")
        return await self.data.prices(request.query.get("resource", ""))

    async def price_cell(self, request: web.Request) -> Any:
        self._operators_only(request, "the prices")
        q = request.query
        rows = (_int(q, "r0"), _int(q, "r1"))
        slots = (_int(q, "s0"), _int(q, "s1"))
        return await self.data.price_cell(q.get("resource", ""), rows, slots)

    async def plans(self, request: web.Request) -> Any:
        self._operators_only(request, "the plans")
        job = request.query.get("job", "")
        if job:
            fields.job_key(job, "job")  # its id, or NAME:ID with tokens
        return await self.data.plans(_int(request.query, "page", 1), job)

    async def jobs(self, request: web.Request) -> Any:
        q = request.query
        return await self.data.jobs(
            request["caller"], q.get("state", ""), q.get("q", "").strip(), _int(q, "after", 0)
        )

    async def job(self, request: web.Request) -> Any:
        return await self.data.job(request["caller"], request.match_info["id"])

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        caller: Caller = request["caller"]
        bearer = bool(request.headers.get("Authorization"))
        if not bearer:  # a browser: its cookie (or nothing) is ambient; the form is not
            await self._check_csrf(request)
        job_id = request.match_info["id"]  # a submitter's own jobs only, as CancelJob
        key = key_for(caller, job_id)
        cancel = self.c.cancel(key, caller.turn, caller.owner, caller.name or None)
        view, released = await as_named(caller, key, cancel)
        log.info("console cancel", job=key, caller=caller.name or None, released=released)
        if request.path.startswith("/api/"):
            times = self.c.slots.times
            record = job_record(job_to_proto(shown_view(caller, view), times), times)
            return web.json_response({"job": record, "released_worker_slots": released})
        raise web.HTTPSeeOther(f"/jobs/{quote(job_id)}")

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.static:
            raise _RefusedError(404, f"no file {name[:100]!r}")
        headers = {"Cache-Control": "public, max-age=86400, immutable", "Vary": "Accept-Encoding"}
        body = self.static[name]
        if "gzip" in request.headers.get("Accept-Encoding", "")[:200]:
            body, headers["Content-Encoding"] = self.static_gzip[name], "gzip"
        return web.Response(body=body, content_type=pages.STATIC[name], headers=headers)

    # -- live events -------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: every event of the bus (a submitter: its own jobs'), after
        those stored since ``Last-Event-ID`` (or ``?after=``) when the stream resumes."""
        caller: Caller = request["caller"]
        self._open_stream(caller)
        try:
            return await self._stream(request, caller)
        finally:
            self._close_stream(caller)

    def _open_stream(self, caller: Caller) -> None:
        """Count a new event stream of ``caller``'s, or refuse it: 429 past the user's
        cap, 503 past everyone's (``[web]``)."""
        web_config = self.config.web
        mine = self.streams.get(caller.name, 0)
        if mine >= web_config.max_event_streams_per_user:
            who = caller.name or "this console's user (without [auth], everyone)"
            raise _RefusedError(
                429,
                f"too many event streams: {who} has {mine} open (web.max_event_streams_per_"
                f"user = {web_config.max_event_streams_per_user}); close another console tab "
                f"or stream first (a closed one frees its place within {_HEARTBEAT_SECONDS:g} s)",
            )
        total = sum(self.streams.values())
        if total >= web_config.max_event_streams:
            raise _RefusedError(
                503,
                f"too many event streams: {total} open in all (web.max_event_streams = "
                f"{web_config.max_event_streams}); try again later",
            )
        self.streams[caller.name] = mine + 1

    def _close_stream(self, caller: Caller) -> None:
        left = self.streams.get(caller.name, 0) - 1
        if left > 0:
            self.streams[caller.name] = left
        else:
            self.streams.pop(caller.name, None)

    async def _stream(self, request: web.Request, caller: Caller) -> web.StreamResponse:
        """The stream of ``caller`` (a submitter sees only its own jobs' events), until
        the browser goes, the console closes, or a reload revokes the caller's token."""
        owner = caller.owner
        queue = self.c.bus.subscribe()  # first, so nothing falls between backfill and live
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                     "X-Accel-Buffering": "no", "X-Content-Type-Options": "nosniff"}
        )  # fmt: skip
        try:
            last = _int(request.query, "after", -1)  # before the answer starts: a 400
            resume = request.headers.get("Last-Event-ID", "")
            if _INTEGER.fullmatch(resume) and not resume.startswith("-"):
                last = int(resume)
            await response.prepare(request)
            await response.write(b"retry: 2000\n\n")
            if last > 0:
                # a page resumed past the store's newest event: the store was restored from
                # a backup (or is another one), and reuses those numbers; its events after
                # its newest are new to the page (before, the page skipped them unseen)
                newest = await self.c.stored_events(-1, limit=1, newest=True)
                last = min(last, newest[-1].sequence if newest else 0)
            backlog: list[Event] = []
            if last >= 0:
                backlog = await self.c.stored_events(last, limit=_BACKFILL_MAX, newest=True)
                if owner is not None and backlog:  # the backlog's owners in one query
                    upto = max(e.sequence for e in backlog)
                    await self._learn_owners({e.job_id for e in backlog if e.job_id}, upto)
            for event in backlog:
                last = max(last, event.sequence)
                if await self._visible(event, owner):
                    await response.write(_sse(event, caller))
            while not self.closing.is_set() and holds(self.tokens, caller):
                event_or_none = await self._next(queue)
                if event_or_none is None:
                    await response.write(b": ping\n\n")
                    continue
                if event_or_none.sequence <= last:
                    continue
                last = event_or_none.sequence
                if await self._visible(event_or_none, owner):
                    await response.write(_sse(event_or_none, caller))
        except (ConnectionResetError, ConnectionError):
            pass  # the browser went away
        finally:
            self.c.bus.unsubscribe(queue)
        return response

    async def _next(self, queue: asyncio.Queue[Event]) -> Event | None:
        """The next event, or None after a heartbeat's interval or at close."""
        getter = asyncio.ensure_future(queue.get())
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            done, _ = await asyncio.wait(
                {getter, closing}, timeout=_HEARTBEAT_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closing.cancel()
            if not getter.done():
                getter.cancel()
        if getter in done:
            return getter.result()
        return None

    async def _visible(self, event: Event, owner: str | None) -> bool:
        """Whether a stream of ``owner`` (None: an operator's, every event) shows
        ``event``: a submitter sees its own jobs' events."""
        if owner is None:
            return True
        if not event.job_id:
            return False
        # a job's first event is a decision: one after the owner was read may be that of
        # a new job under a deleted job's id (retention), another submitter's: read again
        learned = self._learned_at.get(event.job_id, event.sequence)
        if event.kind == "decided" and event.sequence > learned:
            self.owners.pop(event.job_id, None)
        if event.job_id in self.owners:
            return self.owners[event.job_id] == owner
        # what the read found, not the cache after it: another read may have started the
        # cache over meanwhile (the review: an event of the stream's own job was lost)
        found = await self._learn_owners({event.job_id}, event.sequence)
        return found.get(event.job_id) == owner

    def _forget_owners(self, job_ids: list[str]) -> None:
        """Forget the owners of deleted jobs (called in the decision thread)."""
        for job_id in job_ids:
            self.owners.pop(job_id, None)

    async def _learn_owners(self, job_ids: set[str], upto: int) -> dict[str, str | None]:
        """The submitters of ``job_ids``: those known, and those not read in one query
        (or read by a query under way that reads at ``upto`` or later) into
        :attr:`owners` (at most ``_OWNER_CACHE``: past it, it starts over); ``upto``: the
        latest event already stored when they are read."""
        known = {j: self.owners[j] for j in job_ids if j in self.owners}
        unknown = [j for j in job_ids if j not in known]
        waits = {
            self._reading[j][0]
            for j in unknown
            if j in self._reading and self._reading[j][1] >= upto
        }
        mine = [j for j in unknown if j not in self._reading or self._reading[j][1] < upto]
        if mine:
            read = asyncio.ensure_future(self._read_owners(mine, upto))
            for job_id in mine:
                self._reading[job_id] = (read, upto)
            waits.add(read)
        for shared in waits:  # shielded: a stream that goes away ends no other's wait
            found = await asyncio.shield(shared)
            known.update((j, found[j]) for j in unknown if j in found)
        return known

    async def _read_owners(self, job_ids: list[str], upto: int) -> dict[str, str | None]:
        """Read the submitters of ``job_ids`` (one query; None: not stored) into
        :attr:`owners`, where no later read has put them, and return them."""
        try:
            stored = await self.data.owner_of(job_ids)
        finally:
            for job_id in job_ids:
                if self._reading.get(job_id, (None, 0))[1] == upto:
                    del self._reading[job_id]
        found = {job_id: stored.get(job_id) for job_id in job_ids}
        if len(self.owners) + len(job_ids) > _OWNER_CACHE:
            self.owners.clear()
            self._learned_at.clear()
        for job_id, who in found.items():
            if self._learned_at.get(job_id, -1) <= upto:  # not over a later read's
                self.owners[job_id] = who
                self._learned_at[job_id] = upto
        return found


def mask(token: str) -> str:
    """``token`` XOR a fresh random pad, with the pad in front (URL-safe base64): a new
    string in every response, the same token once :func:`unmask` ed."""
    raw = token.encode()
    pad = secrets.token_bytes(len(raw))
    return base64.urlsafe_b64encode(
        pad + bytes(a ^ b for a, b in zip(pad, raw, strict=True))
    ).decode()


def unmask(sent: str) -> str:
    """The token :func:`mask` hid in ``sent``; empty if ``sent`` is not such a string."""
    try:
        raw = base64.urlsafe_b64decode(sent.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        return ""
    half = len(raw) // 2
    if not raw or len(raw) % 2 or len(raw) > 512:
        return ""
    token = bytes(a ^ b for a, b in zip(raw[:half], raw[half:], strict=True))
    return token.decode("ascii", errors="replace")


def _see_other(target: str) -> web.Response:
    return web.Response(status=303, headers={"Location": target})


def _sse(event: Event, caller: Caller) -> bytes:
    """``event`` as a server-sent event for ``caller`` (its job as the caller names it)."""
    job_id = shown(caller, event.job_id) if event.job_id else event.job_id
    body = {"sequence": event.sequence, "kind": event.kind, "job_id": job_id,
            "slot": event.slot, "state": event.state, "detail": event.detail}  # fmt: skip
    return f"id: {event.sequence}\nevent: oasis\ndata: {_dumps(body)}\n\n".encode()


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


_INTEGER = re.compile(r"-?[0-9]{1,18}")
"""An integer a query or header may give: ASCII digits only (``str.isdigit`` takes
``²``, which ``int`` refuses)."""
_PRINTABLE = re.compile(r"[\x21-\x7e]*")


def _int(query: Any, name: str, default: int | None = None) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise SpecError.one(name, "is required")
        return default
    text = str(raw)
    if not _INTEGER.fullmatch(text):
        raise SpecError.one(name, f"must be an integer, got {text[:40]!r}")
    return int(text)


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer's security headers, as it is sent: those of aiohttp's own refusals
    (404, 405, a redirect raised) and event streams included."""
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")


def _same_origin(request: web.Request) -> None:
    """Refuse (403) a request a page of another site sent: its ``Origin`` (``null``
    included) is not this console's, or the browser says ``Sec-Fetch-Site: cross-site``.
    A request without either (curl, a script) is no browser's and passes."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise _RefusedError(403, "cross-origin request refused")
    if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
        raise _RefusedError(403, "cross-site request refused")


def _safe_next(target: str) -> str:
    """A local path to go to after logging in (never another site): printable ASCII
    only, so no tab or line break makes a browser read ``/\t/evil.example`` as
    ``//evil.example``, and no character makes the ``Location`` header unsendable."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    if len(target) > 2000 or not _PRINTABLE.fullmatch(target):
        return "/"
    return target


def _ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """HTTPS with the daemon's certificate; client certificates required if ``[tls]``
    has ``client_ca`` (as for gRPC)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.load_verify_locations(cafile=tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


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
