"""Which calls of its own the perturbation arm may make: one table, each rule with its reason.

Every call the replay and perturbation arms make is the recorded call, or the recorded call
with some arguments changed. A change of *values* keeps each argument's shape, dtype,
layout and device (see :data:`VALUE_RULES`). A change of *shapes* (a sliced point, see
:mod:`torchlens.replay.edges`: batch-like arguments cut to their first row or position, and
parameters and buffers maybe to their first entry) makes a call the model never made, and a
native kernel that does not check its arguments against each other reads past the end of a
cut tensor. The CPU GRU kernel splits its gates into three chunks and takes the third
without checking that there is one: a GRU whose weights are cut to one row killed the
process. So a call of changed shapes is made only when a rule of :data:`CUT_RULES` says its
kernel accepts it; any other call is probed at its recorded shapes only.

A rule is added only with a test that runs it: ``tests/test_cut_sweep.py`` validates models
calling each named function at sizes where torch switches kernels, in child processes, and
fails when a named function was never run at a cut point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CUT_RULES", "VALUE_RULES", "CutRule", "cut_points", "rule_for"]

Tensor = torch.Tensor
Point = tuple[int, bool]  # (leading batch-like dimensions cut, parameters and buffers cut)

# The sliced points, cheapest first. One row with cut weights comes before one row with
# whole ones: at one row with whole weights each probe would compute every output unit.
BATCH_AND_WEIGHTS: tuple[Point, ...] = ((2, True), (2, False), (1, True), (1, False))
BATCH: tuple[Point, ...] = ((2, False), (1, False))  # weights whole
# A convolution's input channels are no sequence: cutting them as one with the batch
# (dims=2) only ever raised, so its points cut one image.
ONE_IMAGE: tuple[Point, ...] = ((1, True), (1, False))


@dataclass(frozen=True)
class CutRule:
    """Functions whose kernels accept the cut ``points``, and why."""

    name: str
    points: tuple[Point, ...]
    reason: str
    functions: frozenset[str] = frozenset()  # recorded function names
    tag: Any = None  # or an aten tag (torch.Tag) every function carrying it is under
    # a condition on the recorded values, when the rule holds only for some calls
    when: Callable[[list[Tensor]], bool] | None = field(default=None, compare=False)


def _batched_cell(values: list[Tensor]) -> bool:
    return bool(values) and values[0].dim() == 2


CUT_RULES: tuple[CutRule, ...] = (
    CutRule(
        "pointwise",
        BATCH_AND_WEIGHTS,
        "aten tags these pointwise: TensorIterator loops, which take the output shape from "
        "the operands' broadcast shapes (a mismatch raises) and read each operand through "
        "its own sizes and strides",
        tag=torch.Tag.pointwise,
    ),
    CutRule(
        "reductions",
        BATCH,
        "aten tags these reductions: TensorIterator reductions over the given tensor's own "
        "dimensions; an out-of-range dimension raises",
        tag=torch.Tag.reduction,
    ),
    CutRule(
        "activations and softmax",
        BATCH,
        "one input read through its own sizes; the dimension argument is checked",
        functions=frozenset({"hardswish", "hardsigmoid", "softmax", "log_softmax"}),
    ),
    CutRule(
        "matrix products",
        BATCH_AND_WEIGHTS,
        "mm, bmm, addmm and the matmul/linear built on them check operand shapes before "
        "calling BLAS ('mat1 and mat2 shapes cannot be multiplied')",
        functions=frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "mv"}),
    ),
    CutRule(
        "convolutions",
        ONE_IMAGE,
        "convolution checks the weight against the input's channels and groups, and the "
        "bias against the weight, before choosing a kernel (check_shape_forward)",
        functions=frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d"}),
    ),
    CutRule(
        "per-channel norms",
        BATCH_AND_WEIGHTS,
        "batch, instance and group norm check weight, bias and running statistics against "
        "the input's channels (and the groups against them)",
        functions=frozenset({"batch_norm", "instance_norm", "group_norm"}),
    ),
    CutRule(
        "layer norms",
        BATCH,
        "layer_norm checks the input's trailing sizes against normalized_shape and the "
        "weight; a cut weight never matches it, so the weights stay whole",
        functions=frozenset({"layer_norm", "rms_norm"}),
    ),
    CutRule(
        "pooling and resampling",
        BATCH,
        "each image or sequence of the batch is computed from its own sizes; grid_sample "
        "checks that input and grid have the same batch",
        functions=frozenset({
            "avg_pool1d", "avg_pool2d", "max_pool1d", "max_pool2d", "adaptive_avg_pool1d",
            "adaptive_avg_pool2d", "adaptive_max_pool2d", "interpolate", "grid_sample", "pad",
            "roll",
        }),
    ),
    CutRule(
        "copies, joins and indexing",
        BATCH,
        "reshapes check the element count, cat and stack the other dimensions, "
        "and indexing checks every index against the size it indexes",
        functions=frozenset({
            "contiguous", "clone", "to", "float", "copy_", "cat", "stack", "flatten", "reshape",
            "getitem", "setitem",
        }),
    ),
    CutRule(
        "attention",
        BATCH,
        "scaled_dot_product_attention checks that query, key, value and the mask "
        "broadcast over batch and heads before choosing a kernel",
        functions=frozenset({"scaled_dot_product_attention"}),
    ),
    CutRule(
        "embedding",
        BATCH,
        "the ids are cut, the table stays whole (a cut table would refuse every id but 0); "
        "embedding checks each id against the table's size",
        functions=frozenset({"embedding"}),
    ),
    CutRule(
        "recurrent cells",
        BATCH,
        "a batched cell's input and hidden state are cut alike (same leading batch), its "
        "weights stay whole: a smaller batch of the call the kernel accepted; the cell "
        "checks input and hidden sizes against the weights",
        functions=frozenset({"rnn_tanh_cell", "rnn_relu_cell", "gru_cell", "lstm_cell"}),
        when=_batched_cell,
    ),
)  # fmt: skip

# The calls of changed values, which every function gets (no rule excludes one).
VALUE_RULES: tuple[tuple[str, str], ...] = (
    (
        "perturbed parent (noise, half, shift, NaN, sign, zero, large, random, inf)",
        "the moved value has the parent's shape, dtype, layout and device; only floating "
        "and complex values are moved, so the integers that address memory (indices, "
        "offsets, lengths, masks) stay as recorded; a sparse parent is only negated or "
        "zeroed (torch's own ops, which keep its invariants), the other probes raise first",
    ),
    (
        "neutral point (the other floating arguments replaced by fresh values)",
        "the same shapes, dtypes, layouts and devices, and again no integer is changed",
    ),
)
# Not cut, probed at their recorded shapes (no rule names them): the whole-sequence RNN
# kernels (rnn_tanh, rnn_relu, gru, lstm) take a hidden state batched along its second
# dimension and flat weights that constrain each other, and do not check them (the CPU GRU
# crashed on weights cut to one row); and every function not named above, torchvision's
# ops among them (roi_align reads the image each box names, unchecked).


@functools.cache  # function -> whether it is torch's own
def _from_torch(func: Any) -> bool:
    """Whether ``func`` is one of torch's own (functions, Tensor methods), not a third
    party's that happens to share a name."""
    module = getattr(func, "__module__", None)
    if module is None:
        module = getattr(getattr(func, "__objclass__", None), "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


_BY_NAME: dict[str, CutRule] = {name: rule for rule in CUT_RULES for name in rule.functions}
_TAGGED = [rule for rule in CUT_RULES if rule.tag is not None]


@functools.cache  # function name -> its rule, worked out once
def rule_for(func_name: str) -> CutRule | None:
    """The rule of :data:`CUT_RULES` covering the function ``func_name``, or None."""
    rule = _BY_NAME.get(func_name)
    if rule is None and _TAGGED:
        try:  # (the aten namespace answers None for a name it lacks)
            packet = getattr(torch.ops.aten, func_name, None)
        except Exception:  # noqa: BLE001 - a name aten cannot even look up
            packet = None
        tags = set()
        if isinstance(packet, torch._ops.OpOverloadPacket):
            tags = {tag for name in packet.overloads() for tag in getattr(packet, name).tags}
        rule = next((r for r in _TAGGED if r.tag in tags), None)
    return rule


def cut_points(func: Any, func_name: str, values: list[Tensor]) -> tuple[Point, ...]:
    """The sliced points a call of ``func`` on ``values`` may be made at: those of its rule,
    or none (the call is probed at its recorded shapes only)."""
    if func is None:
        return ()
    if not _from_torch(func):
        return ()
    rule = rule_for(func_name)
    if rule is None or (rule.when is not None and not rule.when(values)):
        return ()
    return rule.points
