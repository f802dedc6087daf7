"""The operator's console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium against one ``oasisd`` subprocess with tokens
(two submitters, one operator) and the console on a loopback port.

Jobs are submitted over gRPC with the submitters' tokens; the browser logs in, finds
them on the pages, watches a new one arrive without a reload, cancels one and sees its
slots freed in the heatmap. Screenshots of every page at 1280x800 and at phone width
(390x844) go to ``$OASIS_ARTIFACTS`` (default: a temporary directory).

The tests share the daemon and run in the file's order: the cluster is small, so the
jobs of one test change the prices the next sees (the rejection comes late, once the
cancel test has had its admitted job).

Without Chromium the module is skipped, unless ``OASIS_REQUIRE_BROWSER=1`` (CI sets it),
where that is a failure. Selenium is pointed at /usr/bin/chromedriver and never
downloads a driver (``SE_OFFLINE``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import grpc
import pytest

from controller.auth import hash_token
from controller.convert import spec_to_proto
from controller.rpc import oasis_pb2 as pb
from controller.rpc import oasis_pb2_grpc as pb_grpc
from controller.tls import client_channel
from tests.browser import artifacts_dir, needed, opened
from tests.servers import SMALL_JOB, Daemon, json_log, oasis, write_config

TOKENS = {"alice": "alice-console-token", "bob": "bob-console-token", "ops": "ops-console-token"}
ROLES = {"alice": "submitter", "bob": "submitter", "ops": "operator"}
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
LOADING = "#app > .muted:only-child"  # "Loading..." until the script draws the page
WAIT = 15.0  # seconds a page may take to show what it should

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return artifacts_dir()


class Cluster:
    """The daemon and a gRPC stub per token."""

    store: Path
    """The daemon's SQLite store (edited by hand in a test)."""

    def __init__(self, daemon: Daemon, web: str) -> None:
        self.daemon = daemon
        self.web = f"http://{web}"
        self.channels = {
            name: client_channel(daemon.address, token=token) for name, token in TOKENS.items()
        }

    def stub(self, name: str) -> pb_grpc.AdmissionStub:
        return pb_grpc.AdmissionStub(self.channels[name])

    def submit(self, name: str, job_id: str, **changes: Any) -> pb.Job:
        spec = {**SMALL_JOB, "id": job_id, **changes}
        answer = self.stub(name).SubmitJob(pb.SubmitJobRequest(job=spec_to_proto(spec)), timeout=30)
        job: pb.Job = answer.job
        return job

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    needed()
    d = tmp_path_factory.mktemp("console")
    tokens = d / "tokens"
    tokens.write_text("".join(f"{n} {ROLES[n]} {hash_token(t)}\n" for n, t in TOKENS.items()))
    extra = f'[auth]\ntokens_file = "{tokens}"\n[web]\nlisten = "127.0.0.1:0"\n'
    config = write_config(d / "oasisd.toml", d / "data", extra=extra)
    daemon = Daemon(config, d / "oasisd.log").start()
    web = next(
        line["address"] for line in json_log(d / "oasisd.log")
        if line.get("event") == "console listening"
    )  # fmt: skip
    out = Cluster(daemon, web)
    out.store = d / "data" / "oasis.db"
    try:
        yield out
    finally:
        out.close()
        assert daemon.stop() == 0  # a clean stop, event streams open or not


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    needed()
    with opened() as driver:
        yield driver


# -- helpers ---------------------------------------------------------------------------


def wait_for(browser: Any, condition: Any, what: str, timeout: float = WAIT) -> Any:
    """Poll ``condition(browser)`` until it is truthy. A live update or a navigation may
    redraw the page between finding an element and reading it (stale): that poll is tried
    again. Chromium reports some of these not as stale but as an inspector error ("Node
    with given id does not belong to the document"; a CI run failed on it), so that one
    counts as stale too; any other driver error still fails the test at once."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def poll(b: Any) -> Any:
        try:
            return condition(b)
        except WebDriverException as e:
            if "does not belong to the document" in str(e.msg):
                return False
            raise

    ignored = (NoSuchElementException, StaleElementReferenceException)
    wait = WebDriverWait(browser, timeout, poll_frequency=0.1, ignored_exceptions=ignored)
    return wait.until(poll, message=what)


def login(browser: Any, cluster: Cluster, name: str, token: str | None = None) -> None:
    """Log in as ``name`` (its token, or ``token``); with a known token, return once the
    session cookie is set: a page loaded before the form's answer came back would find
    no session (the browser abandons the pending submission), on a loaded machine."""
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(cluster.web + "/login")
    field = browser.find_element(By.ID, "token")
    field.send_keys(TOKENS[name] if token is None else token)
    field.submit()
    if token is None:
        wait_for(browser, lambda b: b.get_cookie("oasis_session"), f"{name}'s session cookie")


def visible_text(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.TAG_NAME, "body").text)


def api(cluster: Cluster, path: str, token: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        cluster.web + path, headers={"Authorization": f"Bearer {token}"}, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def shoot(browser: Any, artifacts: Path, name: str, then: Any = None) -> None:
    """Screenshots of the current page at both sizes (after ``then(browser)``, if given);
    the page must not scroll sideways."""
    for size, (w, h) in SIZES.items():
        browser.set_window_size(w, h)
        time.sleep(0.4)  # the heatmap and the Gantt chart redraw on resize
        if then is not None:
            then(browser)
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        browser.save_screenshot(str(artifacts / f"{name}-{size}.png"))
        assert overflow <= 1, f"{name} at {w}x{h} scrolls sideways by {overflow}px"
    browser.set_window_size(*SIZES["desktop"])


def heat_tip(browser: Any, row: int, col: int) -> str:
    """Focus the heatmap, move its cursor to ``(row, col)`` with the keyboard, and return
    the tooltip once its jobs are read."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    canvas = wait_for(browser, lambda b: b.find_element(By.ID, "heatmap"), "the heatmap")
    browser.execute_script("arguments[0].focus()", canvas)
    canvas.send_keys(*([Keys.ARROW_DOWN] * row + [Keys.ARROW_RIGHT] * col))
    wait_for(
        browser,
        lambda b: "…" not in b.find_element(By.CSS_SELECTOR, "#heat-tip .tip-jobs").text,
        "the jobs of the heatmap cell",
    )
    return str(browser.find_element(By.ID, "heat-tip").text)


# -- the tests -------------------------------------------------------------------------


def test_a_bad_token_is_refused(browser: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(cluster.web + "/jobs")  # not logged in: to the login page
    assert "/login" in browser.current_url
    login(browser, cluster, "alice", token="not-a-token")
    error = wait_for(browser, lambda b: b.find_element(By.ID, "login-error"), "the refusal")
    assert "Unknown token" in error.text
    assert browser.get_cookie("oasis_session") is None
    browser.get(cluster.web + "/jobs")
    assert "/login" in browser.current_url
    status, body = api(cluster, "/api/jobs", "not-a-token")
    assert status == 401 and body["error"]["message"] == "unknown token"


def test_a_submitted_job_shows_on_its_pages(browser: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By

    job = cluster.submit("alice", "alice-job-1")
    assert job.state == pb.JOB_STATE_ADMITTED
    servers = {a.server for a in job.decision.allocations}

    login(browser, cluster, "alice")
    browser.get(cluster.web + "/jobs")
    link = wait_for(browser, lambda b: b.find_element(By.LINK_TEXT, "alice-job-1"), "the job's row")
    row = link.find_element(By.XPATH, "./ancestor::tr")
    assert "admitted" in row.text
    cookie = browser.get_cookie("oasis_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    # the list's completion is the time its slot ends, as on the job's page (the units
    # audit: the list showed the slot's start, an hour early)
    completes = re.findall(r"(\d+) \(([^)]*)\)", row.text)[-1]
    link.click()
    wait_for(browser, lambda b: b.find_element(By.ID, "h-plan"), "the job's page")
    text = visible_text(browser)
    assert "Job alice-job-1" in text and "admitted" in text
    assert "by the end of slot {} ({})".format(*completes) in text, (completes, text)
    for server in servers:
        assert server in text  # the plan per slot names its servers
    assert browser.find_elements(By.ID, "cancel")  # a submitter may cancel its own job
    assert "Plans" not in browser.find_element(By.TAG_NAME, "nav").text
    assert not browser.find_elements(By.PARTIAL_LINK_TEXT, "See it in the plans")  # refused

    login(browser, cluster, "ops")
    browser.get(cluster.web + "/plans")
    bars = wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, 'a[data-job="alice:alice-job-1"]'),
        "the job's bars in the Gantt chart (an operator sees jobs by their keys)",
    )
    assert len(bars) == len(servers)  # one lane on each server it runs on
    hrefs = {unquote(bar.get_dom_attribute("href")) for bar in bars}
    assert hrefs == {"/jobs/alice:alice-job-1"}
    browser.get(cluster.web + "/jobs/alice:alice-job-1")
    wait_for(browser, lambda b: b.find_element(By.ID, "h-plan"), "the job's page, as ops")
    assert browser.find_elements(By.PARTIAL_LINK_TEXT, "See it in the plans")
    # what oasis submit reads: an id, not the key an operator sees the job by
    sendable = json.loads(browser.find_element(By.TAG_NAME, "pre").get_attribute("textContent"))
    assert sendable["id"] == "alice-job-1"


def test_a_submitter_cannot_see_another_submitters_job(browser: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By

    cluster.submit("alice", "alice-job-2")
    cluster.submit("bob", "bob-job-1")
    login(browser, cluster, "bob")
    browser.get(cluster.web + "/jobs")
    wait_for(browser, lambda b: b.find_element(By.LINK_TEXT, "bob-job-1"), "bob's own job")
    assert "alice-job" not in visible_text(browser)
    browser.get(cluster.web + "/jobs/alice-job-2")
    assert "404" in browser.find_element(By.TAG_NAME, "h1").text
    assert "no job 'alice-job-2'" in visible_text(browser)
    browser.get(cluster.web + "/prices")
    assert "403" in browser.find_element(By.TAG_NAME, "h1").text
    # the JSON twins say the same
    status, body = api(cluster, "/api/jobs/alice-job-2", TOKENS["bob"])
    assert status == 404
    status, body = api(cluster, "/api/jobs", TOKENS["bob"])
    assert status == 200 and {j["id"] for j in body["jobs"]} == {"bob-job-1"}
    status, body = api(cluster, "/api/jobs", TOKENS["ops"])
    every = {j["id"] for j in body["jobs"]}
    assert {"alice:alice-job-1", "alice:alice-job-2", "bob:bob-job-1"} <= every


def test_a_new_submission_appears_live(browser: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By

    login(browser, cluster, "ops")
    browser.get(cluster.web + "/jobs")
    wait_for(browser, lambda b: "live" in b.find_element(By.ID, "live").text, "the live stream")
    browser.execute_script("window.notReloaded = true")
    cluster.submit("bob", "bob-live-1")
    new = "bob:bob-live-1"  # an operator sees jobs by their keys
    wait_for(browser, lambda b: b.find_elements(By.LINK_TEXT, new), "the new job, live")
    assert browser.execute_script("return window.notReloaded === true")  # no reload


def test_a_cancel_frees_the_slots_in_the_heatmap(browser: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By

    job = cluster.submit("alice", "alice-cancel-me")
    assert job.state == pb.JOB_STATE_ADMITTED
    first = sorted((a for a in job.decision.allocations if a.workers), key=lambda a: a.slot)[0]
    login(browser, cluster, "ops")
    status, prices = api(cluster, "/api/prices?resource=gpu", TOKENS["ops"])
    assert status == 200
    row = next(i for i, r in enumerate(prices["rows"]) if r["label"] == first.server)
    col = next(i for i, c in enumerate(prices["cols"]) if c["from"] == first.slot)
    browser.get(cluster.web + "/prices?resource=gpu")
    before = heat_tip(browser, row, col)
    assert "alice-cancel-me" in before, before

    browser.get(cluster.web + "/jobs/alice:alice-cancel-me")
    wait_for(browser, lambda b: b.find_element(By.ID, "cancel"), "the cancel button").click()
    wait_for(
        browser,
        lambda b: "cancelled" in b.find_element(By.CSS_SELECTOR, ".job-head").text,
        "the job cancelled",
    )
    browser.get(cluster.web + "/prices?resource=gpu")
    after = heat_tip(browser, row, col)
    assert "alice-cancel-me" not in after, after
    use = [float(line.split()[1].rstrip("%")) for tip in (before, after)
           for line in tip.splitlines() if line.startswith("use ")]  # fmt: skip
    assert use[1] < use[0], (before, after)


def test_jobs_filter_by_state_and_search_by_id(browser: Any, cluster: Cluster) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    cluster.submit("bob", "bob-find-me")
    cluster.submit("bob", "bob-to-cancel")
    status, _ = api(cluster, "/api/jobs/bob:bob-to-cancel/cancel", TOKENS["ops"], method="POST")
    assert status == 200
    login(browser, cluster, "ops")
    browser.get(cluster.web + "/jobs")
    field = wait_for(browser, lambda b: b.find_element(By.ID, "q"), "the search field")
    field.send_keys("bob-find")
    field.submit()
    wait_for(browser, lambda b: "q=bob-find" in b.current_url, "the search's URL")
    ids = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody th a")]
    assert ids == ["bob:bob-find-me"]  # an operator's search finds the id in a key
    browser.get(cluster.web + "/jobs")
    Select(browser.find_element(By.ID, "state")).select_by_value("cancelled")
    browser.find_element(By.ID, "state").submit()
    wait_for(browser, lambda b: "state=cancelled" in b.current_url, "the filter's URL")
    states = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.jobs .state")}
    assert states == {"cancelled"}
    status, body = api(cluster, "/api/jobs?state=cancelled", TOKENS["ops"])
    assert status == 200 and body["jobs"] and {j["state"] for j in body["jobs"]} == {"cancelled"}
    status, body = api(cluster, "/api/jobs?state=nonsense", TOKENS["ops"])
    assert status == 400 and "unknown state" in body["error"]["message"]
    # a NUL failed PostgreSQL's text: a 500 and a 5 KB traceback logged per request
    status, body = api(cluster, "/api/jobs?q=bob%00", TOKENS["alice"])
    assert status == 400 and "q: must not hold control" in body["error"]["message"]
    # a submitter's search finds only its own jobs
    status, body = api(cluster, "/api/jobs?q=bob-", TOKENS["alice"])
    assert status == 200 and body["jobs"] == []
    status, body = api(cluster, "/api/jobs?q=bob:", TOKENS["ops"])  # all of bob's
    assert {"bob:bob-find-me", "bob:bob-to-cancel"} <= {j["id"] for j in body["jobs"]}
    assert all(j["id"].startswith("bob:") for j in body["jobs"])
    status, body = api(cluster, "/api/jobs?q=bob-find", TOKENS["bob"])  # its own ids
    assert [j["id"] for j in body["jobs"]] == ["bob-find-me"]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def post(cluster: Cluster, path: str, form: str, headers: dict[str, str]) -> int:
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(
        cluster.web + path, data=form.encode(), method="POST",
        headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
    )  # fmt: skip
    try:
        with opener.open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        with err:
            if err.code == 303:
                cookie = err.headers.get("Set-Cookie", "")
                headers["Cookie"] = cookie.split(";", 1)[0]
            return err.code


def test_cancel_needs_the_session_and_its_form_token(cluster: Cluster) -> None:
    # a page of another site can make a browser POST with its cookie, but cannot read the
    # form token; a submitter cancels its own jobs only (as CancelJob)
    job_id = cluster.submit("alice", "alice-kept").spec.id
    cancel = f"/jobs/{job_id}/cancel"
    assert post(cluster, cancel, "csrf=guess", {}) == 401  # no session
    ops: dict[str, str] = {}
    assert post(cluster, "/login", f"token={TOKENS['ops']}&next=/", ops) == 303
    assert ops["Cookie"].startswith("oasis_session=")
    assert post(cluster, cancel, "csrf=guess", dict(ops)) == 403
    assert post(cluster, cancel, "", dict(ops)) == 403
    evil = {**ops, "Origin": "http://evil.example"}
    assert post(cluster, cancel, "csrf=guess", evil) == 403
    alice: dict[str, str] = {}
    assert post(cluster, "/login", f"token={TOKENS['alice']}&next=/", alice) == 303
    # another submitter's cancel finds no such job, over HTTP and gRPC alike
    status, body = api(cluster, f"/api/jobs/{job_id}/cancel", TOKENS["bob"], method="POST")
    assert status == 404 and f"no job {job_id!r}" in body["error"]["message"]
    with pytest.raises(grpc.RpcError) as denied:
        cluster.stub("bob").CancelJob(pb.CancelJobRequest(id=job_id), timeout=10)
    assert denied.value.code() == grpc.StatusCode.NOT_FOUND
    status, body = api(cluster, f"/api/jobs/alice:{job_id}", TOKENS["ops"])
    assert status == 200 and body["job"]["state"] == "admitted"
    # a script with the submitter's (or an operator's) bearer token needs no form token
    status, body = api(cluster, f"/api/jobs/{job_id}/cancel", TOKENS["alice"], method="POST")
    assert status == 200 and body["job"]["state"] == "cancelled"


def test_a_rejection_shows_what_priced_it_out(
    browser: Any, cluster: Cluster, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    # after jobs of the usual worth (which set the estimated floor price; one job moves
    # it little), one worth little for much work: the floor alone prices it out
    for i in range(3):
        cluster.submit("bob", f"bob-usual-{i}")
    cheap = {"kind": "sigmoid", "priority": 0.05, "decay": 0.5, "target": 3}
    job = cluster.submit("alice", "alice-cheap", epochs=20, utility=cheap)
    assert job.state == pb.JOB_STATE_REJECTED and job.decision.price_drivers, job.decision
    login(browser, cluster, "alice")
    browser.get(cluster.web + "/jobs/alice-cheap")
    section = wait_for(
        browser,
        lambda b: b.find_element(By.XPATH, "//section[@aria-labelledby='h-drivers']"),
        "the price drivers",
    )
    first = job.decision.price_drivers[0]
    row = section.find_element(By.CSS_SELECTOR, "tbody tr").text
    assert first.resource in row and first.server in row
    # every unit price as the answer has it, to three digits (a small one was shown as 0)
    cells = section.find_elements(By.CSS_SELECTOR, "tbody tr td:last-child")
    shown = [float(c.text.replace(",", "")) for c in cells]
    prices = [p.price for p in job.decision.price_drivers]
    assert shown == pytest.approx(prices, rel=5e-3), (shown, prices)
    assert job.decision.reason[:40] in visible_text(browser)
    shoot(browser, artifacts, "job-rejected")


def test_screenshots_of_every_page(browser: Any, cluster: Cluster, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    for i in range(3):
        cluster.submit("bob", f"bob-shot-{i}", epochs=2 + i)
    browser.delete_all_cookies()
    browser.get(cluster.web + "/login")
    shoot(browser, artifacts, "login")
    login(browser, cluster, "ops")
    pages = {"overview": "/", "prices": "/prices", "plans": "/plans", "jobs": "/jobs",
             "job": "/jobs/alice-job-1"}  # fmt: skip
    for name, path in pages.items():
        browser.get(cluster.web + path)
        wait_for(browser, lambda b: not b.find_elements(By.CSS_SELECTOR, LOADING), f"{name} drawn")
        shoot(browser, artifacts, name)
    # keyboard: the first Tab reaches the skip link, the next ones the navigation
    browser.get(cluster.web + "/")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "Skip to content"
    browser.switch_to.active_element.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "oasis"
    browser.switch_to.active_element.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "Overview"
    browser.get(cluster.web + "/prices")
    shoot(browser, artifacts, "prices-hover", lambda b: heat_tip(b, 0, 1))


def test_a_cancelled_jobs_utility_is_shown_as_planned_not_earned(
    browser: Any, cluster: Cluster
) -> None:
    """Before: the job list (and /api/jobs) showed a cancelled job's planned utility as
    if earned, and its page a payoff and cost without saying they were a plan. Now, as
    in ``oasis jobs``: its utility is null with the plan under ``planned``, and the pages
    label each number as planned (a failed job is drawn the same way)."""
    from selenium.webdriver.common.by import By

    job = cluster.submit("alice", "alice-planned")
    assert job.state == pb.JOB_STATE_ADMITTED
    status, _ = api(cluster, "/api/jobs/alice-planned/cancel", TOKENS["alice"], method="POST")
    assert status == 200
    status, body = api(cluster, "/api/jobs?q=alice-planned", TOKENS["alice"])
    assert status == 200
    [row] = body["jobs"]
    assert row["state"] == "cancelled" and row["utility"] is None
    assert row["planned"] == {
        "completion_slot": job.decision.arrival_slot + job.decision.jct - 1,
        "jct": job.decision.jct,
        "utility": pytest.approx(job.decision.utility),
    }
    login(browser, cluster, "alice")
    browser.get(cluster.web + "/jobs?q=alice-planned")
    link = wait_for(browser, lambda b: b.find_element(By.LINK_TEXT, "alice-planned"), "its row")
    cells = [c.text for c in link.find_element(By.XPATH, "./ancestor::tr").find_elements(
        By.TAG_NAME, "td")]  # fmt: skip
    utility, cost, payoff = cells[-3:]
    shown = f"{job.decision.utility:,.2f}".rstrip("0").rstrip(".")  # as the page's num()
    assert utility == f"{shown} (planned)", cells
    assert cost.endswith("(planned)") and payoff.endswith("(planned)"), cells
    assert cells[-4] == "–", cells  # no completion: it never completed
    link.click()
    wait_for(browser, lambda b: b.find_element(By.ID, "h-plan"), "the job's page")
    facts = browser.find_element(By.CSS_SELECTOR, "section[aria-labelledby='h-decision']").text
    assert f"none earned ({shown} planned)" in facts, facts
    assert "Ran until\nnever ran" in facts.replace("RAN UNTIL", "Ran until"), facts
    assert "not carried out" in facts and "Completion time" not in facts, facts


def test_a_jobs_events_read_in_local_time_with_short_numbers(cluster: Cluster) -> None:
    """The Events table showed each event's time as the daemon's ISO UTC beside its
    slot's local time ("2993485 (Mon 21:10)  2026-12-01T02:13:50Z" in New York, another
    day), and its detail's numbers whole ("payoff": 99.04369147515077, 16 digits). Now the
    time is the browser's, to the second (the ISO time on hover), and the numbers have 6
    significant digits, as ``oasis`` prints them."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from selenium.webdriver.common.by import By

    job = cluster.submit("bob", "bob-events")
    assert job.state == pb.JOB_STATE_ADMITTED
    status, body = api(cluster, "/api/jobs/bob-events", TOKENS["bob"])
    assert status == 200
    [event] = [e for e in body["events"] if e["kind"] == "decided"]
    payoff = event["detail"]["payoff"]
    assert len(repr(payoff)) > 10, payoff  # a payoff with more digits than are shown
    zone = "America/New_York"
    at = datetime.fromisoformat(event["at"].replace("Z", "+00:00")).astimezone(ZoneInfo(zone))
    with opened(zone) as browser:
        login(browser, cluster, "bob")
        browser.get(cluster.web + "/jobs/bob-events")
        row = wait_for(
            browser, lambda b: b.find_element(By.CSS_SELECTOR, "table.events tbody tr"), "events"
        )
        cells = row.find_elements(By.TAG_NAME, "td")
        when = cells[-2].find_element(By.TAG_NAME, "time")
        assert when.text == at.strftime("%a %H:%M:%S"), when.text
        assert when.get_dom_attribute("title") == event["at"]
        shown = json.loads(cells[-1].text)
        assert shown == {**event["detail"], "payoff": float(f"{payoff:.6g}")}, cells[-1].text


def test_every_operators_read_is_refused_to_a_submitter(cluster: Cluster) -> None:
    """The prices, a heatmap cell's hover (which names the jobs holding those servers,
    every tenant's), the plans and the servers are an operator's: a submitter's request
    is 403, each checked on its own (with the price cell's or the plans' check dropped,
    every test passed, and a submitter could list other tenants' jobs)."""
    job = cluster.submit("alice", "alice-on-the-map")
    assert job.state == pb.JOB_STATE_ADMITTED
    slot = job.decision.allocations[0].slot
    status, heatmap = api(cluster, "/api/prices?resource=gpu", TOKENS["ops"])
    assert status == 200, heatmap
    cell = f"/api/prices/cell?resource=gpu&r0=0&r1={heatmap['servers']}&s0={slot}&s1={slot + 1}"
    status, body = api(cluster, cell, TOKENS["ops"])
    assert status == 200 and "alice:alice-on-the-map" in {j["id"] for j in body["jobs"]}, body
    base = "/api/prices/cell?resource=gpu&r0=0"
    for odd in (f"&r1=0&s0={slot}&s1={slot + 1}", f"&r1=1&s0={slot}&s1={slot + 10**9}"):
        status, body = api(cluster, base + odd, TOKENS["ops"])  # no servers; too many slots
        assert status == 400 and "out of range" in body["error"]["message"], (odd, body)
    for path in (cell, "/api/prices", "/api/plans", "/api/plans?job=bob:x", "/api/servers"):
        status, body = api(cluster, path, TOKENS["bob"])
        assert status == 403 and "operators only" in body["error"]["message"], (path, body)


def test_a_jobs_page_reads_events_an_edit_broke(cluster: Cluster, browser: Any) -> None:
    """An event of a job whose slot an edit made text (SQLite keeps it) failed the job's
    page (500: no slot's start time for None), and a detail edited to a megabyte was
    sent whole. Now the page reads as ``oasis watch`` does: the slot null (shown "–"),
    the detail a note saying why it is not shown, the kind cut to its 32 characters."""
    import sqlite3

    from selenium.webdriver.common.by import By

    job = cluster.submit("bob", "bob-edited-events")
    assert job.state == pb.JOB_STATE_ADMITTED
    big = json.dumps({"note": "x" * 1_000_000})
    with contextlib.closing(sqlite3.connect(cluster.store, timeout=30)) as db, db:
        db.execute("UPDATE events SET slot = 'soon', detail = ?, kind = ? WHERE job_id = ?",
                   (big, "k" * 100, "bob:bob-edited-events"))  # fmt: skip
    status, body = api(cluster, "/api/jobs/bob-edited-events", TOKENS["bob"])
    assert status == 200, body
    assert body["events"]
    for event in body["events"]:
        assert (event["slot"], event["slot_starts_at"], event["kind"]) == (None, "", "k" * 32)
        assert set(event["detail"]) == {"unreadable"}, str(event["detail"])[:200]
        assert "over 65536 (the store was edited)" in event["detail"]["unreadable"]
    login(browser, cluster, "bob")
    browser.get(cluster.web + "/jobs/bob-edited-events")
    row = wait_for(
        browser, lambda b: b.find_element(By.CSS_SELECTOR, "table.events tbody tr"), "events"
    )
    assert row.find_elements(By.TAG_NAME, "td")[-3].text == "–"  # Slot, At, Detail


def test_the_plans_of_a_job_that_is_not_there_say_so(cluster: Cluster) -> None:
    """``/plans?job=ID`` for no such job said "Servers job ID uses: no server", as for a
    job with nothing planned: an operator who gave a submitter's id without its
    ``NAME:`` read it as the job holding no server. Now it is 404 as the job's page, and
    a job that exists with no plan still reads "no server"."""
    job = cluster.submit("bob", "bob-unplanned")
    assert job.state == pb.JOB_STATE_ADMITTED
    status, _ = api(cluster, "/api/plans?job=bob:bob-unplanned", TOKENS["ops"])
    assert status == 200
    status, body = api(cluster, "/api/plans?job=bob-unplanned", TOKENS["ops"])
    assert status == 404, body
    assert "a job submitted with a token is NAME:ID" in body["error"]["message"], body
    status, body = api(cluster, "/api/plans?job=bob:no-such-job", TOKENS["ops"])
    assert (status, body["error"]["message"]) == (404, "no job 'bob:no-such-job'"), body
    status, _ = api(cluster, "/api/jobs/bob-unplanned/cancel", TOKENS["bob"], method="POST")
    assert status == 200
    status, body = api(cluster, "/api/plans?job=bob:bob-unplanned", TOKENS["ops"])
    assert (status, body["servers_total"], body["servers"]) == (200, 0, []), body


def test_the_charts_time_axes_are_not_cut_at_their_right_edge(
    browser: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """The last slot label of the Gantt chart and of the heatmap was drawn past the
    chart's right edge and cut: at the slot numbers of a daemon whose slot 0 is the Unix
    epoch, 2993786 read "2" on /plans and 2993774 read "299377" on /prices. Now a label
    that does not fit is left out, as one too close to the label before it. (A daemon of
    its own: this module's counts its slots from now, and its labels are short.)"""
    from selenium.webdriver.common.by import By

    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {ROLES[n]} {hash_token(t)}\n" for n, t in TOKENS.items()))
    extra = f'[auth]\ntokens_file = "{tokens}"\n[web]\nlisten = "127.0.0.1:0"\n'
    config = write_config(tmp_path / "oasisd.toml", tmp_path / "data", epoch=0, extra=extra)
    text = config.read_text().replace("slot_seconds = 3600", "slot_seconds = 600")
    config.write_text(text.replace("window = 24", "window = 300"))
    daemon = Daemon(config, tmp_path / "oasisd.log").start()
    gantt = """
      var s = document.querySelector('svg.gantt'), w = s.viewBox.baseVal.width;
      return Array.from(s.querySelectorAll('text.axis')).map(function (t) {
        var b = t.getBBox(); return [t.textContent, b.x + b.width, w];
      }).filter(function (l) { return l[1] > l[2] + 0.5; });"""
    hook = """
      window.cut = [];
      var fill = CanvasRenderingContext2D.prototype.fillText;
      CanvasRenderingContext2D.prototype.fillText = function (text, x, y) {
        var w = parseFloat(this.canvas.style.width);
        if (this.textAlign === 'left' && x + this.measureText(text).width > w + 0.5) {
          window.cut.push([text, x, w]);
        }
        return fill.apply(this, arguments);
      };
      window.dispatchEvent(new Event('resize'));"""
    try:
        web = Cluster(daemon, next(
            line["address"] for line in json_log(tmp_path / "oasisd.log")
            if line.get("event") == "console listening"
        ))  # fmt: skip
        web.submit("alice", "alice-axes")
        login(browser, web, "ops")
        for w, h in SIZES.values():
            browser.set_window_size(w, h)
            browser.get(web.web + "/plans")
            wait_for(browser, lambda b: b.find_element(By.CSS_SELECTOR, "svg.gantt"), "the chart")
            assert browser.execute_script(gantt) == [], w
            browser.get(web.web + "/prices")
            wait_for(browser, lambda b: b.find_element(By.ID, "heatmap"), "the heatmap")
            browser.execute_script(hook)  # drawn again on resize, through the hook
            time.sleep(0.6)
            assert browser.execute_script("return window.cut") == [], w
        # and pointing at a cell still shows it (the labels are drawn beside its handler)
        from selenium.webdriver.common.action_chains import ActionChains

        canvas = browser.find_element(By.ID, "heatmap")
        ActionChains(browser).move_to_element(canvas).perform()
        tip = wait_for(
            browser, lambda b: b.find_element(By.ID, "heat-tip").is_displayed() and b, "the tip"
        ).find_element(By.ID, "heat-tip")
        assert "unit price" in tip.text, tip.text
        web.close()
    finally:
        browser.set_window_size(*SIZES["desktop"])
        assert daemon.stop() == 0


def test_a_cordon_on_the_servers_page_says_when_in_local_time(
    browser: Any, cluster: Cluster
) -> None:
    """/servers showed a cordon as "cordon from slot 41 to 42 by ops", in slot numbers
    alone, where the overview and ``oasis servers`` give its times: an operator had to
    work out when the server leaves and comes back. Now it reads as the overview."""
    from datetime import datetime

    from selenium.webdriver.common.by import By

    status, body = api(cluster, "/api/servers?page=1", TOKENS["ops"])
    assert status == 200
    clock = body["clock"]
    start, back = clock["slot"] + 20, clock["slot"] + 22  # ahead: no job moved
    name = body["servers"][0]["name"]
    login_args = ["--server", cluster.daemon.address, "--token", TOKENS["ops"]]
    oasis("cordon", name, "--from", str(start), "--until", str(back), "--reason", "disk",
          *login_args)  # fmt: skip
    try:
        login(browser, cluster, "ops")
        browser.get(cluster.web + "/servers")
        rows = "table.servers tbody tr"
        wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, rows), "the servers")
        state = visible_text(browser)
        for slot in (start, back):  # the browser's zone is the machine's, as here
            # to the second, up, as the page says it (04:49:59.2 reads 04:50:00)
            at = math.ceil(clock["epoch"] + slot * clock["slot_seconds"])
            assert datetime.fromtimestamp(at).strftime("%H:%M") in state, (slot, state)
        assert f"cordon from slot {start} (" in state, state
        assert f" to slot {back - 1}, back " in state and "; by ops: disk)" in state, state
    finally:
        oasis("uncordon", name, *login_args)


def test_a_replanned_jobs_payoff_is_marked_as_its_decisions(browser: Any, cluster: Cluster) -> None:
    """A cordon moved an admitted job later: its utility became the new plan's while its
    cost and payoff stayed its decision's, and the job's page and the list showed the
    three side by side (utility 6.83, cost 2.28, payoff 42.72) with no word, where
    ``oasis job`` says "as re-planned; admitted with ...". Now the pages say it too."""
    from selenium.webdriver.common.by import By

    job = cluster.submit("alice", "alice-moved")
    assert job.state == pb.JOB_STATE_ADMITTED
    workers = ["w0", "w1", "w2"]
    login_args = ["--server", cluster.daemon.address, "--token", TOKENS["ops"]]
    # every worker server out until its plan's end: it must move later (a cordon of 3 h
    # left it where it was when the module's earlier jobs had planned it past those)
    until = str(job.decision.completion_slot + 1)
    oasis("cordon", *workers, "--until", until, "--force", *login_args)
    try:
        status, body = api(cluster, "/api/jobs/alice-moved", TOKENS["alice"])
        assert status == 200
        d = body["job"]["decision"]
        assert body["job"]["state"] == "admitted" and d["jct"] > job.decision.jct, d
        assert d["utility"] != pytest.approx(d["payoff"] + d["cost"]), d  # moved
        login(browser, cluster, "alice")
        browser.get(cluster.web + "/jobs/alice-moved")
        wait_for(browser, lambda b: b.find_element(By.ID, "h-plan"), "the job's page")
        facts = browser.find_element(By.CSS_SELECTOR, "section[aria-labelledby='h-decision']").text
        assert " as re-planned " in facts and "admitted with" in facts, facts
        assert "(at admission)" in facts, facts
        browser.get(cluster.web + "/jobs?q=alice-moved")
        link = wait_for(browser, lambda b: b.find_element(By.LINK_TEXT, "alice-moved"), "its row")
        cells = [c.text for c in link.find_element(By.XPATH, "./ancestor::tr").find_elements(
            By.TAG_NAME, "td")]  # fmt: skip
        assert cells[-3].endswith("*"), cells
        assert (
            "re-planned since its admission" in browser.find_element(By.ID, "replanned-note").text
        )
    finally:
        oasis("uncordon", *workers, *login_args)


def test_a_long_job_id_wraps_rather_than_push_the_page_aside(
    browser: Any, cluster: Cluster
) -> None:
    """A 128-character id, unbroken, made the Job column of /jobs as wide as the screen
    (every other column of every job scrolled out of sight, on a desktop too), and
    /plans?job=ID scrolled sideways on a phone by its caption and its key. Now it wraps."""
    from selenium.webdriver.common.by import By

    long_id = "long-" + "x" * 123
    assert cluster.submit("alice", long_id).state == pb.JOB_STATE_ADMITTED
    login(browser, cluster, "ops")
    try:
        browser.get(cluster.web + "/jobs?q=alice:long-")
        link = wait_for(browser, lambda b: b.find_element(By.LINK_TEXT, f"alice:{long_id}"), "row")
        payoff = link.find_element(By.XPATH, "./ancestor::tr/td[last()]")
        right = browser.execute_script("return arguments[0].getBoundingClientRect().right", payoff)
        assert right <= browser.execute_script("return innerWidth"), right  # the row in sight
        browser.set_window_size(*SIZES["phone"])
        browser.get(cluster.web + f"/plans?job=alice:{long_id}")
        wait_for(browser, lambda b: b.find_element(By.ID, "plan-caption"), "the plans")
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, f"/plans?job= scrolls sideways by {overflow}px on a phone"
    finally:
        browser.set_window_size(*SIZES["desktop"])


def test_the_jobs_named_dot_and_dot_dot_open_and_cancel(browser: Any, cluster: Cluster) -> None:
    """The ids ``.`` and ``..`` are valid, but their links were ``/jobs/..``, which a
    browser takes as a dot segment: the job ``..`` in the list opened the overview, its
    page could not be reached at all, and its cancel form posted to ``/cancel``. Now
    their page is ``/job?id=..``, and its cancel ``/job/cancel?id=..``."""
    from selenium.webdriver.common.by import By

    for job_id in (".", ".."):
        assert cluster.submit("alice", job_id).state == pb.JOB_STATE_ADMITTED
    login(browser, cluster, "alice")
    for job_id in (".", ".."):
        browser.get(cluster.web + "/jobs?q=.")
        link = wait_for(browser, lambda b, i=job_id: b.find_element(By.LINK_TEXT, i), "its row")
        link.click()
        wait_for(browser, lambda b: b.find_element(By.ID, "h-plan"), f"the page of {job_id!r}")
        assert browser.find_element(By.TAG_NAME, "h1").text == f"Job {job_id}"
        browser.find_element(By.ID, "cancel").click()
        cancelled = lambda b: "cancelled" in b.find_element(By.CSS_SELECTOR, ".job-head").text  # noqa: E731
        wait_for(browser, cancelled, f"{job_id!r} cancelled")
        assert browser.find_element(By.TAG_NAME, "h1").text == f"Job {job_id}"
    status, body = api(cluster, "/api/job?id=..", TOKENS["alice"])
    assert status == 200 and body["job"]["state"] == "cancelled", body


def test_the_plans_page_of_a_job_without_a_plan_says_so_and_draws_nothing(
    browser: Any, cluster: Cluster
) -> None:
    """``/plans?job=ID`` of a rejected or cancelled job read "Servers job ID uses: no
    server ... Select a bar to open its job." over an empty chart with "page 1 of 1"
    twice, and no word of why. Now it says the job is planned nowhere and links its page."""
    from selenium.webdriver.common.by import By

    assert cluster.submit("bob", "bob-planless").state == pb.JOB_STATE_ADMITTED
    status, _ = api(cluster, "/api/jobs/bob-planless/cancel", TOKENS["bob"], method="POST")
    assert status == 200
    login(browser, cluster, "ops")
    browser.get(cluster.web + "/plans?job=bob:bob-planless")
    caption = wait_for(browser, lambda b: b.find_element(By.ID, "plan-caption"), "the caption")
    assert "Job bob:bob-planless is planned on no server" in caption.text, caption.text
    assert "Select a bar" not in caption.text and not browser.find_elements(By.CLASS_NAME, "pager")
    link = caption.find_element(By.LINK_TEXT, "its page")
    assert unquote(link.get_dom_attribute("href")) == "/jobs/bob:bob-planless"
