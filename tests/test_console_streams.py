"""The console's event streams are capped per user and in all: a real ``oasisd``
subprocess with tokens (three submitters, an operator) and the console on a loopback
port, streams opened over HTTP (``/api/events``, server-sent events) until refused, and
a refused page in headless Chromium.

Each open stream holds a descriptor, a task and a queue in the daemon, and every new
event costs each stream work (a submitter's stream looks up the job's owner): without a
cap one user's script could open streams until the daemon ran out of descriptors, or
slow every event for everyone.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel
from tests.browser import chromium, needed
from tests.servers import SMALL_JOB, Daemon, json_log, write_config

TOKENS = {"alice": "alice-stream-token", "bob": "bob-stream-token", "ops": "ops-stream-token",
          "carol": "carol-stream-token"}  # fmt: skip
ROLES = {"alice": "submitter", "bob": "submitter", "ops": "operator", "carol": "submitter"}
PER_USER = 4
TOTAL = 7
CONNECTIONS = 16

pytestmark = pytest.mark.timeout(120)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}", "Accept": "text/event-stream"}


async def open_stream(http: aiohttp.ClientSession, url: str, name: str) -> Any:
    """An event stream of ``name``'s, open (its first bytes read), or the refusal."""
    r = await http.get(url + "/api/events", headers=bearer(name))
    if r.status == 200:
        assert (await r.content.readuntil(b"\n\n")) == b"retry: 2000\n\n"
    return r


async def next_event(stream: Any) -> dict[str, Any]:
    """The next ``oasis`` event on ``stream`` (heartbeats skipped)."""
    while True:
        block = (await stream.content.readuntil(b"\n\n")).decode()
        for line in block.splitlines():
            if line.startswith("data: "):
                return dict(json.loads(line[len("data: ") :]))


class Console:
    """The daemon and its console's URL."""

    def __init__(self, daemon: Daemon, url: str, tokens: Path, log: Path) -> None:
        self.daemon = daemon
        self.url = url
        self.tokens = tokens  # the tokens file (a test may rewrite it and reload)
        self.log = log


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {ROLES[n]} {hash_token(t)}\n" for n, t in TOKENS.items()))
    extra = (
        f'[auth]\ntokens_file = "{tokens}"\n[web]\nlisten = "127.0.0.1:0"\n'
        f"max_event_streams_per_user = {PER_USER}\nmax_event_streams = {TOTAL}\n"
        f"max_connections = {CONNECTIONS}\n"
    )
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", extra=extra)
    daemon = Daemon(config, tmp_path / "oasisd.log").start()
    try:
        web = next(
            line["address"] for line in json_log(tmp_path / "oasisd.log")
            if line.get("event") == "console listening"
        )  # fmt: skip
        yield Console(daemon, f"http://{web}", tokens, tmp_path / "oasisd.log")
    finally:
        assert daemon.stop() == 0  # a clean stop, streams open or not


def test_one_users_event_streams_are_capped_and_others_still_get_one(console: Console) -> None:
    url, daemon = console.url, console.daemon

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            alice = []
            for _ in range(PER_USER):
                r = await open_stream(http, url, "alice")
                assert r.status == 200, await r.text()
                alice.append(r)
            # one more of Alice's is refused, with the limit named
            refused = await open_stream(http, url, "alice")
            assert refused.status == 429
            message = (await refused.json())["error"]["message"]
            assert f"web.max_event_streams_per_user = {PER_USER}" in message, message
            assert "alice" in message
            # ... also from a browser session of hers: the cap is the user's
            async with http.post(
                url + "/login", data={"token": TOKENS["alice"]}, allow_redirects=False
            ) as login:
                assert login.status == 303
                cookie = f"oasis_session={login.cookies['oasis_session'].value}"
            async with http.get(url + "/api/events", headers={"Cookie": cookie}) as by_cookie:
                assert by_cookie.status == 429

            # another user still gets streams, and they carry events
            bob = await open_stream(http, url, "bob")
            assert bob.status == 200
            for name in ("bob", "alice"):
                with client_channel(daemon.address, token=TOKENS[name]) as channel:
                    spec = {**SMALL_JOB, "id": f"{name}-job"}
                    pb_grpc.AdmissionStub(channel).SubmitJob(
                        pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=30
                    )
            event = await asyncio.wait_for(next_event(bob), 30)
            assert (event["kind"], event["job_id"]) == ("decided", "bob-job")
            # Alice's open streams still work (her own jobs' events only)
            event = await asyncio.wait_for(next_event(alice[-1]), 30)
            assert (event["kind"], event["job_id"]) == ("decided", "alice-job")

            # the total: 4 + 1 open, two more of the operator's fill it
            ops = [await open_stream(http, url, "ops") for _ in range(TOTAL - PER_USER - 1)]
            assert [r.status for r in ops] == [200] * len(ops)
            full = await open_stream(http, url, "carol")
            assert full.status == 503
            message = (await full.json())["error"]["message"]
            assert f"web.max_event_streams = {TOTAL}" in message, message
            for r in [*alice, bob, *ops]:
                r.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    except TimeoutError:
        pytest.fail("an event stream did not deliver an event in time")


def test_a_refused_tab_says_it_is_not_updating(console: Console) -> None:
    """In a real browser: a page of a user whose streams are all taken says it is not
    updating (an EventSource refused is closed for good, so "reconnecting" would be
    false); another user's page is live."""
    needed()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    held = []
    for _ in range(PER_USER):
        request = urllib.request.Request(console.url + "/api/events", headers=bearer("alice"))
        stream = urllib.request.urlopen(request, timeout=10)
        assert stream.status == 200
        held.append(stream)
    profile = tempfile.mkdtemp(prefix="oasis-chromium-")
    browser = chromium(profile)
    try:
        for name, expected in (("alice", "not updating: reload the page"), ("bob", "● live")):
            browser.delete_all_cookies()
            browser.get(console.url + "/login")
            field = browser.find_element(By.ID, "token")
            field.send_keys(TOKENS[name])
            field.submit()
            WebDriverWait(browser, 15).until(lambda b: b.get_cookie("oasis_session"))
            browser.get(console.url + "/jobs")

            def says(b: Any, want: str = expected) -> bool:
                return bool(b.find_element(By.ID, "live").text == want)

            WebDriverWait(browser, 15, poll_frequency=0.1).until(
                says, message=f"{name}'s page to say {expected!r}"
            )
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)
        for stream in held:
            stream.close()


def test_a_flood_of_connections_costs_the_console_not_the_daemon(console: Console) -> None:
    """Connections that send nothing fill ``web.max_connections``; the next is answered
    503 at once and closed (not held, so it costs no descriptor); gRPC clients are served
    all along; once the flood ends the console answers again."""
    host, _, port = console.url.removeprefix("http://").rpartition(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.5)  # every one accepted and counted
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=10) as extra:
                answer = b""
                while chunk := extra.recv(4096):  # read until the daemon closes it
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert b"web.max_connections" in answer
        # the daemon itself is untouched: a gRPC call is served while the console is full
        with client_channel(console.daemon.address, token=TOKENS["ops"]) as channel:
            info = pb_grpc.ClusterStub(channel).GetClusterInfo(
                pb.GetClusterInfoRequest(), timeout=10
            )
            assert info.window > 0
        # a held connection is served like any other (they were accepted, not parked)
        held[0].sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:" + port.encode() + b"\r\n\r\n")
        assert held[0].recv(4096).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the closed ones free their places
        try:
            with urllib.request.urlopen(console.url + "/login", timeout=10) as page:
                assert page.status == 200
                break
        except urllib.error.HTTPError as err:
            assert err.code == 503 and time.monotonic() < deadline, err
            time.sleep(0.1)


def test_a_page_resumed_past_a_restored_stores_newest_event_gets_the_new_ones(
    console: Console,
) -> None:
    """The restore audit: a store restored from a backup numbers its new events from its
    own newest, so a page that had seen more (its Last-Event-ID, sent on reconnect)
    skipped every event up to the number it had seen, without a word."""

    async def run() -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            headers = {**bearer("ops"), "Last-Event-ID": "1000"}
            r = await http.get(console.url + "/api/events", headers=headers)
            assert r.status == 200
            assert (await r.content.readuntil(b"\n\n")) == b"retry: 2000\n\n"
            with client_channel(console.daemon.address, token=TOKENS["alice"]) as channel:
                request = pb.SubmitJobRequest(job=spec_to_proto({**SMALL_JOB, "id": "after"}))
                await asyncio.to_thread(pb_grpc.AdmissionStub(channel).SubmitJob, request,
                                        timeout=60)  # fmt: skip
            event = await asyncio.wait_for(next_event(r), 20)
            r.close()
            return event

    event = asyncio.run(run())
    assert event["job_id"] == "alice:after" and event["kind"] == "decided", event


def test_a_submitters_resumed_stream_gets_its_own_events_whatever_others_sent(
    console: Console,
) -> None:
    """The tenant isolation audit: a stream that resumes (``Last-Event-ID``) was sent the
    newest 1,000 events stored since, every tenant's, filtered to the caller's after: Bob's
    1,100 submissions while Alice's page was reconnecting (5.5 s of his traffic) pushed her
    own job's ``cancelled`` out of them, and her page never learned of it. A submitter's
    resumed stream now replays the newest events of its own jobs."""
    no_value = {"kind": "sigmoid", "priority": 0.001, "decay": 0.5, "target": 3}

    async def resumed(after: int) -> list[tuple[str, str]]:
        async with aiohttp.ClientSession() as http:
            headers = {**bearer("alice"), "Last-Event-ID": str(after)}
            r = await http.get(console.url + "/api/events", headers=headers)
            assert (await r.content.readuntil(b"\n\n")) == b"retry: 2000\n\n"
            event = await asyncio.wait_for(next_event(r), 20)
            r.close()
            return [(event["kind"], event["job_id"])]

    with client_channel(console.daemon.address, token=TOKENS["alice"]) as channel:
        alice = pb_grpc.AdmissionStub(channel)
        request = pb.SubmitJobRequest(job=spec_to_proto({**SMALL_JOB, "id": "mine"}))
        seen = alice.SubmitJob(request, timeout=60).job  # her page has seen its decision
        assert seen.state == pb.JOB_STATE_ADMITTED
        alice.CancelJob(pb.CancelJobRequest(id="mine"), timeout=60)
    with client_channel(console.daemon.address, token=TOKENS["bob"]) as channel:
        bob = pb_grpc.AdmissionStub(channel)
        for i in range(1100):
            spec = {**SMALL_JOB, "id": f"b{i}", "utility": no_value}
            bob.SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=60)
    # her decision was the first event stored: her page had seen event 1
    assert asyncio.run(resumed(1)) == [("cancelled", "mine")]


def test_a_stream_ends_with_its_session_or_token_before_another_event(console: Console) -> None:
    """The audit: a stream checked only its token, and only before waiting for an event.
    A session's stream outlived its logout (and its expiry, and the end of a user's
    oldest session past ``MAX_SESSIONS_PER_CALLER``): a copied cookie kept receiving the
    user's events after the user logged out, for good. And a stream of a token a reload
    revoked was still sent the next event, written before the check. Now a stream ends
    with its session or token, before it writes anything more."""

    async def scenario() -> dict[str, bytes]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            async with http.post(
                console.url + "/login", data={"token": TOKENS["alice"]}, allow_redirects=False
            ) as login:
                cookie = {"Cookie": f"oasis_session={login.cookies['oasis_session'].value}"}
            streams = {
                "alice's session": await http.get(console.url + "/api/events", headers=cookie),
                "ops' token": await open_stream(http, console.url, "ops"),
            }
            assert (await streams["alice's session"].content.readuntil(b"\n\n")).startswith(
                b"retry:"
            )
            async with http.get(console.url + "/jobs", headers=cookie) as page:
                found = re.search(r'name="csrf" content="([^"]+)"', await page.text())
            assert found is not None
            async with http.post(
                console.url + "/logout", headers=cookie, data={"csrf": found[1]},
                allow_redirects=False,
            ) as out:  # fmt: skip
                assert out.status == 303
            kept = {n: t for n, t in TOKENS.items() if n != "ops"}
            console.tokens.write_text(
                "".join(f"{n} {ROLES[n]} {hash_token(t)}\n" for n, t in kept.items())
            )
            assert console.daemon.proc is not None
            console.daemon.proc.send_signal(signal.SIGHUP)
            while not any(line.get("event") == "config reloaded" for line in json_log(console.log)):
                await asyncio.sleep(0.05)
            with client_channel(console.daemon.address, token=TOKENS["alice"]) as channel:
                spec = {**SMALL_JOB, "id": "after-logout"}
                request = pb.SubmitJobRequest(job=spec_to_proto(spec))
                await asyncio.to_thread(
                    pb_grpc.AdmissionStub(channel).SubmitJob, request, timeout=30
                )
            return {name: await rest(stream) for name, stream in streams.items()}

    async def rest(stream: Any) -> bytes:
        """What ``stream`` sends until it ends (within a heartbeat, 15 s), heartbeats left
        out; ``(still open)`` after 20 s."""
        sent, deadline = b"", time.monotonic() + 20
        while not stream.content.at_eof():
            try:
                block = await asyncio.wait_for(
                    stream.content.readuntil(b"\n\n"), deadline - time.monotonic()
                )
            except TimeoutError:
                return sent + b"(still open)"
            except asyncio.IncompleteReadError as err:
                block = err.partial
            sent += block if block != b": ping\n\n" else b""
        return sent

    sent = asyncio.run(scenario())
    assert sent == {"alice's session": b"", "ops' token": b""}
