"""The optional pandas export shared by the debugging reports."""

from __future__ import annotations

from typing import Any

from torchlens.errors import MissingDependencyError

__all__ = ["dataframe"]


def dataframe(rows: list[dict[str, Any]], instead: str) -> Any:
    """``rows`` as a ``pandas.DataFrame``; ``instead`` names the plain-data alternative.

    Raises:
        MissingDependencyError: ``pandas_missing`` when pandas is not installed.
    """
    try:
        import pandas
    except ImportError as err:
        raise MissingDependencyError(
            f"to_pandas() needs pandas; install it with pip install 'torchlens[pandas]' "
            f"or use {instead}",
            code="pandas_missing",
        ) from err
    return pandas.DataFrame(rows)
