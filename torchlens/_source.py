"""``op.source``: the line of the model's code that made an op (``tl.trace(source=True)``)."""

from __future__ import annotations

from typing import Any, NamedTuple

from torchlens.errors import PayloadUnavailableError

__all__ = ["SourceLine", "source_of"]


class SourceLine(NamedTuple):
    """Where an op was called from: the first frame outside torch and torchlens."""

    file: str  # path of the Python file
    line: int  # 1-based line number
    function: str  # name of the function (``forward``) or ``<module>``

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def source_of(op: Any) -> SourceLine:
    """``op.meta["source"]`` as a :class:`SourceLine`.

    Raises:
        PayloadUnavailableError: ``source_not_captured`` when the trace was captured without
            ``source=True`` (or the op was made outside any Python frame of the user's).
    """
    where = op.meta.get("source")
    if where is None:
        raise PayloadUnavailableError(
            f"no source line was recorded for {op.label!r}; trace with "
            "tl.trace(..., source=True) to note the model line behind each op",
            code="source_not_captured",
        )
    return SourceLine(str(where[0]), int(where[1]), str(where[2]))
