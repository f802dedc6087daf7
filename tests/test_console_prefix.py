"""The console under a path of a reverse proxy's host (``[web] public_url``), behind a
real nginx on loopback, the way an operator puts it beside other tools on a head node's
one HTTPS name: ``https://head.example/oasis/``.

One ``oasisd`` (tokens, the console on a loopback port, ``public_url`` the proxy's
``http://127.0.0.1:PORT/oasis/``) and one nginx in front of it on two ports, each as
nginx is set up by default but for its ``location``: one passes the path on
(``proxy_pass http://127.0.0.1:CONSOLE;``), one strips the prefix (``proxy_pass
http://127.0.0.1:CONSOLE/;``). Through each, a client logs in and follows every link, form
and script URL of every page; through the second, the one ``public_url`` names, a headless
Chromium logs in, moves between pages by their links, sees the live event stream, cancels
a job and logs out. Before ``public_url`` the console's links began at ``/``, so behind
such a proxy they led to the proxy's other applications, and a browser's login through
any proxy was refused as cross-origin (its ``Origin`` is the proxy's, not the ``Host``
the proxy sends).

Without nginx the module is skipped, unless ``OASIS_REQUIRE_NGINX=1`` (CI sets it), where
that is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import pytest

from controller.auth import hash_token
from controller.console.public_url import ROUTE_SEGMENTS
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel
from tests.browser import artifacts_dir, needed, opened
from tests.servers import (
    SMALL_JOB,
    Daemon,
    accepts,
    console_address,
    free_port,
    json_log,
    write_config,
)

_NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/bin/nginx") if os.path.exists(p)), None
)
pytestmark = [
    pytest.mark.skipif(
        _NGINX is None and os.environ.get("OASIS_REQUIRE_NGINX") != "1",
        reason="nginx not installed (CI sets OASIS_REQUIRE_NGINX=1: then it fails)",
    ),
    pytest.mark.timeout(300),
]

PREFIX = "/oasis"
TOKENS = {"alice": "alice-prefix-token", "ops": "ops-prefix-token"}
ROLES = {"alice": "submitter", "ops": "operator"}


@contextlib.contextmanager
def _nginx(console: str, ports: dict[str, int]) -> Iterator[None]:
    """nginx on two loopback ports in front of the console at ``console`` (host:port),
    both under ``/oasis/``: ``ports["passed"]`` sends the path on as it is,
    ``ports["stripped"]`` takes the prefix off."""
    assert _NGINX is not None, "nginx not installed"
    folder = Path(tempfile.mkdtemp(prefix="oasis-nginx-"))
    upstream = {"passed": f"http://{console}", "stripped": f"http://{console}/"}
    servers = "".join(
        f"server {{ listen 127.0.0.1:{ports[name]}; "
        f"location {PREFIX}/ {{ proxy_pass {upstream[name]}; proxy_http_version 1.1; "
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; } "
        "location / { return 404 'another application'; } }\n"
        for name in ports
    )
    user = "user root;\n" if os.geteuid() == 0 else ""  # its workers read the temp folders
    (folder / "nginx.conf").write_text(
        f"{user}worker_processes 1;\npid {folder}/nginx.pid;\nerror_log {folder}/error.log;\n"
        "events { worker_connections 64; }\n"
        f"http {{ access_log off; client_body_temp_path {folder}/body; "
        f"proxy_temp_path {folder}/proxy; fastcgi_temp_path {folder}/fcgi; "
        f"uwsgi_temp_path {folder}/uwsgi; scgi_temp_path {folder}/scgi;\n{servers}}}\n"
    )
    proc = subprocess.Popen(
        [_NGINX, "-p", str(folder), "-c", str(folder / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        for port in ports.values():
            if not accepts(port, 30, lambda: proc.poll() is None):
                said = (folder / "error.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"nginx did not listen: {said}")
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


class Proxied:
    """The daemon, its console's own address, and the proxy's base URLs by name."""

    def __init__(self, daemon: Daemon, console: str, ports: dict[str, int], log: Path) -> None:
        self.daemon = daemon
        self.log = log
        self.console = console
        self.bases = {name: f"http://127.0.0.1:{port}{PREFIX}" for name, port in ports.items()}

    def submit(self, job_id: str, **changes: Any) -> bool:
        """Submit ``job_id`` as alice over gRPC; True if it is admitted."""
        spec = {**SMALL_JOB, "id": job_id, **changes}
        with client_channel(self.daemon.address, token=TOKENS["alice"]) as channel:
            request = pb.SubmitJobRequest(job=spec_to_proto(spec))
            answer = pb_grpc.AdmissionStub(channel).SubmitJob(request, timeout=30)
        return bool(answer.job.state == pb.JOB_STATE_ADMITTED)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    d = tmp_path_factory.mktemp("prefix")
    tokens = d / "tokens"
    tokens.write_text("".join(f"{n} {ROLES[n]} {hash_token(t)}\n" for n, t in TOKENS.items()))
    ports = {"passed": free_port(), "stripped": free_port()}
    public = f"http://127.0.0.1:{ports['stripped']}{PREFIX}/"
    extra = (
        f'[auth]\ntokens_file = "{tokens}"\n'
        f'[web]\nlisten = "127.0.0.1:0"\npublic_url = "{public}"\n'
    )
    config = write_config(d / "oasisd.toml", d / "data", extra=extra)
    daemon = Daemon(config, d / "oasisd.log").start()
    said = [e for e in json_log(d / "oasisd.log") if e.get("event") == "console listening"]
    assert said[-1]["public_url"] == public, said  # where the operator's users go
    try:
        with _nginx(console_address(d / "oasisd.log"), ports):
            yield Proxied(daemon, console_address(d / "oasisd.log"), ports, d / "oasisd.log")
    finally:
        assert daemon.stop() == 0


class _Links(HTMLParser):
    """The URLs an HTML page sends a browser to: links, style sheets, scripts, forms'
    actions (with their method) and the page's JSON twin (``data-api``)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []  # (tag, method, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("href", "src", "data-api"):
            if a.get(key):
                self.urls.append((tag, "GET", a[key]))
        if tag == "form":
            self.urls.append((tag, a.get("method", "get").upper(), a.get("action", "")))


async def _logged_in(http: aiohttp.ClientSession, base: str) -> str:
    """Log in as ops through the proxy at ``base`` the way a browser does: the overview
    redirects to the login form, whose form posts the token; returns the overview's HTML."""
    async with http.get(base + "/", allow_redirects=False) as r:
        assert r.status == 303, r.status
        assert r.headers["Location"] == f"{PREFIX}/login?next=/", r.headers["Location"]
    async with http.get(urljoin(base + "/", r.headers["Location"])) as r:
        assert r.status == 200
        form = _Links()
        form.feed(await r.text())
    (action,) = [url for tag, method, url in form.urls if tag == "form" and method == "POST"]
    assert action == f"{PREFIX}/login", action
    data = {"token": TOKENS["ops"], "next": "/"}
    async with http.post(urljoin(base, action), data=data, allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == f"{PREFIX}/", r.headers
        cookie = r.headers["Set-Cookie"]
        # the session is this console's, not every application's behind the proxy
        assert f"Path={PREFIX}/" in cookie, cookie
    async with http.get(base + "/") as r:
        assert r.status == 200 and str(r.url) == base + "/", r.url
        return await r.text()


@pytest.mark.parametrize("proxy", ["passed", "stripped"])
def test_every_link_form_and_script_of_every_page_stays_under_the_prefix(
    proxied: Proxied, proxy: str
) -> None:
    """Logged in through a proxy that passes the path on, or one that strips the prefix,
    every URL of every page (navigation, pagers of the HTML, style sheet and script, the
    forms, the JSON twin) begins with ``/oasis/`` and answers 200 through the proxy.
    Before ``path_prefix`` they began at ``/``: the proxy's other application."""
    job = f"prefix-crawl-{proxy}"
    assert proxied.submit(job)
    base = proxied.bases[proxy]
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(base))

    async def crawl() -> set[str]:
        jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            todo = [(base + "/", await _logged_in(http, base))]
            seen = {base + "/"}
            # a job's page is linked by the script only (the jobs table it draws)
            async with http.get(f"{base}/jobs/alice:{job}") as r:
                assert r.status == 200
                todo.append((str(r.url), await r.text()))
                seen.add(str(r.url))
            while todo:
                page, html = todo.pop()
                links = _Links()
                links.feed(html)
                for tag, method, url in links.urls:
                    if url.startswith("#"):
                        continue
                    assert url.startswith(PREFIX + "/"), (page, tag, url)
                    if method != "GET" or "logout" in url or "cancel" in url:
                        continue
                    target = urljoin(origin, url.split("?v=")[0] if tag != "a" else url)
                    if target in seen or len(seen) > 40:
                        continue
                    seen.add(target)
                    async with http.get(target) as r:
                        assert r.status == 200, (page, url, r.status, (await r.text())[:200])
                        if r.content_type == "text/html":
                            todo.append((target, await r.text()))
            return seen

    seen = asyncio.run(crawl())
    paths = {urlsplit(url).path for url in seen}
    for name in ("/", "/servers", "/prices", "/plans", "/jobs", f"/jobs/alice:{job}",
                 "/api/overview", "/static/console.js", "/static/console.css"):  # fmt: skip
        assert PREFIX + name in paths, (name, sorted(paths))


def test_a_browser_moves_between_pages_watches_live_and_cancels_through_the_proxy(
    proxied: Proxied,
) -> None:
    """Headless Chromium through the proxy that strips the prefix: logging in returns to
    the page asked for; the links the script draws (the job's row, the overview's counts,
    a Gantt bar) open pages under ``/oasis/``; the live event stream connects through the
    proxy; a cancel's form and its redirect stay there; logging out leads to the login
    page there. A screenshot of a job's page goes to ``$OASIS_ARTIFACTS``."""
    from selenium.webdriver.common.by import By

    from tests.test_console import visible_text, wait_for

    needed()
    assert proxied.submit("prefix-browser")
    base = proxied.bases["stripped"]
    key = "alice:prefix-browser"
    with opened() as browser:
        browser.get(base + "/jobs")
        wait_for(browser, lambda b: b.find_elements(By.ID, "token"), "the login form")
        assert browser.current_url == base + "/login?next=/jobs", browser.current_url
        browser.find_element(By.ID, "token").send_keys(TOKENS["ops"])
        browser.find_element(By.ID, "token").submit()
        wait_for(browser, lambda b: b.current_url == base + "/jobs", "back to the jobs page")
        cookie = browser.get_cookie("oasis_session")
        assert cookie is not None and cookie["path"] == PREFIX + "/", cookie

        link = wait_for(browser, lambda b: b.find_element(By.LINK_TEXT, key), "the job's row")
        link.click()
        wait_for(browser, lambda b: b.find_elements(By.ID, "h-plan"), "the job's page")
        assert browser.current_url == f"{base}/jobs/alice%3Aprefix-browser", browser.current_url
        live = wait_for(browser, lambda b: b.find_element(By.CSS_SELECTOR, "#live.on"), "live")
        assert "live" in live.text
        browser.save_screenshot(str(artifacts_dir() / "console-prefix-job.png"))

        browser.find_element(By.LINK_TEXT, "See it in the plans (Gantt chart)").click()
        bar = wait_for(
            browser, lambda b: b.find_element(By.CSS_SELECTOR, f'a[data-job="{key}"]'), "a bar"
        )
        assert browser.current_url.startswith(base + "/plans?job="), browser.current_url
        assert bar.get_dom_attribute("href") == f"{PREFIX}/jobs/alice%3Aprefix-browser"

        browser.find_element(By.LINK_TEXT, "Overview").click()
        counts = wait_for(
            browser, lambda b: b.find_elements(By.CSS_SELECTOR, "a.count-link"), "the counts"
        )
        admitted = next(a for a in counts if "admitted" in a.get_dom_attribute("href"))
        admitted.click()
        wait_for(browser, lambda b: b.find_elements(By.LINK_TEXT, key), "the admitted jobs")
        assert browser.current_url == base + "/jobs?state=admitted", browser.current_url

        browser.get(f"{base}/jobs/{key}")
        wait_for(browser, lambda b: b.find_element(By.ID, "cancel"), "the cancel button").click()
        wait_for(
            browser,
            lambda b: "cancelled" in b.find_element(By.CSS_SELECTOR, ".job-head").text,
            "the job cancelled",
        )
        assert browser.current_url.startswith(f"{base}/jobs/alice"), browser.current_url

        browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
        wait_for(browser, lambda b: b.find_elements(By.ID, "token"), "the login form again")
        assert browser.current_url == base + "/login", browser.current_url
        assert "another application" not in visible_text(browser)


def test_the_daemon_logs_the_client_the_proxy_names_not_the_proxy(proxied: Proxied) -> None:
    """A login and a guessed token through nginx (``X-Forwarded-For
    $proxy_add_x_forwarded_for``, as the README's example) are logged as the browser's
    address, from a client on 127.0.0.5 and 127.0.0.6 here: they were all the proxy's
    ``127.0.0.1``, so an operator could not tell one user or guesser from another. The
    address the client wrote into the header itself is not the one taken."""

    async def from_address(source: str, token: str) -> int:
        connector = aiohttp.TCPConnector(local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as http:
            url = proxied.bases["stripped"] + "/login"
            headers = {"X-Forwarded-For": "198.51.100.1"}  # forged: the proxy adds its own
            async with http.post(url, data={"token": token}, headers=headers,
                                 allow_redirects=False) as r:  # fmt: skip
                return r.status

    assert asyncio.run(from_address("127.0.0.5", "a-guess")) == 401
    assert asyncio.run(from_address("127.0.0.6", TOKENS["alice"])) == 303
    said: dict[str, str] = {}
    deadline = time.monotonic() + 15  # the daemon's log thread writes after the answer
    while len(said) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        said = {
            e["event"]: e["peer"]
            for e in json_log(proxied.log)
            if e.get("event") in ("unauthenticated", "console login")
            and str(e.get("peer", "")).startswith(("127.0.0.5", "127.0.0.6"))
        }
    assert said == {"unauthenticated": "127.0.0.5 via 127.0.0.1",
                    "console login": "127.0.0.6 via 127.0.0.1"}, said  # fmt: skip


def test_the_script_builds_every_url_of_the_console_on_its_base() -> None:
    """Every path of the console's own that ``console.js`` writes (a link, a form's
    action, a fetch, the event stream) is put after ``base`` (the body's ``data-base``):
    a link written as ``"/jobs..."`` alone would leave the prefix behind the proxy. The
    browser test follows a few of them; this reads them all."""
    script = Path(__file__).parent.parent / "controller/console/static/console.js"
    paths = re.compile(r'"/(?:' + "|".join(sorted(ROUTE_SEGMENTS)) + r")\b")
    for number, line in enumerate(script.read_text().splitlines(), 1):
        for found in paths.finditer(line):
            before = line[: found.start()]
            assert before.endswith("base + "), (number, line)
