"""The documented exceptions to the perturbation and value checks, as tables.

The perturbation arm proves each recorded edge by changing the parent's value and watching
the op's output change. Some edges are real but provably carry no value: the op reads only
the parent's shape, dtype or device, or overwrites it. Those are listed here, with the
reason, and counted as *exempt*, never as verified. Everything not listed must pass.

Four kinds of entry:

* :data:`PERTURBATION_EXEMPT`: ``(function, argument positions)`` whose values the output
  never depends on. Positions are the ``ArgRef.position`` paths (``"0"`` is ``self`` for a
  method call); ``None`` means every tensor argument. Some hold only under a condition on
  the recorded call (batch norm reads its running statistics only in eval mode).
* :data:`MAY_NOT_CHANGE`: functions whose output may legitimately stay the same under a
  perturbation (comparisons, arg-max, rounding, writes that cover their whole target). The
  arm still tries two different perturbations; only when neither changes the output is the
  edge exempt.
* :data:`VALUE_EXEMPT`: functions whose output values are undefined (uninitialized memory):
  replay checks their shape and dtype only.
* Parent kinds, applied to every function: integer and boolean parents (indices, masks,
  counts: no small "nearby" value exists, and most changes make the call invalid), and
  parents with zero elements (nothing to change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Exemption",
    "PERTURBATION_EXEMPT",
    "MAY_NOT_CHANGE",
    "VALUE_EXEMPT",
    "MUTATES_ARGUMENTS",
    "exempt_reason",
    "parent_kind_reason",
]


@dataclass(frozen=True)
class Exemption:
    """Argument positions of one function whose values its output does not depend on."""

    reason: str
    positions: frozenset[str] | None = None  # None: every tensor argument
    when: Callable[[Any], bool] | None = None  # condition on the recorded op, if any


def _pos(*positions: str) -> frozenset[str]:
    return frozenset(positions)


def _arg(op: Any, index: int, name: str, default: Any) -> Any:
    """A recorded non-tensor argument, by position or keyword."""
    if name in op.kwargs_template:
        return op.kwargs_template[name]
    if len(op.args_template) > index:
        return op.args_template[index]
    return default


_SHAPE_ONLY = "reads only the shape, dtype and device of this argument"
_FACTORY_LIKE = Exemption(f"*_like factory: {_SHAPE_ONLY}")
_NEW_FACTORY = Exemption(f"new_* factory: {_SHAPE_ONLY}", _pos("0"))
_OVERWRITES = Exemption("overwrites every element of its target", _pos("0"))
_OTHER_SHAPE = Exemption(f"*_as / type_as: {_SHAPE_ONLY}", _pos("1", "other"))

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
    **dict.fromkeys(["expand_as", "view_as", "reshape_as", "type_as"], _OTHER_SHAPE),
    **dict.fromkeys(
        ["fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "exponential_",
         "geometric_", "log_normal_", "cauchy_", "bernoulli_"],
        _OVERWRITES,
    ),
    "to": Exemption(f"x.to(other): {_SHAPE_ONLY}", _pos("1", "other")),
    "batch_norm": Exemption(
        "in training mode the output uses batch statistics; the running statistics are "
        "only updated",
        _pos("1", "2", "running_mean", "running_var"),
        when=lambda op: bool(_arg(op, 5, "training", False)),
    ),
    "instance_norm": Exemption(
        "with use_input_stats the output uses the input's statistics; the running "
        "statistics are only updated",
        _pos("1", "2", "running_mean", "running_var"),
        when=lambda op: bool(_arg(op, 5, "use_input_stats", True)),
    ),
}  # fmt: skip

_COMPARISON = "comparison: a perturbation may leave every comparison result unchanged"
_ARG_EXTREME = "arg-max/min style index: may select the same position after a perturbation"
_STEP = "piecewise-constant function: may round to the same values after a perturbation"
_COVERING_WRITE = (
    "writes into its target; when the write covers every element, the target's old values are gone"
)

MAY_NOT_CHANGE: dict[str, str] = {
    **dict.fromkeys(
        ["eq", "ne", "gt", "lt", "ge", "le", "greater", "less", "greater_equal",
         "less_equal", "not_equal", "isclose", "isfinite", "isinf", "isnan", "isposinf",
         "isneginf", "isreal", "signbit", "logical_and", "logical_or", "logical_xor",
         "logical_not", "all", "any", "equal", "allclose", "nonzero", "argwhere",
         "count_nonzero"],
        _COMPARISON,
    ),
    **dict.fromkeys(
        ["argmax", "argmin", "argsort", "max", "min", "sort", "topk", "kthvalue", "median",
         "nanmedian", "mode", "msort", "cummax", "cummin", "unique", "unique_consecutive",
         "bucketize", "searchsorted", "histc", "bincount", "max_pool1d_with_indices",
         "max_pool2d_with_indices", "max_pool3d_with_indices", "adaptive_max_pool1d",
         "adaptive_max_pool2d", "adaptive_max_pool3d", "aminmax"],
        _ARG_EXTREME,
    ),
    **dict.fromkeys(
        ["sign", "sgn", "floor", "ceil", "round", "trunc", "fix", "floor_divide",
         "remainder", "fmod", "heaviside", "relu6", "hardtanh", "clamp", "clip", "threshold"],
        _STEP,
    ),
    **dict.fromkeys(
        ["bool", "byte", "char", "short", "int", "long"],
        "conversion to an integer or bool dtype: truncates, so nearby values convert alike",
    ),
    **dict.fromkeys(
        ["setitem", "scatter", "scatter_", "index_copy", "index_copy_", "index_put",
         "index_put_", "masked_scatter", "masked_scatter_", "refresh"],
        _COVERING_WRITE,
    ),
}  # fmt: skip

VALUE_EXEMPT: dict[str, str] = dict.fromkeys(
    ["empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"],
    "uninitialized memory: values are not determined by the call",
)

# Functions that write into arguments other than an out=/inplace target: replay passes them
# copies so saved values are never modified.
MUTATES_ARGUMENTS = frozenset({"batch_norm", "instance_norm", "embedding", "embedding_bag"})


def exempt_reason(op: Any, positions: list[str]) -> str | None:
    """Why perturbing the parent fed at ``positions`` of ``op`` proves nothing, if it is so.

    A parent is exempt only when every position it feeds is exempt.
    """
    entry = PERTURBATION_EXEMPT.get(op.func_name)
    if entry is None or (entry.when is not None and not entry.when(op)):
        return None
    if entry.positions is None or all(p in entry.positions for p in positions):
        return entry.reason
    return None


def parent_kind_reason(value: torch.Tensor) -> str | None:
    """Why no parent of this kind can be perturbed, if so (integer, bool, empty)."""
    if value.numel() == 0:
        return "the parent has zero elements: there is nothing to perturb"
    if not (value.is_floating_point() or value.is_complex()):
        return f"{value.dtype} parent (index, mask or count): no nearby value to perturb to"
    return None
