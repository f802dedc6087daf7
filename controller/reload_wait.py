"""``oasisd reload --pid PID``: a reload that waits for the daemon's verdict, the unit's
``ExecReload=``, so ``systemctl reload oasisd`` fails when the file is refused.

``kill -HUP`` returns at once: a file with a mistake was refused in the journal alone,
while ``systemctl reload`` had said nothing, and the operator took the edit (a tenant's
token added or removed, new ``[limits]``) for live. This command reads the count of
reloads begun from the daemon's ``$RUNTIME_DIRECTORY/reload.json``
(:mod:`controller.reload_status`), sends SIGHUP, and waits for the answer of a reload
begun after that read (so after the operator's edit): it prints what the reload said and
exits with :data:`EXIT_APPLIED`, or :data:`EXIT_REFUSED` with the reason on stderr. It
needs no token, only to be the daemon's user (the unit runs it as ``oasis``, with the
daemon's runtime directory), and loads none of the daemon (a tenth of a second).

Exit statuses: 0 applied (with warnings, or edits that wait for a restart: said); 1
refused, nothing changed (a mistake in the file, a file not read in time, the daemon
still starting or stopping); 2 a usage error, or no ``$RUNTIME_DIRECTORY`` (the daemon
writes no outcome without it: ``kill -HUP`` reloads, the journal answers); 3 no answer
within ``--timeout`` (the reload may still apply: see the journal); 4 no oasisd at that
pid (not running, ended before answering, another program: not signalled).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from controller.procfs import ZOMBIE_STATES, stat_fields
from controller.reload_status import Answer, read_status, status_path

__all__ = [
    "EXIT_APPLIED",
    "EXIT_NO_ANSWER",
    "EXIT_NO_DAEMON",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "WAIT_SECONDS",
    "main",
    "wait_for_reload",
]

EXIT_APPLIED = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NO_ANSWER = 3
EXIT_NO_DAEMON = 4

WAIT_SECONDS = 80.0
"""The longest the command waits by default: a reload's read of the file
(:data:`controller.reload.READ_SECONDS`, 30 s) and its check of a restart
(:data:`controller.reload.RESTART_CHECK_SECONDS`, 30 s), with a margin; below systemd's
default timeout of a reload (90 s) and the unit's ``TimeoutStartSec=``."""

POLL_SECONDS = 0.05
"""How often the status file is read while waiting."""

_NAMES = ("oasisd", "controller.daemon", "controller.oasisd")
"""What the command line of an oasisd process holds (the entry point, ``python -m``)."""


def main(argv: Sequence[str] | None = None) -> int:
    """``oasisd reload``'s entry."""
    parser = argparse.ArgumentParser(
        prog="oasisd reload",
        description="Reload oasisd's config file (SIGHUP) and wait for its verdict: exit 0 "
        "applied, 1 refused (nothing changed), 2 usage, 3 no answer in time, 4 no oasisd "
        "at PID. Reads $RUNTIME_DIRECTORY/reload.json (the unit's RuntimeDirectory=oasis).",
    )
    parser.add_argument("--pid", type=int, required=True, help="oasisd's pid ($MAINPID)")
    parser.add_argument("--timeout", type=float, default=WAIT_SECONDS, metavar="SECONDS",
                        help=f"the longest to wait (default {WAIT_SECONDS:g})")  # fmt: skip
    args = parser.parse_args(argv)
    path = status_path()
    if path is None:
        print("oasisd reload: RUNTIME_DIRECTORY is not set, so oasisd writes no reload "
              "outcome to wait on (the unit's RuntimeDirectory=oasis sets it); kill -HUP "
              "PID reloads without waiting, and the journal says the outcome",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.pid <= 1 or args.timeout <= 0:
        print("oasisd reload: --pid must be oasisd's pid, --timeout positive", file=sys.stderr)
        return EXIT_USAGE
    return wait_for_reload(args.pid, path, args.timeout)


def wait_for_reload(
    pid: int,
    path: Path,
    timeout: float = WAIT_SECONDS,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Send SIGHUP to the oasisd of ``pid`` and wait up to ``timeout`` seconds for the
    answer in ``path`` of a reload begun after this call read it; print it (``out``: what
    was applied; ``err``: a refusal, an error) and return the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        before = read_status(path)
    except (OSError, ValueError) as e:
        print(f"oasisd reload: cannot read {path}: {e}", file=err)
        return EXIT_USAGE
    if before is not None and before.pid != pid:
        before = None  # an earlier daemon's (or another's): none of this one's yet
    if before is None:  # not written yet (oasisd imports): at least an oasisd's command line
        why = _not_oasisd(pid)
        if why:
            print(f"oasisd reload: {why}; nothing signalled", file=err)
            return EXIT_NO_DAEMON
    seen = before.begun if before is not None else 0
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        print(f"oasisd reload: no process {pid}: oasisd is not running", file=err)
        return EXIT_NO_DAEMON
    except PermissionError:
        print(f"oasisd reload: may not signal process {pid} (another user's)", file=err)
        return EXIT_NO_DAEMON
    deadline = time.monotonic() + timeout
    answer: Answer | None = None
    while True:
        try:
            now = read_status(path)
        except (OSError, ValueError):
            now = None  # replaced whole, never half written: gone (a stop), read again
        if now is not None and now.pid == pid:
            answer = now.first_after(seen) or answer
            if answer is not None and (answer.final or now.stopping):
                return _report(answer, out, err)
            if answer is None and now.stopping:
                print("oasisd reload: the daemon is stopping: nothing read", file=err)
                return EXIT_REFUSED
        if not _alive(pid):
            if answer is not None:
                return _report(answer, out, err)
            print(f"oasisd reload: oasisd (pid {pid}) ended before answering", file=err)
            return EXIT_NO_DAEMON
        if time.monotonic() >= deadline:
            if answer is not None:  # applied; its checks of a restart are still running
                return _report(answer, out, err)
            print(f"oasisd reload: no answer from oasisd (pid {pid}) within {timeout:g} s; "
                  "the reload may still apply: see the journal (journalctl -u oasisd)",
                  file=err)  # fmt: skip
            return EXIT_NO_ANSWER
        time.sleep(POLL_SECONDS)


def _report(status: Answer, out: TextIO, err: TextIO) -> int:
    """Print the reload's answer; its exit status."""
    if status.outcome != "applied":
        for line in status.lines or (f"reload {status.outcome}",):
            print(line, file=err)
        return EXIT_REFUSED
    for line in status.lines:
        print(line, file=err if line.startswith("error:") else out)
    if not status.final:
        print("warning: the checks of a restart with this file did not finish: see the "
              "journal (journalctl -u oasisd)", file=out)  # fmt: skip
    return EXIT_APPLIED


def _not_oasisd(pid: int) -> str:
    """Why ``pid`` is not an oasisd process to signal ("" if it is one)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return f"no process {pid}: oasisd is not running"
    except OSError as e:
        return f"cannot tell what process {pid} runs: {e}"
    command = [w.decode(errors="replace") for w in words if w]
    if not any(name in word for word in command[:3] for name in _NAMES):
        return f"process {pid} is not oasisd ({' '.join(command)[:120] or 'no command line'})"
    return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (neither gone nor a zombie awaiting its parent)."""
    try:
        return stat_fields(pid)[0] not in ZOMBIE_STATES
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True
