"""Backward capture: true gradients of every op, recorded by autograd hooks.

``tl.trace(model, x, save_grads=True)`` keeps the forward's live autograd graph (through
``trace.output``) and, while the forward runs, puts one hook on the autograd node that
produced each op's value. When a backward goes through that graph — ``trace.backward()`` or a
plain ``loss.backward()`` — each hook receives the gradient of the loss w.r.t. that op's
output and stores it; ``op.grad`` and ``trace.grads[label]`` read it.

Why hook the node and not the tensor: a tensor that is later modified in place gets a new
``grad_fn``, and the gradient w.r.t. the *value an op produced* flows into the node that was
current when the op ran. Hooking ``tensor.grad_fn`` at record time (picking
``tensor.output_nr`` among the node's outputs, for multi-output calls such as ``split`` or
``lstm``) is therefore exact for in-place ops, views and multi-output ops alike. Leaves
(parameters, inputs) have no node; they get a tensor hook, which fires once with the total
gradient of all their uses (shared weights, recurrent loops).

Leaf hooks live on tensors the user keeps (the model's parameters), so a backward of some
*other* graph could reach them. They only record while a backward through this trace is
running: any hook on one of this forward's own nodes, or ``trace.backward()``, marks the pass
as active. When that backward ends, every hook is removed (also when the trace is deleted),
so a second backward records nothing and a freed graph raises PyTorch's usual error. A
backward while the forward still runs (``torch.autograd.grad`` inside it) is the forward's
own: it records nothing and does not end the capture.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from torchlens.capture.grad_alias import AliasTracker
from torchlens.capture.tree import flatten
from torchlens.errors import GradUnavailableError, InvalidArgumentError
from torchlens.trace import Op, Source, Trace

__all__ = ["GradCapture", "GradStore", "GradMapping", "default_loss", "grad_untracked"]

Tensor = torch.Tensor

_UNTRACKED = (
    "{label!r} was computed without gradient tracking (requires_grad=False: under "
    "torch.no_grad, detached, or from integer/bool values), so no gradient can reach it "
    "and it does not lie on the path to the loss"
)
_NOT_SELECTED = (
    "{label!r} was not selected by save=, so its gradient was not kept; trace again with "
    "a selector that matches it"
)
_NOT_ON_PATH = (
    "no gradient reached {label!r}: it does not lie on the path from the outputs to the "
    "loss (its value was not used by anything the loss depends on)"
)


def default_loss(output: Any) -> Tensor:
    """The loss ``trace.backward()`` uses: the sum of the sums of all floating outputs.

    Complex outputs count through their real and imaginary parts. Outputs that do not
    require grad are skipped.

    Raises:
        GradUnavailableError: ``no_differentiable_output`` when no output requires grad.

    Example:
        >>> default_loss((torch.ones(2, requires_grad=True), torch.arange(3)))
        tensor(2., grad_fn=<SumBackward0>)
    """
    terms = []
    for _, tensor in flatten(output)[0]:
        if not tensor.requires_grad:
            continue
        if tensor.is_complex():
            terms.append(torch.view_as_real(tensor).sum())
        elif tensor.is_floating_point():
            terms.append(tensor.sum())
    if not terms:
        raise GradUnavailableError(
            "no output of this trace requires grad, so there is no default loss to "
            "backpropagate; pass loss_fn=... to trace.backward()",
            code="no_differentiable_output",
        )
    loss = terms[0]
    for term in terms[1:]:
        loss = loss + term.to(loss.dtype)
    return loss


class GradStore:
    """Captured gradients by label, with the reason each missing one is missing."""

    def __init__(self) -> None:
        self.values: dict[str, Tensor] = {}
        self.missing: dict[str, tuple[str, str]] = {}  # label -> (code, message)
        # labels whose value was computed without gradient tracking, though a view of it
        # may say requires_grad (one made under no_grad inside a custom autograd.Function)
        self.untracked: set[str] = set()
        self.done = False  # a backward through the trace has finished

    def get(self, label: str) -> Tensor:
        """The gradient of ``label``; raises :class:`GradUnavailableError` if absent."""
        if label in self.missing:
            code, message = self.missing[label]
            raise GradUnavailableError(message, code=code)
        value = self.values.get(label)
        if value is not None:
            return value
        if not self.done:
            raise GradUnavailableError(
                f"backward has not run through this trace yet, so {label!r} has no gradient; "
                "call trace.backward() (or loss.backward() on trace.output) first",
                code="backward_not_run",
            )
        raise GradUnavailableError(_NOT_ON_PATH.format(label=label), code="no_grad")

    def has(self, label: str) -> bool:
        """Whether a gradient for ``label`` can be given."""
        return label in self.values and label not in self.missing


class GradMapping(Mapping[str, Tensor]):
    """Read-only view of a :class:`GradStore`: labels with a captured gradient.

    ``mapping[label]`` raises the store's typed error (``backward_not_run``, ``no_grad``...)
    rather than a bare ``KeyError``.
    """

    def __init__(self, store: GradStore) -> None:
        self._store = store

    def __getitem__(self, label: str) -> Tensor:
        return self._store.get(label)

    def __iter__(self) -> Iterator[str]:
        return (label for label in self._store.values if self._store.has(label))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, label: object) -> bool:
        return isinstance(label, str) and self._store.has(label)

    def get(self, label: str, default: Any = None) -> Any:
        return self._store.get(label) if self._store.has(label) else default

    def __repr__(self) -> str:
        return f"<grads: {len(self)} captured>"


class GradCapture:
    """Registers the gradient hooks during capture, then runs and finishes backward.

    A builder observer while the forward runs (:meth:`observe`), then the trace's
    ``grad_session``. It holds the hook handles and the store, never the model or the trace.

    Args:
        payload_filter: the ``save=`` selection; ops it rejects get no hook and no grad.
    """

    def __init__(self, payload_filter: Callable[[Op], bool] | None = None) -> None:
        self.store = GradStore()
        self.payload_filter = payload_filter
        self.handles: dict[str, RemovableHandle] = {}  # label -> hook on its value
        # given every captured grad once backward ends (streaming writes them to disk)
        self.sinks: list[Callable[[Mapping[str, Tensor]], None]] = []
        self.active = False  # a backward through this trace is running
        # the forward has ended (attach): a backward before that is the forward's own
        # (torch.autograd.grad inside it), not one through this trace
        self.armed = False
        self._queued = False
        self.aliases = AliasTracker()  # records whose grad autograd merges with another's
        # label -> alias_of of ops save= rejected when they ran; kept (not None) only when
        # save= selects module outputs, which a call's end may select (see :meth:`select`)
        self.pending: dict[str, str | None] | None = None

    @property
    def grads(self) -> GradMapping:
        """The captured gradients by label."""
        return GradMapping(self.store)

    # -- during capture -------------------------------------------------------------------
    def observe(self, record: Op | Source, tensor: Tensor, alias_of: str | None) -> None:
        """Builder observer: hook the autograd node that holds ``record``'s value."""
        label = record.label
        old = self.handles.pop(label, None)
        if old is not None:  # the record took a new tensor (an intervention replaced it)
            old.remove()
        if isinstance(record, Op) and self.payload_filter and not self.payload_filter(record):
            self.store.missing[label] = ("not_saved", _NOT_SELECTED.format(label=label))
            if self.pending is not None:
                self.pending[label] = alias_of
            return
        self._hook(record, tensor, alias_of)

    def select(self, op: Op, tensor: Tensor) -> None:
        """``save=`` selected ``op`` when a module call returned its value (``tl.module(...)
        .output``): hook it now. ``tensor`` still holds the op's value (the call returned
        it), so its node is the one the op produced."""
        if self.pending is not None and op.label in self.pending:
            self._hook(op, tensor, self.pending.pop(op.label))

    def _hook(self, record: Op | Source, tensor: Tensor, alias_of: str | None) -> None:
        label = record.label
        if not tensor.requires_grad:
            self.store.missing[label] = ("no_grad", _UNTRACKED.format(label=label))
            self.store.untracked.add(label)
            return
        self.store.missing.pop(label, None)
        if _untracked_view(record, tensor):
            self.store.untracked.add(label)
        else:
            self.store.untracked.discard(label)
        with torch._C.DisableTorchFunction():
            node = tensor.grad_fn
            if node is None:
                handle = tensor.register_hook(partial(_passive_grad, self, label))
            else:  # (a source's node is not this forward's own: it records passively)
                own = not isinstance(record, Source)
                handle = node.register_prehook(
                    partial(_node_grad, self, label, tensor.output_nr, own)
                )
            if isinstance(record, Op):
                self.aliases.note(record, tensor, alias_of, node)
        self.handles[label] = handle

    def attach(self, trace: Trace) -> None:
        """Make ``trace`` read from this capture: ``op.grad``, ``trace.backward()``."""
        for record in [*trace.ops, *trace.sources]:
            record.grad_store = self.store
        for label, reason in self.aliases.ambiguous(trace).items():
            handle = self.handles.pop(label, None)
            if handle is not None:
                handle.remove()
            self.store.missing[label] = ("grad_aliased", reason)
        trace.grad_session = self
        self.armed = True
        self.pending = None  # no module call ends any more
        weakref.finalize(trace, _remove_all, self.handles)

    # -- during backward ------------------------------------------------------------------
    def backward(
        self,
        output: Any,
        loss_fn: Callable[[Any], Tensor] | None = None,
        *,
        retain_graph: bool = False,
    ) -> Tensor:
        """Compute the loss from ``output`` and backpropagate it; see ``Trace.backward``."""
        loss = (loss_fn or default_loss)(output)
        if not isinstance(loss, Tensor):
            raise InvalidArgumentError(
                f"loss_fn returned {type(loss).__name__}, not a tensor: backward needs the "
                "loss as a tensor with its graph (drop a .item() or float())",
                code="bad_loss",
            )
        self.active = True
        try:
            torch.autograd.backward(loss, retain_graph=retain_graph)
        finally:
            self.active = False
        self.finish()
        return loss

    def activate(self) -> None:
        """One of this forward's nodes is being backpropagated: record until it ends.

        Not while the forward still runs: a ``torch.autograd.grad`` call inside it (a
        Jacobian term, as in residual flows or PINNs) goes through the nodes hooked so far;
        its gradients are not the loss's, and ending with it would leave the real backward
        without hooks.
        """
        if self.active or self.store.done or not self.armed:
            return
        self.active = True
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def finish(self) -> None:
        """The backward ended: keep what was recorded, remove every hook, feed the sinks."""
        if self.store.done:
            return
        self.active = False
        self.store.done = True
        _remove_all(self.handles)
        if self.sinks:
            grads = {label: g for label, g in self.store.values.items() if self.store.has(label)}
            for sink in self.sinks:
                sink(grads)

    def put(self, label: str, grad: Tensor | None) -> None:
        """Keep a copy of ``grad`` (autograd may reuse its buffer)."""
        if grad is not None and not self.store.done:
            self.store.values[label] = grad.detach().clone()


def _node_grad(
    capture: GradCapture, label: str, index: int, own: bool, grad_outputs: tuple
) -> None:
    """Pre-hook on the node holding a value: ``grad_outputs[index]`` is its gradient. A
    hook on this forward's ``own`` node marks the backward as one through this trace."""
    if own:
        capture.activate()
    if capture.active:
        capture.put(label, grad_outputs[index] if index < len(grad_outputs) else None)


def _passive_grad(capture: GradCapture, label: str, grad: Tensor) -> None:
    """Hook on a tensor the user may share with other graphs: record only during our pass."""
    if capture.active:
        capture.put(label, grad)


def _remove_all(handles: dict[str, RemovableHandle]) -> None:
    for handle in handles.values():
        handle.remove()
    handles.clear()


def _untracked_view(record: Op | Source, tensor: Tensor) -> bool:
    """A view made without gradient tracking: it says ``requires_grad`` (its base does)
    but has no ``grad_fn``, so no gradient passes through it back to its base."""
    return isinstance(record, Op) and tensor.grad_fn is None and tensor._is_view()


def grad_untracked(record: Op | Source) -> bool:
    """Whether ``record`` was computed without gradient tracking in a ``save_grads``
    capture, whatever its ``requires_grad`` says (False when unknown: no grads kept, or a
    loaded trace)."""
    store = record.grad_store
    return isinstance(store, GradStore) and record.label in store.untracked
