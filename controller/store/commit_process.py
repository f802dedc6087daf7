"""The commit process: the daemon's group-commit writer hands each batch of decisions to
a child process that writes it to the store, so the SQL work (SQLAlchemy, the estimate's
JSON, the driver) runs beside the daemon's threads instead of sharing their interpreter
lock (issue 16: the writer thread held it a third of the time).

Protocol
    The daemon (:class:`CommitProcess`, in its writer thread) starts this module
    (:func:`child_command`; never from the working directory) with pipes on its standard
    input and output. Each message is a 4-byte big-endian length and a pickle: first the settings
    (the store's URL and timeouts, the daemon's pid), answered ``("ready", pid)``; then,
    per batch, ``("commit", payloads, last_sequence, epoch, lock_pid)``
    (:func:`controller.store.decisions.write_decisions`), answered ``("ok", first,
    events)``, ``("fenced", mine, holder, why)``, ``("unavailable", message)`` or
    ``("error", traceback)``; ``("stop",)`` or the end of its input ends it. Only the
    daemon talks to it, over its own pipes.

Failures
    The child's store calls are bounded as the daemon's are (:mod:`.database`), and the
    daemon waits :func:`answer_seconds` at most for an answer. A child that ends, or does
    not answer in time, is killed; the batch fails with :class:`StoreUnavailableError`
    (its fate unknown: the daemon rebuilds its ledger from the store, as after any failed
    commit) and the next batch starts a new child. If a child cannot be started at all
    (a failed exec, a process limit), the writer thread writes the batches itself and
    tries again after :data:`RETRY_SECONDS`: the daemon stays up and durable, only slower.
    The child dies with the daemon (``PR_SET_PDEATHSIG``: a kill -9 of the daemon leaves
    no writer behind) and ignores SIGINT and SIGTERM, which a terminal or systemd sends
    the whole group: the daemon drains its last batches through it, then stops it. It
    ignores SIGHUP too (:data:`IGNORED_SIGNALS`), from the first line of its command: a
    reload is the daemon's, but ``systemctl kill -s HUP oasisd`` (every process of the
    unit) ended the child, and each reload sent so cost the decisions being committed
    their answer (UNAVAILABLE) and the daemon a rebuild of its ledger.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

from controller import startup_gc
from controller.store.database import Database, StoreUnavailableError
from controller.store.decisions import BatchWritten, DecisionPayload, write_decisions
from controller.store.writer_lock import FencedError, Holder

__all__ = [
    "IGNORED_SIGNALS",
    "CommitProcess",
    "CommitProcessError",
    "CommitProcessStartError",
    "answer_seconds",
    "separate_process_ok",
]

_LENGTH = struct.Struct(">I")
IGNORED_SIGNALS = ("SIGHUP", "SIGINT", "SIGTERM")
"""What the child ignores, by name (see the module docstring): a reload, and the stop
signals sent to every process of the daemon's terminal or unit."""
START_SECONDS = 60.0
"""How long the daemon waits for a new child to start (imports; a loaded machine)."""
STOP_SECONDS = 5.0
RETRY_SECONDS = (5.0, 300.0)
"""After a child failed to start, the next try waits this long (doubling from the first
to the second figure while the failures go on)."""
_PR_SET_PDEATHSIG = 1


class CommitProcessError(RuntimeError):
    """The child failed a batch for a reason other than the store's availability or the
    fence (its traceback is the message)."""


class CommitProcessStartError(RuntimeError):
    """No child runs and none could be started now (nothing of the batch was sent: the
    caller may write it itself)."""


def answer_seconds(timeout: float) -> float:
    """Seconds the daemon waits for a batch's answer: every statement of a batch (about
    eight) may take the store's ``timeout`` plus the client's margin of 1 s."""
    return max(30.0, 8 * (timeout + 1.0))


def separate_process_ok(url: str) -> bool:
    """True if a child process can write to the store at ``url`` (not an in-memory
    SQLite database, which only its own connection sees)."""
    from sqlalchemy import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return True
    database = parsed.database or ""
    memory = parsed.query.get("mode") == "memory" or "mode=memory" in database
    return database not in ("", ":memory:") and not memory


# -- the daemon's side ---------------------------------------------------------------------


class CommitProcess:
    """A child process writing batches of decisions (see the module docstring). For one
    thread: the group-commit writer's, which must also be the one that starts it (the
    child's parent-death signal is tied to the thread that started it).

    Args:
        db: the daemon's store; the child opens its own :class:`~controller.store.
            database.Database` with the same URL and settings.
        log: a structlog logger (child starts and ends).
    """

    def __init__(self, db: Database, log: Any) -> None:
        self._settings = {
            "url": db.url,
            "timeout": db.timeout,
            "sqlite_synchronous": db.sqlite_synchronous,
            "idle_transaction": db.idle_transaction,
            "parent": os.getpid(),
        }
        self.answer_seconds = answer_seconds(db.timeout)
        """How long a batch's answer is waited for (then the child is killed)."""
        self._log = log
        self._child: subprocess.Popen[bytes] | None = None
        self.starts = 0  # children started
        self.failed_starts = 0  # in a row
        self._retry_at = 0.0  # time.monotonic() before which no start is tried
        self.command = child_command()

    @property
    def pid(self) -> int | None:
        """The running child's pid (None: none runs)."""
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        """Start a child if none runs. A child that ended between batches (nothing of a
        batch at stake) is replaced.

        Raises:
            CommitProcessStartError: none could be started, now or (after failures, for
                :data:`RETRY_SECONDS`) recently; the writer then writes batches itself.
        """
        if self._child is not None:
            if self._child.poll() is None:
                return
            status = self._kill()
            self._log.warning("commit process ended between batches", status=status)
        if time.monotonic() < self._retry_at:
            raise CommitProcessStartError("the commit process failed to start recently")
        try:
            pid = self._spawn()
        except (OSError, StoreUnavailableError, CommitProcessError) as err:
            self.failed_starts += 1
            first, most = RETRY_SECONDS
            wait = min(most, first * 2 ** (self.failed_starts - 1))
            self._retry_at = time.monotonic() + wait
            self._log.error("commit process did not start; the writer thread commits "
                            "meanwhile", error=str(err), retry_in_s=wait)  # fmt: skip
            raise CommitProcessStartError(str(err)) from err
        self.failed_starts = 0
        self.starts += 1
        if self.starts > 1:  # the first is part of every start; a replacement is news
            self._log.info("commit process restarted", pid=pid, starts=self.starts)

    def _spawn(self) -> int:
        child = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,  # not the writer lock's descriptor: the lock is the daemon's
            # a Ctrl-C in the terminal goes to the foreground process group: in its own
            # group the child does not get it while importing (before main() ignores
            # it), which printed a KeyboardInterrupt traceback; the daemon stops it
            process_group=0,
        )
        assert child.stdin is not None and child.stdout is not None
        os.set_blocking(child.stdin.fileno(), False)
        os.set_blocking(child.stdout.fileno(), False)
        self._child = child
        self._send(("settings", self._settings), START_SECONDS)
        reply = self._receive(START_SECONDS, "start")
        if not (isinstance(reply, tuple) and reply[:1] == ("ready",)):
            self._kill()
            raise CommitProcessError(f"it answered {reply!r:.200}")
        return child.pid

    def commit(
        self,
        payloads: list[DecisionPayload],
        last_sequence: int | None,
        epoch: int | None,
        lock_pid: int | None,
    ) -> BatchWritten:
        """Write a batch through the child (:func:`~controller.store.decisions.
        write_decisions`, same arguments and result).

        Raises:
            CommitProcessStartError: no child runs (:meth:`start`): nothing was sent.
            FencedError: as write_decisions.
            StoreUnavailableError: the store failed the batch, or the child ended or did
                not answer in time (then it is killed, and the batch's fate is unknown).
            CommitProcessError: the batch failed otherwise.
        """
        self.start()
        self._send(("commit", payloads, last_sequence, epoch, lock_pid), self.answer_seconds)
        reply = self._receive(self.answer_seconds, "batch")
        kind = reply[0]
        if kind == "ok":
            return BatchWritten(reply[1], reply[2])
        if kind == "fenced":
            raise FencedError(reply[1], Holder.from_dict(reply[2]), reply[3])
        if kind == "unavailable":
            raise StoreUnavailableError(reply[1])
        raise CommitProcessError(str(reply[1]) if len(reply) > 1 else repr(reply))

    def close(self) -> None:
        """Stop the child (it ends after the batch it writes, if any)."""
        child = self._child
        if child is None:
            return
        with contextlib.suppress(StoreUnavailableError):
            self._send(("stop",), STOP_SECONDS)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(STOP_SECONDS)
        self._kill()

    # -- pipes ----------------------------------------------------------------------------

    def _send(self, message: Any, seconds: float) -> None:
        child = self._child
        assert child is not None and child.stdin is not None
        data = memoryview(_frame(message))
        fd = child.stdin.fileno()
        deadline = time.monotonic() + seconds
        while data:
            self._wait(fd, select.POLLOUT, deadline, f"take a message within {seconds:g} s")
            try:
                n = os.write(fd, data)
            except BlockingIOError:
                continue
            except OSError as err:  # its end of the pipe is closed: it ended
                self._lost(f"it ended ({err.strerror})")
            data = data[n:]

    def _receive(self, seconds: float, what: str) -> Any:
        child = self._child
        assert child is not None and child.stdout is not None
        fd = child.stdout.fileno()
        deadline = time.monotonic() + seconds
        doing = f"answer its {what} within {seconds:g} s"
        head = self._read(fd, _LENGTH.size, deadline, doing)
        (size,) = _LENGTH.unpack(head)
        return pickle.loads(self._read(fd, size, deadline, doing))

    def _read(self, fd: int, size: int, deadline: float, doing: str) -> bytes:
        parts: list[bytes] = []
        left = size
        while left:
            self._wait(fd, select.POLLIN, deadline, doing)
            try:
                chunk = os.read(fd, left)
            except BlockingIOError:
                continue
            if not chunk:
                self._lost("it ended")
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def _wait(self, fd: int, events: int, deadline: float, doing: str) -> None:
        poller = select.poll()
        poller.register(fd, events | select.POLLHUP | select.POLLERR)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000.0):
            self._lost(f"it did not {doing}")

    def _lost(self, why: str) -> None:
        status = self._kill()
        exit_note = f" (exit status {status})" if status is not None else ""
        self._log.warning("commit process lost", why=why, status=status)
        raise StoreUnavailableError(f"the commit process failed: {why}{exit_note}")

    def _kill(self) -> int | None:
        child, self._child = self._child, None
        if child is None:
            return None
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(STOP_SECONDS)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return child.returncode


def _frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


# -- the child's side ----------------------------------------------------------------------


def _die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _read_message(stream: BinaryIO) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _commit(db: Database, message: tuple[Any, ...]) -> tuple[Any, ...]:
    _, payloads, last_sequence, epoch, lock_pid = message
    try:
        with db.held_session() as session:
            written = write_decisions(session, payloads, last_sequence, epoch, lock_pid)
    except FencedError as err:
        holder = err.holder.to_dict() if err.holder is not None else None
        return ("fenced", epoch, holder, err.why)
    except StoreUnavailableError as err:
        return ("unavailable", str(err))
    except Exception:
        return ("error", traceback.format_exc(limit=20))
    return ("ok", written.first_sequence, written.events)


def child_command() -> list[str]:
    """The child's command line: this interpreter, importing this very code.

    ``python -m`` would put the working directory first on the child's path, so a
    ``controller/`` package there ran as the daemon's user (root started in ``/tmp``),
    and in another checkout the child wrote with other code than its parent's
    (an audit, 2026-11-29). ``-P`` leaves the working directory out (Python 3.11); the
    directory this package was imported from goes first instead, unless the child's
    path has it already (site-packages, ``PYTHONPATH``): put first, site-packages would
    come before the standard library."""
    root = str(Path(__file__).resolve().parents[2])
    code = (  # the path's entries resolved as root is: a venv reached through a symlink
        "import signal as s; "  # first: a SIGHUP while the child imports ended it
        f"[s.signal(getattr(s, n), s.SIG_IGN) for n in {IGNORED_SIGNALS!r}]; "
        f"import os, sys; r = {root!r}; "
        "sys.path[:0] = [] if r in map(os.path.realpath, filter(None, sys.path)) else [r]; "
        "import controller.startup_gc as g; g.hold(); "  # collected rarely while importing
        "import controller.store.commit_process as c; sys.exit(c.main())"
    )
    return [sys.executable, "-P", "-c", code]


def main() -> int:
    """The child (see the module docstring)."""
    _die_with_parent()
    for name in IGNORED_SIGNALS:  # as child_command does first (main may be run alone)
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    inbox = sys.stdin.buffer
    # the protocol gets standard output to itself; anything else printed goes to stderr
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    settings = _read_message(inbox)
    if not isinstance(settings, tuple) or settings[0] != "settings":
        return 2
    config = settings[1]
    if os.getppid() != config["parent"]:  # the daemon ended before the signal was set
        return 1
    db = Database(
        config["url"], config["timeout"], config["sqlite_synchronous"], config["idle_transaction"]
    )
    startup_gc.release()  # started: the imports' objects frozen, the defaults back
    try:
        outbox.write(_frame(("ready", os.getpid())))
        outbox.flush()
        while True:
            message = _read_message(inbox)
            if message is None or message[0] != "commit":
                return 0
            outbox.write(_frame(_commit(db, message)))
            outbox.flush()
    except BrokenPipeError:  # the daemon ended
        return 0
    finally:
        db.dispose()


if __name__ == "__main__":  # pragma: no cover - the child's entry
    sys.exit(main())
