"""FLOPs of recorded ops, from the formulas ``torch.utils.flop_counter`` registers.

A trace records torch-level calls (``linear``, ``conv2d``, ``matmul``) with the shapes of
their arguments; the table below maps each such call to the formula
:class:`torch.utils.flop_counter.FlopCounterMode` applies to the aten kernels it lowers to,
so the numbers agree with that counter on the same forward. Only multiply-accumulates are
counted (a FLOP is 2 per MAC, bias additions are left out), as torch does. An op without a
formula has an unknown cost (``None``), never zero; ops that only move or reshape data
(:data:`NO_ARITHMETIC`) cost zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch.utils import flop_counter as _fc

__all__ = ["NO_ARITHMETIC", "op_flops"]

Shape = tuple[int, ...]
ShapeOf = Callable[[str], Shape]

# Calls that do no arithmetic on values: their cost is zero, not unknown.
NO_ARITHMETIC = frozenset(
    """getitem setitem view reshape flatten unflatten permute transpose t contiguous expand
    expand_as squeeze unsqueeze split chunk unbind cat stack narrow select slice clone
    detach to type float half bfloat16 double int long bool size dim numel movedim
    view_as repeat tile flip roll zeros zeros_like ones ones_like empty empty_like full
    full_like arange tensor as_tensor identity masked_fill index_select gather
    refresh""".split()
)


def op_flops(op: Any, shape_of: ShapeOf) -> int | None:
    """The FLOPs of ``op`` (``None`` when no formula covers it).

    Args:
        op: a recorded :class:`~torchlens.trace.Op`.
        shape_of: the shape of a record (op or source) by label.

    Returns:
        FLOPs as ``FlopCounterMode`` counts them; 0 for data movement and for the second
        and later outputs of one call (the first carries the call's cost).

    Example:
        >>> import torch, torchlens as tl
        >>> trace = tl.trace(torch.nn.Linear(4, 3), torch.randn(2, 4), structure_only=True)
        >>> op_flops(trace["linear_1"], lambda label: trace[label].shape)
        48
    """
    if op.func_name in NO_ARITHMETIC or op.output_index > 0:
        return 0
    formula = _FORMULAS.get(op.func_name)
    if formula is None:
        return None
    shapes = {ref.position: tuple(shape_of(ref.label)) for ref in op.parent_args}
    try:
        return int(formula(shapes, tuple(op.shape), op))
    except (KeyError, ValueError, AssertionError, IndexError, TypeError):
        return None  # an argument layout the formula does not cover


def _arg(shapes: dict[str, Shape], index: int, name: str) -> Shape:
    return shapes[str(index)] if str(index) in shapes else shapes[name]


def _matmul(a: Shape, b: Shape, out: Shape) -> int:
    """``a @ b`` with broadcasting: 2 * (output elements) * (contracted size)."""
    if not a or not b:
        raise ValueError("matmul of a scalar")
    return 2 * math.prod(out) * a[-1]


def _linear(shapes: dict[str, Shape], out: Shape, op: Any) -> int:
    x, w = _arg(shapes, 0, "input"), _arg(shapes, 1, "weight")
    return _fc.mm_flop((math.prod(x[:-1]), x[-1]), (w[1], w[0]))


def _mm(shapes: dict[str, Shape], out: Shape, op: Any) -> int:
    return _matmul(_arg(shapes, 0, "input"), _arg(shapes, 1, "other"), out)


def _addmm(shapes: dict[str, Shape], out: Shape, op: Any) -> int:
    """``addmm``/``baddbmm(input, a, b)``: the product only, as torch counts it."""
    a = shapes.get("1") or shapes.get("mat1") or shapes["batch1"]
    return _matmul(a, out, out)


def _conv(transposed: bool) -> Callable[[dict[str, Shape], Shape, Any], int]:
    def formula(shapes: dict[str, Shape], out: Shape, op: Any) -> int:
        x, w = _arg(shapes, 0, "input"), _arg(shapes, 1, "weight")
        if len(x) == len(w) - 1:  # an unbatched input
            x, out = (1, *x), (1, *out)
        return _fc.conv_flop_count(list(x), list(w), list(out), transposed=transposed)

    return formula


def _sdpa(shapes: dict[str, Shape], out: Shape, op: Any) -> int:
    q, k, v = (_four_d(_arg(shapes, i, n)) for i, n in enumerate(("query", "key", "value")))
    return _fc.sdpa_flop_count(q, k, v)


def _four_d(shape: Shape) -> Shape:
    """``(batch, heads, seq, dim)``: leading batch dimensions folded, or a head axis added."""
    if len(shape) < 3:
        raise ValueError("attention needs (..., seq, dim) inputs")
    if len(shape) == 3:
        return (shape[0], 1, *shape[1:])
    return (math.prod(shape[:-3]), *shape[-3:])


def _multi_head_attention(shapes: dict[str, Shape], out: Shape, op: Any) -> int:
    """``F.multi_head_attention_forward`` (``nn.MultiheadAttention``) as its kernels count:
    the q/k/v projections, two batched products per head, the output projection."""
    q, k = _arg(shapes, 0, "query"), _arg(shapes, 1, "key")
    heads = int(_plain_arg(op, 4, "num_heads"))
    target, embed = q[0], q[-1]
    source = k[0]
    batch = math.prod(q[1:-1]) if len(q) == 3 else 1
    kdim = k[-1]
    vdim = _arg(shapes, 2, "value")[-1]
    head_dim = embed // heads
    projections = 2 * batch * (target * embed * embed + source * embed * (kdim + vdim))
    attention = 2 * 2 * batch * heads * target * source * head_dim
    return projections + attention + 2 * batch * target * embed * embed


def _plain_arg(op: Any, index: int, name: str) -> Any:
    args = op.args_template
    return args[index] if len(args) > index else op.kwargs_template[name]


_FORMULAS: dict[str, Callable[[dict[str, Shape], Shape, Any], int]] = {
    "linear": _linear,
    "matmul": _mm,
    "mm": _mm,
    "bmm": _mm,
    "__matmul__": _mm,
    "__rmatmul__": lambda s, out, op: _matmul(_arg(s, 1, "other"), _arg(s, 0, "input"), out),
    "addmm": _addmm,
    "baddbmm": _addmm,
    "conv1d": _conv(False),
    "conv2d": _conv(False),
    "conv3d": _conv(False),
    "conv_transpose1d": _conv(True),
    "conv_transpose2d": _conv(True),
    "conv_transpose3d": _conv(True),
    "scaled_dot_product_attention": _sdpa,
    "multi_head_attention_forward": _multi_head_attention,
}
