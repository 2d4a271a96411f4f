"""The lean pass behind ``tl.find_nonfinite(model, x)``: ``tl.record``'s mode, checking outputs.

:class:`NonFiniteMode` is :class:`~torchlens.capture.record_mode.RecordMode` (so ops are
counted, and labelled, exactly as ``tl.trace`` labels them) with one rule for every function
name: check each floating output. The check is one sum (a NaN or an infinity makes any sum
non-finite), so a healthy forward pays one reduction per output, save the outputs of calls
that keep finite values finite (a view, a concatenation, a softmax) on arguments already
proven finite, which are not summed again. Only at the first non-finite output is anything
else done: the call's tensor arguments, still live, are its parents' values (copied there),
the module stack gives the module call and the Python stack the model's line. Then the
forward halts.

To name the parents as a trace does, the pass keeps ``id(tensor) -> (weak reference, label)``
for every op output; inputs (``input_1``, ...), parameters and buffers (by address) are named
only when a culprit is found.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlens._source import SourceLine
from torchlens._tensors import storage_key, version_of
from torchlens.capture import (
    SPECIAL_OUTPUTS,
    Controls,
    Halt,
    RecordMode,
    caller_line,
    flatten,
    inplace_targets,
    named_modules,
    owned_tensors,
)
from torchlens.recording import OpView
from torchlens.replay import comparable
from torchlens.trace import MemoryPayloadStore

__all__ = ["Culprit", "CulpritOp", "ForwardCall", "NonFiniteMode", "is_nonfinite"]

Tensor = torch.Tensor
_CHECKED = frozenset(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
     torch.complex128, torch.complex32)
)  # fmt: skip
# real floating dtypes, checked in place; the others (complex, sparse) go through
# is_nonfinite, which first makes a dense real view of them
_SUMMED = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))
# functions whose outputs are finite when their floating tensor arguments are: those that
# only move elements (views, copies, concatenations, selections) and a few bounded or
# sign-keeping maps; none takes a fill value. Such an output of arguments proven finite
# is not summed again.
_KEEPS_FINITE = frozenset(
    (
        "view", "reshape", "transpose", "permute", "getitem", "unsqueeze", "squeeze",
        "flatten", "unflatten", "contiguous", "expand", "expand_as", "narrow", "select", "t",
        "chunk", "split", "split_with_sizes", "tensor_split", "unbind", "clone", "detach", "data",
        "cat", "concat", "concatenate", "stack", "movedim", "moveaxis", "view_as",
        "reshape_as", "swapaxes", "swapdims", "repeat", "tile", "roll", "flip", "index_select",
        "gather", "take", "masked_select", "unfold", "diagonal", "tril", "triu", "max", "min",
        "amax", "amin", "sort", "topk", "max_pool1d", "max_pool2d", "max_pool3d", "relu",
        "abs", "neg", "sign", "sigmoid", "tanh", "softmax", "sin", "cos",
    )
)  # fmt: skip
# what a function name's outputs need: _CHECK, _KEEPS, or a test from _KEEPS_WHEN
_CHECK: Any = object()
_KEEPS: Any = object()
_NO_STORAGE: Any = object()


def is_nonfinite(value: Tensor, inf: bool = True) -> bool:
    """Whether a floating or complex value holds a NaN (or, with ``inf``, an infinity);
    other dtypes never do.

    One sum decides most values: a finite sum proves every element finite, and a sum of
    ``±inf`` proves there is no NaN (a NaN makes any sum NaN). Only a sum that leaves the
    question open (finite values may overflow it) takes a second pass, ``aminmax``, into
    whose results a NaN propagates.
    """
    if not (value.is_floating_point() or value.is_complex()):
        return False
    value = comparable(value)
    total = value.sum().item()
    return total - total != 0.0 and _nonfinite_after_sum(value, total, inf)


def _nonfinite_after_sum(value: Tensor, total: float, inf: bool) -> bool:
    """:func:`is_nonfinite` of a real ``value`` whose sum, ``total``, is not finite."""
    if total == total and not inf:  # ±inf: no NaN
        return False
    low, high = (x.item() for x in torch.aminmax(value))
    if high != high:  # a NaN
        return True
    return inf and (abs(low) == math.inf or abs(high) == math.inf)


def _finite(tensor: Tensor, inf: bool) -> tuple[bool, bool]:
    """``(passes, wholly finite)``: not :func:`is_nonfinite`, and free of infinities too
    (with ``inf=False`` a value may pass holding one, and then proves nothing about what
    is computed from it: a softmax of ``inf`` is NaN). One sum for a dense real tensor."""
    if tensor.dtype in _SUMMED and tensor.layout == torch.strided:
        value = tensor.detach() if tensor.requires_grad else tensor
        total = value.sum().item()
        if total - total == 0.0:
            return True, True
        return not _nonfinite_after_sum(value, total, inf), False
    if not is_nonfinite(tensor, inf):
        return True, inf or not is_nonfinite(tensor, True)
    return False, False


def _not_training(args: tuple, kwargs: dict | None) -> bool:
    """A dropout that is the identity: not training (a training one scales, which may
    overflow)."""
    return not _training(args, kwargs)


def _times_at_most_one(args: tuple, kwargs: dict | None) -> bool:
    """``x * s`` (either way round) by a real number ``|s| <= 1``: ``|x * s| <= |x|``, so
    rounding cannot reach an infinity (a NaN ``s`` fails the test)."""
    if len(args) != 2:
        return False
    scalar = args[1] if isinstance(args[0], Tensor) else args[0]
    return isinstance(scalar, (int, float)) and abs(scalar) <= 1


def _over_at_least_one(args: tuple, kwargs: dict | None) -> bool:
    """``x / s`` by a real number ``|s| >= 1`` (an infinite one included: the quotient is
    zero): ``|x / s| <= |x|``; a rounding mode keeps that."""
    return (
        len(args) == 2
        and isinstance(args[0], Tensor)
        and isinstance(args[1], (int, float))
        and abs(args[1]) >= 1
    )


def _exact_gelu(args: tuple, kwargs: dict | None) -> bool:
    """``gelu(x) = x * (1 + erf(x / sqrt 2)) / 2``: ``|gelu(x)| <= |x|`` (the tanh
    approximation is computed another way, and is checked)."""
    return not kwargs or kwargs.get("approximate", "none") == "none"


# functions whose outputs are finite when their floating tensor arguments are, for some
# calls only: name -> whether this call is one of them
_KEEPS_WHEN = {
    **dict.fromkeys(
        ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
         "feature_alpha_dropout"),
        _not_training,
    ),
    "mul": _times_at_most_one,
    "div": _over_at_least_one,
    "true_divide": _over_at_least_one,
    "gelu": _exact_gelu,
}  # fmt: skip


def _training(args: tuple, kwargs: dict | None) -> bool:
    """A dropout call's ``training`` argument (third, or by keyword; true by default)."""
    if kwargs and "training" in kwargs:
        return bool(kwargs["training"])
    if kwargs and "train" in kwargs:  # torch.dropout(input, p, train)
        return bool(kwargs["train"])
    return bool(args[2]) if len(args) > 2 else True


def _label(name: str, count: int, n: int, k: int) -> str:
    """The label ``tl.trace`` gives output ``k`` of call ``count`` of ``name`` (of ``n``)."""
    return f"{name}_{count}" if n == 1 else f"{name}_{count}:{k}"


class CulpritOp(OpView):
    """The op :func:`~torchlens.find_nonfinite` found on a model: an
    :class:`~torchlens.recording.OpView` (``label``, ``index``, ``func_name``,
    ``output_index``, ``module``, ``module_stack``, ``address``, ``out``) with the labels of
    its ``parents``, as ``tl.trace`` names them, and the model's ``source`` line."""

    __slots__ = ("parents", "source")

    def __init__(self, *args: Any, parents: tuple[str, ...], source: SourceLine | None) -> None:
        super().__init__(*args)
        self.parents = parents
        self.source = source


@dataclass
class Culprit:
    """What the pass took at the first non-finite output: the op, its parents' values,
    and whether the call wrote it into a target whose old value was not copied (the
    forward must run again to give that parent's value)."""

    op: CulpritOp
    parent_values: dict[str, Tensor]
    needs_copy: bool = False


@dataclass
class ForwardCall:
    """The call the pass runs: the model, its arguments, its submodules (``None``: not a
    module), and what it returned when it ran to its end. One attribute of the mode, not
    five: a mode past 29 instance attributes gets slower attribute reads on every op
    (CPython stops sharing its attribute keys)."""

    model: Any
    args: tuple
    kwargs: dict
    modules: list[tuple[str, nn.Module]] | None
    output: Any = None


class NonFiniteMode(RecordMode):
    """``tl.record``'s mode halting after the first output holding a NaN (or, with ``inf``,
    an infinity) by raising ``stop_after=``'s halt; the caller puts the RNG state and the
    model's buffers back as :meth:`~torchlens.capture.controls.Controls.halting` does.

    Args:
        model: the model being run (its parameters and buffers name parents).
        args: its positional arguments, ``kwargs`` its keyword arguments (they name inputs).
        inf: also halt at infinities.
        modules: the model's :func:`~torchlens.capture.walk.named_modules`, when walked.
        copy_at: the index of the call whose in-place targets are copied before it writes
            (a rerun, when the first run's culprit was written in place; copying every
            target would cost every in-place call a copy).
    """

    def __init__(
        self,
        model: Any,
        args: tuple,
        kwargs: dict,
        inf: bool = True,
        copy_at: int = -1,
        modules: list[tuple[str, nn.Module]] | None = None,
    ) -> None:
        super().__init__(Controls())  # no rule: the halt is this mode's own
        self.inf = inf
        self.culprit: Culprit | None = None
        self.copy_at = copy_at  # the index of a call whose targets are copied before it
        # the model's submodules are walked once per call
        if modules is None and isinstance(model, nn.Module):
            modules = named_modules(model)
        self.call = ForwardCall(model, args, kwargs, modules)
        # id(output) -> (weak reference, function name, count, outputs of the call, index
        # among them, version when proven finite or None): its label, made only if needed
        self._seen: dict[int, tuple[weakref.ref, str, int, int, int, int | None]] = {}
        # the call about to write in place: (its args, _clean_args before the write,
        # [(target, its copy or None)])
        self._before: tuple[tuple, Any, list[tuple[Tensor, Tensor | None]]] | None = None
        self._outside: set[Any] | None = None  # storages of inputs, parameters, buffers
        self._copy_all = False  # set once something outside was written: copy every target
        self.payloads.aliases[_NO_STORAGE] = []  # never empty: in-place calls reach before_write

    @property
    def halted_at(self) -> str | None:
        """The culprit's label once the forward halted there."""
        return self.controls.halted_at

    def plan_for(self, name: str) -> Any:
        """Not ``None``: every function name reaches :meth:`act`."""
        return _KEEPS if name in _KEEPS_FINITE else _KEEPS_WHEN.get(name, _CHECK)

    def refreshed(self, name: str, count: int, index: int, tensor: Tensor) -> None:
        """A value changed behind the capture's back (a ``refresh`` op in a trace), or made
        out of its sight: checked as any op's output."""
        self.act(self.plan_for(name), name, count, index, 1, (False, (), None), tensor)

    def before_write(self, inplace: bool, args: tuple, kwargs: dict) -> None:
        """Before a call writes into tensors: note whether its arguments were proven finite
        (a ReLU in place keeps them so), and copy the targets when their values could not
        be had again by running the forward up to this call: when it writes into an input,
        a parameter or a buffer, or did so before (or when this is the call to copy).
        :class:`RecordMode` calls it only for a call that may write."""
        targets = inplace_targets(inplace, args, kwargs)
        if not targets:
            self._before = None
            return
        copy = self._copy_all or self.n_ops == self.copy_at
        if not copy:
            outside = self._outside_storages() if self._outside is None else self._outside
            copy = self._copy_all = any(storage_key(t) in outside for t in targets)
        copies = [(t, t.detach().clone() if copy else None) for t in targets]
        self._before = (args, self._clean_args(args, kwargs), copies)

    def act(self, plan: Any, name: str, count: int, index: int, n: int, call, result):
        if n == 1 and isinstance(result, Tensor):
            tensors: Any = (result,)
        else:
            special = SPECIAL_OUTPUTS.get(name)
            args = call[1]
            tensors = [t for _, t in (special(args, result) if special else flatten(result)[0])]
        proven = None if plan is _CHECK else self._proven(plan, call)
        seen = self._seen
        for k, tensor in enumerate(tensors):
            dtype = tensor.dtype
            version = None  # proven finite at this version; None: not proven (or not checked)
            if dtype in _CHECKED:
                if dtype is proven:
                    version = version_of(tensor)
                else:
                    passes, wholly = _finite(tensor, self.inf)
                    if not passes:
                        self._halt(_label(name, count, n, k), name, index + k, k, tensor, call)
                    if wholly:
                        version = version_of(tensor)
            seen[id(tensor)] = (weakref.ref(tensor), name, count, n, k, version)
        if self._before is not None and self._before[0] is call[1]:
            self._before = None  # its copies are no longer needed
        return result

    def _proven(self, plan: Any, call: tuple) -> torch.dtype | None:
        """For a call that keeps finite values finite (``plan``: :data:`_KEEPS`, or a test
        of the call from :data:`_KEEPS_WHEN`, such as a dropout's not training):
        :meth:`_clean_args` of its arguments (as they were before it wrote into any)."""
        _, args, kwargs = call
        if plan is not _KEEPS and not plan(args, kwargs):
            return None
        before = self._before
        if before is not None and before[0] is args:
            return before[1]
        return self._clean_args(args, kwargs)

    def _clean_args(self, args: tuple, kwargs: dict | None) -> torch.dtype | None:
        """The dtype of the floating tensor arguments when each is an op output proven
        finite and not written since, and all share it (a tensor or a list of them: the
        arguments of the calls that keep values finite); else ``None``. Only outputs of
        that dtype are then taken as finite: ``x.view(torch.float16)`` of float32 bits is
        not."""
        for value in kwargs.values() if kwargs else ():
            if isinstance(value, Tensor):
                return None
        seen, proven = self._seen, None
        for arg in args:
            if isinstance(arg, Tensor):
                items: Any = (arg,)
            elif isinstance(arg, (list, tuple)):
                items = arg
            else:
                continue
            for item in items:
                if isinstance(item, Tensor) and item.dtype in _CHECKED:
                    entry = seen.get(id(item))
                    if entry is None or entry[0]() is not item or entry[5] is None:
                        return None
                    if entry[5] != version_of(item) or proven not in (None, item.dtype):
                        return None
                    proven = item.dtype
        return proven

    # -- the culprit ----------------------------------------------------------------------
    def _halt(self, label: str, name: str, index: int, k: int, tensor: Tensor, call) -> None:
        _, args, kwargs = call
        written = self._before if self._before and self._before[0] is args else None
        targets = {id(t): copy for t, copy in written[2]} if written else {}
        needs_copy = any(copy is None for copy in targets.values())
        line = caller_line()
        source = SourceLine(*line) if line is not None else None
        parents: list[str] = []
        values: dict[str, Tensor] = {}
        sources = None
        for _, arg in flatten((args, kwargs or {}))[0]:
            entry = self._seen.get(id(arg))
            if entry is not None and entry[0]() is arg:
                parent = _label(*entry[1:5])
            else:
                sources = self._sources() if sources is None else sources
                parent = sources.get(id(arg)) or self._constant(sources, arg)
            if parent in parents:
                continue
            parents.append(parent)
            if id(arg) not in targets:
                values[parent] = arg.detach().clone()
            elif targets[id(arg)] is not None:  # written by the call: its old value
                values[parent] = targets[id(arg)]
        store = MemoryPayloadStore()
        op = CulpritOp(
            label, index, name, k, self.module_stack, tensor, self.module_type,
            parents=tuple(parents), source=source,
        )  # fmt: skip
        op.store = store
        store.set(label, tensor.detach().clone(), None)
        self.culprit = Culprit(op, values, needs_copy)
        self.controls.halted_at = label
        raise Halt

    def _outside_storages(self) -> set[Any]:
        """Storages of the inputs, parameters and buffers: a forward that writes into one
        of them cannot be run again to the same values."""
        call = self.call
        tensors = [t for _, t in flatten((call.args, call.kwargs))[0]]
        tensors += [t for _, _, t in owned_tensors(call.modules or []).values()]
        self._outside = {storage_key(t) for t in tensors} - {None}
        return self._outside

    def _sources(self) -> dict[int, str]:
        """Labels of the tensors ``tl.trace`` names before any op: the inputs
        (``input_1``, ...: positional then keyword, one label per tensor) and the model's
        parameters and buffers (by address, first name first)."""
        labels: dict[int, str] = {}
        call = self.call
        for _, tensor in flatten(call.args)[0] + flatten(call.kwargs)[0]:
            if id(tensor) not in labels:
                labels[id(tensor)] = f"input_{len(labels) + 1}"
        walk = owned_tensors(call.modules or [])
        owned = {key: address for key, (_, address, _) in walk.items()}
        return {**owned, **labels}  # an input that is also a parameter is an input

    @staticmethod
    def _constant(sources: dict[int, str], tensor: Tensor) -> str:
        """A tensor neither made by an op nor an input, parameter or buffer: a constant,
        numbered among the culprit's own (a trace numbers them over the whole forward)."""
        label = f"constant_{sum(v.startswith('constant_') for v in sources.values()) + 1}"
        sources[id(tensor)] = label
        return label
