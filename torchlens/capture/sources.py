"""The sources of a trace: what a tensor read by the forward, made by no recorded op, is.

One part of :class:`~torchlens.capture.builder.TraceBuilder`, which asks :meth:`Sources.first_seen`
when it reads a tensor it holds no value for. That tensor is, in this order: a parameter
or buffer of a known module (named by address); a weight a hook put in place during the
forward (found in an open module call's ``_parameters``/``_buffers``); a recorded value
under another object (``as_subclass``); what a recorded DTensor holds (``wrappers.py``);
a value computed out of the capture's sight (an op of its own, ``unseen.py``); or a
constant the forward closes over. Inputs are added as the capture starts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlens.capture.unseen import record_unseen
from torchlens.capture.walk import owned_tensors
from torchlens.trace import Source

__all__ = ["Sources", "TRANSFORM_RESULT", "UNSEEN_COMPUTATION"]

Tensor = torch.Tensor
UNSEEN_COMPUTATION = "unseen computation"  # the path of a constant with autograd history
# the path of a constant first seen after calls inside a torch.func transform
TRANSFORM_RESULT = "after a torch.func transform"


class Sources:
    """The sources of one trace, and what names them; see the module docstring.

    Methods that record take the trace's ``builder``, whose records, labels, payloads and
    live map a source joins (passed, not held: no reference cycle through the builder).
    """

    def __init__(self) -> None:
        self.records: list[Source] = []
        self.input_labels: list[str] = []
        self.named_modules: list[tuple[str, nn.Module]] = []  # filled by add_modules
        self.model_buffers: list[Tensor] = []  # updated in place by forwards; see finish
        self.owned: dict[int, tuple[str, str, Tensor]] = {}  # id -> (kind, address, tensor)
        # constants first seen while grad was off: without autograd history, a value computed
        # out of sight cannot be told from one the forward closes over (capture/unseen.py)
        self.without_grad: list[str] = []
        # whether calls ran inside a torch.func transform (vmap, grad), unrecorded: the
        # constants first seen after that may be what it returned (note_transform_call)
        self.transformed = False

    def add_modules(self, modules: list[tuple[str, nn.Module]]) -> None:
        """Know modules (``(address, module)``), so their parameters and buffers are named
        by address (those ``named_parameters``/``named_buffers`` give: the first)."""
        self.named_modules = [*self.named_modules, *modules]
        owned = self.owned
        new = {key: entry for key, entry in owned_tensors(modules).items() if key not in owned}
        owned.update(new)
        self.model_buffers += [t for kind, _, t in new.values() if kind == "buffer"]

    def add(
        self, builder: Any, label: str, kind: str, path: str, tensor: Tensor, copy: bool = False
    ) -> Source:
        """Record ``tensor`` as the source ``label`` (``kind``: input, parameter, buffer or
        constant, found at ``path``), its value kept as a copy when ``copy``."""
        source = Source(  # positional, in field order, as TraceBuilder's Op
            label, kind, path, tuple(tensor.shape), tensor.dtype, tensor.device,
            tensor.requires_grad, [], builder.store,
        )  # fmt: skip
        self.records.append(source)
        builder._records[label] = source
        if builder.save_payloads:
            # buffers are often updated in place by C++ kernels (batch norm statistics),
            # out of the capture's sight: copy them now rather than alias them
            builder.payloads.save(label, tensor, copy=copy or kind == "buffer")
        builder._remember(tensor, label)
        return source

    def add_input(self, builder: Any, path: str, tensor: Tensor) -> str:
        """Record a tensor passed to the traced callable; returns its label."""
        known = builder._current_label(tensor)
        if known is not None:  # the same tensor passed twice is one source
            return known
        label = builder.labeler.new("input")
        self.add(builder, label, "input", path, tensor)
        self.input_labels.append(label)
        return label

    def first_seen(self, builder: Any, tensor: Tensor) -> str:
        """The label of ``tensor``, which holds no value the trace knows: a source, or an
        op linking it to recorded values (see the module docstring)."""
        owned = self.owned.get(id(tensor))
        if owned is not None and owned[2] is tensor:
            kind, address, _ = owned
            records = builder._records
            label = address if address not in records else builder.labeler.new(address)
            self.add(builder, label, kind, address, tensor)
            return label
        weight = self.current_weight(builder, tensor)
        if weight is not None:
            return weight
        same = builder.payloads.same_memory(tensor)
        if same is not None:  # a recorded value under another object (as_subclass)
            builder._remember(tensor, same)
            return same
        linked = builder._wrappers.link(builder, tensor)
        if linked is not None:  # what a recorded DTensor holds, or a DTensor holding one
            return linked
        label = builder.labeler.new("constant")
        if tensor.grad_fn is not None and self._made_during_forward(builder, tensor):
            made = record_unseen(builder, tensor)  # an opaque op linked to what it came from
            if made is not None:
                return made
            path = UNSEEN_COMPUTATION
        else:
            path = TRANSFORM_RESULT if self.transformed else "closure"
            if not torch.is_grad_enabled():  # no history: cannot be told from unseen
                self.without_grad.append(label)
        self.add(builder, label, "constant", path, tensor)
        return label

    def current_weight(self, builder: Any, tensor: Tensor) -> str | None:
        """The label of ``tensor`` as a parameter or buffer of a module whose call is open,
        read from that module's ``_parameters``/``_buffers`` now: weights a hook puts in
        place during the forward (accelerate's offloading moves them in from the ``meta``
        device at each call) are not the tensors the module held when the capture began.

        A weight put in place again (the next call, the next decoding step) is the source
        already recorded at that address while it holds the same value.
        """
        for call_address, module in builder.stack.open_modules():
            for kind, members in (("parameter", module._parameters), ("buffer", module._buffers)):
                for name, member in members.items():
                    if member is tensor:
                        address = f"{call_address}.{name}" if call_address else name
                        return self._weight_source(builder, kind, address, tensor)
        return None

    def _weight_source(self, builder: Any, kind: str, address: str, tensor: Tensor) -> str:
        """The source of a weight found at ``address`` during the forward: the one recorded
        there before when it holds the same value, else a new one."""
        self.owned[id(tensor)] = (kind, address, tensor)  # its later reads: the fast path
        records = builder._records
        earlier = records.get(address)
        if earlier is not None and getattr(earlier, "kind", None) == kind:
            value = builder.payloads.values.get(address)
            if not builder.save_payloads or (
                value is not None
                and value.shape == tensor.shape
                and value.dtype == tensor.dtype
                and value.device == tensor.device
                and torch.equal(value, tensor)
            ):
                builder._remember(tensor, address)
                return address
        label = address if address not in records else builder.labeler.new(address)
        # copied now: the hook that put it in place may release its memory after the call
        # (FSDP frees the parameters it gathered when the module's forward ends)
        self.add(builder, label, kind, address, tensor, copy=True)
        return label

    @staticmethod
    def _made_during_forward(builder: Any, tensor: Tensor) -> bool:
        """Whether ``tensor`` (with autograd history, and no recorded op that made it) got
        its history after this forward's first recorded op did: it was computed out of the
        capture's sight (a TorchScript function, a C++ extension), not kept from an earlier
        call (a cache). Autograd numbers its nodes in the order they are made."""
        made = tensor.grad_fn._sequence_nr()
        values = builder.payloads.values
        for op in builder.ops:
            first = getattr(values.get(op.label), "grad_fn", None)
            if first is not None:
                return first._sequence_nr() < made
        return False
