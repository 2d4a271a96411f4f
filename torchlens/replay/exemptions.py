"""The documented exceptions to the perturbation and value checks, as tables.

The perturbation arm proves each recorded edge by changing the parent's value and watching
the op's output change. Some edges are real but provably carry no value: the op reads only
the parent's shape, dtype or device, or overwrites it. Those are listed here, with the
reason, and counted as *exempt*, never as verified. Everything not listed must pass.

Kinds of entry, each with its reason:

* :data:`PERTURBATION_EXEMPT`: ``(function, argument positions)`` whose values the output
  never depends on. Positions are the ``ArgRef.position`` paths (``"0"`` is ``self`` for a
  method call); ``None`` means every tensor argument. Some hold only under a condition on
  the recorded call (batch norm reads its running statistics only in eval mode). Decided
  without any call. An ``out=`` target is exempt for every function: it is written, not read.
* :data:`UNREAD`: arguments a function does not read *at this call*, by a condition on the
  call's values (``where`` with an all-true condition never reads its ``other``; attention
  with ``is_causal=True`` ignores ``attn_mask``). Applied only after every probe of the
  perturbation arm failed to show the argument is read.
* :data:`MAY_NOT_CHANGE`: functions whose output may legitimately stay the same under every
  probe (equality tests, arg-max style indices, writes that cover their whole target), at
  the listed positions. Also applied only after every probe failed.
* :data:`SILENT_OUTPUT`: an output that is NaN in every element shows no change to any
  argument: its edges are exempt, since nothing can be observed.
* :data:`VALUE_EXEMPT`: functions whose output values are undefined (uninitialized memory):
  replay checks their shape and dtype only. So do :func:`value_exempt` calls of the
  functions that give uninitialized memory at some calls only: ``Tensor.new`` given sizes
  (not data), ``resize_`` and ``resize_as_`` growing their target, and ``set_`` onto a
  storage (not a tensor).
* Parent kinds, applied to every function: integer and boolean parents (indices, masks,
  counts: no small "nearby" value exists, and most changes make the call invalid), and
  parents with zero elements (nothing to change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

__all__ = [
    "Exemption",
    "Unread",
    "PERTURBATION_EXEMPT",
    "UNREAD",
    "MAY_NOT_CHANGE",
    "SILENT_OUTPUT",
    "OUT_TARGET",
    "VALUE_EXEMPT",
    "MAY_BE_UNINITIALIZED",
    "GROWS_TARGET",
    "value_exempt",
    "MUTATES_ARGUMENTS",
    "may_write_arguments",
    "exempt_reason",
    "PROVEN_BY_RULE",
    "proven_by_rule",
    "maybe_exempt",
    "unread_reason",
    "unchanged_reason",
    "parent_kind_reason",
]


@dataclass(frozen=True)
class Exemption:
    """Argument positions of one function whose values its output does not depend on."""

    reason: str
    positions: frozenset[str] | None = None  # None: every tensor argument
    when: Callable[[Any], bool] | None = None  # condition on the recorded op, if any
    # positions that depend on which overload was called (torch.batch_norm's order differs)
    select: Callable[[Any], frozenset[str]] | None = None

    def covers(self, op: Any) -> frozenset[str] | None:
        """The positions exempt at this call (None: every tensor argument)."""
        return self.select(op) if self.select is not None else self.positions


def _pos(*positions: str) -> frozenset[str]:
    return frozenset(positions)


def _argument(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    """A call's argument, by keyword or else by position."""
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def _arg(op: Any, index: int, name: str, default: Any) -> Any:
    """A recorded non-tensor argument, by position or keyword."""
    return _argument(op.args_template, op.kwargs_template, index, name, default)


def _is_number(value: Any) -> bool:
    """A recorded argument that is a plain number (a tensor argument is a slot)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _running_statistics(op: Any, aten_style: Any) -> frozenset[str]:
    """Where the running statistics sit: 1 and 2 in ``F.batch_norm``/``F.instance_norm``,
    3 and 4 in ``torch.batch_norm``/``torch.instance_norm`` and their aten overloads
    (weight and bias come first)."""
    aten = op.func is aten_style or hasattr(op.func, "_overloadpacket")
    first = 3 if aten else 1
    return _pos(str(first), str(first + 1), "running_mean", "running_var")


_SHAPE_ONLY = "reads only the shape, dtype and device of this argument"
_FACTORY_LIKE = Exemption(f"*_like factory: {_SHAPE_ONLY}")
_NEW_FACTORY = Exemption(f"new_* factory: {_SHAPE_ONLY}", _pos("0"))
_OVERWRITES = Exemption("overwrites every element of its target", _pos("0", "tensor"))
_OTHER_SHAPE = Exemption(f"*_as / type_as: {_SHAPE_ONLY}", _pos("1", "other"))
_SET_DATA = Exemption(
    "x.data = value: x takes value's memory; its own old values are never read", _pos("0")
)

PERTURBATION_EXEMPT: dict[str, Exemption] = {
    **dict.fromkeys(
        ["zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
         "randint_like"],
        _FACTORY_LIKE,
    ),
    **dict.fromkeys(
        ["new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided", "new_tensor"],
        _NEW_FACTORY,
    ),
    "new": Exemption("Tensor.new: reads only the dtype and device of its tensor", _pos("0")),
    **dict.fromkeys(["expand_as", "view_as", "reshape_as", "type_as"], _OTHER_SHAPE),
    "resize_as_": Exemption(f"resize_as_: {_SHAPE_ONLY}", _pos("1", "the_template")),
    "set_data": _SET_DATA,
    **dict.fromkeys(
        ["fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "exponential_",
         "geometric_", "log_normal_", "cauchy_", "bernoulli_", "kaiming_uniform_",
         "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "trunc_normal_",
         "orthogonal_", "sparse_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
         "set_"],
        _OVERWRITES,
    ),
    "to": Exemption(f"x.to(other): {_SHAPE_ONLY}", _pos("1", "other")),
    "_nested_view_from_jagged": Exemption(
        "a jagged view's dummy: a placeholder torch passes for its symbolic sizes, never read",
        _pos("2", "dummy"),
    ),
    "bernoulli": Exemption(
        f"bernoulli(x, p) with a number p draws each element with that probability: "
        f"{_SHAPE_ONLY}",
        _pos("0", "input", "self"),
        when=lambda op: _is_number(_arg(op, 1, "p", None)),
    ),
    "refresh": Exemption(
        "keeps no element of the stale value: a recorded write covered every element of it",
        _pos("0"),
        when=lambda op: bool(op.meta.get("covered")),
    ),
    "batch_norm": Exemption(
        "in training mode the output uses batch statistics; the running statistics are "
        "only updated",
        when=lambda op: bool(_arg(op, 5, "training", False)),
        select=lambda op: _running_statistics(op, torch.batch_norm),
    ),
    "instance_norm": Exemption(
        "with use_input_stats the output uses the input's statistics; the running "
        "statistics are only updated",
        when=lambda op: bool(_arg(op, 5, "use_input_stats", True)),
        select=lambda op: _running_statistics(op, torch.instance_norm),
    ),
}  # fmt: skip

OUT_TARGET = "out= target: overwritten by the call, its old value is never read"

_COMPARISON = "comparison: every probe may leave each comparison's result as it was"
_ARG_EXTREME = (
    "index of an extreme or a rank: may select the same positions under every probe "
    "(ties, a reduced dimension of size one)"
)
_STEP = "piecewise-constant function: may give the same values under every probe"
_COVERING_WRITE = (
    "writes into its target; when the write covers every element, the target's old values are gone"
)
_TARGET = _pos("0", "self", "input")

# function -> (reason, positions it covers; None: every tensor argument). Functions whose
# outputs include values (``max``, ``sort``, ``topk``...) are not here: their values move.
MAY_NOT_CHANGE: dict[str, tuple[str, frozenset[str] | None]] = {
    **dict.fromkeys(
        ["eq", "ne", "gt", "lt", "ge", "le", "greater", "less", "greater_equal",
         "less_equal", "not_equal", "isclose", "isfinite", "isinf", "isnan", "isposinf",
         "isneginf", "isreal", "signbit", "logical_and", "logical_or", "logical_xor",
         "logical_not", "all", "any", "equal", "allclose"],
        (_COMPARISON, None),
    ),
    **dict.fromkeys(
        ["argmax", "argmin", "argsort", "unique", "unique_consecutive", "bucketize",
         "searchsorted", "histc", "bincount", "nonzero", "argwhere", "count_nonzero", "nms"],
        (_ARG_EXTREME, None),
    ),
    "multinomial": (
        "sampled indices: with the random draw restored, a moved distribution may sample "
        "the same indices (and halving it changes nothing once normalized)",
        None,
    ),
    **dict.fromkeys(
        ["sign", "sgn", "floor", "ceil", "round", "trunc", "fix", "floor_divide",
         "remainder", "fmod", "heaviside", "relu6", "hardtanh", "clamp", "clip", "threshold"],
        (_STEP, None),
    ),
    **dict.fromkeys(
        ["bool", "byte", "char", "short", "int", "long"],
        ("conversion to an integer or bool dtype: nearby values convert alike", None),
    ),
    **dict.fromkeys(
        ["setitem", "scatter", "scatter_", "index_copy", "index_copy_", "index_put",
         "index_put_", "masked_scatter", "masked_scatter_", "put", "put_", "index_reduce",
         "index_reduce_", "slice_scatter", "select_scatter", "diagonal_scatter",
         "as_strided_scatter"],
        (_COVERING_WRITE, _TARGET),
    ),
    "refresh": (
        "a write through another view: it may cover every element of the stale value, or "
        "(its writer) reach none of them, since views share one version counter",
        None,
    ),
}  # fmt: skip

SILENT_OUTPUT = "the output is NaN in every element: no change to any argument can show"


@dataclass(frozen=True)
class Unread:
    """Argument positions a function does not read at a call where ``when`` holds.

    ``when(get)`` is called with ``get(index, name, default)``, which returns the call's
    argument (a tensor value or a recorded non-tensor) by position or keyword.
    """

    reason: str
    positions: frozenset[str]
    when: Callable[[Callable[[int, str, Any], Any]], bool]


def _all_true(mask: Any) -> bool:
    return isinstance(mask, torch.Tensor) and mask.numel() > 0 and bool(mask.all())


def _all_false(mask: Any) -> bool:
    return isinstance(mask, torch.Tensor) and mask.numel() > 0 and not bool(mask.any())


def _selects_nothing(index: Any) -> bool:
    """An index holding a boolean mask that is false everywhere (``x[mask] = v``,
    ``x[mask, :] = v``): it selects no element."""
    parts = index if type(index) is tuple else (index,)
    return any(
        isinstance(part, torch.Tensor) and part.dtype == torch.bool and _all_false(part)
        for part in parts
    )


def _covers_target(get: Callable[[int, str, Any], Any]) -> bool:
    """``scatter_reduce(..., include_self=False)`` whose index reaches every element."""
    if get(5, "include_self", True):
        return False
    target, dim, index = get(0, "input", None), get(1, "dim", None), get(2, "index", None)
    if not isinstance(target, torch.Tensor) or not isinstance(index, torch.Tensor):
        return False
    hit = torch.zeros(target.shape, dtype=torch.bool, device=target.device)
    return bool(hit.scatter_(dim, index, True).all())


def _causal_hint(get: Callable[[int, str, Any], Any]) -> bool:
    """``multi_head_attention_forward`` replaces ``attn_mask`` by SDPA's causal flag."""
    return (
        bool(get(24, "is_causal", False))
        and get(14, "key_padding_mask", None) is None
        and not get(15, "need_weights", True)
    )


_KEYWORD_ONLY = 1 << 10  # a position no call reaches: the argument is read by keyword only
_BETA_ZERO = Unread(
    "beta=0: the added input is ignored (torch does not even propagate its NaN)",
    _TARGET,
    lambda get: get(_KEYWORD_ONLY, "beta", 1) == 0,
)
_ALPHA_ZERO = Unread(
    "alpha=0: the product is scaled away and its factors are not read",
    _pos("1", "2", "mat1", "mat2", "batch1", "batch2", "mat", "vec", "vec1", "vec2"),
    lambda get: get(_KEYWORD_ONLY, "alpha", 1) == 0,
)
_POWER_ZERO = Unread(
    "exponent 0: the result is 1 whatever the base, NaN included",
    _TARGET,
    lambda get: _is_zero(get(1, "exponent", None)),
)


def _keeps_no_element(upper: bool) -> Callable[[Callable[[int, str, Any], Any]], bool]:
    """``triu``/``tril`` whose diagonal lies past every element of the input's last two
    dimensions (``triu(x, k)`` keeps the elements with ``column - row >= k``, ``tril``
    those with ``column - row <= k``): the output is zeros whatever the input holds."""

    def keeps_none(get: Callable[[int, str, Any], Any]) -> bool:
        value, diagonal = get(0, "input", None), get(1, "diagonal", 0)
        if not isinstance(value, torch.Tensor) or value.dim() < 2 or not isinstance(diagonal, int):
            return False
        rows, cols = value.shape[-2], value.shape[-1]
        return diagonal > cols - 1 if upper else diagonal < -(rows - 1)

    return keeps_none


_KEEPS_NO_ELEMENT = (
    "keeps no element of the input at this call: the diagonal lies past every element, so "
    "the output is zeros whatever the input holds"
)


def _samples_outside(get: Callable[[int, str, Any], Any]) -> bool:
    """``grid_sample`` with zero padding whose every sample point lies where no input
    element is read (outside the input, by more than the kernel's reach): the output is
    zeros whatever the input holds."""
    value, grid = get(0, "input", None), get(1, "grid", None)
    if not isinstance(value, torch.Tensor) or not isinstance(grid, torch.Tensor):
        return False
    mode, padding = get(2, "mode", "bilinear"), get(3, "padding_mode", "zeros")
    corners = bool(get(4, "align_corners", False))
    if padding != "zeros" or mode not in ("bilinear", "nearest", "bicubic"):
        return False
    if grid.numel() == 0 or not grid.is_floating_point() or grid.shape[-1] != value.dim() - 2:
        return False
    sizes = torch.tensor(value.shape[2:][::-1], dtype=torch.float64)  # x, y(, z) order
    g = grid.detach().to(torch.float64, copy=False).cpu()
    at = (g + 1) / 2 * (sizes - 1) if corners else ((g + 1) * sizes - 1) / 2
    reach = {"bilinear": 1.0, "nearest": 0.5, "bicubic": 2.0}[mode]  # pixels read around
    outside = (at < -reach) | (at > sizes - 1 + reach)
    if bool(outside.any(-1).all()):
        return True
    if mode == "bicubic":  # (signed weights: a sum of them can be 0 where some are not)
        return False
    # exactly on the kernel's edge (bilinear at -1 or at the size, where the nearest
    # pixel's weight is 0; nearest rounding half to even): torch's own weights say, and
    # they are never negative here, so ones sampled to zeros everywhere read nothing
    ones = torch.ones((1, 1, *value.shape[2:]), dtype=grid.dtype, device=grid.device)
    grid1 = grid.detach().reshape(1, -1, *grid.shape[2:])  # every point, batch of one
    try:
        sampled = torch.nn.functional.grid_sample(
            ones, grid1, mode=mode, padding_mode="zeros", align_corners=corners
        )  # fmt: skip
    except RuntimeError:  # (a dtype or device without this kernel)
        return False
    return not bool(sampled.any())


def _bernoulli_settled(get: Callable[[int, str, Any], Any]) -> bool:
    """``bernoulli(p)`` whose probabilities are all 0: every probe near 0 keeps the draw
    at 0; the probe that must move it, p set to 1, draws 1 everywhere (no RNG needed)."""
    p = get(0, "input", None)
    if not isinstance(p, torch.Tensor) or p.numel() == 0 or not p.is_floating_point():
        return False
    if bool(p.any()):
        return False
    return bool(torch.bernoulli(torch.ones_like(p)).ne(torch.bernoulli(p)).all())


def _is_zero(value: Any) -> bool:
    return _all_false(value) or (isinstance(value, (int, float)) and value == 0)


UNREAD: dict[str, tuple[Unread, ...]] = {
    **dict.fromkeys(
        ["addmm", "addmm_", "baddbmm", "baddbmm_", "addbmm", "addbmm_", "addmv", "addmv_",
         "addr", "addr_"],
        (_BETA_ZERO, _ALPHA_ZERO),
    ),
    **dict.fromkeys(["pow", "pow_", "float_power", "float_power_"], (_POWER_ZERO,)),
    # an op that provably keeps no element of a parent at this call (the 1x1 causal mask
    # triu(full((1, 1), -inf), 1) at the first step of an autoregressive loop)
    **dict.fromkeys(["triu", "triu_"], (
        Unread(f"triu {_KEEPS_NO_ELEMENT}", _TARGET, _keeps_no_element(upper=True)),
    )),
    **dict.fromkeys(["tril", "tril_"], (
        Unread(f"tril {_KEEPS_NO_ELEMENT}", _TARGET, _keeps_no_element(upper=False)),
    )),
    "grid_sample": (
        Unread("every sample point lies outside the input, past what the kernel reads, "
               "with zero padding: no element of the input is read and the output is zeros",
               _TARGET, _samples_outside),
    ),
    "bernoulli": (
        Unread("every probability is 0: probes near 0 leave every draw 0, so none shows "
               "the edge; p set to 1 draws 1 everywhere, which proves the probabilities "
               "are read", _TARGET, _bernoulli_settled),
    ),
    "where": (
        Unread("the condition is true everywhere: `other` is never read",
               _pos("2", "other"), lambda get: _all_true(get(0, "condition", None))),
        Unread("the condition is false everywhere: `input` is never read",
               _pos("1", "input"), lambda get: _all_false(get(0, "condition", None))),
    ),
    **dict.fromkeys(["masked_fill", "masked_fill_"], (
        Unread("the mask is true everywhere: every element of the target is replaced",
               _TARGET, lambda get: _all_true(get(1, "mask", None))),
        Unread("the mask is false everywhere: the fill value is never read",
               _pos("2", "value"), lambda get: _all_false(get(1, "mask", None))),
    )),
    "setitem": (
        Unread("the index is a boolean mask false everywhere: nothing is written, so the "
               "value is never read", _pos("2"),
               lambda get: _selects_nothing(get(1, "index", None))),
    ),
    **dict.fromkeys(["masked_scatter", "masked_scatter_"], (
        Unread("the mask is false everywhere: nothing is written, so the source is never "
               "read", _pos("2", "source"), lambda get: _all_false(get(1, "mask", None))),
    )),
    **dict.fromkeys(["scatter_reduce", "scatter_reduce_"], (
        Unread("include_self=False and the index reaches every element: the target's "
               "values are never read", _TARGET, _covers_target),
    )),
    # QAT's fused observer and fake-quantizer: with fake quant on, the scale and zero point
    # are recomputed from the running min/max and written over, never read (with it off
    # they are left as they came, outputs of the call by special.SIDE_WRITES: proved)
    "fused_moving_avg_obs_fake_quant": (
        Unread("the incoming scale and zero point are recomputed from the running min/max "
               "and written over, never read", _pos("5", "scale", "6", "zero_point"),
               lambda get: True),
    ),
    "multi_head_attention_forward": (
        Unread("is_causal=True with no key_padding_mask and need_weights=False: the mask "
               "is replaced by the causal flag and never read", _pos("16", "attn_mask"),
               _causal_hint),
    ),
}  # fmt: skip

VALUE_EXEMPT: dict[str, str] = dict.fromkeys(
    ["empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
     "new_empty_strided"],
    "uninitialized memory: values are not determined by the call",
)  # fmt: skip
# functions whose output is uninitialized memory at some calls only (see value_exempt)
GROWS_TARGET = frozenset({"resize_", "resize_as_"})
MAY_BE_UNINITIALIZED = frozenset(VALUE_EXEMPT) | {"new", "set_"} | GROWS_TARGET


def value_exempt(op: Any, parents: list[torch.Tensor], output: torch.Tensor | None) -> bool:
    """Whether ``op``'s output values are not determined by its call, so replay checks
    only its shape and dtype: :data:`VALUE_EXEMPT`, ``x.new(2, 3)`` or ``x.new(size)``
    (sizes give uninitialized memory; data, ``x.new([2., 3.])``, does not),
    ``resize_`` and ``resize_as_`` growing their target (the new elements are
    uninitialized: torch's ``nn.CrossMapLRN2d`` resizes a fresh ``x.new()`` so), and
    ``set_`` onto a storage rather than a tensor (its values are whatever that memory
    holds; ``x.set_()`` gives no elements). ``parents`` are the call's tensor arguments,
    ``output`` its replayed output (for :data:`GROWS_TARGET`; the caller decides growth
    itself when it passes None)."""
    name = op.func_name
    if name in VALUE_EXEMPT:
        return True
    if name == "new":
        sizes = op.args_template[1:]
        if len(sizes) == 1 and type(sizes[0]) is torch.Size:
            return True
        return (
            bool(sizes)
            and not op.kwargs_template.keys() - {"dtype", "device"}
            and all(type(size) is int for size in sizes)
        )
    if name in GROWS_TARGET:
        return bool(parents) and output is not None and output.numel() > parents[0].numel()
    if name == "set_":
        return len(op.parent_args) < 2 and 0 not in op.shape
    return False


# Functions that write into arguments other than an out=/inplace target: replay passes them
# copies so saved values are never modified.
MUTATES_ARGUMENTS = frozenset({"batch_norm", "instance_norm", "embedding", "embedding_bag"})

# Calls of those functions that provably write nothing: embedding renormalizes its weight in
# place only when given max_norm (at position 3 in F.embedding; torch.embedding never does,
# and a flag there is not None, so it is copied anyway), and batch norm updates its running
# statistics only in training mode (position 5 in both overloads).
_WRITES_NOTHING: dict[str, Callable[[Any], bool]] = {
    "embedding": lambda op: _arg(op, 3, "max_norm", None) is None,
    "batch_norm": lambda op: _arg(op, 5, "training", False) is False,
}


def may_write_arguments(op: Any) -> bool:
    """Whether ``op``'s call may write into a tensor argument other than an in-place or
    out= target (see :data:`MUTATES_ARGUMENTS`); replay hands such a call copies."""
    if op.func_name not in MUTATES_ARGUMENTS:
        return False
    writes_nothing = _WRITES_NOTHING.get(op.func_name)
    return writes_nothing is None or not writes_nothing(op)


# an output on the meta device has a shape and a dtype but no values (accelerate's offload
# hooks park weights there after a module runs): no probe can move it (see edges.prove)
ON_META = "the output is on the meta device, which holds no values"


# Functions whose every edge is proven by a documented rule instead of by perturbation:
# function -> the rule. A collective's output is by its definition a function of every
# element each rank sends (a sum, a gather, a scatter), and probing it would need every
# rank to probe it alike; its value is still replayed, once per rank, in lockstep. Filled
# by ``torchlens.distributed`` (docs/distributed.md, "Collectives").
PROVEN_BY_RULE: dict[Any, str] = {}


def proven_by_rule(op: Any) -> str | None:
    """The rule that proves every edge of ``op``, if its function has one."""
    try:
        return PROVEN_BY_RULE.get(op.func)
    except TypeError:  # unhashable
        return None


def exempt_reason(op: Any, positions: list[str]) -> str | None:
    """Why perturbing the parent fed at ``positions`` of ``op`` proves nothing, if it is so.

    A parent is exempt only when every position it feeds is exempt.
    """
    if positions[0].startswith("out") and all(
        p == "out" or p.startswith("out.") for p in positions
    ):
        return OUT_TARGET
    entry = PERTURBATION_EXEMPT.get(op.func_name)
    if entry is None or (entry.when is not None and not entry.when(op)):
        return None
    covered = entry.covers(op)
    if covered is None or all(p in covered for p in positions):
        return entry.reason
    return None


def maybe_exempt(op: Any, position: str) -> bool:
    """False when :func:`exempt_reason` is surely None for a parent fed first at
    ``position``: no table entry for the function, and not an ``out=`` target (the
    cheap test asked first of every edge)."""
    return op.func_name in PERTURBATION_EXEMPT or position.startswith("out")


def unread_reason(op: Any, positions: list[str], args: tuple, kwargs: dict) -> str | None:
    """Why the parent fed at ``positions`` is not read at this call (see :data:`UNREAD`).

    ``args`` and ``kwargs`` are the call's arguments with their values filled in.
    """
    get = partial(_argument, args, kwargs)
    for rule in UNREAD.get(op.func_name, ()):
        if all(p in rule.positions for p in positions) and rule.when(get):
            return rule.reason
    return None


def unchanged_reason(op: Any, positions: list[str]) -> str | None:
    """Why an output may legitimately stay the same under every probe of this parent
    (see :data:`MAY_NOT_CHANGE`), if it may."""
    entry = MAY_NOT_CHANGE.get(op.func_name)
    if entry is None:
        return None
    reason, covered = entry
    if covered is None or all(p in covered for p in positions):
        return reason
    return None


def parent_kind_reason(value: torch.Tensor) -> str | None:
    """Why no parent of this kind can be perturbed, if so (integer, bool, empty)."""
    if value.numel() == 0:
        return "the parent has zero elements: there is nothing to perturb"
    if not (value.is_floating_point() or value.is_complex()):
        return f"{value.dtype} parent (index, mask or count): no nearby value to perturb to"
    return None
