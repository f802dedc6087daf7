"""Who may call what: bearer tokens with a role, and a per-client rate, checked by one
gRPC server interceptor in front of every oasis RPC.

Roles:
    ``submitter``: SubmitJob, QuoteJob, and GetJob, ListJobs, GetProgress and CancelJob
    of the jobs it submitted (another's job reads as NOT_FOUND; reusing another's job id
    is ALREADY_EXISTS), and GetClusterInfo (the slot clock). A submitter cancels its own
    mistakes without an operator (a wrong job admitted holds the cluster for everyone
    until it is cancelled); a cancel only ever releases slots. ``operator``: every RPC,
    every job. Any RPC not listed for submitters (WatchEvents, the rest of the Cluster
    service, and RPCs added later) is for operators only.

Requests carry ``authorization: Bearer TOKEN`` metadata. A missing or unknown token is
UNAUTHENTICATED; a role that may not call the RPC is PERMISSION_DENIED. Health checking
(``grpc.health.v1``) and reflection stay open to everyone: load balancers and
``grpcurl`` need them, and they tell nothing about jobs.

The tokens file (``[auth] tokens_file``) holds one token per line, as its SHA-256, so
the file is no secret worth stealing (the tokens are 256-bit random strings, so an
unsalted hash cannot be reversed by guessing)::

    # name   role        sha256 of the token (hex)
    alice    submitter   2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90
    ops      operator    6b86b273ff34fce19c6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b

``oasis token NAME --role ROLE`` makes a token and prints its line. The name is what the
store records as the job's submitter. With no ``[auth]`` every caller is an anonymous
operator (the embedded defaults, on loopback). A reload (SIGHUP) reads the file again
(:mod:`controller.reload`): a token it no longer holds, or holds with another role, is
refused at its next call and ends its open streams (:func:`holds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import grpc
import structlog

from controller.bearer import TokenInterceptor  # the client's side, re-exported
from controller.files import read_bounded
from controller.handler_memo import HandlerMemo
from controller.holds import Holds
from controller.logs import Complaints
from controller.streams import relay
from controller.tls import is_loopback
from pricing import fields
from pricing.errors import SpecError

if TYPE_CHECKING:  # the client's TokenInterceptor needs neither limits nor numpy
    from controller.limits import RateLimiter

__all__ = [
    "ANONYMOUS",
    "MAX_OPEN_CALLS_PER_HOST",
    "MAX_OPEN_STREAMS",
    "MAX_OPEN_STREAMS_PER_HOST",
    "NAME_PATTERN",
    "OPEN_SERVICES",
    "REVOKE_CHECK_SECONDS",
    "SUBMITTER_METHODS",
    "UNKNOWN_TOKEN",
    "AccessInterceptor",
    "Caller",
    "Role",
    "TokenInterceptor",
    "current_caller",
    "hash_token",
    "holds",
    "load_tokens",
    "new_token",
    "parse_tokens",
    "token_lines",
    "tokens_from_dict",
]

_ADMISSION = "/oasis.v1.Admission/"
SUBMITTER_METHODS = frozenset(
    [
        *(_ADMISSION + name for name in ("SubmitJob", "QuoteJob", "GetJob", "ListJobs",
                                         "GetProgress", "CancelJob")),
        "/oasis.v1.Cluster/GetClusterInfo",  # the slot clock: times next to slot numbers
        # who leads: a client of several head nodes asks before its first call (a node
        # that is hung answers nothing); why a standby cannot lead is an operator's
        "/oasis.v1.HighAvailability/GetLeadership",
    ]
)  # fmt: skip
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
UNKNOWN_TOKEN = (
    "unknown token: it is none of the tokens in oasisd's tokens file (cut short or "
    "mistyped when copied, or removed or replaced there since: a reload ends a token at "
    "once). Check $OASIS_TOKEN or --token, or ask an operator for a new one (oasis token "
    "NAME --add-to FILE)"
)
"""A bearer token the daemon does not know. It says nothing of who holds which token:
a guesser learns only that this one is not one. Before, ``unknown token`` alone, and a
tenant whose token an operator had rotated did not know what to do."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.@-]{1,200}")
"""A token's name: it is stored as a job's submitter (VARCHAR(200))."""

log = structlog.get_logger("oasisd")

REFUSAL_LOG_SECONDS = 10.0
REFUSAL_LINES = 100
"""Lines of one reason of refusal written in :data:`REFUSAL_LOG_SECONDS`, all peers and
callers together; the rest are counted (:class:`~controller.logs.Complaints`)."""
refusals = Complaints(REFUSAL_LOG_SECONDS, field="peer", max_lines=REFUSAL_LINES)
"""Refusals a client can repeat (no token, a bad one, an operator's method, its caps):
one log line per peer (or caller) and reason in :data:`REFUSAL_LOG_SECONDS`, the next
saying how many were held back; one line per refusal filled the disk at 400 KiB/s. At
most :data:`REFUSAL_LINES` of a reason in that time: a client calling from 5,000
addresses wrote 4,981 lines in 4 s."""

REVOKE_CHECK_SECONDS = 15.0
"""How often an open stream checks that its caller's token still holds (:func:`holds`),
seconds; it also checks at each event it sends. The console's heartbeat is as long."""


class Role(StrEnum):
    SUBMITTER = "submitter"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Caller:
    """Who is calling.

    Attributes:
        name: the token's name; empty when authentication is off.
        role: what it may do.
        client: the key of its rate limit: the name, or without one the peer's host; set
            by :class:`AccessInterceptor`.
        turn: the key of its turns at the decision thread and of ``limits.max_in_flight``:
            the token's name; empty without authentication, where calls queue first come,
            first served and uncapped. Without tokens, tenants cannot be told apart: every
            client on the head node is 127.0.0.1, and gRPC clients share one connection
            per address, so a per-host or per-connection cap would let one busy script
            refuse everyone else's calls.
        token: the SHA-256 (hex) of the token it called with, as the tokens file holds
            it; empty when authentication is off. A reload (SIGHUP) that drops or
            rotates the token ends what it opened (:func:`holds`).
    """

    name: str
    role: Role
    client: str = ""
    turn: str = ""
    token: str = field(default="", repr=False)

    @property
    def owner(self) -> str | None:
        """The only submitter whose jobs this caller sees; None: every job."""
        return self.name if self.role is Role.SUBMITTER else None

    @property
    def submitter(self) -> str | None:
        """The identity recorded with the jobs it submits; None when anonymous."""
        return self.name or None


ANONYMOUS = Caller("", Role.OPERATOR)
"""Every caller when authentication is off."""

_caller: ContextVar[Caller | None] = ContextVar("oasis_caller", default=None)


def current_caller() -> Caller:
    """The caller of the RPC being served (set by :class:`AccessInterceptor`)."""
    caller = _caller.get()
    if caller is None:  # fail closed: a servicer reached without the interceptor
        raise RuntimeError("no caller: the access interceptor is not installed")
    return caller


def holds(tokens: Mapping[str, Caller] | None, caller: Caller) -> bool:
    """Whether ``caller`` may still call under ``tokens`` (the daemon's tokens now, which a
    reload may have changed since the caller was admitted): its token is still there,
    with the same name and role. Without authentication (None) everyone may."""
    if tokens is None:
        return True
    now = tokens.get(caller.token)
    return now is not None and now.name == caller.name and now.role is caller.role


def hash_token(token: str) -> str:
    """The SHA-256 of ``token``, hex, as the tokens file holds it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random token: 256 bits, URL-safe base64."""
    return secrets.token_urlsafe(32)


def token_lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number from 1, its words)`` of each line of a tokens file that holds
    any: blank lines and ``#`` comments (whole lines or their ends) left out."""
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if words:
            yield number, words


def load_tokens(path: Path) -> dict[str, Caller]:
    """Read a tokens file: ``{sha256 hex: Caller}``. Errors name the line."""
    where = f"auth.tokens_file: {path}"
    try:
        text = read_bounded(path).decode("utf-8-sig")  # a byte-order mark is no error
    except OSError as err:
        raise SpecError.one(
            "auth.tokens_file",
            f"cannot read {path}: {err.strerror or err}"
            + (
                f" (make it: oasis token NAME --role operator --add-to {path})"
                if isinstance(err, FileNotFoundError)
                else ""
            ),
        ) from err
    except UnicodeDecodeError as err:
        raise SpecError.one("auth.tokens_file", f"{path} is not UTF-8 text") from err
    tokens = parse_tokens(text, where)
    if not tokens:
        raise SpecError.one(where, "holds no token: nobody could call the daemon (add one: "
                            f"oasis token NAME --role operator --add-to {path})")  # fmt: skip
    return tokens


def parse_tokens(text: str, where: str) -> dict[str, Caller]:
    """The tokens of a tokens file's ``text``, ``{sha256 hex: Caller}`` (none: empty).
    SpecError at ``where`` naming the first line the daemon would refuse (``oasis token
    --add-to`` checks a file with it before adding to it)."""
    tokens: dict[str, Caller] = {}
    names: set[str] = set()
    for number, words in token_lines(text):
        if len(words) != 3:
            raise SpecError.one(where, f"line {number}: expected 'NAME ROLE SHA256', got "
                                f"{len(words)} fields")  # fmt: skip
        name, role, digest = words
        if not NAME_PATTERN.fullmatch(name):
            raise SpecError.one(where, f"line {number}: name {name[:40]!r} must be 1-200 of "
                                "A-Z a-z 0-9 _ . @ -")  # fmt: skip
        if role not in Role.__members__.values():
            raise SpecError.one(where, f"line {number}: role must be 'submitter' or "
                                f"'operator', got {role[:40]!r}")  # fmt: skip
        digest = digest.lower()
        if not _HEX64.fullmatch(digest):
            raise SpecError.one(where, f"line {number}: the token's SHA-256 must be 64 hex "
                                "digits (oasis token prints it)")  # fmt: skip
        if name in names:
            raise SpecError.one(where, f"line {number}: name {name!r} appears twice")
        if digest in tokens:
            raise SpecError.one(where, f"line {number}: the same token appears twice")
        names.add(name)
        # its turns and rate are its name's wherever it calls from (the console uses
        # the caller as loaded: a console request waits its turn like a gRPC call)
        tokens[digest] = Caller(name, Role(role), client=name, turn=name, token=digest)
    return tokens


def tokens_from_dict(raw: Mapping[str, Any]) -> dict[str, Caller]:
    """Read an ``[auth]`` table: the tokens of its ``tokens_file`` (a config without the
    table has no tokens: :mod:`controller.config` passes None then)."""
    fields.check_known_keys(raw, {"tokens_file"}, "auth")
    if "tokens_file" not in raw:
        # An [auth] table whose tokens_file was commented out must not silently leave the
        # daemon open to everyone; leaving the whole table out is the way to say that.
        raise SpecError.one(
            "auth.tokens_file", "is required in [auth] (leave the table out for no tokens)"
        )
    return load_tokens(Path(fields.text(raw["tokens_file"], "auth.tokens_file")))


# -- server side ------------------------------------------------------------------------


MAX_OPEN_STREAMS = 32
"""The most streams of the open services (reflection's ``ServerReflectionInfo``, health's
``Watch``) at once, from everyone together. They take no token and may stay open for
good, and every open call holds one of ``connections.max_calls``: without a cap, 1000
reflection streams from anyone on the host refused every tenant's calls. Past it a new
one is RESOURCE_EXHAUSTED; health's ``Check`` (a unary call) is never refused by it."""


MAX_OPEN_STREAMS_PER_HOST = 8
"""Of :data:`MAX_OPEN_STREAMS`, the most one host off loopback may hold: one host holding
all 32 (no token needed) left every other host's health watchers refused, which read a
refused ``Watch`` as the daemon down. Loopback peers are one host to a per-host cap
(every local client and SSH tunnel is 127.0.0.1), so only the total holds for them."""


class _HostShares:
    """What the callers of the open services (no token: each is its host) hold, counted
    in all against ``limit`` and by each host off loopback against ``per_host``; loopback
    peers (every local client and SSH tunnel, any 127.x address) only in all. Used by
    :class:`_StreamCap` (streams) and :class:`_OpenCalls` (health checks)."""

    def __init__(self, limit: int, per_host: int) -> None:
        self.limit = limit
        self.per_host = per_host
        self.open = 0
        self.hosts = Holds()

    def over(self, host: str) -> str:
        """``"all"`` if one more would pass ``limit``, else ``"host"`` if it would pass
        ``host``'s ``per_host``, else ``""``."""
        if self.open >= self.limit:
            return "all"
        if not _loopback_peer(host) and self.hosts.of(host) >= self.per_host:
            return "host"
        return ""

    def take(self, host: str) -> None:
        self.open += 1
        if not _loopback_peer(host):
            self.hosts.take(host)

    def give_back(self, host: str) -> None:
        self.open -= 1
        if not _loopback_peer(host):
            self.hosts.give_back(host)


class _StreamCap:
    """Counts the open services' streaming calls in flight (all on the event loop), in
    all and per host off loopback."""

    def __init__(self, limit: int, per_host: int = MAX_OPEN_STREAMS_PER_HOST) -> None:
        self.shares = _HostShares(limit, per_host)

    def bounded(self, handler: Any) -> Any:
        """``handler`` with its streaming behaviour counted against the cap."""
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._counted(handler.unary_stream))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._counted(handler.stream_stream))
        return handler

    def _counted(self, inner: Callable[[Any, Any], Any]) -> Any:
        """A streaming behaviour (of a request, or of a request stream) held to the cap."""

        async def counted(request: Any, context: Any) -> AsyncIterator[Any]:
            async with self._held(context):
                async for item in relay(inner(request, context)):
                    yield item

        return counted

    @contextlib.asynccontextmanager
    async def _held(self, context: Any) -> AsyncIterator[None]:
        host, shares = _peer_host(context.peer()), self.shares
        over = shares.over(host)
        if over == "all":
            refusals(host, "open streams", "open-service stream refused", limit=shares.limit)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{shares.open} health and reflection streams are open, the most at once "
                f"({shares.limit}); close one, or use Health.Check",
            )
        if over == "host":
            refusals(host, "open streams of a host", "open-service stream refused",
                     per_host=shares.per_host)  # fmt: skip
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{shares.hosts.of(host)} health and reflection streams of this host are "
                f"open, the most one host may hold ({shares.per_host}); close one, or use "
                "Health.Check",
            )
        shares.take(host)
        try:
            yield
        finally:
            shares.give_back(host)


REQUEST_SECONDS = 10.0
"""How long a call may take, once started, to send its request message. gRPC counts a
call against ``connections.max_calls`` from its start, but a unary-request behaviour runs
only once the message has come: calls that never sent one, from any host and without a
token, held every slot for good (10 connections of 100 such calls refused every tenant's
calls for as long as they stayed open). So every unary-request call is served as a
streaming one: the caller is authenticated and charged from its metadata first, then its
message is read within this time (DEADLINE_EXCEEDED past it)."""

MAX_UNREAD = 8
"""The most calls of one client (its token's name, or its host without one) waiting for
their request message at once; past it a new one is RESOURCE_EXHAUSTED. With
:data:`REQUEST_SECONDS`, what keeps one client from holding ``max_calls`` this way."""


class _FirstMessage:
    """Reads the one request of a unary-request call, bounded per client in count and
    time (:data:`MAX_UNREAD`, :data:`REQUEST_SECONDS`; all on the event loop)."""

    def __init__(self, limit: int = MAX_UNREAD, seconds: float = REQUEST_SECONDS) -> None:
        self.limit = limit
        self.seconds = seconds
        self.waiting = Holds()

    async def read(self, client: str, requests: AsyncIterator[Any], context: Any) -> Any:
        held = self.waiting.of(client)
        if held >= self.limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{held} calls of this client are waiting to send their request message, "
                f"the most at once ({self.limit})",
            )
        self.waiting.take(client)
        try:
            async with asyncio.timeout(self.seconds):  # no task per call, as wait_for's
                return await anext(requests)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call sent no request")
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no request message within {self.seconds:g} s of the call's start",
            )
        finally:
            self.waiting.give_back(client)
        raise AssertionError  # unreachable: abort raises


class _InFlight:
    """Counts each client's calls from their admission until they end, answer sent or
    not (all on the event loop), against ``connections.max_calls_per_client``.

    gRPC counts a call against ``connections.max_calls`` until its answer and status
    are sent. A client that never reads its answers (an HTTP/2 receive window of 0)
    held its calls in flight for as long as its connections stayed open: 10 connections
    of 100 such calls, health checks from any host included, refused every tenant's
    calls (an audit, 2026-11-27). Past the cap a new call is RESOURCE_EXHAUSTED; the
    count drops when the call ends (its done callback), however it ends."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls = Holds()

    async def hold(self, client: str, context: Any) -> None:
        held = self.calls.of(client)
        if held >= self.limit:
            refusals(client, "calls in flight", "calls in flight refused", limit=self.limit,
                     from_peer=context.peer())  # fmt: skip
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{held} calls of this client are in flight, the most at once "
                f"(connections.max_calls_per_client = {self.limit}); wait for their "
                "answers (read them) before more",
            )
        self.calls.take(client)
        context.add_done_callback(lambda _context: self.calls.give_back(client))


MAX_OPEN_CALLS_PER_HOST = 16
"""The most health-checking calls (``Check``, ``Watch``) one host off loopback may have
in flight at once, of the ``connections.max_calls_per_client`` all hosts share."""


class _OpenCalls:
    """The open services' unary-request calls in flight (health's ``Check`` and
    ``Watch``; reflection's streams are :class:`_StreamCap`'s alone), which take no
    token (each is its host's), counted from every host together against ``limit``
    (``connections.max_calls_per_client``: callers without a token are one client to
    it) and from one host off loopback against ``per_host``; loopback peers (a host's
    every 127.x address) only together.

    Counted per host alone, each host held ``limit``: a client that never read its
    answers (a receive window of 0) held 100 health checks from each of 11 loopback
    addresses (127.0.0.2, ...; off loopback, 10 addresses of one IPv6 prefix would do)
    and so all 1,000 of ``connections.max_calls``, with no token, for as long as it kept
    those 11 connections open: every tenant's and operator's calls were refused
    (``Concurrent RPC limit exceeded!``; the tenant audit). Now such callers hold at
    most ``limit`` of ``max_calls`` in all, and the tenants' calls the rest."""

    def __init__(self, limit: int, per_host: int = MAX_OPEN_CALLS_PER_HOST) -> None:
        self.shares = _HostShares(limit, min(per_host, limit))

    async def hold(self, client: str, context: Any) -> None:
        shares = self.shares
        over = shares.over(client)
        if over:
            mine = over == "host"  # its host's share, not the total
            cap = {"per_host": shares.per_host} if mine else {"limit": shares.limit}
            refusals(client, "open calls", "calls in flight refused", from_peer=context.peer(),
                     **cap)  # fmt: skip
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{shares.hosts.of(client)} health-checking calls of this host are in "
                f"flight, the most one host may have ({shares.per_host}); wait for their "
                "answers (read them) before more"
                if mine
                else f"{shares.open} health-checking calls are in flight from every "
                f"host together, the most at once (connections.max_calls_per_client = "
                f"{shares.limit}: callers without a token count as one client); try again",
            )
        shares.take(client)
        context.add_done_callback(lambda _context: shares.give_back(client))


def _read_first(
    handler: Any,
    admit: Callable[[Any], Awaitable[str]],
    first: _FirstMessage,
    calls: _InFlight | _OpenCalls,
) -> Any:
    """``handler`` with a unary request served as a streamed one (:data:`REQUEST_SECONDS`):
    ``admit(context)`` (which names the client) runs before the request is read, and the
    call counts against its client's calls in flight (:class:`_InFlight`, or for the open
    services :class:`_OpenCalls`); the behaviour then gets the request as ever.
    Streamed-request handlers: unchanged."""

    async def admitted(context: Any) -> str:
        client = await admit(context)
        await calls.hold(client, context)
        return client

    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        async def su(requests: Any, context: Any) -> Any:
            request = await first.read(await admitted(context), requests, context)
            return await unary_unary(request, context)

        return handler._replace(request_streaming=True, unary_unary=None, stream_unary=su)
    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        async def ss(requests: Any, context: Any) -> AsyncIterator[Any]:
            request = await first.read(await admitted(context), requests, context)
            async for item in relay(unary_stream(request, context)):
                yield item

        return handler._replace(request_streaming=True, unary_stream=None, stream_stream=ss)
    return handler


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates, authorises and rate-limits every RPC outside :data:`OPEN_SERVICES`,
    then makes the caller available to the servicer (:func:`current_caller`).

    Args:
        tokens: ``{sha256 hex: Caller}``; None: authentication off (every caller
            :data:`ANONYMOUS`).
        limiter: the per-client rate limit; None: none.
        per_client: the most calls of one client in flight at once
            (``connections.max_calls_per_client``).
    """

    def __init__(
        self,
        tokens: Mapping[str, Caller] | None,
        limiter: RateLimiter | None,
        per_client: int = 100,
    ) -> None:
        self.tokens = tokens
        self.limiter = limiter
        self._open_streams = _StreamCap(MAX_OPEN_STREAMS)
        self._first = _FirstMessage()
        self._calls = _InFlight(per_client)
        self._open_calls = _OpenCalls(per_client)
        self._memo = HandlerMemo()

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return handler
        return self._memo.wrapped(details.method, handler, self._wrapped)

    def _wrapped(self, method: str, handler: Any) -> Any:
        """``handler`` of ``method`` admitted (token, role, rate), its request read
        bounded in time."""
        if method.lstrip("/").split("/", 1)[0] in OPEN_SERVICES:
            return _read_first(
                self._open_streams.bounded(handler), _open_client, self._first, self._open_calls
            )
        if handler.request_streaming:  # none of oasis's own RPCs
            return _wrap(handler, lambda context: self._admit(method, context))
        return _read_first(handler, self._caller_of(method), self._first, self._calls)

    def _caller_of(self, method: str) -> Callable[[Any], Awaitable[str]]:
        """Admits a caller of ``method`` (:meth:`_admit`) and sets it for the call; returns
        its client name."""

        async def admit(context: Any) -> str:
            caller = await self._admit(method, context)
            _caller.set(caller)
            return caller.client

        return admit

    async def _admit(self, method: str, context: grpc.aio.ServicerContext) -> Caller:
        caller = ANONYMOUS
        if self.tokens is not None:
            caller = await self._authenticate(method, context)
            if caller.role is not Role.OPERATOR and method not in SUBMITTER_METHODS:
                await self._throttle(caller.name, context)  # its rate, as its other calls
                refusals(caller.name, f"denied {method}", "permission denied", method=method)
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{caller.name} ({caller.role}) may not call {method}: operators only",
                )
        client = caller.name or _peer_host(context.peer())
        await self._throttle(client, context)
        return dataclasses.replace(caller, client=client, turn=caller.name)

    async def _throttle(self, client: str, context: grpc.aio.ServicerContext) -> None:
        """Take one request from ``client``'s bucket, or abort with RESOURCE_EXHAUSTED."""
        if self.limiter is None:
            return
        wait = self.limiter.take(client)
        if wait > 0:
            ms = self.limiter.retry_hint_ms(wait)
            context.set_trailing_metadata((("grpc-retry-pushback-ms", str(ms)),))
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.limiter.words}; retry in {ms / 1000:.3f} s",
            )

    async def _authenticate(self, method: str, context: grpc.aio.ServicerContext) -> Caller:
        assert self.tokens is not None
        values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        scheme, _, token = (values[0] if values else "").partition(" ")
        if not values or scheme.lower() != "bearer" or not token.strip():
            await self._throttle(_peer_host(context.peer()), context)
            refusals(_peer_host(context.peer()), "no token", "unauthenticated", method=method,
                     why="no token")  # fmt: skip
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "no bearer token: send metadata 'authorization: Bearer TOKEN' (oasis: set "
                "$OASIS_TOKEN, or give --token after the command: oasis jobs --token TOKEN)",
            )
        caller = self.tokens.get(hash_token(token.strip()))
        if caller is None:
            # Guessing tokens costs the guesser's address its rate (and keeps its log
            # lines to that rate).
            await self._throttle(_peer_host(context.peer()), context)
            refusals(_peer_host(context.peer()), "bad token", "unauthenticated", method=method,
                     why="bad token")  # fmt: skip
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNKNOWN_TOKEN)
            raise AssertionError  # unreachable: abort raises
        return caller


async def _open_client(context: Any) -> str:
    """The client of an open-service call: its host (no token is asked)."""
    return _peer_host(context.peer())


def _loopback_peer(host: str) -> bool:
    """Whether a peer host as :func:`_peer_host` gives it (``ipv4:127.0.0.1``,
    ``ipv6:[::1]``, ``unix:...``) is this machine."""
    kind, _, address = host.partition(":")
    if kind.startswith("unix"):  # unix: and unix-abstract:
        return True
    # gRPC percent-encodes an IPv6 peer's brackets: ipv6:%5B::1%5D:49744
    return kind in ("ipv4", "ipv6") and is_loopback(unquote(address).strip("[]"))


def _peer_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` -> ``ipv4:127.0.0.1``: one bucket per host, not per port."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def _wrap(handler: Any, admit: Callable[[Any], Awaitable[Caller]]) -> Any:
    """A streamed-request ``handler`` with ``admit(context)`` run before its behaviour,
    whose caller is then set for the servicer (unary requests: :func:`_read_first`)."""
    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        async def su(requests: Any, context: Any) -> Any:
            _caller.set(await admit(context))
            return await stream_unary(requests, context)

        return handler._replace(stream_unary=su)
    stream_stream = handler.stream_stream

    async def ss(requests: Any, context: Any) -> AsyncIterator[Any]:
        _caller.set(await admit(context))
        async for item in stream_stream(requests, context):
            yield item

    return handler._replace(stream_stream=ss)
