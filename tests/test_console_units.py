"""The console's parts without a browser: heatmap binning against a brute-force
reduction, the ``[web]`` table's rules, sessions, and the login's redirect target."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.auth import Caller, Role, hash_token, load_tokens
from controller.config import ConfigError, demo_config, from_dict, load
from controller.console import app as app_module
from controller.console import streams as streams_module
from controller.console.app import Console, _safe_next
from controller.console.heatmap import LEVELS, bin_edges, bin_grid, price_levels
from controller.console.sessions import MAX_SESSIONS, MAX_SESSIONS_PER_CALLER, Sessions
from controller.console.settings import DEFAULT_WEB_LISTEN, web_from_dict
from controller.events import EventBus
from controller.tls import TlsConfig
from pricing.errors import SpecError
from tests.test_security import make_pki

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = {
    "resources": ["gpu", "bandwidth"],
    "servers": [
        {"name": "w0", "kind": "worker", "capacity": {"gpu": 4, "bandwidth": 10}},
        {"name": "p0", "kind": "ps", "capacity": {"gpu": 0, "bandwidth": 10}},
    ],
}


def _console_config(tmp_path: Path, **roles: str) -> Any:
    """A config whose console listens on a free loopback port, with a tokens file of
    ``roles`` (``name="role"``); each name's token is ``NAME-token``."""
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {r} {hash_token(n + '-token')}\n" for n, r in roles.items()))
    return from_dict({"cluster": CLUSTER, "auth": {"tokens_file": str(tokens)},
                      "web": {"listen": "127.0.0.1:0"}})  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 230),
    cols=st.integers(1, 310),
    max_rows=st.integers(1, 100),
    max_cols=st.integers(1, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_binning_matches_a_brute_force_reduction(
    rows: int, cols: int, max_rows: int, max_cols: int, seed: int
) -> None:
    values = np.random.default_rng(seed).lognormal(size=(rows, cols))
    grid = bin_grid(values, max_rows, max_cols)
    assert grid.low.shape == (min(rows, max_rows), min(cols, max_cols))
    re, ce = grid.row_edges, grid.col_edges
    assert re[0] == 0 and re[-1] == rows and np.all(np.diff(re) >= 1)
    assert ce[0] == 0 and ce[-1] == cols and np.all(np.diff(ce) >= 1)
    for i in range(len(re) - 1):
        for j in range(len(ce) - 1):
            cell = values[re[i] : re[i + 1], ce[j] : ce[j + 1]]
            assert grid.low[i, j] == cell.min()
            assert grid.high[i, j] == cell.max()
            assert grid.mean[i, j] == pytest.approx(cell.mean(), rel=1e-12)


def test_a_large_grid_is_bounded_and_bins_are_near_equal() -> None:
    grid = bin_grid(np.ones((1000, 300)))
    assert grid.mean.shape == (100, 100)
    assert set(np.diff(grid.row_edges).tolist()) == {10}
    assert set(np.diff(grid.col_edges).tolist()) == {3}
    assert set(np.diff(bin_edges(250, 100)).tolist()) <= {2, 3}
    with pytest.raises(ValueError, match="empty"):
        bin_grid(np.ones((0, 3)))


def test_price_levels_span_the_log_scale_from_floor_to_top() -> None:
    levels = price_levels(np.array([[0.001, 0.01, 0.1], [1.0, 10.0, 1e9]]), 0.01, 1.0)
    assert levels.tolist() == [[0, 0, LEVELS // 2 + 1], [LEVELS, LEVELS, LEVELS]]
    assert price_levels(np.array([5.0]), 2.0, 2.0).tolist() == [0]


def test_web_listen_stays_on_loopback_unless_tls_or_allowed() -> None:
    assert web_from_dict({}, None).listen == ""  # absent: no console
    assert web_from_dict({"listen": "127.0.0.1:0"}, None).listen == "127.0.0.1:0"
    with pytest.raises(SpecError, match=r"web\.listen: 0\.0\.0\.0:8080 is not a loopback"):
        web_from_dict({"listen": "0.0.0.0:8080"}, None)
    remote = web_from_dict({"listen": "0.0.0.0:8080", "allow_insecure_remote": True}, None)
    assert remote.allow_insecure_remote
    for bad, field in (
        ({"listen": "8080"}, "web.listen"),
        ({"listen": 8080}, "web.listen"),
        ({"lisen": "127.0.0.1:1"}, "web.lisen"),
        ({"allow_insecure_remote": "yes"}, "web.allow_insecure_remote"),
        ({"session_hours": 0}, "web.session_hours"),
        ({"session_hours": 10_000}, "web.session_hours"),
        ({"max_event_streams_per_user": 0}, "web.max_event_streams_per_user: must be >= 1"),
        ({"max_event_streams": "many"}, "web.max_event_streams: must be an integer"),
    ):
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            web_from_dict(bad, None)
    assert web_from_dict({"session_hours": 2}, None).session_seconds == 7200
    caps = web_from_dict({"max_event_streams_per_user": 3, "max_event_streams": 9}, None)
    assert (caps.max_event_streams_per_user, caps.max_event_streams) == (3, 9)
    assert (
        web_from_dict({}, None).max_event_streams_per_user,
        web_from_dict({}, None).max_event_streams,
    ) == (32, 256)


def test_web_settings_read_back_from_their_table_whole() -> None:
    """``oasisd --web-listen`` replaces ``listen`` in ``WebConfig.to_dict()`` and reads it
    again: every setting must come back, a key added later included (dataclass equality
    compares every field)."""
    every = web_from_dict(
        {"listen": "127.0.0.1:9", "allow_insecure_remote": True, "session_hours": 3,
         "max_event_streams_per_user": 5, "max_event_streams": 7, "max_connections": 9,
         "public_url": "https://head.example/oasis/"},
        None,
    )  # fmt: skip
    assert every != web_from_dict({}, None)
    assert all(getattr(every, f.name) != f.default for f in dataclasses.fields(every))
    assert web_from_dict(every.to_dict(), None) == every
    moved = web_from_dict({**every.to_dict(), "listen": "127.0.0.1:0"}, None)
    assert moved == dataclasses.replace(every, listen="127.0.0.1:0")


def test_web_settings_at_their_bounds_are_taken_and_past_them_refused() -> None:
    """The mutation audit of the [web] table: its defaults, each bound moved by one, and
    a non-loopback address under [tls] refused, all went unnoticed."""
    d = web_from_dict({}, None)
    assert (d.session_seconds, d.max_connections, d.max_connections_per_host) == (
        8 * 3600.0, 512, 64)  # fmt: skip
    assert web_from_dict({"listen": "127.0.0.1:65535"}, None).listen == "127.0.0.1:65535"
    assert web_from_dict({"session_hours": 720}, None).session_seconds == 720 * 3600.0
    assert web_from_dict({"max_connections": 10_000}, None).max_connections == 10_000
    for bad, message in (
        ({"listen": "127.0.0.1:65536"}, "web.listen: must be host:port"),
        ({"listen": ":8080", "allow_insecure_remote": True}, "web.listen: must be host:port"),
        ({"session_hours": 720.5}, "web.session_hours: must be <= 720"),
        ({"max_connections": 10_001}, "web.max_connections: must be <= 10000"),
    ):
        with pytest.raises(SpecError, match="^" + re.escape(message)):
            web_from_dict(bad, None)
    # oasisd --web-listen reads to_dict() back: a per-host cap below the default's kept
    capped = web_from_dict({"max_connections": 100, "max_connections_per_host": 10}, None)
    assert web_from_dict(capped.to_dict(), None) == capped
    # [tls]: the console serves HTTPS, so any address is taken
    tls = TlsConfig(Path("c.pem"), Path("k.pem"), None, b"", b"", None)
    assert web_from_dict({"listen": "0.0.0.0:8080"}, tls).listen == "0.0.0.0:8080"


def test_the_console_is_on_in_the_embedded_defaults_and_off_in_the_example(
    tmp_path: Path,
) -> None:
    from tests.servers import example_config

    assert demo_config().web.listen == DEFAULT_WEB_LISTEN
    assert load(example_config(tmp_path)).web.listen == ""
    assert from_dict({"cluster": CLUSTER}).web.listen == ""
    with pytest.raises(ConfigError, match=r"web\.listen: .* is not a loopback address"):
        from_dict({"cluster": CLUSTER, "web": {"listen": "10.1.2.3:8080"}})


def test_a_stream_goes_on_while_its_session_and_token_hold() -> None:
    """An event stream ends when its session does (logout, expiry, the user's newer
    logins past the cap) or its token does (a reload), whichever comes first."""
    now = [0.0]
    alice = Caller("alice", Role.SUBMITTER, token=hash_token("a"))
    bob = Caller("bob", Role.SUBMITTER, token=hash_token("b"))
    streams = streams_module.EventStreams()
    streams.tokens = {alice.token: alice, bob.token: bob}
    streams.sessions = Sessions(60.0, monotonic=lambda: now[0])
    first, second = streams.sessions.open(alice), streams.sessions.open(alice)
    assert streams._still_allowed(alice, first) and streams._still_allowed(bob, None)
    streams.sessions.close(first.id)  # logged out: its stream ends, the other goes on
    assert not streams._still_allowed(alice, first) and streams._still_allowed(alice, second)
    now[0] = 60.0  # expired
    assert not streams._still_allowed(alice, second)
    assert streams._still_allowed(alice, None)  # a bearer token's, while the token holds
    streams.tokens = {alice.token: alice, bob.token: dataclasses.replace(bob, role=Role.OPERATOR)}
    assert not streams._still_allowed(bob, None)  # its role changed by a reload


def test_sessions_expire_and_keep_a_bounded_number() -> None:
    now = [0.0]
    sessions = Sessions(60.0, monotonic=lambda: now[0])
    alice = sessions.open(Caller("alice", Role.SUBMITTER))
    assert sessions.get(alice.id) is alice
    assert alice.csrf_ok(alice.csrf) and not alice.csrf_ok("guess")
    assert sessions.get("unknown") is None
    now[0] = 60.0
    assert sessions.get(alice.id) is None  # expired
    first = sessions.open(Caller("ops", Role.OPERATOR))
    for i in range(MAX_SESSIONS):  # many users: the oldest session of all goes
        sessions.open(Caller(f"user{i}", Role.OPERATOR))
    assert len(sessions) == MAX_SESSIONS
    assert sessions.get(first.id) is None  # the oldest went
    for _ in range(MAX_SESSIONS_PER_CALLER + 5):  # one user: its own oldest goes
        sessions.open(Caller("ops", Role.OPERATOR))
    assert len(sessions) == MAX_SESSIONS
    last = sessions.open(Caller("ops", Role.OPERATOR))
    sessions.close(last.id)
    assert sessions.get(last.id) is None


def test_a_full_session_table_ends_every_expired_session_at_the_next_login() -> None:
    """At MAX_SESSIONS, a login ends every expired session, not only the oldest one: the
    table does not stay full of dead sessions, each evicted one login at a time (with the
    expiry pass dropped, every test passed)."""
    now = [0.0]
    sessions = Sessions(60.0, monotonic=lambda: now[0])
    live = sessions.open(Caller("ops", Role.OPERATOR))
    now[0] = 30.0
    for i in range(MAX_SESSIONS - 1):
        sessions.open(Caller(f"user{i}", Role.SUBMITTER))  # each expires at 90
    assert len(sessions) == MAX_SESSIONS
    now[0] = 59.0
    newest = sessions.open(Caller("late", Role.SUBMITTER))  # nothing expired: the oldest goes
    assert sessions.get(live.id) is None and len(sessions) == MAX_SESSIONS
    now[0] = 100.0
    later = sessions.open(Caller("later", Role.SUBMITTER))
    assert sessions.get(newest.id) is newest and sessions.get(later.id) is later
    assert len(sessions) == 2


def test_after_login_only_a_local_path() -> None:
    assert _safe_next("/jobs?state=admitted") == "/jobs?state=admitted"
    for bad in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "jobs", ""):
        assert _safe_next(bad) == "/"
    # a browser drops a tab or line break from a URL: "/\t/evil" would be "//evil";
    # a control or non-ASCII character made the Location header unsendable (no answer)
    for bad in ("/\t/evil.example/", "/\r/x", "/\n/x", "/\x00x", "/\x7fx", "/\u00e9", "/a b"):
        assert _safe_next(bad) == "/", repr(bad)


def test_integers_in_queries_are_ascii_digits() -> None:
    """``str.isdigit`` takes ``²`` and ``--5``, which ``int`` then refused: a 500."""
    assert app_module._int({"n": "-12"}, "n") == -12
    assert app_module._int({}, "n", 7) == 7
    for bad in ("\u00b2", "--5", "1\u0660", "+3", "1e3", "9" * 19, " 1"):
        with pytest.raises(SpecError, match="n: must be an integer"):
            app_module._int({"n": bad}, "n")
    # an integer too long was told it was none ("after: must be an integer, got '9999...'")
    with pytest.raises(SpecError, match=r"n: must be an integer of at most 18 digits, got '9{19}'"):
        app_module._int({"n": "9" * 19}, "n")


def test_the_tokens_file_gives_each_caller_its_own_turn(tmp_path: Path) -> None:
    """The console uses the callers as loaded; they had an empty turn, the daemon's own:
    a submitter's console cancels then skipped ``limits.max_in_flight`` and the turns
    every gRPC call of theirs takes."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice submitter {hash_token('a')}\nops operator {hash_token('o')}\n")
    loaded = load_tokens(tokens)
    assert {(c.name, c.client, c.turn) for c in loaded.values()} == {
        ("alice", "alice", "alice"),
        ("ops", "ops", "ops"),
    }


# -- the server itself, in-process (no controller needed for login and static files) ----


async def _started(config: Any) -> Console:
    console = Console(config, cast(Any, None), None, None)
    await console.start()
    return console


def test_a_busy_address_names_web_listen() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = from_dict({"cluster": CLUSTER, "web": {"listen": f"127.0.0.1:{port}"}})
        with pytest.raises(OSError, match=rf"web\.listen: cannot listen on 127\.0\.0\.1:{port}"):
            asyncio.run(_started(config))


def test_with_tls_the_console_is_https_with_client_certificates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"ops operator {hash_token('ops-token')}\n")
    config = from_dict(
        {
            "cluster": CLUSTER,
            "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key),
                    "client_ca": str(pki.ca)},
            "auth": {"tokens_file": str(tokens)},
            "web": {"listen": "127.0.0.1:0"},
        }
    )  # fmt: skip

    async def scenario() -> None:
        console = await _started(config)
        url = f"https://{console.address}"
        trusted = ssl.create_default_context(cafile=pki.ca)
        trusted.load_cert_chain(pki.client_cert, pki.client_key)
        anonymous = ssl.create_default_context(cafile=pki.ca)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/static/console.css", ssl=trusted) as r:
                    assert r.status == 200 and "--focus" in await r.text()
                async with http.post(
                    url + "/login", data={"token": "ops-token", "next": "/jobs"}, ssl=trusted,
                    allow_redirects=False,
                ) as r:  # fmt: skip
                    assert r.status == 303 and r.headers["Location"] == "/jobs"
                    cookie = r.headers["Set-Cookie"]
                    assert all(f in cookie for f in ("HttpOnly", "SameSite=Strict", "Secure"))
                with pytest.raises(aiohttp.ClientError):  # no client certificate
                    async with http.get(url + "/login", ssl=anonymous) as r:
                        await r.read()
                with pytest.raises(aiohttp.ClientError):  # plain HTTP
                    async with http.get(f"http://{console.address}/login") as r:
                        await r.read()
        finally:
            await console.close()

    asyncio.run(scenario())


def test_one_users_logins_do_not_end_another_users_session(tmp_path: Path) -> None:
    """The console keeps at most MAX_SESSIONS sessions, the oldest going first: a
    submitter's script that logged in for every poll (10,000 logins) logged every other
    user out, operators included. A user's own oldest session goes now, past
    MAX_SESSIONS_PER_CALLER."""
    config = _console_config(tmp_path, ops="operator", alice="submitter")

    async def login(http: aiohttp.ClientSession, url: str, token: str) -> str:
        async with http.post(url + "/login", data={"token": token}, allow_redirects=False) as r:
            assert r.status == 303
            return str(r.cookies["oasis_session"].value)

    async def scenario() -> None:
        console = await _started(config)
        url = f"http://{console.address}"
        try:
            async with aiohttp.ClientSession() as http:
                ops = await login(http, url, "ops-token")
                for _ in range(MAX_SESSIONS // 50):
                    await asyncio.gather(*(login(http, url, "alice-token") for _ in range(50)))
                latest = await login(http, url, "alice-token")
        finally:
            await console.close()
        assert console.sessions.get(ops) is not None  # still logged in
        assert console.sessions.get(latest) is not None
        assert len(console.sessions) == 1 + MAX_SESSIONS_PER_CALLER

    asyncio.run(scenario())


# the console keys requests by str (request["caller"]), which aiohttp 3.14 warns of
@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_closed_event_stream_frees_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``[auth]`` every caller is one user: past its cap a stream is refused
    (429, the key named); a stream the client closed frees its place at its next
    heartbeat (15 s in the daemon, 0.05 s here)."""
    monkeypatch.setattr(streams_module, "_HEARTBEAT_SECONDS", 0.05)
    web = {"listen": "127.0.0.1:0", "max_event_streams_per_user": 2, "max_event_streams": 5}
    config = from_dict({"cluster": CLUSTER, "web": web})
    controller = cast(Any, SimpleNamespace(bus=EventBus(), prune_hooks=[]))

    async def scenario() -> None:
        console = Console(config, controller, None, None)
        await console.start()
        url = f"http://{console.address}/api/events"
        try:
            async with aiohttp.ClientSession() as http:
                first, second = await http.get(url), await http.get(url)
                assert (first.status, second.status) == (200, 200)
                async with http.get(url) as refused:
                    assert refused.status == 429
                    message = (await refused.json())["error"]["message"]
                assert "web.max_event_streams_per_user = 2" in message
                assert "without [auth], everyone" in message
                first.close()  # the client goes away; the daemon notices at a heartbeat
                for _ in range(100):
                    again = await http.get(url)
                    if again.status == 200:
                        break
                    again.close()
                    await asyncio.sleep(0.05)
                assert again.status == 200
                assert console.streams == {"": 2}
                second.close()
                again.close()
                for _ in range(100):
                    if not console.streams:
                        break
                    await asyncio.sleep(0.05)
                assert console.streams == {}
        finally:
            await console.close()

    asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_stream_whose_client_stopped_reading_ends_and_frees_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stall audit: a client that opened streams and never read them left each
    stream waiting in a write for good once the socket's buffers filled (aiohttp's drain
    has no timeout), never reaching its next check, holding its place under the caps: 8
    such users' 32 streams each refused every other console. Now a write not taken
    within ``WRITE_SECONDS`` (30 s in the daemon, 0.5 s here) ends the stream, aborts
    its connection and frees its place, logged once; a stream read meanwhile gets every
    event and goes on."""
    from structlog.testing import capture_logs

    from controller.events import Event

    monkeypatch.setattr(streams_module, "WRITE_SECONDS", 0.5)
    web = {"listen": "127.0.0.1:0", "max_event_streams_per_user": 3, "max_event_streams": 5}
    config = from_dict({"cluster": CLUSTER, "web": web})
    bus = EventBus()
    controller = cast(Any, SimpleNamespace(bus=bus, prune_hooks=[]))
    blob = "x" * 256 * 1024
    events = 40  # 10 MiB for each stream: past the kernel's buffers (4 MiB at most) and aiohttp's

    async def unread(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
        """A stream opened over a socket that never reads (a small receive buffer)."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        request = (
            f"GET /api/events HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n"
        )
        await loop.sock_sendall(sock, request.encode())
        return sock

    async def ended(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bool:
        """Whether the daemon ended ``sock``'s connection (read what is left, to its end)."""
        try:
            while await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 5):
                pass
        except ConnectionResetError:
            pass  # aborted: what it had not taken was dropped
        except TimeoutError:
            return False
        return True

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        console = Console(config, controller, None, None)
        await console.start()
        host, port = console.address.rsplit(":", 1)
        url = f"http://{console.address}/api/events"
        stalled: list[socket.socket] = []
        try:
            async with aiohttp.ClientSession() as http:
                reader = await http.get(url)
                assert reader.status == 200
                stalled = [await unread(loop, host, int(port)) for _ in range(2)]
                while console.streams != {"": 3}:
                    await asyncio.sleep(0.01)
                async with http.get(url) as refused:
                    assert refused.status == 429  # the user's 3 are taken

                async def read_all() -> list[int]:
                    seen: list[int] = []
                    while len(seen) < events:
                        line = (await reader.content.readline()).decode()
                        if line.startswith("id: "):
                            seen.append(int(line[4:]))
                    return seen

                reading = asyncio.ensure_future(read_all())
                for sequence in range(1, events + 1):
                    bus.publish(Event(sequence, "note", "", 0, "", {"blob": blob}))
                    await asyncio.sleep(0.01)
                assert await asyncio.wait_for(reading, 30) == list(range(1, events + 1))
                deadline = loop.time() + 10
                while console.streams != {"": 1} and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                assert console.streams == {"": 1}, "the unread streams still hold their places"
                assert [await ended(loop, sock) for sock in stalled] == [True, True]
                again = await http.get(url)  # a place freed: a new stream is let in
                assert again.status == 200
                again.close()
                reader.close()
        finally:
            for sock in stalled:
                sock.close()
            await console.close()

    with capture_logs() as logs:
        asyncio.run(scenario())
    stalls = [e for e in logs if e["event"].startswith("console event stream ended")]
    assert [(e["log_level"], e["user"]) for e in stalls] == [("info", ""), ("info", "")]


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_console_requests_cost_the_callers_rate(tmp_path: Path) -> None:
    """A user's console requests take from its ``[limits] rate`` as its gRPC calls do:
    a submitter's script polling the console at hundreds of requests a second slowed
    every tenant's calls (the console shares the daemon's loop, threads and store).
    Another user's bucket is untouched; the login page stays open. The login page and
    the static files take no bucket, and a login its token's own: they took the peer's,
    which everyone behind one address shares (loopback, an SSH tunnel, a proxy), so an
    unauthenticated flood of them refused every user's login."""
    from controller.limits import RateLimiter

    config = _console_config(tmp_path, bob="operator", alice="submitter", carol="submitter")
    limiter = RateLimiter(rate=0.001, burst=3)  # no refill within the test

    async def scenario() -> None:
        console = Console(config, cast(Any, None), limiter, None)
        await console.start()
        url = f"http://{console.address}"
        alice = {"Authorization": "Bearer alice-token"}
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(3):  # past the rate's check: no such page
                    async with http.get(url + "/api/nothing", headers=alice) as r:
                        assert r.status == 404
                async with http.get(url + "/api/nothing", headers=alice) as r:
                    assert r.status == 429
                    assert "rate limit" in (await r.json())["error"]["message"]
                bob = {"Authorization": "Bearer bob-token"}
                async with http.get(url + "/api/nothing", headers=bob) as r:
                    assert r.status == 404
                async with http.get(url + "/login") as r:
                    assert r.status == 200
                # a flood from this peer, with no token: served, or refused on its own
                for _ in range(10):
                    async with http.get(url + "/static/console.css") as r:
                        assert r.status == 200
                    async with http.get(url + "/login") as r:
                        assert r.status == 200
                same = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
                guesses = [(await http.post(url + "/login", data={"token": "guess"},
                                            headers=same)).status for _ in range(5)]  # fmt: skip
                assert guesses == [401, 401, 401, 429, 429]  # the peer's bucket: guesses
                async with http.post(url + "/login", data={"token": "carol-token"},
                                     headers=same, allow_redirects=False) as r:  # fmt: skip
                    assert r.status == 303 and "oasis_session" in r.cookies
        finally:
            await console.close()

    asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
@pytest.mark.parametrize("proxied", [True, False])
def test_behind_a_proxy_a_guess_is_logged_and_rated_as_the_client_the_proxy_names(
    tmp_path: Path, proxied: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind ``[web] public_url`` (the console on loopback), a refused token is logged,
    and takes from the rate, as the client the proxy names last in ``X-Forwarded-For``:
    every guess through a proxy was logged as ``127.0.0.1``, and one guesser took the
    rate of every user's mistyped token. An earlier entry (a client may write it) is not
    taken; without ``public_url`` the header is not taken at all (anyone on the node
    could write it)."""
    from structlog.testing import capture_logs

    from controller.auth import refusals
    from controller.limits import RateLimiter

    monkeypatch.setattr(refusals, "_last", {})  # no line held back for an earlier test's
    monkeypatch.setattr(refusals, "_lines", {})
    config = _console_config(tmp_path, carol="submitter")
    if proxied:
        web = dataclasses.replace(config.web, public_url="https://head.example/oasis/")
        config = dataclasses.replace(config, web=web)
    limiter = RateLimiter(rate=0.001, burst=2)  # no refill within the test

    async def scenario() -> list[int]:
        console = Console(config, cast(Any, None), limiter, None)
        await console.start()
        url = f"http://{console.address}"
        statuses = []
        try:
            async with aiohttp.ClientSession() as http:
                for forwarded in ("203.0.113.7", "203.0.113.7", "198.51.100.1, 203.0.113.7",
                                  "203.0.113.8", "not an address"):  # fmt: skip
                    headers = {"Origin": url, "X-Forwarded-For": forwarded}
                    async with http.post(url + "/login", data={"token": "guess"},
                                         headers=headers) as r:  # fmt: skip
                        statuses.append(r.status)
        finally:
            await console.close()
        return statuses

    with capture_logs() as logs:
        statuses = asyncio.run(scenario())
    peers = [e["peer"] for e in logs if e["event"] == "unauthenticated"]
    if proxied:  # 203.0.113.7's two guesses take its bucket; the others have their own
        assert statuses == [401, 401, 429, 401, 401], statuses
        assert peers == ["203.0.113.7 via 127.0.0.1", "203.0.113.8 via 127.0.0.1",
                         "127.0.0.1"], peers  # fmt: skip
    else:  # the peer's one bucket, as before
        assert statuses == [401, 401, 429, 429, 429], statuses
        assert peers == ["127.0.0.1"], peers


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_submitters_large_console_answers_cost_its_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submitter's console answer past 16 KiB costs its rate a token each 16 KiB more,
    as its gRPC answers do (building a long page costs the shared event loop); an
    operator's reads are not charged."""
    from controller.limits import BYTES_PER_TOKEN, RateLimiter

    config = _console_config(tmp_path, bob="operator", alice="submitter")
    limiter = RateLimiter(rate=0.001, burst=3)  # no refill within the test
    page = {"jobs": ["x" * 1000] * (6 * BYTES_PER_TOKEN // 1000)}  # about 6 x 16 KiB

    async def scenario() -> None:
        console = Console(config, cast(Any, None), limiter, None)

        async def jobs(*_: Any) -> dict[str, Any]:
            return page

        monkeypatch.setattr(console.data, "jobs", jobs)
        await console.start()
        url = f"http://{console.address}/api/jobs"
        try:
            async with aiohttp.ClientSession() as http:
                for who, statuses in (("bob", [200, 200, 200, 429]), ("alice", [200, 429])):
                    got = []
                    for _ in statuses:
                        headers = {"Authorization": f"Bearer {who}-token"}
                        async with http.get(url, headers=headers) as r:
                            got.append(r.status)
                    assert got == statuses, who
        finally:
            await console.close()

    asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_submitters_replayed_events_cost_its_rate(tmp_path: Path) -> None:
    """The tenant audit: the events a submitter's stream replays (``?after=``,
    ``Last-Event-ID``: its newest 1,000, some 150 KB) cost its rate a token each 16 KiB
    past the first, as its pages do; they cost the request's one token, and a script
    opening streams ten times a second within the rate took another tenant's calls from
    a p90 of 2.4 ms to 97 ms. An operator's replay is not charged."""
    from controller.events import Event
    from controller.limits import BYTES_PER_TOKEN, RateLimiter

    config = _console_config(tmp_path, bob="operator", alice="submitter")
    limiter = RateLimiter(rate=0.001, burst=3)  # no refill within the test
    blob = "x" * 1000
    stored = [Event(n, "note", "alice:j", 0, "", {"blob": blob})
              for n in range(1, 6 * BYTES_PER_TOKEN // 1000)]  # fmt: skip

    async def events(after: int, *_: Any, **__: Any) -> list[Event]:
        return [e for e in stored if e.sequence > after]

    async def own(owner: str, after: int, *_: Any) -> list[Event]:
        return await events(after)

    controller = cast(Any, SimpleNamespace(bus=EventBus(), prune_hooks=[],
                                           stored_events=events, own_events=own))  # fmt: skip

    async def replayed(http: aiohttp.ClientSession, url: str, who: str) -> int:
        headers = {"Authorization": f"Bearer {who}-token", "Accept": "text/event-stream"}
        async with http.get(url + "/api/events?after=0", headers=headers) as r:
            if r.status != 200:
                return r.status
            seen = 0
            while seen < len(stored):  # then the client leaves, in the live part
                if (await r.content.readline()).startswith(b"id: "):
                    seen += 1
            return r.status

    async def scenario() -> None:
        console = Console(config, controller, limiter, None)

        async def owners(job_ids: Any) -> dict[str, str | None]:
            return dict.fromkeys(job_ids, "alice")

        console.data.owner_of = owners  # type: ignore[method-assign]
        await console.start()
        url = f"http://{console.address}"
        try:
            async with aiohttp.ClientSession() as http:
                got = [await replayed(http, url, "bob") for _ in range(3)]
                assert got == [200, 200, 200]  # an operator's replays: a token each
                got = [await replayed(http, url, "alice") for _ in range(2)]
                assert got == [200, 429]  # before: [200, 200]
        finally:
            await console.close()

    asyncio.run(scenario())


def test_one_host_off_loopback_holds_at_most_its_share_of_the_console() -> None:
    """The tenant audit: one client holding every console connection (each sending a
    byte of its request every 25 s, reopened as they closed) kept the console down for
    everyone. A host off loopback holds at most ``web.max_connections_per_host``; past
    it a connection is answered 503 and closed. Loopback peers are every SSH tunnel's
    one address, so they are not capped per host. (A remote peer is out of the tests'
    reach on 127.0.0.1: a transport that says where it comes from stands in for it.)"""
    from controller.console.app import _PerHost
    from controller.holds import Holds

    class Transport(asyncio.WriteTransport):
        def __init__(self, host: str) -> None:
            super().__init__()
            self.host, self.written, self.closed = host, b"", False

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return (self.host, 40000) if name == "peername" else default

        def write(self, data: Any) -> None:
            self.written += bytes(data)

        def close(self) -> None:
            self.closed = True

    served: list[Any] = []

    def serve() -> Any:
        inner = SimpleNamespace(made=[], lost=[], data=[])
        inner.connection_made = inner.made.append
        inner.connection_lost = inner.lost.append
        inner.data_received = inner.data.append
        served.append(inner)
        return inner

    hosts = Holds()
    gates = [_PerHost(serve, hosts, 2) for _ in range(6)]
    far = [Transport("203.0.113.7") for _ in range(3)]
    for gate, transport in zip(gates, far, strict=False):
        gate.connection_made(cast(Any, transport))
    assert [t.closed for t in far] == [False, False, True]
    assert far[2].written.startswith(b"HTTP/1.1 503 ")
    assert len(served) == 2 and hosts["203.0.113.7"] == 2
    gates[0].data_received(b"GET / HTTP/1.1\r\n")
    assert served[0].data == [b"GET / HTTP/1.1\r\n"]  # handed on
    gates[2].connection_lost(None)  # the refused one frees nothing
    gates[0].connection_lost(None)
    assert served[0].lost == [None] and hosts["203.0.113.7"] == 1
    again = Transport("203.0.113.7")
    gates[3].connection_made(cast(Any, again))
    assert not again.closed and hosts["203.0.113.7"] == 2
    for gate in gates[4:]:  # loopback: not counted per host
        for _ in range(2):
            gate.connection_made(cast(Any, Transport("127.0.0.1")))
    assert "127.0.0.1" not in hosts and len(served) == 7
    # a console listening on [::] (both stacks) sees 127.0.0.1 as ::ffff:127.0.0.1: every
    # SSH tunnel shared one host's cap there (Python < 3.13 calls it not loopback)
    mapped = [Transport("::ffff:127.0.0.1") for _ in range(3)]
    for transport in mapped:
        _PerHost(serve, hosts, 2).connection_made(cast(Any, transport))
    assert not any(t.closed for t in mapped) and "::ffff:127.0.0.1" not in hosts
    far_mapped = [Transport("::ffff:203.0.113.9") for _ in range(3)]
    for transport in far_mapped:  # an IPv4 host off loopback, mapped: still capped
        _PerHost(serve, hosts, 2).connection_made(cast(Any, transport))
    assert [t.closed for t in far_mapped] == [False, False, True]
    with pytest.raises(SpecError, match="max_connections_per_host: must be <= "):
        web_from_dict({"max_connections": 10, "max_connections_per_host": 11}, None)


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_submitters_streams_read_job_owners_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submitter's event stream shows its own jobs' events only. Its backlog's owners
    are read in one query, and all streams share what was read: 32 streams replaying
    1,000 events made a store query per event and stream, and slowed every tenant's
    gRPC reads (they share the thread pool)."""
    from controller.events import Event

    config = _console_config(tmp_path, alice="submitter")
    backlog = [Event(i + 1, "decided", f"j{i % 10}", 0, "admitted") for i in range(200)]

    async def stored_events(after: int, limit: int, newest: bool) -> list[Event]:
        return [e for e in backlog if e.sequence > after][-limit:]

    async def own_events(owner: str, after: int, limit: int, client: str) -> list[Event]:
        return await stored_events(after, limit, True)  # the stream checks each owner

    controller = cast(
        Any,
        SimpleNamespace(
            bus=EventBus(), stored_events=stored_events, own_events=own_events, prune_hooks=[]
        ),
    )
    queries: list[list[str]] = []

    async def scenario() -> None:
        console = Console(config, controller, None, None)

        async def owner_of(ids: Any) -> dict[str, str | None]:
            queries.append(sorted(ids))
            return {j: ("alice" if int(j[1:]) % 2 == 0 else "bob") for j in ids}

        monkeypatch.setattr(console.data, "owner_of", owner_of)
        await console.start()
        url = f"http://{console.address}/api/events?after=0"
        alice = {"Authorization": "Bearer alice-token"}
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(3):
                    async with http.get(url, headers=alice) as r:
                        assert r.status == 200
                        seen: list[str] = []
                        while len(seen) < 100:
                            line = (await r.content.readline()).decode()
                            if line.startswith("data: "):
                                seen.append(json.loads(line[6:])["job_id"])
                        assert set(seen) == {f"j{i}" for i in range(0, 10, 2)}
        finally:
            await console.close()

    asyncio.run(scenario())
    assert queries == [[f"j{i}" for i in range(10)]]


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_new_jobs_owner_is_read_once_for_every_stream_that_meets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams that meet a new job's event at once share one read of its owner: 32 of a
    submitter's streams made 32 store queries for each of another tenant's decisions."""
    from controller.events import Event

    config = _console_config(tmp_path, alice="submitter")
    bus = EventBus()
    controller = cast(Any, SimpleNamespace(bus=bus, prune_hooks=[]))
    queries: list[list[str]] = []

    async def scenario() -> None:
        console = Console(config, controller, None, None)

        async def owner_of(ids: Any) -> dict[str, str | None]:
            queries.append(sorted(ids))
            await asyncio.sleep(0.3)  # a slow store: every stream asks meanwhile
            return {j: "alice" if j.startswith("a") else "bob" for j in ids}

        monkeypatch.setattr(console.data, "owner_of", owner_of)
        await console.start()
        url = f"http://{console.address}/api/events"
        alice = {"Authorization": "Bearer alice-token"}
        try:
            async with aiohttp.ClientSession() as http:
                streams = [await http.get(url, headers=alice) for _ in range(8)]
                assert [r.status for r in streams] == [200] * 8
                while sum(console.streams.values()) < 8:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # each stream waits on the bus
                bus.publish(Event(1, "decided", "b-1", 0, "admitted"))  # another's
                bus.publish(Event(2, "decided", "a-1", 0, "admitted"))
                for r in streams:
                    line = ""
                    while not line.startswith("data: "):
                        line = (await r.content.readline()).decode()
                    assert json.loads(line[6:])["job_id"] == "a-1"
                    r.close()
        finally:
            await console.close()

    asyncio.run(scenario())
    assert sorted(queries) == [["a-1"], ["b-1"]]


def test_a_stream_decides_from_what_its_read_found_not_the_cache_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The review: with owner reads shared, a stream looked its job up in the cache once
    its read was done, and another read that had started the cache over (past
    ``_OWNER_CACHE``) meanwhile made it drop an event of its own job for good."""
    from controller.events import Event

    monkeypatch.setattr(streams_module, "_OWNER_CACHE", 2)
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    controller = cast(Any, SimpleNamespace(bus=EventBus(), prune_hooks=[]))

    async def scenario() -> list[bool]:
        console = Console(config, controller, None, None)
        console.owners["old"], console._learned_at["old"] = "bob", 0
        gate = asyncio.Event()

        async def owner_of(ids: Any) -> dict[str, str | None]:
            await gate.wait()
            return dict.fromkeys(ids, "alice")

        monkeypatch.setattr(console.data, "owner_of", owner_of)
        shown = [
            asyncio.create_task(
                console._visible(Event(5 + i, "decided", f"a-{i}", 0, "x"), "alice")
            )
            for i in (1, 2)
        ]
        await asyncio.sleep(0.01)
        gate.set()
        return list(await asyncio.gather(*shown))

    assert asyncio.run(scenario()) == [True, True]


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_login_from_another_site_is_refused(tmp_path: Path) -> None:
    """Login CSRF: a page of another site posted its author's token to /login, and the
    visitor's browser was then logged in as that author (its operator session cookie
    replaced), submitting and reading as someone else without noticing."""
    config = _console_config(tmp_path, alice="submitter")

    async def scenario() -> None:
        console = await _started(config)
        url = f"http://{console.address}"
        form = {"token": "alice-token", "next": "/"}
        try:
            async with aiohttp.ClientSession() as http:
                for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                                {"Sec-Fetch-Site": "cross-site"}):  # fmt: skip
                    async with http.post(url + "/login", data=form, headers=headers,
                                         allow_redirects=False) as r:  # fmt: skip
                        assert r.status == 403, headers
                        assert "oasis_session" not in r.cookies, headers
                same = {"Origin": url, "Sec-Fetch-Site": "same-origin"}
                async with http.post(url + "/login", data=form, headers=same,
                                     allow_redirects=False) as r:  # fmt: skip
                    assert r.status == 303 and "oasis_session" in r.cookies
        finally:
            await console.close()

    asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_every_answer_carries_the_security_headers_and_files_go_gzipped_once() -> None:
    """aiohttp's own answers (a 404 of no route, a 405, a redirect) skipped the
    middleware that set the headers: no CSP, no X-Frame-Options, no no-store. A bad
    integer in an event stream's query answered 200, then a 500 inside the stream. The
    static files were gzipped again for every request, on the loop gRPC shares."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    controller = cast(Any, SimpleNamespace(bus=EventBus(), prune_hooks=[]))

    async def scenario() -> None:
        console = Console(config, controller, None, None)
        await console.start()
        url = f"http://{console.address}"
        try:
            async with aiohttp.ClientSession() as http:
                for method, path, status in (("GET", "/nothing", 404), ("PUT", "/", 405),
                                             ("GET", "/login", 303),
                                             ("GET", "/api/events?after=%C2%B2", 400)):  # fmt: skip
                    async with http.request(method, url + path, allow_redirects=False) as r:
                        assert r.status == status, (method, path)
                        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
                        assert r.headers["X-Frame-Options"] == "DENY", path
                        assert r.headers["X-Content-Type-Options"] == "nosniff", path
                file = "console.js"
                async with http.get(url + "/static/" + file,
                                    headers={"Accept-Encoding": "gzip"}) as r:  # fmt: skip
                    assert r.headers["Content-Encoding"] == "gzip"
                    assert await r.read() == console.static[file]  # aiohttp decompresses
                async with http.get(url + "/static/" + file,
                                    headers={"Accept-Encoding": "identity"}) as r:  # fmt: skip
                    assert "Content-Encoding" not in r.headers
                    assert await r.read() == console.static[file]
        finally:
            await console.close()

    asyncio.run(scenario())


# the console keys requests by str (request["caller"]), which aiohttp 3.14 warns of
@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_store_outage_is_told_to_a_submitter_without_the_databases_address(
    tmp_path: Path,
) -> None:
    """A store outage showed every tenant the database's host and port (or the path of
    a full file system); an operator still reads why."""
    from controller.errors import TENANT_UNAVAILABLE
    from controller.store import StoreUnavailableError

    config = _console_config(tmp_path, ops="operator", alice="submitter")
    why = 'connection to server at "10.0.0.5", port 5432 failed: Connection refused'

    async def down(*_args: Any) -> Any:
        raise StoreUnavailableError(why)

    async def scenario() -> dict[str, tuple[int, str]]:
        console = await _started(config)
        console.data.jobs = down  # type: ignore[method-assign,assignment]
        seen = {}
        try:
            async with aiohttp.ClientSession() as http:
                for name in ("alice", "ops"):
                    headers = {"Authorization": f"Bearer {name}-token"}
                    url = f"http://{console.address}/api/jobs"
                    async with http.get(url, headers=headers) as r:
                        seen[name] = (r.status, (await r.json())["error"]["message"])
        finally:
            await console.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen["alice"] == (503, TENANT_UNAVAILABLE)
    assert seen["ops"][0] == 503 and "10.0.0.5" in seen["ops"][1]


def test_a_store_outage_over_grpc_is_told_to_a_submitter_without_the_address() -> None:
    from controller import auth, servicer
    from controller.errors import TENANT_UNAVAILABLE
    from controller.store import StoreUnavailableError

    class AbortedError(Exception):
        pass

    class Context:
        async def abort_with_status(self, status: Any) -> None:
            raise AbortedError(status.details)

        async def abort(self, _code: Any, details: str) -> None:
            raise AbortedError(details)

    async def down() -> None:
        raise StoreUnavailableError('connection to server at "10.0.0.5", port 5432 failed')

    async def told(caller: Caller) -> str:
        token = auth._caller.set(caller)
        try:
            await servicer._guard(cast(Any, Context()), down())
        except AbortedError as err:
            return str(err)
        finally:
            auth._caller.reset(token)
        raise AssertionError("not aborted")

    assert asyncio.run(told(Caller("alice", Role.SUBMITTER))) == TENANT_UNAVAILABLE
    assert "10.0.0.5" in asyncio.run(told(Caller("ops", Role.OPERATOR)))


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_a_submitters_stream_forgets_the_jobs_retention_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submitter's open stream learns the owner of every job whose events it meets;
    once retention deletes those jobs nothing of them stays. The sequence each owner
    was read at was kept for every deleted job: with ``keep_days`` set, the owners left
    and never reached ``_OWNER_CACHE`` to start the cache over, so a soak with one tab
    open grew by an entry per job for ever."""
    from controller.events import Event

    config = _console_config(tmp_path, alice="submitter")
    bus = EventBus()
    controller = cast(Any, SimpleNamespace(bus=bus, prune_hooks=[]))
    jobs = [f"{'a' if i % 2 else 'b'}-{i}" for i in range(60)]

    async def scenario() -> Console:
        console = Console(config, controller, None, None)

        async def owner_of(ids: Any) -> dict[str, str | None]:
            return {j: "alice" if j.startswith("a") else "bob" for j in ids}

        monkeypatch.setattr(console.data, "owner_of", owner_of)
        await console.start()
        url = f"http://{console.address}/api/events"
        try:
            async with aiohttp.ClientSession() as http:
                r = await http.get(url, headers={"Authorization": "Bearer alice-token"})
                assert r.status == 200
                while not console.streams:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)  # the stream waits on the bus
                for i, job in enumerate(jobs):
                    bus.publish(Event(i + 1, "decided", job, 0, "admitted"))
                seen = 0
                while seen < len(jobs) // 2:  # alice's: every other one
                    if (await r.content.readline()).startswith(b"data: "):
                        seen += 1
                assert set(console.owners) == set(jobs)
                for forget in controller.prune_hooks:  # retention deleted them all
                    forget(jobs)
                r.close()
        finally:
            await console.close()
        return console

    console = asyncio.run(scenario())
    assert console.owners == {}
    assert console._learned_at == {}


def test_a_public_url_gives_the_consoles_prefix_hosts_and_https() -> None:
    """``[web] public_url``: its path (no ``/`` at its end) is where the console's links
    begin, its host (and host:port unless the port is the scheme's) what a browser's
    ``Origin`` and a proxy's ``Host`` may name, and https makes the cookie Secure."""
    from controller.console.public_url import parse

    assert parse("") is None
    one = parse("https://Head.Example/oasis/")
    assert one is not None
    assert (one.url, one.prefix, one.hosts, one.secure) == (
        "https://Head.Example/oasis", "/oasis", frozenset({"head.example"}), True)  # fmt: skip
    two = parse("http://head.example:8443/tools/oasis")
    assert two is not None
    assert (two.prefix, two.hosts, two.secure) == (
        "/tools/oasis", frozenset({"head.example", "head.example:8443"}), False)  # fmt: skip
    default = parse("https://head.example:443")
    assert default is not None and (default.prefix, default.hosts) == (
        "",
        frozenset({"head.example"}),
    )
    six = parse("http://[::1]:8080/")
    assert six is not None and six.hosts == {"[::1]", "[::1]:8080"} and six.prefix == ""
    assert web_from_dict({"public_url": "https://h.example/o/"}, None).public_url == (
        "https://h.example/o")  # fmt: skip


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (8080, "must be a string"),
        ("head.example/oasis", "must be an http:// or https:// URL"),
        ("ftp://head.example/", "must be an http:// or https:// URL"),
        ("https:///oasis", "must be an http:// or https:// URL"),
        ("https://u:p@head.example/", "with no user, query or fragment"),
        ("https://head.example/oasis?x=1", "with no user, query or fragment"),
        ("https://head.example/oasis#top", "with no user, query or fragment"),
        ("https://head.example/oasis?", "with no user, query or fragment"),
        ("https://head.example:99999/", "has a port that is not a number"),
        ("https://head.example/o asis", "printable ASCII"),
        ("https://head.example/ø", "printable ASCII"),
        ("https://head.example//oasis", "has a path the console cannot be served under"),
        ("https://head.example/oa%20sis", "has a path the console cannot be served under"),
        ("https://head.example/../oasis", "may not have . or .. in its path"),
        ("https://head.example/jobs", "has a path beginning with /jobs"),
        ("https://head.example/api/x", "has a path beginning with /api"),
        ("https://head.example/" + "a" * 500, "at most 500 characters"),
    ],
)
def test_a_public_url_the_console_cannot_serve_is_refused_naming_the_key(
    url: object, words: str
) -> None:
    with pytest.raises(SpecError) as refused:
        web_from_dict({"public_url": url}, None)
    assert str(refused.value).startswith("web.public_url: "), refused.value
    assert words in str(refused.value), refused.value


def test_the_route_segments_a_public_url_may_not_begin_with_are_the_consoles_own() -> None:
    """A public URL's path may not begin with a path of the console's own (``/jobs/x``
    would be the job x's page or the prefix's): the list checked is the routes' first
    segments, whole."""
    from controller.console.public_url import ROUTE_SEGMENTS

    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    app = Console(config, cast(Any, SimpleNamespace(prune_hooks=[])), None, None).app()
    first = {r.canonical.split("/")[1] for r in app.router.resources()}
    assert first - {""} == ROUTE_SEGMENTS
