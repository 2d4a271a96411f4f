"""The perturbation arm's parts: how values are moved, where calls are cut, which edges need
no call, how outputs are compared, and that the cheap paths still fail a false edge."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.replay import check_trace
from torchlens.replay.interpreter import Checker
from torchlens.replay.perturb import SLICE_MIN_ELEMENTS, Perturber, same_elements, sliced
from torchlens.replay.tolerances import differs, mismatch


@pytest.mark.parametrize(
    "dtype, shape",
    [
        (torch.float32, (3, 5)),
        (torch.float32, ()),
        (torch.float32, (2, 5000)),  # wider than the noise block: tiled
        (torch.float16, (4, 3)),
        (torch.bfloat16, (4, 3)),
        (torch.complex64, (2, 3)),
        (torch.float32, (0, 4)),
    ],
    ids=["float", "0-d", "wide", "half", "bfloat16", "complex", "empty"],
)
def test_first_move_keeps_shape_and_dtype_and_is_clearly_different(dtype, shape):
    value = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    moved = Perturber().moved(value, 0)
    assert (moved.shape, moved.dtype) == (value.shape, value.dtype)
    assert differs(moved, value) or value.numel() == 0  # beyond the dtype's tolerance
    assert float((moved != value).float().mean()) > 0.9 if value.numel() else True


def test_first_move_is_relative_for_large_entries():
    value = torch.full((8,), 1e6)
    change = (Perturber().moved(value, 0) - value).abs()
    assert bool((change > 1e6 * 1e-3).all())  # far outside float32 tolerance


def test_later_moves_make_non_finite_entries_finite():
    value = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    for attempt in (1, 2):
        moved = Perturber().moved(value, attempt)
        assert bool(moved.isfinite().all()), moved
        assert moved[0] != value[0] and moved[3] != value[3]


def test_perturber_never_draws_from_the_callers_rng():
    value = torch.randn(3, 4)
    state = torch.get_rng_state()
    Perturber().moved(value, 0)
    assert torch.equal(torch.get_rng_state(), state)


def test_same_elements_holds_for_permutations_and_reshapes_only():
    x = torch.randn(4, 6)
    assert same_elements(x.t(), x)
    assert same_elements(x.view(6, 4), x)
    assert same_elements(x[:, ::2].t(), x[:, ::2])
    assert not same_elements(x[:, :3], x)  # a part of it
    assert not same_elements(x[1], x[0])  # same storage, other elements
    assert not same_elements(x.clone(), x)
    assert not same_elements(x.as_strided((2, 2), (1, 1)), x.as_strided((4,), (1,)))
    assert not same_elements(x[:0], x[:0])  # nothing to change
    fused = torch.randn(2, 8, 96)  # a fused projection; keys are its middle third
    keys = fused[..., 32:64]
    assert same_elements(keys.view(2, 8, 4, 8), keys)  # heads split off a strided slice
    assert same_elements(keys.view(2, 8, 4, 8).transpose(1, 2), keys)
    assert not same_elements(keys.view(2, 8, 4, 8)[:, :, :2], keys)
    flat = torch.randn(8)
    assert same_elements(flat.as_strided((2, 2), (1, 2)), flat.as_strided((4,), (1,)))


def test_sliced_cuts_batch_like_arguments_and_optionally_weights():
    x, w, b = torch.randn(8, 64, 256), torch.randn(512, 256), torch.randn(512)
    kinds, shapes = ["input", "parameter", "parameter"], [(8, 64, 512)]
    position = sliced([x, w, b], kinds, shapes, dims=2)
    assert [tuple(t.shape) for t in position] == [(1, 1, 256), (512, 256), (512,)]
    cut = sliced([x, w, b], kinds, shapes, dims=2, weights=True)
    assert [tuple(t.shape) for t in cut] == [(1, 1, 256), (1, 256), (1,)]
    assert cut[1].data_ptr() == w.data_ptr()  # views, not copies
    small = torch.randn(2, 3)
    assert sliced([small], ["input"], [(2, 3)], dims=1) is None  # below SLICE_MIN_ELEMENTS
    assert 2 * 3 * 2 < SLICE_MIN_ELEMENTS
    assert sliced([x], ["input"], [(8, 64, 256)], dims=2, weights=True) is None  # no weights


def test_sliced_cuts_an_argument_broadcast_over_a_leading_dimension_too():
    q, mask = torch.randn(2, 4, 128, 64), torch.zeros(2, 1, 128, 128)  # a mask of one head
    kinds, shapes = ["input", "input"], [(2, 4, 128, 64)]
    point = sliced([q, mask], kinds, shapes, dims=2)
    assert [tuple(t.shape) for t in point] == [(1, 1, 128, 64), (1, 1, 128, 128)]
    other = torch.zeros(3, 1, 128, 128)  # neither the batch nor broadcast over it: kept
    point = sliced([q, other], kinds, shapes, dims=2)
    assert [tuple(t.shape) for t in point] == [(1, 1, 128, 64), (3, 1, 128, 128)]
    ones = torch.zeros(1, 1, 128, 128)  # broadcast over both: nothing to cut
    assert sliced([ones, ones], kinds, shapes, dims=2) is None


def test_attention_with_a_mask_over_heads_is_probed_at_one_head_of_one_sequence(monkeypatch):
    q, k, v = (torch.randn(2, 4, 128, 64) for _ in range(3))
    mask = torch.randn(2, 1, 128, 128)

    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    trace = tl.trace(attend, (q, k, v, mask))
    seen = _spy_calls(monkeypatch)
    status = check_trace(trace)
    assert status.state == "passed" and status.perturbation_verified == 1
    small = ((1, 1, 128, 64),) * 3 + ((1, 1, 128, 128),)
    probes = [shapes for name, shapes in seen if name == "scaled_dot_product_attention"]
    assert probes.count(small) == 5  # its baseline, then one probe per parent
    assert len(probes) == 6  # and the replay at full size, nothing else


def test_a_convolution_with_as_many_input_as_output_channels_is_probed_at_one_unit(
    monkeypatch,
):
    conv = nn.Conv1d(64, 64, 3, padding=1)  # its input channels look like a sequence
    trace = tl.trace(conv, torch.randn(2, 64, 256))
    seen = _spy_calls(monkeypatch)
    assert check_trace(trace).state == "passed"
    points = {shapes for name, shapes in seen if name == "conv1d"}
    # one row with the first output unit: no probe computes every output channel
    assert ((1, 64, 256), (1, 64, 3), (1,)) in points
    assert ((1, 64, 256), (64, 64, 3), (64,)) not in points


def test_sliced_points_run_without_the_requires_grad_flags_of_the_capture():
    bias = nn.Parameter(torch.randn(2, 4, 64, 64) * 0.1)  # a learned position bias
    q, k, v = (torch.randn(2, 4, 64, 64) for _ in range(3))
    trace = tl.trace(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                     (q, k, v))  # fmt: skip
    op = trace["scaled_dot_product_attention_1"]
    calls, real = [], op.func

    @functools.wraps(real)  # torch's own function still (cut points are made for torch's)
    def spy(*args, **kwargs):
        calls.append((args[0].shape[0], kwargs["attn_mask"].requires_grad))
        return real(*args, **kwargs)

    op.func = spy
    assert check_trace(trace).state == "passed"
    # the replay runs with the bias's flag (it picks the kernel the capture ran), the
    # perturbation arm's own sliced points without it (both its baseline and its probes)
    assert calls[0] == (2, True)
    sliced_calls = [flag for batch, flag in calls if batch == 1]
    assert len(sliced_calls) == 5 and not any(sliced_calls)


def test_differs_under_the_tolerance_table():
    x = torch.randn(4, 5)
    c = torch.randn(3, dtype=torch.complex64)
    nan = torch.tensor([float("nan"), 1.0])
    same = [(x, x.clone()), (x, x + 1e-9), (x.half(), x.half()), (c, c.clone()), (nan, nan)]
    other = [(x, x + 1), (x.half(), (x + 0.5).half()), (c, c * 1j), (nan, torch.ones(2))]
    other += [(torch.tensor([1, 2]), torch.tensor([1, 3])), (x, x.double()), (x, x[:2])]
    assert [differs(a, b) for a, b in same] == [False] * len(same)
    assert [differs(a, b) for a, b in other] == [True] * len(other)
    assert differs(x + 1, x) and not differs(x.clone(), x)


def test_mismatch_skips_the_pass_only_for_the_very_same_memory():
    x = torch.randn(3, 4)
    assert mismatch(x.t(), x.t()) is None
    assert mismatch(x[:, :2], x[:, 1:3]) is not None  # same storage, other elements


def _spy_calls(monkeypatch, by_label: bool = False) -> list[tuple[str, tuple]]:
    """Record every call the checker runs: (function name, or the op's label with
    ``by_label``; its tensor arguments' shapes)."""
    seen: list[tuple[str, tuple]] = []
    original = Checker.run_call

    def spy(self, op, values, skip=frozenset(), sliced=False):
        seen.append((op.label if by_label else op.func_name, tuple(tuple(v.shape) for v in values)))
        return original(self, op, values, skip, sliced)

    monkeypatch.setattr(Checker, "run_call", spy)
    return seen


def test_a_view_edge_is_proved_without_a_perturbed_call(monkeypatch):
    trace = tl.trace(lambda x: x.transpose(0, 1) * 2, torch.randn(3, 4))
    seen = _spy_calls(monkeypatch)
    status = check_trace(trace)
    assert status.state == "passed" and status.perturbation_verified == 2
    assert [name for name, _ in seen].count("transpose") == 1  # the replay only


def test_weights_are_cut_before_the_call_is_perturbed(monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(256, 512)
    trace = tl.trace(layer, torch.randn(8, 64, 256))
    seen = _spy_calls(monkeypatch)
    assert check_trace(trace).state == "passed"
    replay, *perturbed = [shapes for name, shapes in seen if name == "linear"]
    assert replay == ((8, 64, 256), (512, 256), (512,))
    assert perturbed and all(shapes == ((1, 1, 256), (1, 256), (1,)) for shapes in perturbed)


def test_a_convolution_is_perturbed_at_one_image_and_one_output_channel(monkeypatch):
    """Its input's channels are no sequence: the point that cuts only the weights (every
    image, one output channel) is passed over for the one that cuts the batch as well."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 16, 3, padding=1)
    trace = tl.trace(conv, torch.randn(8, 3, 32, 32))
    seen = _spy_calls(monkeypatch)
    assert check_trace(trace).state == "passed"
    replay, *perturbed = [shapes for name, shapes in seen if name == "conv2d"]
    assert replay == ((8, 3, 32, 32), (16, 3, 3, 3), (16,))
    assert perturbed and all(shapes == ((1, 3, 32, 32), (1, 3, 3, 3), (1,)) for shapes in perturbed)


def test_a_grouped_convolution_is_perturbed_at_one_image_with_whole_weights(monkeypatch):
    """A depthwise convolution refuses a cut channel and cut weights (its groups are
    fixed): no such point is tried, and the 1x1 convolution after it, of the same ranks,
    still takes cut weights."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise
        nn.Conv2d(16, 32, 1),
        nn.Conv2d(32, 32, 3, padding=1, groups=4),
    )
    trace = tl.trace(model, torch.randn(4, 16, 32, 32))
    seen = _spy_calls(monkeypatch, by_label=True)
    assert check_trace(trace).state == "passed"
    depthwise = [shapes for label, shapes in seen if label == "conv2d_1"][1:]
    assert depthwise == [((1, 16, 32, 32), (16, 1, 3, 3), (16,))] * 4  # baseline, 3 probes
    pointwise = [shapes for label, shapes in seen if label == "conv2d_2"][1:]
    assert pointwise == [((1, 16, 32, 32), (1, 16, 1, 1), (1,))] * 4
    grouped = [shapes for label, shapes in seen if label == "conv2d_3"][1:]
    assert grouped == [((1, 32, 32, 32), (32, 8, 3, 3), (32,))] * 4


def test_a_refused_cut_is_not_tried_again_on_a_call_of_the_same_shapes(monkeypatch):
    """A 2-d linear whose features number its outputs refuses the points that cut its
    features with its rows; the second linear of the same shapes goes straight to one row."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256))
    trace = tl.trace(model, torch.randn(512, 256))
    seen = _spy_calls(monkeypatch, by_label=True)
    assert check_trace(trace).state == "passed"
    refused = [((1, 1), (1, 256), (1,)), ((1, 1), (256, 256), (256,))]
    row = ((1, 256), (1, 256), (1,))
    first = [shapes for label, shapes in seen if label == "linear_1"][1:]
    second = [shapes for label, shapes in seen if label == "linear_2"][1:]
    assert first == refused + [row] * 4  # refused twice, then a baseline and three probes
    assert second == [row] * 4


def test_a_layer_norm_is_cut_with_its_weights_whole(monkeypatch):
    """Its rule (cut_rules.CUT_RULES) keeps a layer norm's weights whole: a cut weight never
    matches the normalized shape, so that point is not even tried."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 256), nn.LayerNorm(256))
    trace = tl.trace(model, torch.randn(4, 64, 256))
    seen = _spy_calls(monkeypatch, by_label=True)
    assert check_trace(trace).state == "passed"
    whole = ((1, 1, 256), (256,), (256,))
    for label in ("layer_norm_1", "layer_norm_2"):
        assert [shapes for name, shapes in seen if name == label][1:] == [whole] * 4


def test_an_edge_behind_a_zero_scale_is_proved_by_nan_at_a_sliced_point(monkeypatch):
    """A batch norm whose scale is zero (timm's ResNets start each block's last one so)
    hides its input and mean from every finite move; NaN shows them at one sliced point,
    without running the full call again."""
    torch.manual_seed(0)
    norm = nn.BatchNorm2d(16).eval()
    nn.init.zeros_(norm.weight)
    trace = tl.trace(norm, torch.randn(8, 16, 32, 32))
    seen = _spy_calls(monkeypatch)
    status = check_trace(trace)
    assert status.state == "passed" and status.perturbation_verified == 1, str(status)
    full = [shapes for name, shapes in seen if name == "batch_norm" and shapes[0][0] == 8]
    assert len(full) == 1  # the replay only


def test_recorded_point_is_recomputed_when_no_sliced_point_shows_the_edge(monkeypatch):
    """Row 0 of x is negative, so ``where`` takes none of w there, whatever its value (NaN
    too): no sliced point can show w; the full call does."""
    w = nn.Parameter(torch.randn(256))
    x = torch.randn(4, 64, 256).abs()
    x[0] = -x[0]
    trace = tl.trace(lambda t: torch.where(t > 0, w, t), x)
    seen = _spy_calls(monkeypatch)
    status = check_trace(trace)
    assert status.state == "passed", str(status)
    full = ((4, 64, 256), (256,), (4, 64, 256))
    assert seen.count(("where", full)) >= 2  # the replay, then the recorded point again
    sliced = [shapes for name, shapes in seen if name == "where" and shapes[0][0] == 1]
    assert len(sliced) >= 5  # a baseline and the four sliced probes of w, at one point


def test_a_function_that_ignores_its_bias_fails_even_with_weights_cut():
    torch.manual_seed(0)
    trace = tl.trace(nn.Linear(256, 512), torch.randn(8, 64, 256))
    op = trace["linear_1"]
    bias = trace["bias"].out.clone()
    op.func = lambda x, w, b: F.linear(x, w) + bias[: w.shape[0]]  # never reads b
    status = check_trace(trace)
    assert [(f.label, f.arm) for f in status.failures] == [("linear_1", "perturbation")]
    assert "'bias'" in status.failures[0].reason
