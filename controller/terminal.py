"""The client's printing boundary: what ``oasis`` writes shows, it does not act.

Much of what the client prints came from someone else: a key of a job file a tenant
sent, a cordon's reason another operator gave, a server's name, a trace. A character
that acts (ESC starting a sequence that writes the clipboard or moves the cursor, CR,
a bidi override: :mod:`pricing.text`) would act on the reader's terminal. Rather than
escaping at each of the many places that print, :func:`guarded` wraps the standard
streams once, for the whole command: every such character is written as its escape
(``\\x1b``), newlines and tabs pass. JSON output is ASCII already and passes unchanged.
A stream whose encoding cannot hold a character (a Latin-1 or ASCII locale) writes it
as ``\\uXXXX`` instead of failing with a traceback.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from pricing.text import escape

__all__ = ["SafeStream", "guarded", "unfiltered"]

_KEEP = "\n\t"


class SafeStream:
    """A text stream that escapes what :func:`pricing.text.escape` does (but newlines
    and tabs) before writing to ``stream``; every other attribute is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        # the common case first: printable ASCII (JSON, tables) passes as it is
        self.stream.write(text if text.isascii() and text.isprintable() else escape(text, _KEEP))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`SafeStream` within the block (and
    writing what their encoding lacks as escapes), put back after it."""
    saved = sys.stdout, sys.stderr
    for stream in saved:
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            with contextlib.suppress(ValueError, io.UnsupportedOperation):
                stream.reconfigure(errors="backslashreplace")
    sys.stdout, sys.stderr = (s if isinstance(s, SafeStream) else SafeStream(s) for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def unfiltered(stream: TextIO) -> TextIO:
    """The stream under a :class:`SafeStream`: for the client's own control characters
    (``oasis replay``'s progress line rewritten with CR), never for text from others."""
    return stream.stream if isinstance(stream, SafeStream) else stream
