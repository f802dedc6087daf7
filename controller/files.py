"""Reading the operator's files (config, tokens, TLS certificates, a prior) with a bound:
a mistyped path that names ``/dev/zero``, a log or a FIFO must give a clear error, not
fill the daemon's memory or hang it (a reload read ``tokens_file = "/dev/zero"`` until
the process ran out of memory; an audit, 2026-11-27). Writing a file whole, or not at
all (:func:`write_whole`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["MAX_CONFIG_BYTES", "read_bounded", "write_whole"]

MAX_CONFIG_BYTES = 16 << 20
"""The largest config, tokens or certificate file read (16 MiB): a tokens file of 50,000
tokens is about 14 MB."""


def read_bounded(path: Path, limit: int = MAX_CONFIG_BYTES, pipes: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (or, with ``pipes``, of a pipe: a client's
    ``--tls-key <(vault read ...)``), at most ``limit`` of them.

    Raises:
        OSError: it cannot be opened or read, is not a regular file (a device, a FIFO
            unless ``pipes``, a directory; opened without blocking, so a FIFO never hangs
            the daemon), or holds more than ``limit`` bytes; ``strerror`` says which.
    """
    # a pipe is opened blocking (a command-line tool waits for its writer: opened
    # without, a read before the writer came would see an empty file); anything else not
    # (so a FIFO the daemon is pointed at never hangs it), then checked
    piped = pipes and stat.S_ISFIFO(os.stat(path).st_mode)
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if piped else os.O_NONBLOCK)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or (piped and stat.S_ISFIFO(mode))):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
            raise OSError(0, f"not a regular file ({kind})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(0, f"larger than {limit} bytes: not the file meant?")
    return data


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a new file beside it, synced,
    then renamed over it. A full disk left a truncated trace before, and could have
    truncated the prior a running config names (``oasis calibrate -o``).

    The file keeps what it had: through a symbolic link its target is written; an
    existing file's mode and group carry over (a prior kept ``0640 root:oasis`` stays
    readable by the daemon); a new one gets the mode ``open()`` would give. A path that
    is not a regular file (``/dev/stdout``, a FIFO), or in a folder this user may not
    write, is written in place, as before. Raises OSError."""
    if path.exists() and not path.is_file():  # /dev/stdout (a pipe behind it), a FIFO
        path.write_text(text, encoding="utf-8")
        return
    try:
        target = path.resolve() if path.is_symlink() else path
    except RuntimeError as err:  # a loop of links (Python 3.11)
        raise OSError(errno.ELOOP, f"{path}: a loop of symbolic links") from err
    try:
        fd, temporary = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
        )
    except PermissionError:  # the file may be writable where the folder is not
        target.write_text(text, encoding="utf-8")
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            try:
                st = target.stat()
            except FileNotFoundError:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            else:
                os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode))
                if os.fstat(f.fileno()).st_gid != st.st_gid:
                    # not this user's group (EPERM), unmapped in a namespace (EINVAL): as new
                    with contextlib.suppress(OSError):
                        os.fchown(f.fileno(), -1, st.st_gid)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    """This process's umask (read by setting it, then put back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
