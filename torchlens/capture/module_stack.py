"""The module calls of one trace: which are open, how often each module was called, and
which ops each call holds. One part of :class:`~torchlens.capture.builder.TraceBuilder`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from torchlens.trace import ModuleCall

__all__ = ["ModuleStack"]

Frames = tuple[tuple[str, int], ...]  # the open calls as (address, call number), outermost first


class ModuleStack:
    """The module calls (and opened composite groups) of one capture, in the order they
    started; ops are only appended, so a call's ops are one run of them: ``ops[start:end]``."""

    __slots__ = ("frames", "calls", "_open", "_starts", "_ends", "_counts")

    def __init__(self) -> None:
        # the open calls, outermost first: one tuple, shared by every op recorded meanwhile
        self.frames: Frames = ()
        self.calls: list[ModuleCall] = []
        # the open calls, innermost last, each with its index in calls, the frames it
        # replaced (to pop back to) and its module (None: a group)
        self._open: list[tuple[ModuleCall, int, Frames, nn.Module | None]] = []
        self._starts: list[int] = []
        self._ends: list[int | None] = []  # None while open
        self._counts: dict[int | str, int] = {}  # module ids; addresses of opened groups

    def open(
        self,
        key: int | str,
        address: str,
        type_name: str,
        inputs: tuple[str, ...],
        n_ops: int,
        module: nn.Module | None = None,
    ) -> None:
        """A call of the module (``key``: its id) or group (its address) at ``address``
        starts after the first ``n_ops`` ops, given the values labelled ``inputs``."""
        counts = self._counts
        number = counts[key] = counts.get(key, 0) + 1
        call = ModuleCall(address, number, type_name, inputs)
        self._open.append((call, len(self.calls), self.frames, module))
        self.frames += ((address, number),)
        self.calls.append(call)
        self._starts.append(n_ops)
        self._ends.append(None)

    def pop(self, n_ops: int) -> ModuleCall | None:
        """The innermost open call ends after the first ``n_ops`` ops; returns it."""
        if not self._open:
            return None
        call, index, self.frames, _ = self._open.pop()
        self._ends[index] = n_ops
        return call

    def open_modules(self) -> Iterator[tuple[str, nn.Module]]:
        """``(address, module)`` of each open module call, innermost first."""
        for call, _, _, module in reversed(self._open):
            if module is not None:
                yield call.address, module

    def root(self, root_type: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> Any:
        """The call of the whole capture: ``<root>:1``, or ``<root>:0`` when the root
        module's own calls (inside a traced method) are calls 1, 2, ... of ``""``."""
        first = 0 if any(not call.address for call in self.calls) else 1
        return ModuleCall("", first, root_type, inputs, outputs)

    def close(self, labels: tuple[str, ...]) -> None:
        """Give each call its ops, ``labels`` being every op's (a call still open, halted
        inside, runs to the end)."""
        for call, start, end in zip(self.calls, self._starts, self._ends):
            call.ops = labels[start:end]
