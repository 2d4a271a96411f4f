"""Tables of rows: plain text for summaries (fixed-width columns, no dependencies), and the
optional pandas export of the reports' rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


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


def dataframe(rows: list[dict[str, Any]], instead: str = "to_dicts()") -> Any:
    """``rows`` as a ``pandas.DataFrame``; ``instead`` names the plain-data alternative.

    Raises:
        MissingDependencyError: ``pandas_missing`` when pandas is not installed.
    """
    try:
        import pandas
    except ImportError as err:
        from torchlens.errors import MissingDependencyError  # errors sits beside this module

        raise MissingDependencyError(
            f"to_pandas() needs pandas; install it with pip install 'torchlens[pandas]' "
            f"or use {instead}",
            code="pandas_missing",
        ) from err
    return pandas.DataFrame(rows)
