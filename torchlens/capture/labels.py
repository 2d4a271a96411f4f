"""Op labels, counted one way for every capture (``tl.trace``, ``tl.record``, ``tl.extract``,
``find_nonfinite``): ``name_k``, one counter per function name, a label already taken
skipped. A parameter or buffer of the root whose name looks like a label (``linear_1``) is
named by its address, so that label is reserved from the start: an op's label then never
depends on whether the forward read that weight before it, and a recording, which names no
weight, counts exactly as a trace does.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable

from torch import nn

__all__ = ["Labeler"]

_LABEL_LIKE = re.compile(r".+_[1-9][0-9]*")  # what f"{name}_{count}" can give (count >= 1)


class Labeler:
    """Counts labels per function name, skipping those reserved or taken.

    Args:
        taken: labels in use besides the reserved ones (a trace's records: inputs and
            constants are sources too); a recording, which has none, passes nothing.
    """

    __slots__ = ("counts", "reserved", "taken")

    def __init__(self, taken: Container[str] = ()) -> None:
        self.counts: dict[str, int] = {}  # name -> the count of its latest label
        self.reserved: set[str] = set()  # the root's weights named like labels
        self.taken = taken

    def reserve(self, modules: Iterable[tuple[str, nn.Module]]) -> None:
        """Reserve the addresses of the parameters and buffers of the root's own modules
        (address ``""`` in a :func:`~torchlens.capture.walk.named_modules` walk): the only
        addresses without a dot, so the only ones an op label can look like. Only names
        shaped like a label (``name_k``) are kept: no other can clash, and an empty set
        keeps every count on the per-op fast path."""
        for address, module in modules:
            if not address:
                for members in (module._parameters, module._buffers):
                    self.reserved.update(
                        k for k, v in members.items() if v is not None and _LABEL_LIKE.fullmatch(k)
                    )

    def count(self, name: str) -> int:
        """The next count of ``name``: its label is ``f"{name}_{count}"``."""
        count = self.counts[name] = self._next(name)
        return count

    def _next(self, name: str) -> int:
        count = self.counts.get(name, 0) + 1
        while f"{name}_{count}" in self.reserved or f"{name}_{count}" in self.taken:
            count += 1
        return count

    def new(self, name: str) -> str:
        """The next label of ``name`` (inline: the per-op path of ``tl.trace``)."""
        count = self.counts.get(name, 0) + 1
        label = f"{name}_{count}"
        if label in self.taken or label in self.reserved:
            count = self._next(name)
            label = f"{name}_{count}"
        self.counts[name] = count
        return label

    def peek(self, name: str) -> str:
        """The label :meth:`new` would give next, without taking it (an op that raised)."""
        return f"{name}_{self._next(name)}"
