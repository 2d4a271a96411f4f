"""A :class:`Recording`: the few activations ``tl.record`` kept, by label.

``tl.record`` builds no graph. What it returns is a list of :class:`OpView` s, the light op
views that selectors see, one per matched op, and a payload store holding their values at the
moment they were produced. Labels are the ones ``tl.trace`` gives the same ops.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens._store import Stored
from torchlens._views import OpSequence, not_found_message
from torchlens.errors import LookupFailedError, PayloadUnavailableError
from torchlens.trace import MemoryPayloadStore, Op

__all__ = ["OpView", "Recording"]


class OpView(Stored):
    """What a selector or an intervention sees of one op, and what a recording keeps of it.

    Fields follow :class:`~torchlens.trace.Op`: ``label``, ``index`` (ops counted so far,
    0-based), ``func_name``, ``output_index``, ``module`` (innermost address), ``module_stack``
    (``(address, call)`` pairs), ``module_type`` (the innermost module's class name, e.g.
    ``"Conv2d"``), ``shape``, ``dtype``, ``device`` and ``meta``.
    """

    __slots__ = (
        "label", "index", "func_name", "output_index", "module", "module_stack",
        "module_type", "shape", "dtype", "device", "meta", "returned_by", "_store",
    )  # fmt: skip

    def __init__(
        self,
        label: str,
        index: int,
        func_name: str,
        output_index: int,
        module_stack: tuple[tuple[str, int], ...],
        tensor: torch.Tensor,
        module_type: str = "",
    ) -> None:
        self.label = label
        self.index = index
        self.func_name = func_name
        self.output_index = output_index
        self.module_stack = module_stack
        self.module = module_stack[-1][0] if module_stack else ""
        self.module_type = module_type
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self.device = tensor.device
        self.meta: dict[str, Any] = {}
        self.returned_by: tuple[tuple[str, int, str], ...] = ()  # set for module outputs
        self._store: MemoryPayloadStore | None = None

    address = Op.address  # the innermost module call as "address:call", as for an Op

    @property
    def out(self) -> torch.Tensor:
        """The saved value; raises :class:`PayloadUnavailableError` if none was kept."""
        if self._store is None:
            raise PayloadUnavailableError(
                f"{self.label!r} is a view seen during the forward, not a recorded op",
                code="not_saved",
            )
        return self._store.get(self.label)

    def __repr__(self) -> str:
        return (
            f"OpView({self.label!r}, func={self.func_name!r}, module={self.module!r}, "
            f"shape={self.shape})"
        )


class Recording(OpSequence):
    """What ``tl.record`` kept: matched ops in execution order, their values and the output.

    ``recording["relu_1"]`` is the :class:`OpView` of that op and ``.out`` its value;
    ``recording.activations`` maps every label to its value. ``output`` is what the model
    returned, ``None`` when ``stop_after=`` halted the forward (then ``halted`` is True).

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> rec = tl.record(model, torch.randn(2, 4), save=tl.func("relu"))
        >>> rec.labels, rec["relu_1"].module, rec["relu_1"].out.shape
        (['relu_1'], '1', torch.Size([2, 3]))
    """

    def __init__(
        self,
        ops: list[OpView],
        store: MemoryPayloadStore,
        output: Any,
        meta: dict[str, Any],
    ) -> None:
        self.ops = ops
        self.store = store
        self.output = output
        self.meta = meta
        self._by_label = {op.label: op for op in ops}

    def __getitem__(self, label: str) -> OpView:
        view = self._by_label.get(label)
        if view is None:
            raise LookupFailedError(not_found_message(label, self._by_label))
        return view

    @property
    def activations(self) -> dict[str, torch.Tensor]:
        """Every kept value by label (ops whose value could not be kept are left out)."""
        return {op.label: self.store.get(op.label) for op in self.ops if self.store.has(op.label)}

    @property
    def intervened(self) -> list[str]:
        """Labels of the ops whose output an ``intervene=`` function replaced."""
        return list(self.meta.get("intervened", ()))

    def __repr__(self) -> str:
        halted = ", halted" if self.halted else ""
        return f"<Recording: {len(self.ops)} ops kept of {self.meta.get('n_ops', '?')}{halted}>"
