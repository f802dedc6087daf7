"""How the client commands reach the daemon: options, address, channel, and errors in
words a person can act on (or JSON with ``--json``).

Exit status of a client command: 0 done (a job admitted), 3 a job rejected, 2 bad input
(INVALID_ARGUMENT or a file the client cannot use), 1 anything else (the daemon
unreachable or stopping, NOT_FOUND, ALREADY_EXISTS, ...). With ``--json`` an error is one
JSON object on standard output, ``{"error": {"code", "message", "field", "problems"}}``
(the trace tools, ``replay`` and ``offline``, keep standard output for SPEC 6 and say
what is wrong on standard error).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from controller.clock import SlotTimes
from controller.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    InputError,
    call_timeout,
    problem_lines,
)
from controller.commands.failover import (
    KEEPALIVE_OPTIONS,
    FollowingStub,
    LeaderPool,
    redirected_by,
    split_servers,
    tried_address,
)
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel, read_pem
from pricing.errors import Problem, SpecError

_T = TypeVar("_T")

__all__ = [
    "CHECK_IT",
    "DEFAULT_PORT",
    "DEFAULT_SERVER",
    "EXIT_REJECTED",
    "SILENT_WORDS",
    "PartialFailureError",
    "Stubs",
    "daemon_address",
    "guarded",
    "options",
    "print_json",
    "report_error",
    "retry_pushback",
    "took_but_silent",
    "unreachable_cause",
]

DEFAULT_PORT = 50051
DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
EXIT_REJECTED = 3


def daemon_address(text: str) -> str:
    """``HOST`` -> ``HOST:50051``; ``HOST:PORT``, ``[::1]:PORT`` and gRPC target URIs
    (``dns:///...``, ``unix:...``) stay as given; a bare IPv6 address gets brackets."""
    text = text.strip()
    if not text or "/" in text or text.startswith(("unix:", "dns:", "ipv4:", "ipv6:")):
        return text
    if text.startswith("["):
        return text if "]:" in text else f"{text}:{DEFAULT_PORT}"
    if text.count(":") > 1:  # a bare IPv6 address
        return f"[{text}]:{DEFAULT_PORT}"
    host, sep, port = text.rpartition(":")
    return text if sep and host and port else f"{text.rstrip(':')}:{DEFAULT_PORT}"


_URL_SCHEMES = ("http", "https", "grpc", "grpcs")
"""Schemes of URLs, not of gRPC targets (``dns:``, ``unix:``, ...), given as ``--server``."""


def _checked(address: str) -> str:
    """``address`` (as :func:`daemon_address` gives it) if its host and port can name a
    daemon; InputError naming ``--server`` if not (``:`` became ``:50051:50051``, and
    port 99999 was reported as "nothing listens there"; ``http://head:50051``, the
    console's kind of address, as gRPC's "errors resolving ... Misformatted domain
    name")."""
    scheme, sep, rest = address.partition("://")
    if sep and scheme.lower() in _URL_SCHEMES:
        host_port = rest.split("/", 1)[0] or "HOST:PORT"
        tls = " (TLS: --tls, or --tls-ca FILE)" if scheme.lower() in ("https", "grpcs") else ""
        raise InputError(
            f"--server {address!r}: is a URL; give the daemon's gRPC address as HOST[:PORT]: "
            f"{host_port}{tls} (the console's http:// address is another port)"
        )
    if "/" in address or address.startswith(("unix:", "dns:", "ipv4:", "ipv6:")):
        return address
    host, _, port = address.rpartition(":")
    if not host.strip("[]") or not port.isascii() or not port.isdigit():
        raise InputError(f"--server {address!r}: not HOST[:PORT]")
    if not 1 <= int(port) <= 65535:
        raise InputError(f"--server {address!r}: the port must be 1..65535, got {port}")
    return address


_ENV_OPTIONS = (
    ("--tls-ca", "OASIS_TLS_CA", "FILE", "use TLS, trusting this CA"),
    ("--tls-cert", "OASIS_TLS_CERT", "FILE", "client certificate for mutual TLS"),
    ("--tls-key", "OASIS_TLS_KEY", "FILE", "its private key"),
    ("--token", "OASIS_TOKEN", "TOKEN", "bearer token, better from the environment (not in ps)"),
)


def options() -> argparse.ArgumentParser:
    """The options every client command shares (a parent parser)."""
    p = argparse.ArgumentParser(add_help=False)
    env = os.environ.get
    p.add_argument(
        "--server",
        default=env("OASIS_SERVER", DEFAULT_SERVER),
        metavar="HOST[:PORT][,...]",
        help=f"the daemon's address; the port defaults to {DEFAULT_PORT}; several head nodes "
        f"separated by commas: the leader is found and followed "
        f"(default: $OASIS_SERVER or {DEFAULT_SERVER})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--timeout", type=call_timeout, default=30.0, help="seconds per call (default 30)"
    )
    p.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CAs")
    for flag, var, meta, what in _ENV_OPTIONS:
        p.add_argument(flag, metavar=meta, default=env(var, ""), help=f"{what} (default: ${var})")
    p.add_argument(
        "--tls-server-name",
        metavar="NAME",
        default="",
        help="name to verify in the daemon's certificate (default: its host)",
    )
    return p


def _connect(
    args: argparse.Namespace, address: str, options: list[tuple[str, Any]] | None = None
) -> grpc.Channel:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InputError("--tls-cert and --tls-key go together")

    def pem(path: str, what: str, option: str) -> bytes | None:
        if not path:
            return None
        try:
            return read_pem(Path(path), what, option, pipes=True)
        except SpecError as err:
            raise InputError(str(err)) from err

    return client_channel(
        daemon_address(address),
        tls=args.tls,
        ca_pem=pem(args.tls_ca, "CERTIFICATE", "--tls-ca"),
        cert_pem=pem(args.tls_cert, "CERTIFICATE", "--tls-cert"),
        key_pem=pem(args.tls_key, "PRIVATE KEY", "--tls-key"),
        server_name=args.tls_server_name,
        token=bearer_token(args.token),
        options=options,
    )


def retry_pushback(err: grpc.RpcError) -> float | None:
    """The seconds a refused call may be made again after, as the daemon names them in
    its ``grpc-retry-pushback-ms`` trailer (a client over its rate: refused before the
    request was read); None without one, or with one that is not a count of ms (another
    cap, ``max_in_flight`` or a limit, where no wait makes room)."""
    hint = dict(err.trailing_metadata() or ()).get("grpc-retry-pushback-ms", "")
    if not (isinstance(hint, str) and hint.isascii() and hint.isdigit()):
        return None
    return int(hint) / 1000


def bearer_token(token: str) -> str:
    """``--token`` (or ``$OASIS_TOKEN``) as sent: without the whitespace around it (a
    token read from a file with Windows line ends keeps its ``\\r``; the daemon strips
    it too). InputError, naming the option, for any other character that is not
    printable ASCII: gRPC sends no other in a header, and every call failed with
    ``INTERNAL: Invalid metadata``, naming neither the token nor the character."""
    token = token.strip()
    for i, c in enumerate(token):
        if not " " <= c <= "~":
            raise InputError(
                f"--token (or $OASIS_TOKEN): holds {c!r} at character {i + 1}, which a "
                "token cannot hold (printable ASCII only, as oasis token makes them): "
                "was it copied whole and alone?"
            )
    return token


class Stubs:
    """The stubs of one command, and the daemon's slot clock.

    ``--server`` may name several head nodes, ``a:50051,b:50051``: calls then go to the
    leader and are retried over the nodes (:mod:`controller.commands.failover`) for up to
    ``--timeout`` seconds in all."""

    def __init__(self, args: argparse.Namespace) -> None:
        addresses = [_checked(daemon_address(a)) for a in split_servers(args.server)]
        if not addresses:
            raise InputError("--server: no address given")
        self._check_tls(args)
        bearer_token(args.token)  # before any call: a bad one is the caller's to mend
        pings = KEEPALIVE_OPTIONS if len(addresses) > 1 else None  # a paused node: the next
        self.pool = LeaderPool(addresses, lambda a: _connect(args, a, pings), budget=args.timeout)
        self.channel = self.pool.channel()
        self.admission: Any = FollowingStub(self.pool, pb_grpc.AdmissionStub)
        self.cluster: Any = FollowingStub(self.pool, pb_grpc.ClusterStub)
        self.timeout = args.timeout
        self._info: pb.GetClusterInfoResponse | None = None

    @staticmethod
    def _check_tls(args: argparse.Namespace) -> None:
        if bool(args.tls_cert) != bool(args.tls_key):
            raise InputError("--tls-cert and --tls-key go together")

    @property
    def address(self) -> str:
        """The node the last call went to (the leader, once found)."""
        return self.pool.address

    def info(self) -> pb.GetClusterInfoResponse | None:
        """The daemon's slot clock (GetClusterInfo), fetched once (:meth:`paced`); None
        from a daemon that does not offer it."""
        if self._info is None:
            try:
                call = functools.partial(
                    self.cluster.GetClusterInfo, pb.GetClusterInfoRequest(), timeout=self.timeout
                )
                self._info = self.paced(call)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                return None
        return self._info

    def paced(self, call: Callable[[], _T]) -> _T:
        """``call()``, made again after the wait the daemon names when it refused it for
        the client's rate (RESOURCE_EXHAUSTED with a ``grpc-retry-pushback-ms`` trailer:
        refused before it was read, so nothing was done), for up to ``--timeout`` seconds
        of waiting in all. Before, a list longer than the rate's burst (40 with the
        example config) stopped at the first item past it, the rest not sent, though the
        daemon said to retry in a few milliseconds; and the slot clock asked after a
        submission's answer, refused so, failed the command (exit 1, RESOURCE_EXHAUSTED,
        which reads as "not admitted") with its job admitted."""
        waited = 0.0
        while True:
            try:
                return call()
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                seconds = retry_pushback(err)
                if seconds is None or waited + seconds > self.timeout:
                    raise  # another cap (max_in_flight, a limit), or past --timeout of waits
                time.sleep(seconds)
                waited += seconds

    def times(self) -> SlotTimes | None:
        """Slot numbers to times, or None (see :meth:`info`)."""
        info = self.info()
        return None if info is None else SlotTimes(info.epoch, info.slot_seconds)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=1))


def guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``func`` with its failures reported (see the module docstring)."""

    def run(args: argparse.Namespace) -> int:
        extra: dict[str, Any] = {}
        try:
            return func(args)
        except PartialFailureError as partial:
            err, extra = partial.cause, partial.extra
        except grpc.RpcError as rpc_error:
            err = rpc_error
        except InputError as bad:  # a job file the client cannot use
            if not args.json:
                raise
            return report_error(args, "INVALID_ARGUMENT", str(bad), bad.problems, bad.extra,
                                bad.about)  # fmt: skip
        code = err.code()
        problems = _field_violations(err)
        message = _explain(code, err.details() or "", args, tried_address(err))
        sizes = _TOO_LARGE.search(err.details() or "")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and sizes:  # a job file too large:
            sent, most = (int(n) for n in sizes.groups())  # bad input (exit 2), not load
            message = (
                f"the request is {sent:,} bytes, more than the daemon takes ({most:,}, its "
                "[limits] max_message_bytes): a job that large is refused whatever the load"
            )
            return report_error(args, "INVALID_ARGUMENT", message, [], extra)
        said = redirected_by(err)
        if said:  # a standby sent the call to a leader that is gone: what it said
            message += f" ({said})"
        flags: dict[str, str] = getattr(args, "api_flags", None) or {}
        if flags:  # the request's field the command's option filled: name the option
            problems = [Problem(flags.get(p.field, p.field), p.reason) for p in problems]
            for field, flag in flags.items():
                message = re.sub(rf"(?m)^(\s*){re.escape(field)}:", rf"\g<1>{flag}:", message)
        return report_error(args, code.name, message, problems, extra)

    return run


_TOO_LARGE = re.compile(r"Received message larger than max \((\d+) vs\. (\d+)\)")
"""gRPC's refusal of a request over the daemon's ``grpc.max_receive_message_length``."""


class PartialFailureError(Exception):
    """A call failed after others of the same command took effect: ``cause`` is the
    failed call's error, ``extra`` what took effect, for ``--json`` (top-level keys
    next to ``error``)."""

    def __init__(self, cause: grpc.RpcError, extra: dict[str, Any]) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.extra = extra


_OPTION_ERROR = re.compile(r"(-o|--[a-z][a-z0-9-]*)(?: \(or \$[A-Z_]+\))?(?: '[^']*'| [^\s:']+)?:")
"""A client's refusal of one option's value, as it begins (``--server 'h:0': ...``,
``--token (or $OASIS_TOKEN): ...``): with ``--json`` that option is the error's field,
as for argparse's usage errors (it was ``""``, the option named in the message alone).
A message naming two (``--tls-cert and --tls-key go together``) names no one field."""


def report_error(
    args: argparse.Namespace,
    code: str,
    message: str,
    problems: Sequence[Problem] = (),
    extra: dict[str, Any] | None = None,
    about: Sequence[dict[str, Any]] = (),
) -> int:
    """Show an error (text on stderr, or with ``--json`` one JSON object on stdout:
    ``{"error": {"code", "message", "field", "problems"}}`` and ``extra``'s keys, each
    problem ``{"field", "message"}`` and its ``about``'s); return the exit status: 2 for
    INVALID_ARGUMENT, else 1."""
    status = EXIT_BAD_INPUT if code == "INVALID_ARGUMENT" else EXIT_FAILURE
    if getattr(args, "json", False):
        option = _OPTION_ERROR.match(message) if code == "INVALID_ARGUMENT" else None
        if option and not problems:  # the client's own refusal of an option's value
            problems = [Problem(option[1], message[option.end() :].strip())]
        keys = list(about) + [{}] * (len(problems) - len(about))
        error = {
            "code": code,
            "message": message,
            "field": problems[0].field if problems else "",
            "problems": [
                {"field": p.field, "message": p.reason, **more}
                for p, more in zip(problems, keys, strict=False)
            ],
        }
        # a stream of one event per line (watch) ends with an error of one line too
        indent = None if getattr(args, "command", "") == "watch" else 1
        print(json.dumps({"error": error, **(extra or {})}, indent=indent))
    elif problems:
        lines = problem_lines(problems, "--json lists every one")
        print(f"oasis {args.command}: {code}: invalid input:\n{lines}", file=sys.stderr)
    else:
        print(f"oasis {args.command}: {code}: {message}", file=sys.stderr)
    if not getattr(args, "json", False) and extra and isinstance(extra.get("note"), str):
        print(f"oasis {args.command}: {extra['note']}", file=sys.stderr)
    return status


def _field_violations(err: grpc.RpcError) -> list[Problem]:
    """The BadRequest field violations of an error (controller/statuses.py), if any."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    try:
        status = rpc_status.from_call(err)
    except ValueError:  # trailer and status disagree: trust neither
        return []
    out: list[Problem] = []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            request = error_details_pb2.BadRequest()
            detail.Unpack(request)
            out.extend(Problem(v.field, v.description) for v in request.field_violations)
    return out


_CAUSES = (
    ("connection refused", "connection refused: nothing listens there"),
    ("dns resolution failed", "the host name does not resolve"),
    ("name resolution", "the host name does not resolve"),
    # before "ssl": gRPC's words for a certificate that names neither the --server host
    # nor --tls-server-name (the client audit: shown raw, "Custom verification check
    # failed with error: UNAUTHENTICATED: Hostname Verification Check failed.")
    (
        "hostname verification",
        "the daemon's certificate does not hold the name it was called by (the --server "
        "host, or --tls-server-name)",
    ),
    ("ssl", "the TLS handshake failed"),
    ("handshake", "the TLS handshake failed"),
    ("deadline", "no answer in time"),
    ("socket closed", "the connection was closed"),
    ("connection reset", "the connection was reset"),
    ("http1", "an HTTP/1 server answered there, not oasisd's gRPC (the console's port?)"),
    ("parsing http/2", "something other than gRPC answered there (the console's port?)"),
)


_SILENT = ("before receiving settings frame", "ping timeout", "keepalive watchdog timeout")
"""gRPC's words for a peer that took the TCP connection (the kernel's doing) but did not
answer: the connection's HTTP/2 start, or a keepalive ping during a call, timed out."""


_OPERATORS_ONLY = re.compile(r"(.+) \((\w+)\) may not call /[\w.]+/(\w+): operators only")
"""The daemon's refusal of a call to a submitter (``controller/auth.py``), which named
the call's path alone: ``oasis status`` with a tenant's token said ``alice (submitter)
may not call /oasis.v1.Cluster/ListServers: operators only``."""


SILENT_WORDS = (
    "it took the connection but did not answer (the process stopped or hung: SIGSTOP, a "
    "frozen host; or another program holds the port)"
)
"""What is known of a node that :func:`took_but_silent`: up as far as the kernel goes."""

CHECK_IT = "Check oasisd there (systemctl status oasisd, and its log)"


def took_but_silent(code: grpc.StatusCode, details: str) -> bool:
    """Whether a call failed for want of an answer from a node that took the TCP
    connection (a connection's HTTP/2 start or a keepalive ping timed out), not for a
    refused or unresolvable address: the process there stopped or hung."""
    lowered = details.lower()
    return (
        code == grpc.StatusCode.UNAVAILABLE
        and any(key in lowered for key in _SILENT)
        and not lowered.startswith("this oasisd ")
    )


def unreachable_cause(details: str) -> str:
    """The cause of a failed connection in words (``connection refused: nothing listens
    there``), or gRPC's own words shortened."""
    lowered = details.lower()
    return next((why for key, why in _CAUSES if key in lowered), _shortened(details))


def _shortened(text: str, most: int = 200) -> str:
    """``text``, or its first words within ``most`` characters and "..." (not cut
    mid-word: "Trying to connect an http1.x serv")."""
    if len(text) <= most:
        return text
    cut = text[:most].rsplit(" ", 1)[0]
    return f"{cut.rstrip(' .,;:')}..."


def _where(args: argparse.Namespace, tried: str | None) -> str:
    """The node a failed call went to, as the user named it, and the others named: the
    whole comma list read as one address gave "[a:1,b:2]:50051"; a standby's redirect
    to a dead leader read as the standby being down."""
    named = [daemon_address(a) for a in split_servers(args.server)] or [args.server]
    where = tried or named[0]
    if where not in named:
        return f"{where} (the leader a node of --server named)"
    return f"{where} (tried last of {', '.join(named)})" if len(named) > 1 else where


def store_unavailable(details: str) -> bool:
    """Whether a call's error text is the daemon's store outage: its messages begin with
    ``controller.errors.STORE_UNAVAILABLE`` (not imported here: that loads numpy)."""
    return details.lower().startswith("the store is unavailable")


def _explain(
    code: grpc.StatusCode, details: str, args: argparse.Namespace, tried: str | None = None
) -> str:
    """The server's message, or for a daemon that cannot be reached, what to check;
    ``tried``: the node the call went to last (:func:`.failover.tried_address`)."""
    address = _where(args, tried)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return (
            f"no answer from {address} within --timeout {args.timeout:g} s. Check that "
            "oasisd runs there (it may be busy, or the address a different service)"
        )
    denied = _OPERATORS_ONLY.fullmatch(details)
    if code == grpc.StatusCode.PERMISSION_DENIED and denied:
        name, role, method = denied.groups()
        return (
            f"{name}'s token is a {role}'s: this command calls {method}, which operators "
            "alone may call (it reads or changes what every tenant shares). Give an "
            "operator's token ($OASIS_TOKEN or --token), or ask an operator"
        )
    lowered = details.lower()
    if took_but_silent(code, details):
        return f"cannot reach the daemon at {address}: {SILENT_WORDS}. {CHECK_IT}"
    unreachable = (
        code == grpc.StatusCode.UNAVAILABLE
        and not store_unavailable(details)  # the daemon answered: its store is out
        # a node's refusal (controller.errors.NotLeaderError), which may quote its store's
        # "Connection refused": that node answered (the HA audit)
        and not lowered.startswith("this oasisd ")
        and (
            "failed to connect" in lowered
            or ("connect" in lowered and "draining" not in lowered)
            or any(key in lowered for key, _ in _CAUSES)
        )
    )
    if not unreachable:
        return details
    cause = unreachable_cause(details)
    tls = (
        "the daemon's certificate and --tls-ca (or --tls-server-name), or whether it "
        "serves TLS at all (one without [tls] serves plaintext: call it without --tls)"
        if args.tls or args.tls_ca
        else "whether the daemon serves TLS (then give --tls-ca FILE or --tls)"
    )
    return (
        f"cannot reach the daemon at {address}: {cause}. Check that oasisd runs there "
        "(systemctl status oasisd; it logs 'oasisd listening on HOST:PORT'), that "
        f"--server or $OASIS_SERVER names that address (default port {DEFAULT_PORT}), "
        f"and {tls}"
    )
