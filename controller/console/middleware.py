"""What every console request and answer goes through: the loopback ``Host`` check,
refusals and domain errors as a page or JSON (never a traceback), authentication and
the caller's rate, compression and the byte charge of large answers, and the security
headers of every answer.
"""

from __future__ import annotations

from urllib.parse import quote

import structlog
from aiohttp import web

from controller.auth import Caller, Role
from controller.console import pages
from controller.console.login import Login
from controller.console.public_url import public
from controller.console.state import _Handler, _RefusedError
from controller.errors import (
    TENANT_UNAVAILABLE,
    BusyError,
    ConflictError,
    DrainingError,
    NotFoundError,
    PreconditionError,
)
from controller.store import StoreUnavailableError
from pricing.errors import SpecError

log = structlog.get_logger("oasisd")

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
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


class Middleware(Login):
    """The console's middlewares, in the order they run (a part of :class:`.app.Console`)."""

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
        if self.loopback and request.host.lower() not in self.hosts:
            return self._refusal(request, 421, f"this console answers to loopback names only, "
                                 f"not {request.host[:100]!r}. {_PROXIED}")  # fmt: skip
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
        path = self._local(request)
        if path.startswith(_OPEN):
            # no caller yet, and no bucket taken: the login page and the static files
            # cost no more to serve than a 429 does, and the peer's bucket is shared by
            # everyone behind its address (loopback, an SSH tunnel, a proxy), so an
            # unauthenticated flood of them refused every user's login. A login takes
            # from its token's rate, or the peer's if the token is unknown (:meth:`login`)
            return await handler(request)
        caller, session = self._caller(request)
        if caller is None:
            if path.startswith("/api/") or request.method != "GET":
                raise _RefusedError(
                    401, f"log in first ({public('/login', self.prefix)}), or send "
                    "Authorization: Bearer TOKEN",
                )  # fmt: skip
            target = path + (f"?{request.query_string}" if request.query_string else "")
            login = public("/login", self.prefix)
            raise web.HTTPSeeOther(f"{login}?next={quote(target, safe='/')}")
        # a request of the console costs its caller's rate as a gRPC call does (the same
        # bucket: the console shares the daemon's event loop, threads and store)
        self._throttle(request, caller.name)
        request["caller"] = caller
        request["session"] = session
        return await handler(request)

    def _refusal(self, request: web.Request, status: int, message: str) -> web.Response:
        api = self._local(request).startswith("/api/")
        if api or "json" in request.headers.get("Accept", "")[:100]:
            error = {"error": {"status": status, "message": message}}
            return web.json_response(error, status=status)
        caller = request.get("caller")
        html = pages.error_page(
            self.version, status, message, caller, auth=self.tokens is not None,
            csrf=self._csrf_of(request) if caller else "", prefix=self.prefix,
        )  # fmt: skip
        return web.Response(text=html, status=status, content_type="text/html")


_PROXIED = (
    "Behind a reverse proxy: set [web] public_url to the URL users open (such as "
    "https://head.example/oasis/), whose host is then answered too and whose path the "
    "console's links begin with, or have the proxy send the Host the console listens on "
    "(nginx does, unless told proxy_set_header Host $host)"
)
"""The 421's second half: in the README's words, for an operator whose proxy met it."""


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer's security headers, as it is sent: those of aiohttp's own refusals
    (404, 405, a redirect raised) and event streams included."""
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")
