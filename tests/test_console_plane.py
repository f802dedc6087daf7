"""A job's progress on its console page, from a real execution plane: Mosquitto, oasisd
with ``[mqtt]`` and 6 s slots (the harness of ``tests/test_mqtt_plane.py``) and the
console, reference agents reporting progress, and headless Chromium reading the page.

Skipped without Mosquitto or Chromium, unless CI requires them (``OASIS_REQUIRE_*``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.rpc import oasis_pb2 as pb
from tests.broker import NEEDS_MOSQUITTO
from tests.browser import artifacts_dir, chromium, needed
from tests.servers import json_log
from tests.test_console import shoot
from tests.test_mqtt_plane import SERVERS, Cluster, plane_job, wait_for

pytestmark = [
    pytest.mark.timeout(300),
    NEEDS_MOSQUITTO,
]


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    needed()
    cluster = Cluster(tmp_path)
    text = cluster.daemon.config.read_text()
    cluster.daemon.config.write_text(
        text.replace("[cluster]", '[web]\nlisten = "127.0.0.1:0"\n\n[cluster]', 1)
    )
    try:
        cluster.daemon.start()
        web = next(
            e["address"] for e in json_log(tmp_path / "oasisd.log")
            if e.get("event") == "console listening"
        )  # fmt: skip
        yield cluster, f"http://{web}"
    finally:
        cluster.close()


def test_a_running_jobs_progress_is_drawn_against_its_plan(plane: tuple[Cluster, str]) -> None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cluster, web = plane
    for server in SERVERS:
        cluster.start_agent(server, speed=0.8)  # a little slower than planned
    job = cluster.submit(plane_job("shown"))
    assert job["decision"]["admitted"] is True

    def reported() -> Any:
        got = cluster.stub().GetProgress(pb.GetProgressRequest(id="shown"), timeout=10)
        return got.progress if got.progress.reports >= 3 else None

    progress = wait_for("progress reports", reported)
    profile = tempfile.mkdtemp(prefix="oasis-chromium-")
    browser = chromium(profile)
    try:
        browser.get(f"{web}/jobs/shown")

        def drawn(b: Any) -> tuple[str, str, bool, bool]:
            """The chart's label, the section's text, and whether the interval band and
            the plan line are drawn, read in one go: a live update may redraw the page
            between two reads (the element goes stale), and the poll is tried again."""
            chart = b.find_element(By.CSS_SELECTOR, "svg.progress")
            section = b.find_element(By.XPATH, "//section[@aria-labelledby='h-progress']")
            return (
                chart.get_attribute("aria-label") or "",
                section.text,
                bool(chart.find_elements(By.CSS_SELECTOR, "rect.interval")),
                bool(chart.find_elements(By.CSS_SELECTOR, "line.plan-line")),
            )

        ignored = (NoSuchElementException, StaleElementReferenceException)
        label, text, interval, plan = WebDriverWait(browser, 15, ignored_exceptions=ignored).until(
            drawn, "the progress chart"
        )
        assert "used" in label and "estimate" in label and "between" in label
        assert f"of {progress.minibatches_total}" in text  # mini-batches done of the total
        assert "% interval" in text and "reports" in text
        # the interval and the plan are drawn: a band and a dashed line in the chart
        assert interval and plan
        shoot(browser, artifacts_dir(), "job-progress", lambda b: b.execute_script(
            "arguments[0].scrollIntoView()",
            b.find_element(By.XPATH, "//section[@aria-labelledby='h-progress']"),
        ))  # fmt: skip
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)
