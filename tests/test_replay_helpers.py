"""Small public helpers of replay and capture that the arms rely on for speed."""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

import torchlens as tl
from torchlens.capture.autocast import any_autocast, autocast_state
from torchlens.capture.tree import ArgSlot, slots_in_order
from torchlens.replay import check_trace
from torchlens.replay.exemptions import exempt_reason, may_write_arguments, maybe_exempt
from torchlens.replay.perturb import SLICE_MIN_ELEMENTS, cut, large_enough, slice_plan, sliced
from torchlens.replay.tolerances import comparable, equal, mismatch

# (the module by name: ``torchlens.replay`` the attribute is the function tl.replay)
tolerances = importlib.import_module("torchlens.replay.tolerances")


def test_equal_agrees_with_torch_equal_on_large_and_small_values():
    big = torch.randn(64, 128)  # over the size where numpy compares
    assert big.numel() >= 1 << 12
    cases = [
        (big, big.clone()),
        (big, big + 1e-7),
        (torch.zeros(64, 128), -torch.zeros(64, 128)),  # -0.0 equals 0.0
        (torch.full((64, 128), float("nan")), torch.full((64, 128), float("nan"))),
        (big.t(), big.t().contiguous()),  # strided views
        (torch.ones(3), torch.ones(3)),
        (torch.arange(5000), torch.arange(5000)),
        (torch.ones(5000, dtype=torch.bool), torch.zeros(5000, dtype=torch.bool)),
    ]
    for a, b in cases:
        assert equal(a, b) == torch.equal(a, b)


def _mismatch_without_memcmp(actual, expected):
    memcmp, tolerances._MEMCMP = tolerances._MEMCMP, None
    try:
        return mismatch(actual, expected)
    finally:
        tolerances._MEMCMP = memcmp


def test_mismatch_by_bytes_gives_the_tolerance_rule_answer():
    big = torch.randn(64, 128)
    nan = big.clone()
    nan[3, 5] = float("nan")
    moved = nan.clone()
    moved[7, 1] += 1.0
    cube = torch.randn(4, 8, 16)
    cplx = torch.randn(64, 128, dtype=torch.complex64)

    def quantized(scale):
        return torch.quantize_per_tensor(big, scale, 0, torch.qint8)

    cases = [
        (big, big.clone()),  # the same bytes
        (nan, nan.clone()),  # NaN in the same place matches
        (nan, moved),  # one element off
        (torch.zeros(64, 128), -torch.zeros(64, 128)),  # other bytes, equal values
        (big.t(), big.clone().t()),  # the same transposed layout
        (cube.permute(2, 0, 1), cube.clone().permute(2, 0, 1)),
        (cube.permute(2, 0, 1), (cube + 1).permute(2, 0, 1)),
        (big[:, ::2], big.clone()[:, ::2]),  # gaps in the span: compared elementwise
        (big[:, :1].expand(64, 8), big[:, :1].clone().expand(64, 8)),  # stride 0
        (torch.randn(3).expand(4, 3), torch.randn(3).expand(4, 3)),
        (big.t(), big.t().contiguous()),  # one layout each
        (torch._neg_view(big), torch._neg_view(big.clone())),
        (torch.arange(5000), torch.arange(5000)),
        (torch.ones(0, 3), torch.ones(0, 3)),
        (torch.ones(5000, dtype=torch.bool), torch.zeros(5000, dtype=torch.bool)),
        (big.bfloat16(), big.bfloat16()),  # dtypes numpy lacks: bytes, then torch
        (big.bfloat16(), (big + 1).bfloat16()),
        (cplx, cplx.clone()),
        (cplx.conj(), cplx.clone().conj()),  # both conjugated lazily: the same values
        (cplx.conj(), cplx.conj().resolve_conj()),  # other bytes, equal values
        (cplx, cplx.clone().conj()),  # the same bytes, other values
        (quantized(0.1), quantized(0.1)),
        (quantized(0.1), quantized(0.2)),  # the same bytes, other scales
    ]
    assert tolerances._MEMCMP is not None  # this machine's C library has memcmp
    for a, b in cases:
        assert mismatch(a, b) == _mismatch_without_memcmp(a, b)
    assert mismatch(nan, moved).startswith("values differ in 1 of 8192 elements")
    assert tolerances._same_bytes(big.t(), big.clone().t())
    assert tolerances._same_bytes(big.bfloat16(), big.bfloat16())
    assert not tolerances._same_bytes(quantized(0.1), quantized(0.1))  # scales unread
    assert not tolerances._same_bytes(big[:, ::2], big.clone()[:, ::2])
    assert not tolerances._same_bytes(torch.zeros(4), -torch.zeros(4))  # equal all the same
    assert mismatch(torch.zeros(4), -torch.zeros(4)) is None
    assert mismatch(cplx, cplx.clone().conj()) and mismatch(quantized(0.1), quantized(0.2))


def test_slice_plan_and_cut_are_what_sliced_gives():
    x, w = torch.randn(8, 64, 256), torch.randn(512, 256)
    values, kinds, shapes = [x, w], ["op", "parameter"], [(8, 64, 512)]
    assert large_enough(values, shapes)
    assert not large_enough([torch.ones(4)], [(4,)]) and SLICE_MIN_ELEMENTS > 4
    plan = slice_plan(values, kinds, shapes, dims=2, weights=False)
    assert plan == [(0, 2)]  # the batch argument, cut in two leading dimensions
    small = cut(values, plan)
    assert small[0].shape == (1, 1, 256) and small[1] is w
    expected = sliced(values, kinds, shapes, dims=2)
    assert all(torch.equal(a, b) for a, b in zip(small, expected))
    assert slice_plan(values, kinds, shapes, weights=True) == [(0, 1), (1, 1)]  # and a row of w
    assert slice_plan(values, kinds, [(1, 64, 512)]) is None  # nothing to cut


def test_may_write_arguments_only_for_calls_that_can_write():
    weight = torch.randn(10, 4)
    ids = torch.tensor([1, 2])

    def embed(max_norm):
        return lambda x: F.embedding(x, weight, max_norm=max_norm)

    plain = tl.trace(embed(None), ids)["embedding_1"]
    renorm = tl.trace(embed(1.0), ids)["embedding_1"]
    assert not may_write_arguments(plain) and may_write_arguments(renorm)
    bn = torch.nn.BatchNorm1d(4)
    x = torch.randn(3, 4)
    assert may_write_arguments(tl.trace(bn.train(), x)["batch_norm_1"])
    assert not may_write_arguments(tl.trace(bn.eval(), x)["batch_norm_1"])
    assert not may_write_arguments(tl.trace(torch.relu, x)["relu_1"])


def test_any_autocast_answers_inside_and_outside_a_region():
    assert not any_autocast() and autocast_state() is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert any_autocast()
        assert autocast_state() == [["cpu", "bfloat16"]]


def test_slots_in_order_only_for_flat_calls_in_slot_order():
    s0, s1 = ArgSlot(0), ArgSlot(1)
    assert slots_in_order((s0, s1), {}, 2)
    assert slots_in_order((s0, 2.0, (2, -1), None), {"dim": -1, "size": (3, slice(0, 2))}, 1)
    assert slots_in_order((1, 2), {}, 0)  # a factory call: atoms only
    assert not slots_in_order((s1, s0), {}, 2)  # swapped
    assert not slots_in_order((s0,), {}, 2)  # fewer slots than tensors
    assert not slots_in_order((s0, s1), {}, 1)  # a slot after the first n
    assert not slots_in_order((s0, 2.0), {"weight": s1}, 2)  # a tensor keyword
    assert not slots_in_order(([s0, s1],), {}, 2)  # nested: cat([a, b])
    assert not slots_in_order((s0, [2, 3]), {}, 1)  # a list is mutable: filled afresh
    assert not slots_in_order([s0], {}, 1)  # not a tuple template


def test_maybe_exempt_is_false_only_where_exempt_reason_is_none():
    x = torch.randn(3, 4)
    trace = tl.trace(lambda a: torch.zeros_like(a) + a.sum(), x)
    for op in trace.ops:
        for ref in op.parent_args:
            if not maybe_exempt(op, ref.position):
                assert exempt_reason(op, [ref.position]) is None
    zeros = trace["zeros_like_1"]
    assert maybe_exempt(zeros, "0") and exempt_reason(zeros, ["0"])


def test_comparable_keeps_a_plain_value_and_detaches_the_rest():
    plain = torch.randn(3)
    assert comparable(plain) is plain
    tracked = torch.randn(3, requires_grad=True)
    assert not comparable(tracked).requires_grad
    assert comparable(tracked).data_ptr() == tracked.data_ptr()
    complex_value = torch.randn(3, dtype=torch.complex64)
    assert comparable(complex_value).shape == (3, 2)  # a real view
    assert comparable(torch.randn(3, 3).to_sparse()).layout == torch.strided


def test_a_saved_value_edited_after_capture_is_not_replayed_against():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    trace = tl.trace(model, torch.randn(2, 4))
    trace["linear_1"].out.mul_(2)  # edits the saved value in place
    status = check_trace(trace)
    assert status.state == "unverified"
    assert {(gap.label, gap.arm) for gap in status.unchecked} >= {("linear_1", "replay")}
    assert all(
        "payload_overwritten" in gap.reason or "modified in place" in gap.reason
        for gap in status.unchecked
        if gap.label == "linear_1"
    )
