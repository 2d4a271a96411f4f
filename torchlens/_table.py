"""Plain-text tables for summaries: fixed-width columns, no dependencies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def format_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header."""
    text_rows = [[str(cell) for cell in row] for row in rows]
    widths = [len(h) for h in header]
    for row in text_rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in text_rows)
    return "\n".join(lines)
