"""Plain-text tables for people (``--json`` is for machines)."""

from __future__ import annotations

from collections.abc import Sequence

from pricing.text import escape

__all__ = ["render_table", "width"]


def width(cell: str) -> int:
    """Terminal columns ``cell`` takes: a CJK character two, a combining mark none
    (wcwidth, imported for cells that are not ASCII only)."""
    if cell.isascii():
        return len(cell)
    from wcwidth import wcswidth

    columns = wcswidth(cell)
    return columns if columns >= 0 else len(cell)  # a character wcwidth does not know


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; column indices in ``right`` align right.
    Cells are escaped (:func:`pricing.text.escape`): a name with a control character
    shows it, and does not move the columns."""
    cells = [[escape(c) for c in row] for row in [headers, *rows]]
    widths = [0] * len(headers)
    for row in cells:
        widths = [max(w, width(c)) for w, c in zip(widths, row, strict=True)]

    def line(row: Sequence[str]) -> str:
        padded = []
        for i, (c, w) in enumerate(zip(row, widths, strict=True)):
            pad = " " * (w - width(c))
            padded.append(pad + c if i in right else c + pad)
        return "  ".join(padded).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *map(line, cells[1:])])
