"""What controller.procfs reads of /proc: a process's stat fields and status numbers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from controller import procfs


def test_status_reads_the_named_numbers_of_a_process() -> None:
    mine = procfs.status("self", ("VmRSS", "VmHWM", "Threads"))
    assert set(mine) == {"VmRSS", "VmHWM", "Threads"}
    assert 0 < mine["VmRSS"] <= mine["VmHWM"]  # kB, the peak at least the present
    assert mine["Threads"] >= 1
    assert procfs.status(os.getpid()).keys() == {"VmRSS"}  # the default: resident memory
    assert procfs.status("self", ("NoSuchKey",)) == {}


def test_status_of_an_ended_process_is_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while procfs.stat_fields(child.pid)[0] not in procfs.ZOMBIE_STATES:
        time.sleep(0.01)  # ended, not yet reaped: its status has no memory lines
    assert procfs.status(child.pid) == {}
    assert "Threads" in procfs.status(child.pid, ("Threads",))
    child.wait()
    assert procfs.status("no-such-process") == {}  # unreadable: nothing, no error


def test_stat_fields_start_after_the_name() -> None:
    fields = procfs.stat_fields("self")
    assert fields[0] in {b"R", b"S"} and int(fields[1]) == os.getppid()


def test_stat_fields_start_after_the_names_last_parenthesis(tmp_path: Path) -> None:
    """A command's name is its owner's to choose, and may hold ``) `` itself: the fields
    are those after the last ``)`` (a worker named ``a) R 1 1`` read as another state,
    parent and group would have its memory counted for another group, or none)."""
    program = tmp_path / "a) R 1 1"
    shutil.copy("/bin/sleep", program)
    child = subprocess.Popen([str(program), "30"], start_new_session=True)
    try:
        for _ in range(1000):  # until it has exec'ed (it may still be the forked Python)
            with open(f"/proc/{child.pid}/comm") as comm:
                if comm.read().strip() == "a) R 1 1":
                    break
            time.sleep(0.01)
        with open(f"/proc/{child.pid}/comm") as comm:
            assert comm.read().strip() == "a) R 1 1"
        fields = procfs.stat_fields(child.pid)
        assert fields[0] in {b"R", b"S"}
        assert (int(fields[1]), int(fields[2])) == (os.getpid(), child.pid)  # ppid, pgrp
    finally:
        child.kill()
        child.wait()
