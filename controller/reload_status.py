"""The outcome of each reload, written for ``oasisd reload`` to wait on
(:mod:`controller.reload_wait`): ``systemctl reload oasisd`` fails when the daemon refuses
the file, rather than returning success while the refusal goes to the journal alone.

The daemon writes a small JSON file, ``reload.json``, in ``$RUNTIME_DIRECTORY`` (set by
systemd for a unit with ``RuntimeDirectory=oasis``: ``/run/oasis``; without it nothing
is written), whole or not at all (a temporary file renamed over it), at each step:

- ``pid``: the daemon that wrote it (a file of another pid is not this daemon's);
- ``begun``: the reloads begun in this daemon's life, each numbered as it begins, before
  it reads the file: a waiter that read ``begun = N`` before its SIGHUP gets its answer
  from reload ``N + 1`` or later, which read the file after the operator's edit (several
  SIGHUPs at once are one reload more, :meth:`controller.reload.Reloader.hangup`, so the
  reload answering may be another's too);
- ``answers``: the last :data:`KEPT_ANSWERS` reloads that came to a verdict, each its
  ``number``, the ``outcome`` (:data:`OUTCOMES`), what it said (``lines``, one each, as
  the journal has them) and whether its checks of a restart with the file are done too
  (``final``): a waiter reports the first one after its read, its own reload's (the
  last one only would give a waiter whose SIGHUP was answered by reload 7 the "no
  change" of a reload 8 that another waiter's SIGHUP started meanwhile);
- ``stopping``: the daemon stops; the reloads begun and not answered read nothing more.

A SIGHUP while the daemon still starts is answered ``"starting"`` (nothing read).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from controller.files import write_whole

__all__ = [
    "KEPT_ANSWERS",
    "OUTCOMES",
    "STATUS_NAME",
    "Answer",
    "ReloadStatus",
    "Status",
    "read_status",
    "status_path",
]

STATUS_NAME = "reload.json"
"""The file's name in ``$RUNTIME_DIRECTORY``."""

OUTCOMES = {
    "applied": "the file was read and what applies without a restart applied",
    "refused": "the file was not applied: nothing changed",
    "starting": "the daemon was still starting: nothing read",
}
"""Each verdict a reload's answer gives, and what it means."""

KEPT_ANSWERS = 16
"""The reloads' answers the file keeps, the latest."""


@dataclass(frozen=True)
class Answer:
    """One reload's verdict (see the module's docstring)."""

    number: int
    outcome: str
    lines: tuple[str, ...] = ()
    final: bool = True


@dataclass(frozen=True)
class Status:
    """The content of ``reload.json`` (see the module's docstring)."""

    pid: int
    begun: int = 0
    answers: tuple[Answer, ...] = ()
    stopping: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Status:
        """The status in ``data`` (the file's JSON). Raises ValueError if it is not one."""
        try:
            answers = tuple(
                Answer(
                    int(a["number"]),
                    str(a["outcome"]),
                    tuple(str(x) for x in a["lines"]),
                    bool(a["final"]),
                )
                for a in data["answers"]
            )
            return cls(int(data["pid"]), int(data["begun"]), answers, bool(data["stopping"]))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a reload status: {err}") from err

    def first_after(self, seen: int) -> Answer | None:
        """The answer of the first reload numbered above ``seen`` (None: none yet)."""
        return min((a for a in self.answers if a.number > seen), default=None,
                   key=lambda a: a.number)  # fmt: skip


def status_path(environ: dict[str, str] | None = None) -> Path | None:
    """``$RUNTIME_DIRECTORY/reload.json``, or None when the variable is unset or empty
    (systemd may list several directories, separated by ``:``; the first is taken)."""
    env = os.environ if environ is None else environ
    folder = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(folder) / STATUS_NAME if folder else None


def read_status(path: Path) -> Status | None:
    """The status at ``path``; None if there is none yet. Raises OSError (unreadable)
    or ValueError (not a status: written by something else)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a reload status")
    return Status.from_dict(data)


@dataclass
class ReloadStatus:
    """The daemon's side: each step of its reloads written to ``path`` (None: nothing
    written, the daemon runs outside a unit with ``RuntimeDirectory=``). A write that
    fails (a full ``/run``) is given to ``on_error`` and never stops a reload."""

    path: Path | None
    now: Status = field(default_factory=lambda: Status(pid=os.getpid()))
    on_error: Any = None
    _failed: bool = False

    @classmethod
    def from_environ(cls, on_error: Any = None) -> ReloadStatus:
        """For this process, at ``$RUNTIME_DIRECTORY/reload.json``; its first write says
        it starts (no reload begun)."""
        status = cls(status_path(), on_error=on_error)
        status._write()
        return status

    def begin(self) -> int:
        """A reload begins, before it reads the file: its number."""
        self.now = replace(self.now, begun=self.now.begun + 1)
        self._write()
        return self.now.begun

    def answer(self, number: int, outcome: str, lines: list[str], final: bool = True) -> None:
        """Reload ``number`` came to ``outcome`` (:data:`OUTCOMES`), saying ``lines``;
        ``final``: its checks are done too."""
        others = [a for a in self.now.answers if a.number != number]
        kept = [*others, Answer(number, outcome, tuple(lines), final)][-KEPT_ANSWERS:]
        self.now = replace(self.now, answers=tuple(kept))
        self._write()

    def starting(self) -> None:
        """A SIGHUP while the daemon starts: answered at once, nothing read."""
        self.answer(self.begin(), "starting", ["the daemon is still starting: nothing read; "
                                               "reload again once it is ready"])  # fmt: skip

    def stopping(self) -> None:
        """The daemon stops: no reload reads anything from now on."""
        self.now = replace(self.now, stopping=True)
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            write_whole(self.path, self.now.to_json())
        except OSError as err:
            if self.on_error is not None and not self._failed:  # said once
                self.on_error(err)
            self._failed = True
