"""The collector eased while a process starts, then set back (controller.startup_gc)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from controller import startup_gc
from tests.servers import ROOT


@pytest.fixture
def collector() -> Iterator[tuple[int, int, int]]:
    """This process's thresholds before the test, set back after it, frozen objects
    thawed."""
    before = gc.get_threshold()
    try:
        yield before
    finally:
        startup_gc._found.clear()
        gc.set_threshold(*before)
        gc.unfreeze()


def test_hold_collects_rarely_and_release_sets_the_thresholds_back(
    collector: tuple[int, int, int],
) -> None:
    gc.set_threshold(700, 10, 10)
    startup_gc.hold()
    assert gc.get_threshold() == (startup_gc.STARTUP_THRESHOLD, 10, 10)
    startup_gc.hold()  # again (oasisd, then the daemon's main): still the first ones kept
    kept = [object() for _ in range(3)]  # noqa: F841 - alive through the freeze
    startup_gc.release()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() > 0  # what start-up left is out of later collections


def test_a_higher_threshold_is_not_lowered(collector: tuple[int, int, int]) -> None:
    gc.set_threshold(50_000, 5, 5)
    startup_gc.hold()
    assert gc.get_threshold() == (50_000, 5, 5)
    startup_gc.release()
    assert gc.get_threshold() == (50_000, 5, 5)


def test_release_without_hold_keeps_the_thresholds(collector: tuple[int, int, int]) -> None:
    gc.set_threshold(900, 10, 10)
    startup_gc.release()
    assert gc.get_threshold() == (900, 10, 10)


def test_the_oasisd_command_eases_the_collector_before_its_imports() -> None:
    """``oasisd`` holds before it imports the daemon (where the objects are made), and
    the commit process's command line does the same before its own imports."""
    from controller.store.commit_process import child_command

    code = child_command()[-1]
    assert code.index("g.hold()") < code.index("import controller.store.commit_process")
    probe = (
        "import gc, sys; sys.argv = ['oasisd', '--version']; "
        "import controller.oasisd as o; "
        "import controller.daemon as d; "
        "seen = []; d._run = lambda: seen.append(gc.get_threshold()); o.run(); "
        "print(seen[0][0])"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    assert int(out.stdout) == startup_gc.STARTUP_THRESHOLD, out
