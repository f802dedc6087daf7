"""A SQLite store's file, watched: is it still the file this process opened?

A ``rm -rf`` of the data directory (a clean-up script, an operator in the wrong shell)
or a ``mv`` of a backup over the store, under a running daemon, left it writing to a
file no name led to any more: every submission was answered "admitted" and committed to
a file the next start would not find, and a second oasisd could start on the same
``data_dir``, its writer lock gone with the directory. The store's watch checks the
file every second (``Database.ping``); once it is gone or replaced, every call is
refused (``UNAVAILABLE``), the write-ahead log is checkpointed into the open file, and
the error says how to copy that file back from ``/proc`` while the daemon still holds
it open.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["StoreFile"]


class StoreFile:
    """The file at ``path``, identified by its device and inode the first time
    :meth:`check` finds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None

    def check(self) -> str:
        """ "" while ``path`` is the file first seen there (or none was seen yet); else
        what became of it."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "was deleted" if self._identity is not None else ""
        except OSError as err:  # its directory unreadable: not a change of file
            return "" if self._identity is None else f"cannot be read ({err.strerror})"
        identity = (st.st_dev, st.st_ino)
        if self._identity is None:
            self._identity = identity
            return ""
        return "" if identity == self._identity else "was replaced by another file"

    def open_copies(self) -> list[tuple[str, Path]]:
        """``(/proc path, name to copy it to)`` for each file of the store (the database
        and its write-ahead log) this process holds open with no name left."""
        fds = Path("/proc/self/fd")
        pid = os.getpid()
        found: dict[str, tuple[str, Path]] = {}
        wanted = {f"{self.path} (deleted)": self.path,
                  f"{self.path}-wal (deleted)": Path(f"{self.path}-wal")}  # fmt: skip
        try:
            entries = list(fds.iterdir())
        except OSError:
            return []
        for fd in entries:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in wanted and target not in found:
                found[target] = (f"/proc/{pid}/fd/{fd.name}", wanted[target])
        return sorted(found.values(), key=lambda pair: str(pair[1]))
