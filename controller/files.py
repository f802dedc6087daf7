"""Reading the operator's files (config, tokens, TLS certificates, a prior) with a bound:
a mistyped path that names ``/dev/zero``, a log or a FIFO must give a clear error, not
fill the daemon's memory or hang it (a reload read ``tokens_file = "/dev/zero"`` until
the process ran out of memory; an audit, 2026-11-27)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["MAX_CONFIG_BYTES", "read_bounded"]

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
