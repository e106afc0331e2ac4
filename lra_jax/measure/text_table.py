"""Plain-text tables as the commands print them: columns as wide as their widest cell, two spaces apart."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """`header` (none when empty) over `rows`, one line each, trailing spaces dropped.

    `align` gives each column's alignment, 'l' (left, the default) or 'r' (right, for numbers):
    "lrrr". A row with fewer cells than the others is cut short there: its last cell is written as
    it is, neither padded nor measured (a note or an error may run past its column).
    """
    lines = [[str(c) for c in row] for row in ([header] if header else []) + list(rows)]
    columns = max(map(len, lines), default=0)
    widths = [0] * columns
    for cells in lines:
        for i, c in enumerate(cells if len(cells) == columns else cells[:-1]):
            widths[i] = max(widths[i], len(c))
    align = align.ljust(columns, "l")

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)]
        if len(cells) < columns:
            padded[-1] = cells[-1]
        return "  ".join(padded).rstrip()

    return "\n".join(line(cells) for cells in lines)
