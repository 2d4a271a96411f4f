"""Small public helpers of replay and capture that the arms rely on for speed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torchlens as tl
from torchlens.capture.autocast import any_autocast, autocast_state
from torchlens.replay.exemptions import may_write_arguments
from torchlens.replay.perturb import SLICE_MIN_ELEMENTS, cut, large_enough, slice_plan, sliced
from torchlens.replay.tolerances import equal


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
