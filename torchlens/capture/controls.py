"""``save=``, ``intervene=`` and ``stop_after=``: what a capture keeps, edits and halts on.

One :class:`Controls` object per call holds the parsed selectors and the state they build up
(which ops matched, which were edited). ``tl.trace`` plugs it into the builder (a payload
filter) and the capture mode (an op hook); ``tl.record`` asks it the same questions from its
lean mode. Halting is a private exception raised after the matching op and caught by
:meth:`Controls.halting`, which puts the RNG state and the model's buffers back as they were
before the call.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlens._calls import with_second
from torchlens._tensors import version_of
from torchlens.capture import rng
from torchlens.capture.tree import flatten, flatten_call
from torchlens.errors import (
    InterventionError,
    InvalidArgumentError,
    MixedShapesWarning,
    PayloadUnavailableError,
)
from torchlens.selectors import Candidates, Selector, as_selector, require_match
from torchlens.trace import lookup_while

__all__ = [
    "Intervention",
    "Controls",
    "apply_edit",
    "original_key",
    "reapply",
    "trace_candidates",
]

Tensor = torch.Tensor
EditFn = Callable[[Tensor, Any], Tensor]


@dataclass(frozen=True)
class Intervention:
    """An ``intervene=`` function with its options.

    Args:
        fn: ``fn(tensor, op_view) -> tensor`` returns the value downstream ops should use;
            a function of the tensor alone, ``fn(tensor) -> tensor``, works too.
        keep_original: also keep the value before the edit (store key
            ``op.meta["original_key"]``, read it with ``trace.store.get(key)``).
        allow_changes: let ``fn`` change the shape, dtype or device of the value.

    Example:
        >>> edit = Intervention(lambda t, op: t * 0, keep_original=True)
    """

    fn: EditFn
    keep_original: bool = False
    allow_changes: bool = False


class Halt(BaseException):
    """Raised after the ``stop_after`` op; a BaseException so ``except Exception`` in model
    code cannot swallow it."""


def run_after_halt(halt: type[BaseException], func: Any, args: tuple, kwargs: dict | None) -> Any:
    """A call made after ``stop_after=`` matched, while the calls returning the op halted on
    end: ``halt`` is raised at the first call that reads or makes a tensor (unrecorded);
    calls of no tensor run on, so that ``torch.no_grad()`` and the like still put the grad
    mode back on their way out."""
    if flatten_call(args, kwargs or {})[0]:
        raise halt
    result = func(*args, **kwargs) if kwargs else func(*args)
    if flatten(result)[0]:  # a factory (torch.arange): made, not recorded
        raise halt
    return result


def original_key(label: str) -> str:
    """The store key of an edited op's value before the edit."""
    return f"{label}#original"


def apply_edit(edit: Intervention, tensor: Tensor, view: Any, inplace: bool) -> Tensor:
    """Run ``edit`` on an op's output and check what it returned.

    The output of an in-place op is still referenced by the model's own variables, so the
    new value is copied into it rather than swapped in.
    """
    new = edit.fn(tensor, view)
    if not isinstance(new, Tensor):
        raise InterventionError(
            f"the intervene= function for {view.label!r} returned {type(new).__name__}; "
            "return the tensor downstream ops should use instead",
            code="bad_return",
        )
    if new is tensor:
        return tensor
    if inplace or not edit.allow_changes:
        _check_same(new, tensor, view.label, inplace)
    if inplace:
        tensor.copy_(new)
        return tensor
    return new


def _check_same(new: Tensor, old: Tensor, label: str, inplace: bool) -> None:
    for what, a, b in (
        ("shape", tuple(new.shape), tuple(old.shape)),
        ("dtype", new.dtype, old.dtype),
        ("device", new.device, old.device),
    ):
        if a != b:
            fix = (
                "an in-place op's output is edited in place, so it must keep them"
                if inplace
                else "pass tl.Intervention(fn, allow_changes=True) if this is intended"
            )
            raise InterventionError(
                f"the intervene= function for {label!r} changed the {what} from {b} to {a}; {fix}",
                code="inplace_change" if inplace else f"changed_{what}",
            )


def parse_intervene(intervene: Any) -> list[tuple[Selector, Intervention]]:
    """``intervene=`` as ``(selector, edit)`` pairs, checked once: the capture and
    ``trace.rerun`` (in ``edits``) read the same argument the same way.

    Raises:
        InvalidArgumentError: when ``intervene`` is not a mapping of selectors to edits.
    """
    if intervene is None:
        return []
    if not isinstance(intervene, Mapping):
        raise InvalidArgumentError(
            "intervene= takes a dict {selector: fn(tensor, op) -> tensor}, "
            f"got {type(intervene).__name__}",
            code="bad_intervene",
        )
    edits = []
    for selector, edit in intervene.items():
        if not isinstance(edit, Intervention):
            if not callable(edit):
                raise InvalidArgumentError(
                    f"intervene= values are functions fn(tensor, op) -> tensor or "
                    f"tl.Intervention(...), got {type(edit).__name__} for {selector!r}",
                    code="bad_intervene",
                )
            edit = Intervention(edit)
        edits.append((as_selector(selector), _two_arguments(edit, selector)))
    return edits


def _two_arguments(edit: Intervention, selector: Any) -> Intervention:
    """``edit`` with a function called as ``fn(tensor, op)``, by the one rule of
    :func:`torchlens._calls.with_second` (the op only when the function asks for it); one
    taking neither form is refused now, not mid-forward."""
    fn = with_second(edit.fn, "op")
    if fn is edit.fn:
        return edit
    if fn is not None:
        return dataclasses.replace(edit, fn=fn)
    raise InvalidArgumentError(
        f"the intervene= function for {selector!r} takes neither (tensor) nor (tensor, op) "
        f"(its signature is {inspect.signature(edit.fn)}); write it as fn(tensor, op) -> "
        "tensor or fn(tensor) -> tensor",
        code="bad_intervene",
    )


class Controls:
    """The parsed ``save=``, ``intervene=`` and ``stop_after=`` of one call, and what they hit.

    Args:
        save: ops whose values to keep (``None``: the caller's default).
        intervene: ``{selector: fn or Intervention}``.
        stop_after: halt the forward after the first op it matches.
    """

    def __init__(
        self,
        save: Any = None,
        intervene: Any = None,
        stop_after: Any = None,
        *,
        structure_only: bool = False,
    ) -> None:
        if structure_only and save is not None:
            raise InvalidArgumentError(
                "save= picks which values to keep, but structure_only=True keeps none; "
                "drop one of the two",
                code="conflicting_options",
            )
        self.save = None if save is None else as_selector(save)
        self.edits = parse_intervene(intervene)
        self.stop = None if stop_after is None else as_selector(stop_after)
        self.saved = 0  # ops the save selector matched
        self.edit_hits = [0] * len(self.edits)
        # per edit: (rank, feature size) -> (shape, label) of the first op edited so
        self.edit_shapes: list[dict[tuple[int, int], tuple]] = [{} for _ in self.edits]
        self.intervened: list[str] = []  # labels of edited ops, in order
        self._edited: set[tuple[int, str]] = set()  # (edit index, label) applied
        self.halted_at: str | None = None
        self._types: dict[str, str] = {}  # module address -> class name (_module_type)
        self._builder: Any = None  # whose named_modules grow during the forward

    @property
    def active(self) -> bool:
        """Whether any control was given."""
        return self.save is not None or bool(self.edits) or self.stop is not None

    # -- tl.trace -------------------------------------------------------------------------
    def save_filter(self) -> Callable[[Any], bool] | None:
        """The builder's payload filter for ``save=`` (``None``: keep every value)."""
        if self.save is None:
            return None
        matches = self.save.matches
        type_of = self._module_type

        def payload_filter(op: Any) -> bool:
            if not op.module_type:  # what a tl.where predicate may ask; Trace fills the rest
                op.module_type = type_of(op.module)
            hit = matches(op)
            self.saved += hit
            return hit

        return payload_filter

    @property
    def rules(self) -> list[Selector]:
        """Every selector given: ``save=``, ``stop_after=``, then each edit's."""
        given = [self.save, self.stop, *(sel for sel, _ in self.edits)]
        return [rule for rule in given if rule is not None]

    @property
    def at_exit(self) -> bool:
        """Whether a rule asks what a module call returned (``tl.module(...).output``)."""
        return any(rule.at_exit for rule in self.rules)

    def hooks(self, builder: Any) -> tuple[Callable[[Any, Tensor], Tensor], ...]:
        """The capture mode's op hooks: none unless ``intervene=`` or ``stop_after=``; the
        builder's module exit hook when a rule selects module outputs."""
        if not self.active:
            return ()  # nothing to ask per op: the module types are not needed either
        self._builder = builder
        if self.at_exit:
            builder.exit_hooks.append(self.exit_hook(builder))
        return (self.trace_hook(builder),) if self.edits or self.stop is not None else ()

    def exit_hook(self, builder: Any) -> Callable[[Any, list[Tensor]], list[Tensor]]:
        """The builder's module exit hook: save, edit or halt on what a call returned."""
        edits = [(i, sel, edit) for i, (sel, edit) in enumerate(self.edits) if sel.at_exit]
        save = self.save if self.save is not None and self.save.at_exit else None
        stop = self.stop if self.stop is not None and self.stop.at_exit else None

        def hook(call: Any, tensors: list[Tensor]) -> list[Tensor]:
            frame = (call.address, call.call_index, call.module_type)
            tensors = list(tensors)
            for k, label in enumerate(call.outputs[: len(tensors)]):
                op = builder.record(label)
                if not hasattr(op, "returned_by"):
                    continue  # a source returned as is: not an op
                op.returned_by += (frame,)
                if save is not None and save.matches(op):
                    self.saved += 1  # (kept already, as the op halted on: matched too)
                    if not op.has_out:
                        builder.save_extra(label, tensors[k])
                    for selected in builder.late_selected:
                        selected(op, tensors[k])
                for i, selector, edit in edits:
                    if selector.matches(op):
                        tensors[k] = self._edit_traced(builder, op, tensors[k], edit, i)
                if stop is not None and self.halted_at is None and stop.matches(op):
                    self.halted_at = label  # halts once the calls returning it end
                    builder.halt_pending = Halt
            return tensors

        return hook

    def _module_type(self, address: str) -> str:
        """The class name of the module at ``address``, learnt from the builder's modules
        (which grow during the forward: ``capture/roots.py``) when it is not known yet."""
        name = self._types.get(address)
        if name is None:
            for known, module in self._builder.named_modules:
                self._types.setdefault(known, type(module).__name__)
            name = self._types.setdefault(address, "")  # (a group's address: none)
        return name

    def note_shape(self, i: int, label: str, shape: tuple[int, ...]) -> None:
        """Warn once when the ``i``-th intervene= selector edits ops of a second shape.

        Shapes alike but for their leading axes (the same rank and feature axis: a prompt
        of 6 tokens, then one token per decoding step) are one shape here: one edit along
        the features fits them all.
        """
        shapes = self.edit_shapes[i]
        kind = (len(shape), shape[-1]) if shape else (0, 0)
        new = kind not in shapes
        shapes.setdefault(kind, (shape, label))
        if new and len(shapes) == 2:
            selector = self.edits[i][0]
            seen = ", ".join(f"{lab} {tuple(s)}" for s, lab in shapes.values())
            warnings.warn(
                f"the intervene= selector {selector!r} edits ops of different shapes ({seen}); "
                "one function rarely fits both. To edit what a module returned, select "
                "tl.module(...).output; to edit one op, tl.label(...)",
                MixedShapesWarning,
                stacklevel=2,
            )

    def trace_hook(self, builder: Any) -> Callable[[Any, Tensor], Tensor]:
        """The capture mode's op hook: apply edits, then halt if ``stop_after`` matches."""

        type_of = self._module_type

        def hook(op: Any, tensor: Tensor) -> Tensor:
            if not op.module_type:
                op.module_type = type_of(op.module)
            for i, (selector, edit) in enumerate(self.edits):
                if selector.matches(op):
                    # the ops so far, for the edit to read (tl.attention_pattern asks
                    # whether the query was packed)
                    with lookup_while(op, builder.record):
                        tensor = self._edit_traced(builder, op, tensor, edit, i)
            if self.stop is not None and self.halted_at is None and self.stop.matches(op):
                self.halted_at = op.label
                if not op.has_out:  # the op a forward halts on keeps its value
                    builder.save_extra(op.label, tensor)
                # the forward halts at its next op or module call: the calls that return
                # this op end first, so that they count as returning it, as in tl.record
                builder.halt_pending = Halt
            return tensor

        return hook

    def first_edit(self, i: int, label: str) -> bool:
        """Whether the ``i``-th edit is yet to be applied to op ``label`` (it now is): a
        value that several module calls return (``nn.Identity``, a block returning its last
        layer's output), or that a rule matches both when it is made and when a call
        returns it, is edited once."""
        key = (i, label)
        if key in self._edited:
            return False
        self._edited.add(key)
        return True

    def _edit_traced(
        self, builder: Any, op: Any, tensor: Tensor, edit: Intervention, i: int
    ) -> Tensor:
        self.edit_hits[i] += 1
        if not self.first_edit(i, op.label):
            return tensor
        self.note_shape(i, op.label, tuple(tensor.shape))
        original = tensor.detach().clone() if edit.keep_original else None
        version = version_of(tensor)
        new = apply_edit(edit, tensor, op, op.is_inplace)
        if new is not tensor or version_of(new) != version:
            builder.replace_output(op, new)
        if original is not None:
            builder.save_extra(original_key(op.label), original)
            op.meta["original_key"] = original_key(op.label)
        op.meta["intervened"] = True
        self.intervened.append(op.label)
        return new

    # -- halting and checks ---------------------------------------------------------------
    @contextmanager
    def halting(self, model: Any, modules: list[tuple[str, nn.Module]]) -> Iterator[None]:
        """Catch the halt of ``stop_after``; the RNG state and the model's buffers (of
        ``modules``, the walk of its root) are then put back as they were when the block
        began. Also notes the model's type, which selectors see as ``op.module_type`` of
        the ops run outside any submodule."""
        if not isinstance(model, nn.Module):
            self._types[""] = getattr(model, "__qualname__", None) or type(model).__name__
        if self.stop is None:
            yield
            return
        state = rng.snapshot()
        buffers = snapshot_buffers(module for _, module in modules)
        try:
            yield
        except Halt:  # (raised only once halted_at is set)
            pass
        if self.halted_at is not None:  # or tl.record halted after the forward's last op
            rng.restore(state)
            restore_buffers(buffers)

    def check(self, seen: Callable[[], Candidates]) -> None:
        """Raise :class:`~torchlens.errors.SelectorMatchError` for a selector that matched
        no op of the forward that ran; ``seen()`` gives the names for its hint."""
        if self.save is not None and not self.saved:
            require_match(self.save, "save=", seen())
        for (selector, _), hits in zip(self.edits, self.edit_hits):
            if not hits:
                require_match(selector, "intervene=", seen())
        if self.stop is not None and self.halted_at is None:
            require_match(self.stop, "stop_after=", seen())

    def meta(self) -> dict[str, Any]:
        """What to note on the finished trace or recording."""
        meta: dict[str, Any] = {}
        if self.stop is not None:
            meta["halted"] = self.halted_at is not None
            meta["halted_at"] = self.halted_at
        if self.edits:
            meta["intervened"] = list(self.intervened)
            # for a ground-truth rerun with the same edits (not written to disk)
            meta["interventions"] = {sel: edit for sel, edit in self.edits}
        return meta


def reapply(trace: Any, ops: list[Any], outputs: list[Tensor]) -> list[Tensor]:
    """A replayed call's outputs with the trace's interventions applied as capture applied
    them, so that per-op replay of an intervened trace compares like with like.

    Raises:
        PayloadUnavailableError: ``interventions_unavailable`` when an op was edited but the
            functions are not on the trace (a trace loaded from disk).
    """
    if not any(op.meta.get("intervened") for op in ops):
        return outputs
    edits = trace.meta.get("interventions")
    if not isinstance(edits, Mapping):
        raise PayloadUnavailableError(
            f"{ops[0].label!r} was edited by intervene=, but the functions are not stored "
            "with this trace (they are not saved to disk); check the trace that tl.trace "
            "returned",
            code="interventions_unavailable",
        )
    outputs = list(outputs)
    for op in ops:
        if op.meta.get("intervened") and op.output_index < len(outputs):
            value = outputs[op.output_index]
            for selector, edit in edits.items():
                if selector.matches(op):
                    value = apply_edit(edit, value, op, inplace=False)
            outputs[op.output_index] = value
    return outputs


def trace_candidates(trace: Any) -> Candidates:
    """The names a trace offers for "matched nothing" hints."""
    return Candidates(
        func_names={op.func_name for op in trace.ops},
        modules={m.address for m in trace.modules},
        labels=[op.label for op in trace.ops],
    )


def snapshot_buffers(modules: Iterable[nn.Module]) -> list[tuple[dict, str, Tensor, Tensor]]:
    """A copy of every buffer of ``modules``, with where it lives, for
    :func:`restore_buffers`."""
    saved = []
    for module in modules:
        for name, buffer in module._buffers.items():
            if buffer is not None:
                saved.append((module._buffers, name, buffer, buffer.detach().clone()))
    return saved


def restore_buffers(saved: list[tuple[dict, str, Tensor, Tensor]]) -> None:
    """Put back the buffers :func:`snapshot_buffers` copied: a halted forward (here and in
    ``find_nonfinite``) leaves the model as it found it."""
    with torch.no_grad():  # kernels such as batch_norm update buffers without a version bump
        for buffers, name, buffer, copy in saved:
            buffers[name] = buffer
            buffer.copy_(copy)
