"""The console's serving side, in-process (no daemon): what an event stream resumes
from and sends once, what it leaves behind when it ends, and the checks every request
goes through (login, the form token and origin, the security headers, the body size).
Each test pins a behaviour a mutation audit found no test held."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest

from controller.config import from_dict
from controller.console import streams as streams_module
from controller.console.app import Console
from controller.events import Event, EventBus
from tests.test_console_units import CLUSTER, _console_config

pytestmark = pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")


def _controller(
    bus: EventBus, stored: list[Event], on_read: Callable[[], None] = lambda: None
) -> Any:
    """A controller that stores ``stored`` and publishes on ``bus``; ``on_read`` is
    called as a stream reads the store (an event may be published meanwhile)."""

    async def events(after: int, *_: Any, newest: bool = False, **__: Any) -> list[Event]:
        on_read()
        found = [e for e in stored if e.sequence > after]
        return found[-1:] if newest and after < 0 else found

    async def own(owner: str, after: int, *_: Any) -> list[Event]:
        return await events(after)

    return cast(Any, SimpleNamespace(bus=bus, prune_hooks=[], stored_events=events,
                                     own_events=own))  # fmt: skip


async def _ids(response: aiohttp.ClientResponse, until: int) -> list[int]:
    """The event ids read from ``response`` up to and including ``until``."""
    seen: list[int] = []
    while not seen or seen[-1] != until:
        line = (await asyncio.wait_for(response.content.readline(), 10)).decode()
        if line.startswith("id: "):
            seen.append(int(line[4:]))
    return seen


def _run(config: Any, controller: Any, scenario: Callable[[Console, str], Awaitable[None]]) -> None:
    async def main() -> None:
        console = Console(config, controller, None, None)
        await console.start()
        try:
            await scenario(console, f"http://{console.address}")
        finally:
            await console.close()

    asyncio.run(main())


def test_a_negative_last_event_id_is_ignored_and_the_query_resumes_the_stream() -> None:
    """``Last-Event-ID`` is the id of an event the page got: a sequence, never negative.
    A negative one (a script's) is ignored, and ``?after=`` says where to resume; taken,
    it resumed nothing."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    stored = [Event(n, "note", "", 0, "", {}) for n in (1, 2, 3)]
    bus = EventBus()

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http:
            headers = {"Last-Event-ID": "-1"}
            async with http.get(url + "/api/events?after=1", headers=headers) as r:
                assert r.status == 200
                assert await _ids(r, 3) == [2, 3]

    _run(config, _controller(bus, stored), scenario)


def test_an_event_published_while_the_backlog_is_read_is_sent_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream subscribes before it reads the backlog, so an event stored and published
    meanwhile is both in the backlog and in its queue: sent once, not twice. And a stream
    that ends leaves the bus (no queue kept filling for good)."""
    monkeypatch.setattr(streams_module, "_HEARTBEAT_SECONDS", 0.05)
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    bus = EventBus()
    stored = [Event(1, "note", "", 0, "", {})]

    def on_read() -> None:
        if len(stored) == 1:  # the next event, stored and published as the backlog is read
            stored.append(Event(2, "note", "", 0, "", {}))
            bus.publish(stored[-1])

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http, http.get(url + "/api/events?after=0") as r:
            assert r.status == 200
            await _ids(r, 2)
            bus.publish(Event(3, "note", "", 0, "", {}))
            assert await _ids(r, 3) == [3]  # before: [2, 3], event 2 twice
        for _ in range(200):  # the daemon notices the client left at a heartbeat
            if not console.streams:
                break
            await asyncio.sleep(0.05)
        assert console.streams == {}
        assert not bus._queues, "an ended stream is still subscribed to the bus"

    _run(config, _controller(bus, stored, on_read), scenario)


def test_a_submitters_stream_shows_no_event_of_no_job(tmp_path: Path) -> None:
    """A submitter's stream carries its own jobs' events only: an event of no job (a
    cordon, a reload: the operator's business) is not sent to it, live or replayed; an
    operator's stream carries it."""
    config = _console_config(tmp_path, alice="submitter", ops="operator")
    bus = EventBus()
    stored = [Event(1, "cordoned", "", 0, "", {"server": "w0"}),
              Event(2, "decided", "alice:j", 0, "admitted", {})]  # fmt: skip

    async def scenario(console: Console, url: str) -> None:
        async def owners(job_ids: Any) -> dict[str, str | None]:
            return dict.fromkeys(job_ids, "alice")

        console.data.owner_of = owners  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            streams = {}
            for who in ("alice", "ops"):
                headers = {"Authorization": f"Bearer {who}-token"}
                streams[who] = await http.get(url + "/api/events?after=0", headers=headers)
                assert streams[who].status == 200
            assert await _ids(streams["alice"], 2) == [2]
            assert await _ids(streams["ops"], 2) == [1, 2]
            bus.publish(Event(3, "uncordoned", "", 0, "", {"server": "w0"}))
            bus.publish(Event(4, "running", "alice:j", 0, "running", {}))
            assert await _ids(streams["alice"], 4) == [4]
            assert await _ids(streams["ops"], 4) == [3, 4]
            for stream in streams.values():
                stream.close()

    _run(config, _controller(bus, stored), scenario)


def test_a_submitters_stream_never_shows_another_submitters_job(tmp_path: Path) -> None:
    """Alice's stream does not show bob's job's events: not the first (its owner read
    from the store), nor those after it (its owner then known), live or replayed."""
    config = _console_config(tmp_path, alice="submitter", bob="submitter")
    bus = EventBus()
    stored = [Event(1, "decided", "bob:k", 0, "admitted", {}),
              Event(2, "running", "bob:k", 0, "running", {}),
              Event(3, "decided", "alice:j", 0, "admitted", {})]  # fmt: skip

    async def scenario(console: Console, url: str) -> None:
        async def owners(job_ids: Any) -> dict[str, str | None]:
            return {job_id: job_id.split(":")[0] for job_id in job_ids}

        console.data.owner_of = owners  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": "Bearer alice-token"}
            async with http.get(url + "/api/events?after=0", headers=headers) as r:
                assert r.status == 200
                assert await _ids(r, 3) == [3]
                bus.publish(Event(4, "decided", "bob:m", 0, "admitted", {}))
                bus.publish(Event(5, "running", "bob:m", 0, "running", {}))
                bus.publish(Event(6, "finished", "bob:k", 0, "finished", {}))
                bus.publish(Event(7, "running", "alice:j", 0, "running", {}))
                assert await _ids(r, 7) == [7]

    _run(config, _controller(bus, stored), scenario)


# -- the checks every request goes through ------------------------------------------

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def test_every_answer_carries_every_security_header_whole() -> None:
    """Each security header, whole, on a page, a refusal, aiohttp's own 404 and 405:
    the policy allows no inline script and no <base>, no page leaks its URL (and so a
    job's id) to another site, and no answer is cached."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http:
            for method, path, status in (("GET", "/login", 303), ("GET", "/nothing", 404),
                                         ("PUT", "/", 405), ("GET", "/static/x", 404),
                                         ("GET", "/api/jobs?after=x", 400)):  # fmt: skip
                async with http.request(method, url + path, allow_redirects=False) as r:
                    assert r.status == status, (method, path)
                    assert r.headers["Content-Security-Policy"] == _CSP, path
                    assert r.headers["Referrer-Policy"] == "same-origin", path
                    assert r.headers["Cache-Control"] == "no-store", path
                    assert r.headers["X-Frame-Options"] == "DENY", path

    _run(config, None, scenario)


def test_an_internal_error_is_logged_not_told() -> None:
    """An unexpected error answers 500 with a fixed message: its text (a path, a
    database's address, another tenant's job) is for the daemon's log only; a client
    that asks for JSON is answered JSON on a page's path too."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})

    async def scenario(console: Console, url: str) -> None:
        async def jobs(*_: Any, **__: Any) -> Any:
            raise RuntimeError("secret: postgresql://oasis:hunter2@db")

        console.data.jobs = jobs  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            for path, accept in (("/api/jobs", ""), ("/jobs", "text/html"),
                                 ("/jobs", "application/json")):  # fmt: skip
                async with http.get(url + path, headers={"Accept": accept}) as r:
                    assert r.status == 500
                    body = await r.text()
                    assert "hunter2" not in body and "internal error" in body
                    json_asked = path.startswith("/api/") or "json" in accept
                    assert r.content_type == ("application/json" if json_asked else "text/html")

    _run(config, None, scenario)


def test_a_token_is_only_taken_as_a_bearer_token_and_guesses_cost_the_peers_rate(
    tmp_path: Path,
) -> None:
    """``Authorization: Basic TOKEN`` is no bearer token: refused (401). Every bad token,
    and every bad login, takes from the peer's rate: guessing is refused (429) once it
    is spent. A good login takes from its own user's rate, not the peer's."""
    from controller.limits import RateLimiter

    config = _console_config(tmp_path, alice="submitter", bob="submitter")

    async def main() -> None:
        limiter = RateLimiter(rate=0.001, burst=2)  # no refill within the test
        console = Console(config, None, limiter, None)  # type: ignore[arg-type]
        await console.start()
        url = f"http://{console.address}"
        try:
            async with aiohttp.ClientSession() as http:
                basic = {"Authorization": "Basic alice-token"}
                async with http.get(url + "/api/overview", headers=basic) as r:
                    assert r.status == 401
                got = []
                for _ in range(2):
                    guess = {"Authorization": "Bearer guess"}
                    async with http.get(url + "/api/overview", headers=guess) as r:
                        got.append(r.status)
                assert got == [401, 429]  # the peer's 2: the Basic one and a guess
                async with http.post(url + "/login", data={"token": "guess"}) as r:
                    assert r.status == 429
                for _ in range(2):  # alice's own rate, then spent
                    async with http.post(url + "/login", data={"token": "alice-token"},
                                         allow_redirects=False) as r:  # fmt: skip
                        got.append(r.status)
                assert got[2:] == [303, 303]
                async with http.post(url + "/login", data={"token": "alice-token"},
                                     allow_redirects=False) as r:  # fmt: skip
                    assert r.status == 429  # alice's rate spent: refused
        finally:
            await console.close()

    asyncio.run(main())


def test_a_cancel_needs_its_form_token_and_a_same_origin_page(tmp_path: Path) -> None:
    """A browser's cancel (its session cookie) is taken with the session's form token,
    from this console's page: with the right token but a page of another site's
    ``Origin`` (or ``Sec-Fetch-Site: cross-site``), refused as well (403), and the
    controller is never asked."""
    from controller.console.login import mask
    from controller.errors import NotFoundError

    config = _console_config(tmp_path, ops="operator")
    asked: list[str] = []

    async def cancel(key: str, *_: Any) -> Any:
        asked.append(key)
        raise NotFoundError(f"no job {key!r}")

    controller = cast(Any, SimpleNamespace(bus=EventBus(), prune_hooks=[], cancel=cancel))

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/login", data={"token": "ops-token"},
                                 allow_redirects=False) as r:  # fmt: skip
                assert r.status == 303
                cookie = {"Cookie": f"oasis_session={r.cookies['oasis_session'].value}"}
            session = console.sessions.get(r.cookies["oasis_session"].value)
            assert session is not None
            token = {"X-CSRF-Token": mask(session.csrf)}
            for other in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                          {"X-CSRF-Token": mask("guess" * 9)}):  # fmt: skip
                headers = {**cookie, **token, **other}
                async with http.post(url + "/api/jobs/x/cancel", headers=headers) as r:
                    assert r.status == 403, other
            assert asked == []
            headers = {**cookie, **token, "Origin": url, "Sec-Fetch-Site": "same-origin"}
            async with http.post(url + "/api/jobs/x/cancel", headers=headers) as r:
                assert r.status == 404  # past the checks: the controller was asked
            assert asked == ["x"]

    _run(config, controller, scenario)


def test_a_logout_needs_its_form_token_and_ends_the_session_and_its_cookie(
    tmp_path: Path,
) -> None:
    """Another site's page cannot log a visitor out (logout CSRF: 403, the session goes
    on); a logout from the console's page ends the session and deletes its cookie."""
    from controller.console.login import mask

    config = _console_config(tmp_path, ops="operator")

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/login", data={"token": "ops-token"},
                                 allow_redirects=False) as r:  # fmt: skip
                session_id = r.cookies["oasis_session"].value
            cookie = {"Cookie": f"oasis_session={session_id}"}
            session = console.sessions.get(session_id)
            assert session is not None
            async with http.post(url + "/logout", headers=cookie, data={"csrf": "guess"},
                                 allow_redirects=False) as r:  # fmt: skip
                assert r.status == 403
            assert console.sessions.get(session_id) is session
            async with http.post(url + "/logout", headers=cookie,
                                 data={"csrf": mask(session.csrf)},
                                 allow_redirects=False) as r:  # fmt: skip
                assert (r.status, r.headers["Location"]) == (303, "/login")
                assert r.cookies["oasis_session"].value == ""
                assert r.cookies["oasis_session"]["max-age"] == "0"
            assert console.sessions.get(session_id) is None
            async with http.get(url + "/api/overview", headers=cookie) as r:
                assert r.status == 401

    _run(config, None, scenario)


def test_a_body_past_64_kib_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """A request's body is at most 64 KiB (``client_max_size``): a login form of
    200 KiB is refused 413, not read into the daemon's memory. Before a login only ``/login`` and
    the files under ``/static/`` are open."""
    config = _console_config(tmp_path, ops="operator")

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http:
            form = {"token": "ops-token", "next": "/" + "x" * (200 << 10)}
            async with http.post(url + "/login", data=form, allow_redirects=False) as r:
                assert r.status == 413
            assert len(console.sessions) == 0
            for path in ("/static", "/staticx"):
                async with http.get(url + path, allow_redirects=False) as r:
                    assert r.status in (303, 401), path
                    assert r.headers.get("Location", "/login").startswith("/login"), path

    _run(config, None, scenario)


def test_the_job_owners_the_streams_remember_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The owners the submitters' streams share are at most ``_OWNER_CACHE`` (past it,
    they start over), the sequences they were read at with them: a stream replaying a
    long history of many jobs does not grow the daemon's memory for good."""
    monkeypatch.setattr(streams_module, "_OWNER_CACHE", 10)
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    console = Console(config, _controller(EventBus(), []), None, None)

    async def owner_of(job_ids: Any) -> dict[str, str | None]:
        return dict.fromkeys(job_ids, "alice")

    console.data.owner_of = owner_of  # type: ignore[method-assign]

    async def scenario() -> None:
        for n in range(25):
            found = await console._learn_owners({f"j{n}", f"k{n}"}, n)
            assert found == {f"j{n}": "alice", f"k{n}": "alice"}
            assert len(console.owners) <= 10 and len(console._learned_at) <= 10
        assert console.owners["j24"] == "alice" and not console._reading

    asyncio.run(scenario())


async def _alices_read_begun_then_bobs(
    console: Console,
) -> tuple[asyncio.Event, asyncio.Future[dict[str, str | None]]]:
    """Job ``a``'s owner read twice: the first read (begun at sequence 5, when ``a`` was
    alice's job) waits on the returned gate, the second (bob's job by then) answers at
    once. Returns the gate and the first read, begun."""
    gate = asyncio.Event()
    answers = iter(["alice", "bob"])

    async def owner_of(job_ids: Any) -> dict[str, str | None]:
        who = next(answers)
        if who == "alice":
            await gate.wait()  # the older read, slow
        return dict.fromkeys(job_ids, who)

    console.data.owner_of = owner_of  # type: ignore[method-assign]
    older = asyncio.ensure_future(console._learn_owners({"a"}, 5))
    await asyncio.sleep(0.01)
    return gate, older


def test_an_older_read_of_a_jobs_owner_does_not_overwrite_a_newer_one() -> None:
    """Job ``a`` was alice's; retention deleted it and bob's new job took its id. A read
    of its owner begun before (at sequence 5) ends after a read begun at bob's decision
    (at 9): what the older found (alice) is not kept over the newer (bob), or bob's
    job's next events would show in alice's streams."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    console = Console(config, _controller(EventBus(), []), None, None)

    async def scenario() -> None:
        gate, older = await _alices_read_begun_then_bobs(console)
        assert await console._learn_owners({"a"}, 9) == {"a": "bob"}
        gate.set()
        assert await older == {"a": "alice"}  # what that read found, for its own caller
        assert console.owners["a"] == "bob"
        later = Event(10, "running", "a", 0, "running", {})
        assert not await console._visible(later, "alice")
        assert await console._visible(later, "bob")

    asyncio.run(scenario())


def test_a_stalled_streams_connection_is_dropped_not_left_to_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream whose client stopped reading ends after ``WRITE_SECONDS`` (0.5 s here)
    and its connection is aborted: closed, it would wait to flush what the client never
    reads, and hold its descriptor and its place under ``web.max_connections`` for good
    (the client here still connected, reading nothing)."""
    import socket

    monkeypatch.setattr(streams_module, "WRITE_SECONDS", 0.5)
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    bus = EventBus()
    blob = "x" * 256 * 1024

    async def scenario(console: Console, url: str) -> None:
        loop = asyncio.get_running_loop()
        host, port = console.address.rsplit(":", 1)
        assert console.runner is not None and console.runner.server is not None
        server = console.runner.server
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, int(port)))
            request = f"GET /api/events HTTP/1.1\r\nHost: {console.address}\r\n\r\n"
            await loop.sock_sendall(sock, request.encode())
            while console.streams != {"": 1}:
                await asyncio.sleep(0.01)
            sequence = 0
            while console.streams and sequence < 200:  # 50 MiB at most: past every buffer
                sequence += 1
                bus.publish(Event(sequence, "note", "", 0, "", {"blob": blob}))
                await asyncio.sleep(0.01)
            assert console.streams == {}, "the unread stream did not end"
            for _ in range(200):
                if not server.connections:
                    break
                await asyncio.sleep(0.05)
            assert not server.connections, "the stalled stream's connection is still held"

    _run(config, _controller(bus, []), scenario)


# -- the connections below HTTP -----------------------------------------------------


async def _closed_by_server(sock: Any, loop: asyncio.AbstractEventLoop) -> bytes:
    """Everything ``sock`` gets until the console closes its connection (at most 20 s:
    then the assert fails)."""
    got = b""
    while True:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 20)
        if not chunk:
            return got
        got += chunk


def test_idle_and_handshaking_connections_are_closed_and_the_cap_refuses_and_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle connection is closed after ``IDLE_SECONDS`` (0.5 s here, aiohttp's own: an
    hour), an HTTPS one that never finishes its handshake after ``HANDSHAKE_SECONDS``;
    one past ``web.max_connections`` is answered 503 and closed at once. Each held open
    kept a descriptor and a place under the cap for good."""
    import socket

    from controller.console import app as app_module
    from tests.test_security import make_pki

    monkeypatch.setattr(app_module, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(app_module, "HANDSHAKE_SECONDS", 0.5)
    pki = make_pki(tmp_path)
    web = {"listen": "127.0.0.1:0", "max_connections": 1}
    plain = from_dict({"cluster": CLUSTER, "web": web})
    tls = {"cert": str(pki.server_cert), "key": str(pki.server_key)}
    https = from_dict({"cluster": CLUSTER, "tls": tls, "web": {"listen": "127.0.0.1:0"}})

    async def connect(console: Console) -> socket.socket:
        host, port = console.address.rsplit(":", 1)
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        return sock

    async def idle(console: Console, url: str) -> None:
        loop = asyncio.get_running_loop()
        with await connect(console) as sock:
            request = f"GET /static/console.css HTTP/1.1\r\nHost: {console.address}\r\n\r\n"
            await loop.sock_sendall(sock, request.encode())
            first = await asyncio.wait_for(loop.sock_recv(sock, 65536), 20)
            assert first.startswith(b"HTTP/1.1 200 ")
            assert console.runner is not None and console.runner.server is not None
            while not console.runner.server.connections:  # served, then idle
                await asyncio.sleep(0.01)
            with await connect(console) as refused:  # the one place is taken
                answer = await _closed_by_server(refused, loop)
                assert answer.startswith(b"HTTP/1.1 503 ")
                assert b"web.max_connections" in answer
            await _closed_by_server(sock, loop)  # idle: closed

    async def handshaking(console: Console, url: str) -> None:
        with await connect(console) as sock:  # a TLS handshake never begun
            assert await _closed_by_server(sock, asyncio.get_running_loop()) == b""

    _run(plain, _controller(EventBus(), []), idle)
    _run(https, _controller(EventBus(), []), handshaking)


def test_a_new_jobs_decision_does_not_wait_on_an_older_read_of_its_id() -> None:
    """A stream that meets bob's decision for job ``a`` (at sequence 9) reads its owner
    as of then: it does not share a read of ``a``'s owner begun before (at 5, when the
    id was still alice's job's), which would show bob's job to alice."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})
    console = Console(config, _controller(EventBus(), []), None, None)

    async def scenario() -> None:
        gate, older = await _alices_read_begun_then_bobs(console)
        decided = Event(9, "decided", "a", 0, "admitted", {})
        shown = asyncio.ensure_future(console._visible(decided, "alice"))
        await asyncio.sleep(0.01)
        gate.set()
        assert await older == {"a": "alice"}
        assert await shown is False
        assert console.owners["a"] == "bob"

    asyncio.run(scenario())


def test_a_console_on_loopback_answers_loopback_host_names_only(tmp_path: Path) -> None:
    """DNS rebinding: another site's name, rebound to 127.0.0.1, would let its page read
    the console with the visitor's session. A request whose ``Host`` is not a loopback
    name with the console's port is refused (421) before any login or handler."""
    config = _console_config(tmp_path, ops="operator")

    async def scenario(console: Console, url: str) -> None:
        port = console.address.rsplit(":", 1)[1]
        async with aiohttp.ClientSession() as http:
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.1:1"):
                headers = {"Host": host, "Authorization": "Bearer ops-token"}
                async with http.get(url + "/api/overview", headers=headers) as r:
                    assert r.status == 421, host
                    said = (await r.json())["error"]["message"]
                    # what a reverse proxy's operator does (nginx with Host $host met it)
                    words = (f"this console answers to loopback names only, not {host!r}. "
                             "Behind a reverse proxy: set [web] public_url to the URL users "
                             "open")  # fmt: skip
                    assert said.startswith(words), said
                form = {"token": "ops-token"}
                async with http.post(
                    url + "/login", headers={"Host": host}, data=form, allow_redirects=False
                ) as r:
                    assert r.status == 421 and "Set-Cookie" not in r.headers, host
            for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
                async with http.get(url + "/login", headers={"Host": host}) as r:
                    assert r.status == 200, host

    _run(config, None, scenario)


def test_the_path_after_login_is_at_most_2000_characters() -> None:
    """A login's ``next`` of more than 2,000 characters goes to ``/``: a page of another
    site cannot make the console answer a redirect of any length."""
    from controller.console.login import _safe_next

    assert _safe_next("/" + "a" * 1999) == "/" + "a" * 1999
    assert _safe_next("/" + "a" * 2000) == "/"


def test_closing_the_console_ends_its_open_streams_whole() -> None:
    """The console's close ends each open event stream first: the page gets the stream's
    proper end (and reconnects), not a connection cut once aiohttp's shutdown gives up
    on the stream after a minute, holding the daemon's stop that long."""
    config = from_dict({"cluster": CLUSTER, "web": {"listen": "127.0.0.1:0"}})

    async def main() -> None:
        console = Console(config, _controller(EventBus(), []), None, None)
        await console.start()
        try:
            async with aiohttp.ClientSession() as http:
                url = f"http://{console.address}/api/events"
                async with http.get(url) as r:
                    assert r.status == 200
                    assert await r.content.readuntil(b"\n\n") == b"retry: 2000\n\n"
                    closing = asyncio.ensure_future(console.close())
                    rest = await asyncio.wait_for(r.content.read(), 120)  # no cut: no error
                    assert rest in (b"", b": ping\n\n")  # at most the wait's heartbeat
                    await closing
        finally:
            await console.close()

    asyncio.run(main())


def test_behind_a_public_url_its_host_and_origin_are_taken_and_every_path_is_under_it(
    tmp_path: Path,
) -> None:
    """``[web] public_url = "https://head.example/oasis/"``: a proxy may send its host as
    ``Host`` (another name still gets 421), a login posted from a page of it (its
    ``Origin``) is taken, another site's is not; the session cookie is Secure and for
    ``/oasis/`` only; every redirect stays under ``/oasis`` (a ``next`` that carries the
    prefix is not given it twice), with or without the prefix on the request's path."""
    from controller.console.login import mask

    config = _console_config(tmp_path, ops="operator")
    config = dataclasses.replace(
        config, web=dataclasses.replace(config.web, public_url="https://head.example/oasis")
    )
    ours, theirs = "https://head.example", "https://evil.example"

    async def scenario(console: Console, url: str) -> None:
        async with aiohttp.ClientSession() as http:
            # host names are not case-sensitive: a proxy may send the name as typed
            for host, status in (("head.example", 200), ("Head.Example", 200),
                                 ("evil.example", 421)):  # fmt: skip
                async with http.get(url + "/oasis/login", headers={"Host": host}) as r:
                    assert r.status == status, host
                    if status == 200:
                        assert 'action="/oasis/login"' in await r.text()
            async with http.get(url + "/oasis", allow_redirects=False) as r:
                assert (r.status, r.headers["Location"]) == (303, "/oasis/login?next=/")
            for path in ("/oasis/jobs?state=admitted", "/jobs?state=admitted"):
                async with http.get(url + path, allow_redirects=False) as r:
                    assert r.status == 303, path
                    went = urlsplit(r.headers["Location"])
                    assert went.path == "/oasis/login", went
                    assert parse_qs(went.query) == {"next": ["/jobs?state=admitted"]}, went
            async with http.get(url + "/oasis/api/jobs") as r:
                assert r.status == 401
                assert (await r.json())["error"]["message"].startswith(
                    "log in first (/oasis/login)"
                )
            form = {"token": "ops-token", "next": "/oasis/jobs"}
            async with http.post(url + "/login", data=form, headers={"Origin": theirs},
                                 allow_redirects=False) as r:  # fmt: skip
                assert r.status == 403 and "Set-Cookie" not in r.headers
            async with http.post(url + "/oasis/login", data=form, headers={"Origin": ours},
                                 allow_redirects=False) as r:  # fmt: skip
                assert (r.status, r.headers["Location"]) == (303, "/oasis/jobs")
                cookie = r.cookies["oasis_session"]
                assert (cookie["path"], cookie["secure"], cookie["httponly"]) == (
                    "/oasis/", True, True)  # fmt: skip
            session = console.sessions.get(cookie.value)
            assert session is not None
            headers = {"Cookie": f"oasis_session={cookie.value}", "Origin": ours}
            async with http.post(url + "/logout", data={"csrf": mask(session.csrf)},
                                 headers=headers, allow_redirects=False) as r:  # fmt: skip
                assert (r.status, r.headers["Location"]) == (303, "/oasis/login")
                assert r.cookies["oasis_session"]["path"] == "/oasis/"
            async with http.get(url + "/oasis", headers=headers, allow_redirects=False) as r:
                assert r.status == 303  # logged out: to the login page
            async with http.post(url + "/oasis/login", data=form, allow_redirects=False) as r:
                cookie = r.cookies["oasis_session"]
            headers = {"Cookie": f"oasis_session={cookie.value}"}
            async with http.get(url + "/oasis", headers=headers, allow_redirects=False) as r:
                assert (r.status, r.headers["Location"]) == (301, "/oasis/")

    _run(config, None, scenario)
