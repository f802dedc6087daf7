"""Text from outside that people read: which characters it must not carry as they are.

A job file's key, a cordon's reason or a server's name ends up on an operator's
terminal, in a table another user reads, or in a log. Written raw, some characters act
instead of showing: C0 and C1 controls (ESC starts terminal sequences that write the
clipboard, retitle the window or move the cursor to draw fake lines; CR overwrites a
line), DEL, the Unicode format characters (bidi overrides such as U+202E reorder what
follows, zero-width marks hide text), the line and paragraph separators, and lone
surrogates (not encodable as UTF-8 at all). :data:`UNSAFE` matches exactly those: the
general categories Cc, Cf, Cs, Zl and Zp (``tests/test_text.py`` checks every code
point against :mod:`unicodedata`).

Inputs whose text has no reason to hold them refuse them (:func:`printable`); output
shows them escaped (:func:`escape`), the way ``repr`` would.
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE", "escape", "label", "printable_problem"]

UNSAFE = re.compile(
    "["
    "\x00-\x1f\x7f-\x9f"  # Cc: C0, DEL, C1
    "\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"  # Cf
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"  # Cf
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"  # Cf
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"  # Cf (tags)
    "\u2028\u2029"  # Zl, Zp
    "\ud800-\udfff"  # Cs: lone surrogates
    "]"
)
"""One character that acts rather than shows (see the module's docstring)."""


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str, keep: str = "") -> str:
    """``text`` with every :data:`UNSAFE` character but those in ``keep`` written as its
    escape (``\\x1b``, ``\\u202e``), as ``repr`` writes them."""
    if UNSAFE.search(text) is None:
        return text
    if not keep:
        return UNSAFE.sub(_escaped, text)
    return UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escaped(m), text)


def label(key: object) -> str:
    """A key of a JSON object as a field path shows it: as it is when it is non-blank
    text without :data:`UNSAFE` characters, else its ``repr`` (quoted, escaped)."""
    if isinstance(key, str) and key.strip() and UNSAFE.search(key) is None:
        return key
    return repr(key)


def printable_problem(text: str) -> str | None:
    """Why ``text`` cannot be shown as it is (its first :data:`UNSAFE` character, by
    position and escape), or None if it can."""
    found = UNSAFE.search(text)
    if found is None:
        return None
    return (
        f"must not hold control or invisible format characters, found "
        f"{found.group()!r} at character {found.start() + 1}"
    )
