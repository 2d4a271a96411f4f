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
from torchlens.capture.controls import Controls, _Halt
from torchlens.capture.mode import _inplace_targets
from torchlens.capture.record_mode import RecordMode
from torchlens.capture.source import caller_line
from torchlens.capture.special import SPECIAL_OUTPUTS
from torchlens.capture.tree import flatten
from torchlens.capture.walk import named_modules, owned_tensors
from torchlens.recording import OpView
from torchlens.replay.tolerances import comparable
from torchlens.selectors import where
from torchlens.trace import MemoryPayloadStore

__all__ = ["Culprit", "CulpritOp", "NonFiniteMode", "is_nonfinite"]

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
        "chunk", "split", "split_with_sizes", "tensor_split", "unbind", "clone", "detach",
        "cat", "concat", "concatenate", "stack", "movedim", "moveaxis", "view_as",
        "reshape_as", "swapaxes", "swapdims", "repeat", "tile", "roll", "flip", "index_select",
        "gather", "take", "masked_select", "unfold", "diagonal", "tril", "triu", "max", "min",
        "amax", "amin", "sort", "topk", "max_pool1d", "max_pool2d", "max_pool3d", "relu",
        "abs", "neg", "sign", "sigmoid", "tanh", "softmax", "sin", "cos",
    )
)  # fmt: skip
# dropouts: the identity when not training (a training one scales, which may overflow)
_DROPOUTS = frozenset(
    ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
)
_CHECK, _KEEPS, _KEEPS_IN_EVAL = 1, 2, 3  # what a function name's outputs need
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


def _never(op: Any) -> bool:
    return False


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


def _training(args: tuple, kwargs: dict | None) -> bool:
    """A dropout call's ``training`` argument (third, or by keyword; true by default)."""
    if kwargs and "training" in kwargs:
        return bool(kwargs["training"])
    if kwargs and "train" in kwargs:  # torch.dropout(input, p, train)
        return bool(kwargs["train"])
    return bool(args[2]) if len(args) > 2 else True


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
    """What the pass took at the first non-finite output: the op, its parents' values."""

    op: CulpritOp
    parent_values: dict[str, Tensor]


class NonFiniteMode(RecordMode):
    """``tl.record``'s mode halting after the first output holding a NaN (or, with ``inf``,
    an infinity); the halt is ``stop_after=``'s, so the RNG state and the model's buffers
    are put back by :meth:`~torchlens.capture.controls.Controls.halting`.

    Args:
        model: the model being run (its parameters and buffers name parents).
        args: its positional arguments, ``kwargs`` its keyword arguments (they name inputs).
        inf: also halt at infinities.
        copy_at: the index of the call whose in-place targets are copied before it writes
            (a rerun, when the first run's culprit was written in place; copying every
            target would cost every in-place call a copy).
    """

    def __init__(
        self, model: Any, args: tuple, kwargs: dict, inf: bool = True, copy_at: int = -1
    ) -> None:
        super().__init__(Controls(stop_after=where(_never)))
        self.inf = inf
        self.culprit: Culprit | None = None
        self.copy_at = copy_at  # the index of a call whose targets are copied before it
        self.needs_copy = False  # the culprit was written in place, uncopied: run again
        self.model, self.args, self.kwargs = model, args, kwargs
        self.output: Any = None  # what the model returned, when it ran to its end
        # id(output) -> (weak reference, label, version when proven finite or None)
        self._seen: dict[int, tuple[weakref.ref, str, int | None]] = {}
        # the call about to write in place: (its args, _clean_args before the write,
        # [(target, its copy or None)])
        self._before: tuple[tuple, Any, list[tuple[Tensor, Tensor | None]]] | None = None
        self._outside: set[Any] | None = None  # storages of inputs, parameters, buffers
        self._copy_all = False  # set once something outside was written: copy every target
        self._aliases = {_NO_STORAGE: []}  # never empty: in-place calls reach _protect

    def _plan_for(self, name: str) -> int:
        """Not ``None``: every function name reaches :meth:`_act`."""
        if name in _KEEPS_FINITE:
            return _KEEPS
        return _KEEPS_IN_EVAL if name in _DROPOUTS else _CHECK

    def _protect(self, inplace: bool, args: tuple, kwargs: dict) -> None:
        """Before a call writes into tensors: note whether its arguments were proven finite
        (a ReLU in place keeps them so), and copy the targets when their values could not
        be had again by running the forward up to this call: when it writes into an input,
        a parameter or a buffer, or did so before (or when this is the call to copy)."""
        if not (inplace or "out" in kwargs or kwargs.get("inplace") is True):
            self._before = None  # a call with keywords that writes nothing (the usual one)
            return
        targets = _inplace_targets(inplace, args, kwargs)
        if not targets:
            self._before = None
            return
        copy = self._copy_all or self.n_ops == self.copy_at
        if not copy:
            outside = self._outside_storages() if self._outside is None else self._outside
            copy = self._copy_all = any(storage_key(t) in outside for t in targets)
        copies = [(t, t.detach().clone() if copy else None) for t in targets]
        self._before = (args, self._clean_args(args, kwargs), copies)

    def _act(self, plan: int, name: str, count: int, index: int, n: int, call, result):
        inplace, args, kwargs = call
        if n == 1 and isinstance(result, Tensor):
            tensors: Any = (result,)
        else:
            special = SPECIAL_OUTPUTS.get(name)
            tensors = [t for _, t in (special(args, result) if special else flatten(result)[0])]
        proven = None  # the dtype of the arguments proven finite, when they all were
        if plan == _KEEPS or (plan == _KEEPS_IN_EVAL and not _training(args, kwargs)):
            before = self._before
            written = before is not None and before[0] is args
            proven = before[1] if written else self._clean_args(args, kwargs)
        seen, inf = self._seen, self.inf
        for k, tensor in enumerate(tensors):
            label = f"{name}_{count}" if n == 1 else f"{name}_{count}:{k}"
            version = None  # proven finite at this version; None: not proven (or not checked)
            if tensor.dtype in _CHECKED:
                wholly = True
                if tensor.dtype is not proven:
                    passes, wholly = _finite(tensor, inf)
                    if not passes:
                        self._halt(label, name, index + k, k, tensor, call)
                if wholly:
                    version = version_of(tensor)
            seen[id(tensor)] = (weakref.ref(tensor), label, version)
        if self._before is not None and self._before[0] is args:
            self._before = None  # its copies are no longer needed
        return result

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
                    if entry is None or entry[0]() is not item or entry[2] is None:
                        return None
                    if entry[2] != version_of(item) or proven not in (None, item.dtype):
                        return None
                    proven = item.dtype
        return proven

    # -- the culprit ----------------------------------------------------------------------
    def _halt(self, label: str, name: str, index: int, k: int, tensor: Tensor, call) -> None:
        _, args, kwargs = call
        written = self._before if self._before and self._before[0] is args else None
        targets = {id(t): copy for t, copy in written[2]} if written else {}
        self.needs_copy = any(copy is None for copy in targets.values())
        line = caller_line()
        source = SourceLine(*line) if line is not None else None
        parents: list[str] = []
        values: dict[str, Tensor] = {}
        sources = None
        for _, arg in flatten((args, kwargs or {}))[0]:
            entry = self._seen.get(id(arg))
            if entry is not None and entry[0]() is arg:
                parent = entry[1]
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
            label, index, name, k, self._frames, tensor, self._types[-1],
            parents=tuple(parents), source=source,
        )  # fmt: skip
        op._store = store
        store.set(label, tensor.detach().clone(), None)
        self.culprit = Culprit(op, values)
        self.controls.halted_at = label
        raise _Halt

    def _outside_storages(self) -> set[Any]:
        """Storages of the inputs, parameters and buffers: a forward that writes into one
        of them cannot be run again to the same values."""
        tensors = [t for _, t in flatten((self.args, self.kwargs))[0]]
        if isinstance(self.model, nn.Module):
            tensors += [*self.model.parameters(), *self.model.buffers()]
        self._outside = {storage_key(t) for t in tensors} - {None}
        return self._outside

    def _sources(self) -> dict[int, str]:
        """Labels of the tensors ``tl.trace`` names before any op: the inputs
        (``input_1``, ...: positional then keyword, one label per tensor) and the model's
        parameters and buffers (by address, first name first)."""
        labels: dict[int, str] = {}
        for _, tensor in flatten(self.args)[0] + flatten(self.kwargs)[0]:
            if id(tensor) not in labels:
                labels[id(tensor)] = f"input_{len(labels) + 1}"
        owned: dict[int, str] = {}
        if isinstance(self.model, nn.Module):
            walk = owned_tensors(named_modules(self.model))
            owned = {key: address for key, (_, address, _) in walk.items()}
        return {**owned, **labels}  # an input that is also a parameter is an input

    @staticmethod
    def _constant(sources: dict[int, str], tensor: Tensor) -> str:
        """A tensor neither made by an op nor an input, parameter or buffer: a constant,
        numbered among the culprit's own (a trace numbers them over the whole forward)."""
        label = f"constant_{sum(v.startswith('constant_') for v in sources.values()) + 1}"
        sources[id(tensor)] = label
        return label
