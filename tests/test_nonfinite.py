"""tl.find_nonfinite: the first op whose output holds a NaN or an infinity."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError

BAD_FUNCS = {"log": "log", "zero_div": "div", "exp_overflow": "exp"}


def _bad(kind: str, h: torch.Tensor) -> torch.Tensor:
    if kind == "log":
        return torch.log(h - 100.0)  # BAD LINE log
    if kind == "zero_div":
        return (h * 0) / (h * 0)  # BAD LINE zero_div
    return torch.exp(h.abs() + 1000.0)  # BAD LINE exp_overflow


class Block(nn.Module):
    def __init__(self, kind: str | None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.kind = kind

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        return _bad(self.kind, h) if self.kind else h


class Net(nn.Module):
    def __init__(self, bad_layer: int | None, kind: str = "log") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(kind if i == bad_layer else None) for i in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def _line(kind: str) -> int:
    lines, start = inspect.getsourcelines(_bad)
    return start + next(i for i, text in enumerate(lines) if f"BAD LINE {kind}" in text)


@pytest.mark.parametrize("layer", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("kind", list(BAD_FUNCS))
def test_names_the_op_module_call_and_line(kind, layer):
    model, x = Net(layer, kind), torch.randn(2, 4)
    report = tl.find_nonfinite(model, x)
    assert report and report.found
    op = report.op
    assert op.func_name == BAD_FUNCS[kind]
    assert report.module_call == f"layers.{layer}:1"
    assert report.source.file == __file__ and report.source.line == _line(kind)
    assert report.source.function == "_bad"
    assert not report.stats.finite
    assert isinstance(report.trace, tl.Recording)  # the lean pass, not a trace
    assert report.trace.labels == [op.label] and report.trace.halted
    assert report.trace[op.label].out is op.out and report.trace.output is None
    assert report.checked == op.index + 1  # the forward halted right there
    for stats in report.parents.values():
        assert stats.finite  # the culprit made the first non-finite value
    text = str(report)
    assert op.label in text and f"layers.{layer}:1" in text and f":{_line(kind)} in _bad" in text
    on_trace = tl.find_nonfinite(tl.trace(model, x))  # the same answer from a full trace
    assert on_trace.op.label == op.label and on_trace.module_call == report.module_call
    assert on_trace.op.parents == op.parents and on_trace.checked == report.checked
    for label, value in report.parent_values.items():
        assert torch.equal(value, on_trace.parent_values[label])
    assert on_trace.source is None  # that trace was captured without source=True


def test_parent_statistics():
    report = tl.find_nonfinite(lambda t: torch.log(t) * 2, torch.tensor([1.0, -2.0, 4.0]))
    assert report.op.label == "log_1"
    stats = report.parents["input_1"]
    assert (stats.min, stats.max, stats.mean) == (-2.0, 4.0, 1.0)
    assert (stats.nan, stats.posinf, stats.neginf) == (0, 0, 0)
    assert (report.stats.nan, report.stats.min, report.stats.max) == (
        1,
        0.0,
        pytest.approx(1.3863, 1e-4),
    )


def test_a_non_finite_input_is_flagged_as_the_parent():
    x = torch.tensor([[1.0, float("inf"), 0.0, 2.0]])
    report = tl.find_nonfinite(Net(None), x)
    assert report.op.label == "linear_1"
    assert report.parents["input_1"].posinf == 1 and not report.parents["input_1"].finite
    assert "already non-finite" in str(report)


def test_nothing_found_says_so():
    model, x = Net(None), torch.randn(2, 4)
    report = tl.find_nonfinite(model, x)
    n_ops = len(tl.trace(model, x))
    assert not report and report.op is None and report.checked == n_ops
    assert report.trace.labels == [] and not report.trace.halted
    assert torch.equal(report.trace.output, model(x))  # the forward ran to its end
    assert str(report) == f"no NaN or Inf: none in the {n_ops} op outputs checked"
    on_trace = tl.find_nonfinite(tl.trace(model, x))
    assert not on_trace and on_trace.checked == n_ops


def test_halting_leaves_buffers_and_rng_as_they_were():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return torch.log(self.bn(x) - 100 + torch.rand_like(x))

    model = Noisy().train()
    torch.manual_seed(3)
    report = tl.find_nonfinite(model, torch.randn(8, 4))
    assert report.op.func_name == "log"
    assert torch.equal(model.bn.running_mean, torch.zeros(4))
    assert int(model.bn.num_batches_tracked) == 0


def test_structure_only_trace_is_refused():
    trace = tl.trace(Net(None), torch.randn(2, 4), structure_only=True)
    with pytest.raises(InvalidArgumentError) as err:
        tl.find_nonfinite(trace)
    assert err.value.code == "no_values"


def test_inf_false_skips_masks_filled_with_minus_inf():
    def masked_attention(scores):
        mask = torch.ones(3, 3).triu(1).bool()
        scores = scores.masked_fill(mask, float("-inf"))  # -inf on purpose
        weights = torch.softmax(scores, dim=-1)
        return torch.sqrt(weights - 0.5)  # NaN where a weight is below 0.5

    scores = torch.zeros(3, 3)
    assert tl.find_nonfinite(masked_attention, scores).op.func_name == "masked_fill"
    report = tl.find_nonfinite(masked_attention, scores, inf=False)
    assert report.op.func_name == "sqrt" and report.parents["sub_1"].min == -0.5
    assert str(report).startswith("first output with a NaN: sqrt_1")
    assert tl.find_nonfinite(tl.trace(masked_attention, scores), inf=False).op.label == "sqrt_1"
    assert "no NaN:" in str(tl.find_nonfinite(torch.exp, torch.tensor([1000.0]), inf=False))


def test_a_finite_value_whose_sum_overflows_is_finite():
    from torchlens.debug.nonfinite import is_nonfinite

    big = torch.full((10,), 60000.0, dtype=torch.float16)
    assert not is_nonfinite(big) and is_nonfinite(torch.tensor([1.0, float("nan")]))
    assert not is_nonfinite(torch.tensor([1, 2])) and not is_nonfinite(torch.empty(0))
    nan, inf = float("nan"), float("inf")
    both = torch.tensor([60000.0, 60000.0, -60000.0, -60000.0], dtype=torch.float16)
    cases = [  # (value, has a NaN or an infinity, has a NaN)
        (both, False, False),  # partial sums overflow to +inf and -inf: the sum is NaN
        (torch.cat([both, torch.tensor([nan], dtype=torch.float16)]), True, True),
        (torch.tensor([1.0, inf]), True, False),
        (torch.tensor([-inf, inf]), True, False),  # the sum is NaN, no element is
        (torch.tensor([-inf, inf, nan]), True, True),
        (torch.tensor([1 + 1j, complex(nan, 0)]), True, True),
        (torch.tensor([1 + 1j, complex(inf, 0)]), True, False),
        (torch.tensor([1.0, nan], dtype=torch.bfloat16), True, True),
    ]
    for value, any_bad, any_nan in cases:
        assert is_nonfinite(value) == any_bad and is_nonfinite(value, inf=False) == any_nan


def _agree(model, args, kwargs=None, *, inf=True):
    """The lean pass and the scan of a full trace (with source lines) report the same."""
    lean = tl.find_nonfinite(model, args, kwargs, inf=inf)
    full = tl.find_nonfinite(tl.trace(model, args, kwargs, source=True), inf=inf)
    assert lean and full
    assert (lean.op.label, lean.op.func_name, lean.op.index) == (
        full.op.label,
        full.op.func_name,
        full.op.index,
    )
    assert lean.op.parents == full.op.parents
    assert list(lean.parents) == list(full.parents) and lean.parents == full.parents
    assert lean.stats == full.stats and lean.checked == full.checked
    assert lean.module_call == full.module_call and lean.source == full.source
    for label, value in full.parent_values.items():
        torch.testing.assert_close(lean.parent_values[label], value, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(lean.op.out, full.op.out, rtol=0, atol=0, equal_nan=True)
    return lean


def test_a_parameter_as_the_parent():
    model = Net(None)
    with torch.no_grad():
        model.layers[1].fc.weight[2, 1] = float("nan")
    report = _agree(model, torch.randn(2, 4))
    assert report.op.label == "linear_2" and report.module_call == "layers.1.fc:1"
    assert report.op.parents == ("tanh_1", "layers.1.fc.weight", "layers.1.fc.bias")
    assert report.parents["layers.1.fc.weight"].nan == 1
    assert report.source.function == "forward"


def test_a_buffer_as_the_parent():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("scale", torch.tensor([1.0, 0.0, 1.0, 1.0]))

        def forward(self, x):
            return torch.log(self.fc(x).abs() * self.scale)  # log(0) = -inf

    report = _agree(Scaled(), torch.randn(3, 4))
    assert report.op.label == "log_1" and report.op.parents == ("mul_1",)
    report = _agree(lambda x, w: x / w, (torch.ones(2), torch.tensor([1.0, 0.0])))
    assert report.op.parents == ("input_1", "input_2")


def test_a_model_input_as_the_parent_positional_and_keyword():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, *, mask):
            return torch.sqrt(self.fc(x).sigmoid() - mask)

    x, mask = torch.randn(2, 4), torch.tensor([0.0, 2.0, 0.0, 0.0])
    report = _agree(Gate(), x, {"mask": mask})
    assert report.op.label == "sqrt_1" and report.op.parents == ("sub_1",)
    assert report.parents["sub_1"].max < 1 < 2 and report.module_call == ""
    report = _agree(lambda x, *, k: torch.pow(k, x * 0.5), torch.ones(3), {"k": -torch.ones(3)})
    assert report.op.label == "pow_1" and report.op.parents == ("input_2", "mul_1")
    report = _agree(Net(None), torch.tensor([[1.0, float("inf"), 0.0, 2.0]]))
    assert report.op.parents == ("input_1", "layers.0.fc.weight", "layers.0.fc.bias")
    assert not report.parents["input_1"].finite


def test_a_multi_output_culprit():
    def halves(x):
        first, second = torch.split(torch.log(x.abs() + 1) - 1, 2)
        return torch.sqrt(second), torch.sqrt(first)

    x = torch.tensor([3.0, 4.0, 0.0, 5.0])  # log(1) - 1 < 0 sits in the second half
    report = _agree(halves, x)
    assert report.op.label == "sqrt_1" and report.op.parents == ("split_1:1",)
    report = _agree(lambda t: torch.split(t * 2, 2), torch.tensor([1.0, 2.0, float("nan"), 4.0]))
    assert report.op.label == "mul_1"
    report = _agree(lambda t: t.split(2), torch.tensor([1.0, 2.0, float("nan"), 4.0]))
    assert report.op.label == "split_1:1" and report.op.output_index == 1
    assert report.op.parents == ("input_1",) and report.checked == 2


def test_a_culprit_made_in_place():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x) * 1.0
            h.sub_(10.0).log_()  # negative before the log: made NaN in place
            return h

    report = _agree(InPlace(), torch.randn(2, 4))
    assert report.op.label == "log__1" and report.op.parents == ("sub__1",)
    assert report.parents["sub__1"].finite and report.parents["sub__1"].max < 0  # before
    x = torch.tensor([1.0, -1.0])
    report = _agree(lambda t: torch.relu(t).mul_(t).add_(t.sqrt()), x)
    assert report.op.label == "sqrt_1"  # its parent was never written: the input
    report = _agree(lambda t: torch.div(t, torch.zeros(2), out=torch.ones(2)) + 1, x)
    assert report.op.label == "div_1" and report.op.parents == ("input_1", "zeros_1", "ones_1")
    assert report.parents["ones_1"].min == 1  # out= is written in place: its value before
    zero = torch.tensor([0.0, 1.0])  # neither an input nor a parameter: a constant
    report = _agree(lambda t: t / zero, x)
    assert report.op.parents == ("input_1", "constant_1") and report.parents["constant_1"].min == 0


def test_element_moving_ops_are_checked_unless_their_arguments_were():
    nan = float("nan")
    report = _agree(lambda x, y: torch.cat([x.exp(), y]), (torch.ones(2), torch.tensor([nan])))
    assert report.op.label == "cat_1"  # an input is not proven finite: checked
    report = _agree(lambda x: x.t().contiguous().view(-1), torch.tensor([[1.0, nan]]))
    assert report.op.label == "t_1"
    report = _agree(lambda x: (x.exp() * 1e30).view(-1) * 1e30, torch.ones(2, 1))
    assert report.op.label == "mul_2"  # the view of a finite value was finite


def test_ops_after_the_culprit_do_not_run():
    ran = []

    def model(x):
        y = torch.log(x)
        ran.append("after")
        return y + 1

    report = tl.find_nonfinite(model, torch.tensor([-1.0]))
    assert report.op.label == "log_1" and ran == []


def test_the_model_error_keeps_its_type():
    class Broken(nn.Module):
        def forward(self, x):
            x = x * 2
            raise KeyError("the model's own")

    with pytest.raises(KeyError, match="the model's own"):
        tl.find_nonfinite(Broken(), torch.ones(2))
    with pytest.raises(RuntimeError):  # torch's error inside the forward: unchanged too
        tl.find_nonfinite(lambda x: x @ torch.ones(3, 3), torch.ones(2, 2))
    report = tl.find_nonfinite(lambda x: torch.log(x), torch.tensor([-1.0]))
    assert report  # nothing was left behind by the failed runs


def test_the_model_path_agrees_with_the_trace_path_on_nested_modules():
    for layer in range(3):
        for kind in BAD_FUNCS:
            _agree(Net(layer, kind), torch.randn(2, 4))
    _agree(Net(None), torch.tensor([[1.0, float("inf"), 0.0, 2.0]]))


def test_a_culprit_written_in_place_into_an_op_output_is_found_by_a_second_run():
    calls = []

    def model(x):
        calls.append(1)
        h = x * 1.0
        return torch.nn.functional.relu(h, inplace=True).sub_(2.0).log_()  # log of -2 or -1

    x = torch.tensor([0.0, 1.0])
    report = _agree(model, x)
    assert report.op.label == "log__1" and report.op.parents == ("sub__1",)
    assert torch.equal(report.parent_values["sub__1"], torch.tensor([-2.0, -1.0]))  # before
    calls.clear()
    tl.find_nonfinite(model, x)
    assert len(calls) == 2  # the first run halted there; the second copied the target first
    calls.clear()
    tl.find_nonfinite(lambda t: (calls.append(1), torch.log(t * 1.0))[1], -x)
    assert len(calls) == 1  # a culprit not made in place takes one run


def test_a_culprit_written_in_place_into_an_input_is_copied_at_once():
    calls = []

    def model(x):
        calls.append(1)
        return x.log_()

    x = torch.tensor([-1.0, 2.0])
    report = tl.find_nonfinite(model, x)
    assert report.op.label == "log__1" and report.op.parents == ("input_1",)
    assert torch.equal(report.parent_values["input_1"], torch.tensor([-1.0, 2.0]))
    assert len(calls) == 1 and x[0].isnan()  # the model's own write happened, once

    def writes_first(x):  # once an input was written, every later target is copied
        calls.append(1)
        x.mul_(2.0)
        return (x + 0.0).sqrt_()

    calls.clear()
    report = tl.find_nonfinite(writes_first, torch.tensor([-1.0, 2.0]))
    assert report.op.label == "sqrt__1" and len(calls) == 1
    assert torch.equal(report.parent_values["add_1"], torch.tensor([-2.0, 4.0]))


def test_a_forward_that_does_not_repeat_keeps_the_first_answer():
    calls = []

    def model(x):
        calls.append(1)
        h = x * 1.0
        return h.sub_(2.0 if len(calls) == 1 else 0.0).log_()  # NaN on the first call only

    report = tl.find_nonfinite(model, torch.tensor([1.0]))
    assert len(calls) == 2 and report.op.label == "log__1"
    assert report.op.parents == ("sub__1",) and report.parent_values == {}  # overwritten
    assert "parent" not in str(report).split("output")[-1]


def test_in_place_maps_of_checked_values_and_inference_mode():
    class Net2(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return torch.log(self.relu(self.fc(x)) - 1.0)

    model, x = Net2(), torch.randn(3, 4)
    report = _agree(model, x)
    assert report.op.label == "log_1" and report.op.parents == ("sub_1",)
    with torch.inference_mode():
        report = tl.find_nonfinite(model, x)
    assert report.op.label == "log_1" and report.parents["sub_1"].max < 0


def test_dropout_is_checked_only_when_training():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(3e38)  # finite, but twice it is not
    x = torch.randn(64, 4)
    assert not tl.find_nonfinite(model.eval(), x)  # the identity
    torch.manual_seed(0)
    report = tl.find_nonfinite(model.train(), x)  # kept elements are scaled by 2
    assert report.op.label == "dropout_1" and report.op.parents == ("linear_1",)
    assert report.stats.posinf > 0 and report.parents["linear_1"].finite


def test_a_view_as_another_dtype_is_checked():
    bits = torch.tensor([0x7E003C00], dtype=torch.int32).view(torch.float32)  # 4.25e37
    report = _agree(lambda x: (x * 1.0).view(torch.float16), bits)  # halves: 1.0 and NaN
    assert report.op.label == "view_1" and report.op.parents == ("mul_1",)
    assert report.parents["mul_1"].finite and report.stats.nan == 1


def test_nan_only_search_checks_what_is_computed_from_an_infinity():
    """With inf=False an infinity passes, so it proves nothing about the ops computed from
    it: a softmax over +inf is NaN and is found, on the model and on its trace alike."""

    def overflow_then_softmax(x):
        return torch.softmax(x * 1e38 * 10, -1)

    x = torch.ones(1, 3)
    report = tl.find_nonfinite(overflow_then_softmax, x, inf=False)
    assert report.op.label == "softmax_1"
    assert report.parents["mul_2"].posinf == 3
    on_trace = tl.find_nonfinite(tl.trace(overflow_then_softmax, x), inf=False)
    assert on_trace.op.label == "softmax_1"


def test_a_sum_that_overflows_in_low_precision_is_not_reported():
    """The lean pass's one-sum check: a half-precision sum that overflows (to +inf, or to
    NaN from +inf and -inf partial sums) with every element finite is settled exactly."""
    big = torch.full((64,), 60000.0, dtype=torch.float16)  # its sum is above 65504
    both = torch.tensor([3e38, -3e38] * 8)  # lanes of +inf and -inf partial sums
    assert big.sum().isinf() and both.sum().isnan() and both.bfloat16().sum().isnan()
    wide = torch.tensor([1.5e308, -1.5e308] * 8, dtype=torch.float64)
    assert wide.sum().isnan()
    for value in (big, both, both.bfloat16(), wide):
        for inf in (True, False):
            report = tl.find_nonfinite(lambda x: x * 1.0 + 0.0, value, inf=inf)
            assert not report and report.checked == 2
    report = tl.find_nonfinite(lambda x: (x * 1.0).log(), both)
    assert report.op.label == "log_1" and report.parents["mul_1"].finite


def test_scaling_by_a_number_is_checked_unless_it_cannot_grow():
    """``x * s`` with ``|s| <= 1`` and ``x / s`` with ``|s| >= 1`` of a value proven finite
    are not summed again; any other scale (or a NaN one) is checked."""
    big = torch.full((2,), 3e38)
    report = _agree(lambda x: (x * 1.0) * 10.0, big)
    assert report.op.label == "mul_2"
    assert _agree(lambda x: 10.0 * (x * 1.0), big).op.label == "mul_2"
    assert _agree(lambda x: (x * 1.0) / 0.1, big).op.label == "div_1"
    assert _agree(lambda x: (x * 1.0) / 0, big).op.label == "div_1"
    assert _agree(lambda x: (x * 1.0) * float("nan"), big).op.label == "mul_2"
    assert _agree(lambda x: torch.div(x * 1.0, -1e-3, rounding_mode="floor"), big)
    assert not tl.find_nonfinite(lambda x: (x * -0.5) / 3 / float("inf") * 1, big)
    # an infinity passes with inf=False, is not proven finite, and times 0 is NaN
    report = _agree(lambda x: (x * 1e38 * 10) * 0.0, torch.ones(2), inf=False)
    assert report.op.label == "mul_3" and report.parents["mul_2"].posinf == 2


def test_an_infinity_reaching_gelu_is_checked_when_looking_for_nan_only():
    """``gelu(x)`` of a finite ``x`` is finite and not summed again; of an infinity (which
    passes with ``inf=False``) it is NaN, and found."""
    x = torch.tensor([1.0, -2.0])
    assert not tl.find_nonfinite(lambda t: torch.nn.functional.gelu(t * 1.0), x)
    report = tl.find_nonfinite(lambda t: torch.nn.functional.gelu(t * 1e38 * 10), x, inf=False)
    assert report.op.label == "gelu_1" and report.stats.nan == 2  # of +inf and of -inf


def test_calls_that_keep_finite_values_finite_are_not_summed(monkeypatch):
    """What the pass sums: each output once, save those of calls that keep proven finite
    values finite (counted by patching the check)."""
    import torchlens.debug._nonfinite_pass as nonfinite_pass

    checked: list[tuple[int, ...]] = []
    real = nonfinite_pass._finite

    def counting(tensor, inf):
        checked.append(tuple(tensor.shape))
        return real(tensor, inf)

    monkeypatch.setattr(nonfinite_pass, "_finite", counting)

    def model(x):
        h = torch.nn.functional.gelu(x * 2.0)  # mul checked, gelu not
        h = torch.nn.functional.dropout(h / 4.0, 0.5, training=False)  # neither
        return torch.relu(h * 0.5).view(-1) * 3.0  # the last mul only

    assert not tl.find_nonfinite(model, torch.randn(2, 3))
    assert checked == [(2, 3), (6,)]
