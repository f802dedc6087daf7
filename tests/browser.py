"""Headless Chromium for tests and benchmarks: Debian's ``chromium`` and
``chromium-driver`` at /usr/bin, driven by Selenium, which is told where the driver is and
never downloads one (``SE_OFFLINE``). Nothing it loads comes from the network: the flags
turn off Chromium's own background traffic (updates, sync, QUIC)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["CHROMEDRIVER", "CHROMIUM", "artifacts_dir", "chromium", "missing", "needed", "opened"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,800",
)


def missing() -> list[str]:
    """What is missing to drive a browser (empty: nothing)."""
    out = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        out.append("the selenium package")
    return out


def needed() -> None:
    """Skip the calling test without a browser, or fail it if ``OASIS_REQUIRE_BROWSER=1``
    (CI sets it: a missing browser must not pass as a skip)."""
    lacking = missing()
    if lacking:
        if os.environ.get("OASIS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"OASIS_REQUIRE_BROWSER=1 but missing: {', '.join(lacking)}")
        pytest.skip(f"no browser: missing {', '.join(lacking)} "
                    "(apt-get install -y chromium chromium-driver)")  # fmt: skip


@contextlib.contextmanager
def opened(tz: str | None = None) -> Iterator[Any]:
    """:func:`chromium` with a profile of its own, quit and removed after; ``tz``: the
    time zone it runs in (Chromium reads ``TZ``), None: the process's."""
    profile = tempfile.mkdtemp(prefix="oasis-chromium-")
    with pytest.MonkeyPatch.context() as patch:
        if tz is not None:
            patch.setenv("TZ", tz)
        driver = chromium(profile)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def chromium(profile: str) -> Any:
    """A Selenium driver of headless Chromium with its profile in ``profile`` (a
    directory the caller removes afterwards)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    return driver


def artifacts_dir() -> Path:
    """Where screenshots go: ``$OASIS_ARTIFACTS/console`` (default: a new temporary
    directory); never in the repository unless asked."""
    root = os.environ.get("OASIS_ARTIFACTS") or tempfile.mkdtemp(prefix="oasis-console-")
    path = Path(root) / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path
