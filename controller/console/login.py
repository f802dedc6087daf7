"""Who sends a console request: without ``[auth]`` anyone (an operator); with it, a
bearer token (scripts) or a session cookie from ``/login`` (browsers). Here too: the
login and logout handlers, the rate every request takes from, and the form (CSRF) token
a browser's state-changing request must carry, masked afresh in each page.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from controller.auth import ANONYMOUS, Caller, hash_token, holds, refusals
from controller.console import pages
from controller.console.public_url import cookie_path, local, public
from controller.console.sessions import COOKIE, Session
from controller.console.state import ConsoleState, _RefusedError
from controller.tls import is_loopback

log = structlog.get_logger("oasisd")

_PRINTABLE = re.compile(r"[\x21-\x7e]*")


class Login(ConsoleState):
    """Callers, sessions and form tokens (a part of :class:`.app.Console`)."""

    def set_tokens(self, tokens: Mapping[str, Caller] | None) -> int:
        """Take the tokens a reload read (:mod:`controller.reload`): the sessions of a
        token removed, rotated or given another role end; returns how many. Their open
        event streams end at their next event or heartbeat, sending neither
        (:meth:`.streams.EventStreams._still_allowed`)."""
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
                client = self._client(request)
                self._throttle(request, f"web:{client}")
                refusals(client, "console bad token", "unauthenticated",
                         console=True, path=request.path[:200], why="bad token")  # fmt: skip
                raise _RefusedError(401, "unknown token")
            return caller, None
        session = self.sessions.get(request.cookies.get(COOKIE, ""))
        return (session.caller, session) if session else (None, None)

    def _local(self, request: web.Request) -> str:
        """``request``'s path as the console's own, without ``[web] public_url``'s path."""
        return local(request.path, self.prefix)

    def _after_login(self, target: str) -> str:
        """Where to go after logging in: the console's own path (:func:`_safe_next`),
        the prefix taken off if a link carried it."""
        return local(_safe_next(target), self.prefix)

    def _throttle(self, request: web.Request, client: str = "") -> None:
        """Take one request from ``client``'s rate (``[limits] rate``; by default the
        sender's, :meth:`_client`, as for a refused token), or refuse it with 429."""
        if (
            self.limiter is not None
            and self.limiter.take(client or f"web:{self._client(request)}") > 0
        ):
            raise _RefusedError(429, self.limiter.words)

    def _client(self, request: web.Request) -> str:
        """Who sent ``request``, for the refusal log and the rate of unknown tokens: its
        peer's address; behind ``[web] public_url`` (a loopback console), the client the
        proxy names last in ``X-Forwarded-For`` (nginx: ``proxy_set_header
        X-Forwarded-For $proxy_add_x_forwarded_for``), as ``CLIENT via PEER``.

        The last entry is the one the proxy itself wrote (a client may send earlier ones),
        and only a loopback peer's is taken. Before, every guess through a proxy was
        logged as ``127.0.0.1``, and one guesser's refusals took the rate of every
        user's mistyped token."""
        peer = request.remote or ""
        if not (self.public_hosts and self.loopback and is_loopback(peer)):
            return peer
        forwarded = request.headers.get("X-Forwarded-For", "")[-200:]
        last = forwarded.rpartition(",")[2].strip()
        try:
            client = ipaddress.ip_address(last)
        except ValueError:
            return peer  # none, or not an address: the peer it came from
        return f"{client} via {peer}"

    def _csrf_of(self, request: web.Request) -> str:
        """The form token of ``request``'s session (or of this daemon, without
        ``[auth]``), as a page carries it: masked afresh each time."""
        return mask(self._csrf_secret(request))

    def _csrf_secret(self, request: web.Request) -> str:
        session: Session | None = request.get("session")
        return session.csrf if session is not None else self.anonymous_csrf

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self.tokens is None:
            raise web.HTTPSeeOther(public("/", self.prefix))
        target = self._after_login(request.query.get("next", "/"))
        html = pages.login_page(self.version, target, self.prefix)
        return web.Response(text=html, content_type="text/html")

    async def login(self, request: web.Request) -> web.StreamResponse:
        if self.tokens is None:
            raise web.HTTPSeeOther(public("/", self.prefix))
        # another site's page must not log a visitor in as someone else (login CSRF:
        # the visitor would then submit and read as the attacker's token)
        _same_origin(request, self.public_hosts)
        form = await request.post()
        token = str(form.get("token", "")).strip()
        target = self._after_login(str(form.get("next", "/")))
        caller = self.tokens.get(hash_token(token)) if token else None
        if caller is None:
            client = self._client(request)
            self._throttle(request, f"web:{client}")  # guesses: the sender's rate
            refusals(client, "console login", "unauthenticated", console=True,
                     path="/login", why="bad token")  # fmt: skip
            problem = "Unknown token: not logged in."
            html = pages.login_page(self.version, target, self.prefix, problem)
            return web.Response(text=html, status=401, content_type="text/html")
        self._throttle(request, caller.name)  # its own rate, as its requests after it
        session = self.sessions.open(caller)
        log.info("console login", caller=caller.name, role=caller.role.value,
                 peer=self._client(request))  # fmt: skip
        response = _see_other(public(target, self.prefix))
        response.set_cookie(
            COOKIE, session.id, max_age=int(self.sessions.lifetime),
            path=cookie_path(self.prefix), httponly=True, samesite="Strict",
            secure=self.secure_cookie,
        )  # fmt: skip
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        session: Session | None = request.get("session")
        if session is not None:
            await self._check_csrf(request)
            self.sessions.close(session.id)
        response = _see_other(public("/login" if self.tokens is not None else "/", self.prefix))
        response.del_cookie(COOKIE, path=cookie_path(self.prefix))
        return response

    async def _check_csrf(self, request: web.Request) -> None:
        """A browser's state-changing request must come from a page of this console."""
        _same_origin(request, self.public_hosts)
        sent = request.headers.get("X-CSRF-Token", "")
        if not sent:
            form = await request.post()
            sent = str(form.get("csrf", ""))
        expected = self._csrf_secret(request)
        if not secrets.compare_digest(unmask(sent).encode(), expected.encode()):
            raise _RefusedError(403, "missing or stale form token: reload the page and try again")


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


def _same_origin(request: web.Request, public_hosts: frozenset[str]) -> None:
    """Refuse (403) a request a page of another site sent: its ``Origin`` (``null``
    included) is neither this console's ``Host`` nor a host of ``[web] public_url`` (a
    page served through the proxy), or the browser says ``Sec-Fetch-Site: cross-site``.
    A request without either (curl, a script) is no browser's and passes."""
    origin = request.headers.get("Origin")
    if (
        origin is not None
        and (netloc := urlsplit(origin).netloc) != request.host
        and (netloc.lower() not in public_hosts)
    ):
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
