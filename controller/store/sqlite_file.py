"""A SQLite store's file, watched: is it still the file this process opened?

A ``rm -rf`` of the data directory (a clean-up script, an operator in the wrong shell)
or a ``mv`` of a backup over the store, under a running daemon, left it writing to a
file no name led to any more: every submission was answered "admitted" and committed to
a file the next start would not find, and a second oasisd could start on the same
``data_dir``, its writer lock gone with the directory. The store's watch checks the
file every second (``Database.ping``); once it is gone or replaced, every call is
refused (``UNAVAILABLE``), and the error says how to copy the database and its
write-ahead log back from ``/proc`` while the daemon still holds them open.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["StoreFile"]

_Identity = tuple[int, int]  # (st_dev, st_ino)


def _identity(path: str | Path) -> _Identity | None:
    """The file at ``path`` (symbolic links followed), or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class StoreFile:
    """The database file at ``path`` and its write-ahead log (``path-wal``), identified
    by device and inode the first time :meth:`check` finds them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.wal = Path(f"{path}-wal")
        self._identity: _Identity | None = None
        self._wal_identity: _Identity | None = None

    def check(self) -> str:
        """ "" while ``path`` is the file first seen there (or none was seen yet); else
        what became of it. Only a file gone or another file there counts: an error
        reading the directory (permissions, a stale NFS handle) may pass."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "was deleted" if self._identity is not None else ""
        except OSError:
            return ""
        identity = (st.st_dev, st.st_ino)
        if self._identity is None:
            self._identity = identity
        if self._wal_identity is None:  # the log comes with the first connection
            self._wal_identity = _identity(self.wal)
        return "" if identity == self._identity else "was replaced by another file"

    def open_copies(self) -> list[tuple[str, Path]]:
        """``(/proc path, name to copy it to)`` for the database and its write-ahead log
        as this process holds them open, found by identity (a data directory reached
        through a symbolic link shows another name there)."""
        wanted = {self._identity: self.path, self._wal_identity: self.wal}
        wanted.pop(None, None)
        fds = Path("/proc/self/fd")
        try:
            entries = sorted(fds.iterdir(), key=lambda fd: int(fd.name))
        except (OSError, ValueError):
            return []
        found: dict[Path, str] = {}
        pid = os.getpid()
        for fd in entries:
            name = wanted.get(_identity(fd))
            if name is not None and name not in found:
                found[name] = f"/proc/{pid}/fd/{fd.name}"
        return [(src, dst) for dst, src in sorted(found.items())]
