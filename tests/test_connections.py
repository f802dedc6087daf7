"""Connections cannot exhaust the daemon: idle TCP connections past ``max_connections`` are
closed at accept, those that never start HTTP/2 are closed after ``handshake_seconds``,
idle gRPC connections after ``idle_seconds``; the daemon's descriptors stay bounded and
it keeps serving a normal client. Before the caps (controller/connections.py) 1,100 idle
connections exhausted the unit's 1,024 descriptors."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.config import ConfigError, from_dict
from controller.connections import Connections
from tests.servers import CLUSTER_TOML, Daemon, write_config

NOFILE = 256  # the daemon's descriptor limit in this test
CAP = 32
IDLE_SOCKETS = 400  # more than the daemon has descriptors


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_connections_cannot_exhaust_descriptors(tmp_path: Path) -> None:
    extra = f"\n[connections]\nmax_connections = {CAP}\nhandshake_seconds = 2\nidle_seconds = 1\n"
    config = write_config(tmp_path / "c.toml", tmp_path / "data", extra=extra)
    log = tmp_path / "c.log"
    daemon = Daemon(config, log, nofile=NOFILE).start()
    host, port = daemon.address.rsplit(":", 1)
    idle: list[socket.socket] = []
    try:
        assert daemon.proc is not None
        baseline = _fds(daemon.proc.pid)
        for _ in range(IDLE_SOCKETS):
            s = socket.create_connection((host, int(port)), timeout=5)
            idle.append(s)  # connected, never speaks
        time.sleep(0.5)
        assert _fds(daemon.proc.pid) <= baseline + CAP + 8, (baseline, _fds(daemon.proc.pid))
        # a normal client gets through while the idle sockets are still open on this side
        with grpc.insecure_channel(daemon.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

            # an idle gRPC connection is closed after idle_seconds: the channel goes IDLE
            states: list[grpc.ChannelConnectivity] = []
            went_idle = threading.Event()

            def seen(state: grpc.ChannelConnectivity) -> None:
                states.append(state)
                if (
                    state == grpc.ChannelConnectivity.IDLE
                    and grpc.ChannelConnectivity.READY in states
                ):
                    went_idle.set()

            channel.subscribe(seen)
            assert went_idle.wait(30), states
            channel.unsubscribe(seen)
        assert daemon.proc.poll() is None
        assert "Too many open files" not in log.read_text()
    finally:
        for s in idle:
            s.close()
        assert daemon.stop() == 0, log.read_text()


def test_connections_settings_are_checked() -> None:
    import tomllib

    base = tomllib.loads(CLUSTER_TOML)
    config = from_dict({**base, "connections": {"max_connections": 10, "idle_seconds": 0.5}})
    assert config.connections == Connections(max_connections=10, idle_seconds=0.5)
    options = dict(config.connections.server_options())
    assert options["grpc.max_allowed_incoming_connections"] == 10
    assert options["grpc.max_connection_idle_ms"] == 500
    assert from_dict(base).connections == Connections()
    smaller = from_dict({**base, "connections": {"max_calls": 50}}).connections
    assert (smaller.max_calls, smaller.max_calls_per_client) == (50, 50)  # the default, capped
    for bad, message in [
        ({"max_connections": 0}, "connections.max_connections: must be >= 1"),
        ({"max_calls": 10**9}, "connections.max_calls: must be <= 1000000"),
        ({"idle_seconds": -1}, "connections.idle_seconds: must be > 0"),
        ({"keepalive_seconds": 1e9}, "connections.keepalive_seconds: must be <= 86400"),
        ({"streams": 1}, "connections.streams: unknown key"),
        (
            {"max_calls": 50, "max_calls_per_client": 60},
            r"connections.max_calls_per_client: must be <= connections.max_calls \(50\), got 60",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            from_dict({**base, "connections": bad})


def _never_sent(channel: grpc.Channel, method: str, n: int, token: str | None) -> list[Any]:
    """``n`` calls of ``method`` that never send their request message (the stream stays
    open until the test ends), as futures."""
    call = channel.stream_unary(method, request_serializer=bytes, response_deserializer=bytes)
    metadata = (("authorization", f"Bearer {token}"),) if token else None

    def never() -> Iterator[bytes]:
        _STOP.wait(120)
        yield from ()

    return [call.future(never(), metadata=metadata, timeout=120) for _ in range(n)]


_STOP = threading.Event()


def _ended(futures: list[Any], seconds: float) -> dict[grpc.StatusCode, int]:
    """Codes of the calls that ended within ``seconds`` (the others still held)."""
    deadline = time.monotonic() + seconds
    codes: dict[grpc.StatusCode, int] = {}
    for f in futures:
        try:
            f.result(timeout=max(deadline - time.monotonic(), 0.01))
        except grpc.FutureTimeoutError:
            continue
        except grpc.RpcError as err:
            codes[err.code()] = codes.get(err.code(), 0) + 1
    return codes


def test_calls_that_never_send_their_request_cannot_hold_every_call(tmp_path: Path) -> None:
    """gRPC counts a call against ``max_calls`` from its start, but a unary behaviour runs
    once its message has come. Before: 60 calls that never sent one, from a host without
    a token, held ``max_calls = 40`` for good and every tenant's calls were refused. Now
    the caller is checked from its metadata first (no token: refused at once), a client
    waits on at most MAX_UNREAD messages at once, each for REQUEST_SECONDS."""
    from controller.auth import MAX_UNREAD, REQUEST_SECONDS, hash_token
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc

    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"alice submitter {hash_token('alice-token')}\n"
        f"mallory submitter {hash_token('mallory-token')}\n"
    )
    extra = (f'\n[connections]\nmax_calls = 40\nmax_calls_per_client = 10\n'
             f'[auth]\ntokens_file = "{tokens}"\n')  # fmt: skip
    config = write_config(tmp_path / "c.toml", tmp_path / "data", extra=extra)
    daemon = Daemon(config, tmp_path / "c.log").start()
    _STOP.clear()
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            get = "/oasis.v1.Admission/GetJob"
            anonymous = _never_sent(channel, get, 60, None)
            assert _ended(anonymous, 5.0) == {grpc.StatusCode.UNAUTHENTICATED: 60}
            held = _never_sent(channel, get, 30, "mallory-token")
            refused = _ended(held, 3.0)
            assert refused == {grpc.StatusCode.RESOURCE_EXHAUSTED: 30 - MAX_UNREAD}, refused
            checks = _never_sent(channel, "/grpc.health.v1.Health/Check", 30, None)
            refused = _ended(checks, 3.0)
            assert refused == {grpc.StatusCode.RESOURCE_EXHAUSTED: 30 - MAX_UNREAD}, refused
            # 16 calls held: alice is served; a health check from this host is not, as
            # its host holds its MAX_UNREAD (another host's would be)
            alice = (("authorization", "Bearer alice-token"),)
            info = pb_grpc.ClusterStub(channel).GetClusterInfo(
                pb.GetClusterInfoRequest(), metadata=alice, timeout=10
            )
            assert info.slot_seconds > 0
            health = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.RpcError) as refused_check:
                health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert refused_check.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # the held ones end once their time to send a message is over
            late = _ended(held + checks, REQUEST_SECONDS + 5.0)
            assert late.get(grpc.StatusCode.DEADLINE_EXCEEDED) == 2 * MAX_UNREAD, late
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
                health_pb2.HealthCheckResponse.SERVING
            )

            # calls whose answers are never read (a receive window of 0) stay in flight
            # until their connection closes: at most max_calls_per_client of a client.
            # Before: these 45 held all 40 of max_calls and every tenant was refused.
            cluster = pb_grpc.ClusterStub(channel)
            mallory = (("authorization", "Bearer mallory-token"),)
            stalled = [_Unread(daemon.address, "/oasis.v1.Cluster/GetClusterInfo", 15,
                               "mallory-token") for _ in range(2)]  # fmt: skip
            stalled.append(_Unread(daemon.address, "/grpc.health.v1.Health/Check", 15, ""))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # until mallory's ten are held
                try:
                    cluster.GetClusterInfo(pb.GetClusterInfoRequest(), metadata=mallory, timeout=10)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    assert "max_calls_per_client = 10" in str(err.details()), err.details()
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("mallory's unread calls were never counted")
            time.sleep(0.5)  # the health checks too
            info = cluster.GetClusterInfo(pb.GetClusterInfoRequest(), metadata=alice, timeout=10)
            assert info.slot_seconds > 0  # alice is served
            for unread in stalled:
                unread.close()
            _served_once_released(  # closed: the calls end, the count drops
                lambda: cluster.GetClusterInfo(
                    pb.GetClusterInfoRequest(), metadata=mallory, timeout=10
                )
            )
    finally:
        _STOP.set()
        assert daemon.stop() == 0, (tmp_path / "c.log").read_text()


def _served_once_released(call: Callable[[], object], seconds: float = 20.0) -> None:
    """Make ``call`` until it is served, refused RESOURCE_EXHAUSTED meanwhile: the calls
    that held the cap were closed, and must be released within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            call()
            return
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert time.monotonic() < deadline, "the closed calls were never released"
            time.sleep(0.2)


class _Unread:
    """``n`` gRPC calls of ``path`` on one raw HTTP/2 connection that advertises a stream
    receive window of 0, so no answer can ever be sent: the calls stay in flight until
    :meth:`close`. ``source``: the local address to connect from (another loopback
    address is another host to the daemon). A thread answers the daemon's SETTINGS and
    PINGs (so keepalive does not close it)."""

    def __init__(self, address: str, path: str, n: int, token: str, source: str = "") -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection(
            (host, int(port)), timeout=10, source_address=(source, 0) if source else None
        )
        headers = b"".join(_literal(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", address),
            ("content-type", "application/grpc"), ("te", "trailers"),
            *((("authorization", f"Bearer {token}"),) if token else ()),
        ))  # fmt: skip
        out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, struct.pack(">HI", 4, 0))
        for stream in range(1, 2 * n, 2):  # HEADERS (END_HEADERS), DATA: an empty message
            out += _frame(1, 4, stream, headers) + _frame(0, 1, stream, b"\x00" * 5)
        self.sock.sendall(out)
        self.closed = threading.Event()
        threading.Thread(target=self._answer, daemon=True).start()

    def _answer(self) -> None:
        buf = b""
        self.sock.settimeout(0.5)
        while not self.closed.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            buf += data
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                payload, buf = buf[9 : 9 + size], buf[9 + size :]
                with contextlib.suppress(OSError):
                    if kind == 4 and not flags & 1:  # SETTINGS: acknowledge
                        self.sock.sendall(_frame(4, 1, 0))
                    elif kind == 6 and not flags & 1:  # PING: answer
                        self.sock.sendall(_frame(6, 1, 0, payload))

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


def test_health_checks_from_many_hosts_cannot_hold_every_call(tmp_path: Path) -> None:
    """The tenant audit: the open services' calls (no token) were capped per host alone,
    so a client that never read its answers held ``max_calls_per_client`` health checks
    from each of 11 loopback addresses, all 1,000 of ``max_calls``, and every tenant's
    and operator's call was refused (``Concurrent RPC limit exceeded!``) for as long as
    it kept its 11 connections. Here 5 addresses of 10 such calls against ``max_calls =
    40``. Callers without a token now hold ``max_calls_per_client`` in all."""
    from controller.auth import hash_token
    from controller.rpc import oasis_pb2 as pb
    from controller.rpc import oasis_pb2_grpc as pb_grpc

    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice submitter {hash_token('alice-token')}\n")
    extra = (f'\n[connections]\nmax_calls = 40\nmax_calls_per_client = 10\n'
             f'[auth]\ntokens_file = "{tokens}"\n')  # fmt: skip
    config = write_config(tmp_path / "c.toml", tmp_path / "data", extra=extra)
    daemon = Daemon(config, tmp_path / "c.log").start()
    check = "/grpc.health.v1.Health/Check"
    stalled = [_Unread(daemon.address, check, 10, "", f"127.0.0.{i}") for i in range(2, 7)]
    try:
        with grpc.insecure_channel(daemon.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 20
            while True:  # until the stalled checks are held
                try:
                    health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    assert "max_calls_per_client = 10" in str(err.details()), err.details()
                    assert "count as one client" in str(err.details()), err.details()
                    break
                assert time.monotonic() < deadline, "the stalled health checks were never held"
                time.sleep(0.1)
            alice = (("authorization", "Bearer alice-token"),)
            cluster = pb_grpc.ClusterStub(channel)
            for _ in range(5):  # alice is served (before: RESOURCE_EXHAUSTED, every call)
                info = cluster.GetClusterInfo(pb.GetClusterInfoRequest(), metadata=alice,
                                              timeout=10)  # fmt: skip
                assert info.slot_seconds > 0
            for unread in stalled:
                unread.close()
            _served_once_released(  # closed: the calls end, the count drops
                lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            )
    finally:
        for unread in stalled:
            unread.close()
        assert daemon.stop() == 0, (tmp_path / "c.log").read_text()


def test_one_host_off_loopback_holds_at_most_its_share_of_the_open_calls() -> None:
    """Of the open services' calls in flight (``max_calls_per_client`` from every host
    together), one host off loopback holds at most ``MAX_OPEN_CALLS_PER_HOST``, so it
    cannot leave every other host's health checks refused; loopback peers only the
    total. (A remote peer is out of the tests' reach: a call context stands in.)"""
    import asyncio

    from controller.auth import _OpenCalls
    from tests.test_limit_checks import Context, RefusedError

    async def scenario() -> None:
        calls = _OpenCalls(limit=5, per_host=2)
        held = []
        for host in ("ipv4:203.0.113.7", "ipv4:203.0.113.7", "ipv4:198.51.100.9"):
            held.append(Context(host + ":1"))
            await calls.hold(host, held[-1])
        with pytest.raises(RefusedError, match="the most one host may have \\(2\\)"):
            await calls.hold("ipv4:203.0.113.7", Context("ipv4:203.0.113.7:2"))
        for host in ("ipv4:127.0.0.1", "ipv4:127.0.0.2"):  # loopback: the total only
            held.append(Context(host + ":3"))
            await calls.hold(host, held[-1])
        with pytest.raises(RefusedError, match="every host together, the most at once"):
            await calls.hold("ipv4:192.0.2.1", Context("ipv4:192.0.2.1:4"))
        for context in held:
            context.end()
        assert calls.shares.open == 0 and not calls.shares.hosts

    asyncio.run(scenario())


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload
    )


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing (names and values < 127 bytes)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def test_one_host_off_loopback_holds_at_most_its_share_of_the_open_streams() -> None:
    """The tenant audit: one host held all 32 health-watch and reflection streams (no
    token needed), and every other host's ``Watch``, which some health checkers read as
    the daemon's state, was refused. A host off loopback holds at most
    ``MAX_OPEN_STREAMS_PER_HOST`` of them; loopback peers (every local client and SSH
    tunnel is 127.0.0.1) only the total. (A remote peer is out of the tests' reach on
    127.0.0.1: a call context that names its peer stands in for one.)"""
    import asyncio

    from controller.auth import _StreamCap
    from tests.test_limit_checks import Context, RefusedError

    async def scenario() -> None:
        cap = _StreamCap(limit=5, per_host=2)
        held = contextlib.AsyncExitStack()
        far = "ipv4:203.0.113.7:{}"
        for port in (1, 2):
            await held.enter_async_context(cap._held(Context(far.format(port))))
        with pytest.raises(RefusedError, match="the most one host may hold \\(2\\)"):
            await held.enter_async_context(cap._held(Context(far.format(3))))
        await held.enter_async_context(cap._held(Context("ipv4:198.51.100.9:1")))  # another
        # loopback: the total only (gRPC's own forms of the peers: an IPv6 address's
        # brackets percent-encoded, which a first version read as another host)
        for peer in ("ipv4:127.0.0.1:7", "ipv6:%5B::1%5D:8"):
            await held.enter_async_context(cap._held(Context(peer)))
        assert cap.shares.open == 5 and dict(cap.shares.hosts) == {"ipv4:203.0.113.7": 2,
                                                       "ipv4:198.51.100.9": 1}  # fmt: skip
        with pytest.raises(RefusedError, match="the most at once \\(5\\)"):
            await held.enter_async_context(cap._held(Context("ipv4:127.0.0.1:9")))
        await held.aclose()
        assert cap.shares.open == 0 and not cap.shares.hosts

    asyncio.run(scenario())
