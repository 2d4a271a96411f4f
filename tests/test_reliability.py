"""Reliability: memory, re-entrancy, threads and inputs that escape the usual path."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack

import torchlens as tl


def small_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()


# -- memory -------------------------------------------------------------------------------------


@pytest.fixture
def no_gc():
    """Collect first, then disable the cycle collector: only reference counting frees."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_trace_holds_no_reference_to_the_model(no_gc):
    model = small_mlp()
    model_ref = weakref.ref(model)
    trace = tl.trace(model, torch.randn(2, 4))
    del model
    assert model_ref() is None, "the trace (or a cycle) keeps the model alive"
    assert len(trace) == 3


def test_deleting_a_trace_frees_its_payloads(no_gc):
    trace = tl.trace(small_mlp(), torch.randn(2, 4))
    payload = weakref.ref(trace["relu_1"].out)
    store = weakref.ref(trace.store)
    del trace
    assert payload() is None and store() is None


def test_capture_that_raises_frees_what_it_held(no_gc):
    held = []

    def explode(x):
        y = x * 2
        held.append(weakref.ref(y))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as info:
        tl.trace(explode, torch.randn(1000))
    del info
    assert held[0]() is None


def test_values_aliasing_buffers_survive_the_next_forward():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3).train()
    trace = tl.trace(bn, torch.randn(4, 3))
    bn(torch.randn(4, 3))  # updates num_batches_tracked (and the statistics) in place
    assert trace["add__1"].out.item() == 1
    assert bn.num_batches_tracked.item() == 2


def test_repeated_captures_do_not_accumulate():
    model, x = small_mlp(), torch.randn(2, 4)
    payloads = []
    for _ in range(50):
        trace = tl.trace(model, x)
        payloads.append(weakref.ref(trace["linear_1"].out))
        del trace
    gc.collect()
    assert sum(ref() is not None for ref in payloads) == 0


# -- re-entrancy and threads -------------------------------------------------------------------


def test_trace_inside_traced_forward_is_refused_and_outer_state_is_clean():
    class Inner(nn.Module):
        def forward(self, x):
            tl.trace(torch.relu, x)
            return x

    model = Inner()
    with pytest.raises(tl.errors.ReentrantCaptureError):
        tl.trace(model, torch.randn(2))
    assert _get_current_function_mode_stack() == []
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert len(tl.trace(torch.relu, torch.randn(2))) == 1


def test_threads_tracing_at_once_do_not_mix():
    models = [nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)]) for _ in range(2)]
    shared = models[0]
    errors: list[str] = []
    expected_modules = [str(i) for i in range(6)]

    def work(model):
        try:
            for _ in range(15):
                trace = tl.trace(model, torch.randn(2, 8))
                assert [op.module for op in trace] == expected_modules
                assert [op.func_name for op in trace] == ["linear"] * 6
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=work, args=(m,)) for m in (*models, shared)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for model in models:  # every capture's forward wrappers are gone, whatever the order
        assert all("forward" not in module.__dict__ for module in model.modules())


def test_wrappers_of_two_captures_of_one_model_unwind_in_either_order():
    """Two captures of one model in flight (as in two threads): the one that ends first
    leaves the other's wrapper in place, and the model ends with no wrapper at all."""
    from torchlens.capture.hooks import ForwardWrap

    for first, second in ((0, 1), (1, 0)):
        module = nn.Linear(2, 2)

        def factory(module, address, forward):
            def wrapped(*args, **kwargs):
                return forward(*args, **kwargs)

            return wrapped

        wraps = [ForwardWrap(module, factory, "fc"), ForwardWrap(module, factory, "fc")]
        assert module.__dict__["forward"] is wraps[1].wrapper
        wraps[first].remove()
        wraps[second].remove()
        assert "forward" not in module.__dict__


# -- inputs that escape the usual path ---------------------------------------------------------


class HoldsState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.memory = torch.ones(3)  # a plain attribute, not a buffer

    def forward(self, x):
        y = self.fc(x) + self.memory
        self.memory = y.detach()[0]  # kept on self between calls
        return y


def test_tensor_held_on_self_between_calls():
    torch.manual_seed(0)
    model = HoldsState()
    x = torch.randn(2, 3)
    first = tl.trace(model, x)
    assert first[first["add_1"].parents[1]].kind == "constant"
    second = tl.trace(model, x)  # memory is now the previous call's detached output
    constant = second[second["add_1"].parents[1]]
    assert constant.kind == "constant"
    torch.testing.assert_close(constant.out, first["linear_1"].out[0] + 1)


def test_scalar_tensor_and_parameter_inputs():
    def f(x):
        return x * torch.tensor(3.0) + torch.tensor([1.0, 2.0])

    x = nn.Parameter(torch.randn(2))
    trace = tl.trace(f, x)
    assert [op.func_name for op in trace] == ["tensor", "mul", "tensor", "add"]
    assert trace.inputs[0].requires_grad
    assert torch.equal(trace["tensor_1"].out, torch.tensor(3.0))
    torch.testing.assert_close(trace.output, f(x))


def test_inference_mode_and_no_grad_regions():
    def f(x):
        with torch.inference_mode():
            a = x * 2
        with torch.no_grad():
            b = x + 1
        return a.sum() + b.sum() + x.sum()

    x = torch.randn(3)
    trace = tl.trace(f, x)
    assert [op.func_name for op in trace][:2] == ["mul", "add"]
    torch.testing.assert_close(trace["mul_1"].out, x * 2)
    torch.testing.assert_close(trace.output, f(x))


def test_autocast_region_is_recorded():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.mm(x, w)
        return y.float() + 1

    trace = tl.trace(f, (torch.randn(2, 3), torch.randn(3, 2)))
    assert trace["mm_1"].dtype == torch.bfloat16
    assert trace["mm_1"].meta["autocast"] == [["cpu", "bfloat16"]]
    assert "autocast" not in trace["add_1"].meta


@dataclasses.dataclass
class DataclassOut:
    logits: torch.Tensor
    hidden: torch.Tensor


NamedOut = namedtuple("NamedOut", "logits hidden")


class ModelOutputLike(OrderedDict):
    """Shaped like Hugging Face's ModelOutput: an ordered dict of named tensors."""


@pytest.mark.parametrize(
    "wrap",
    [
        lambda a, b: DataclassOut(a, b),
        lambda a, b: NamedOut(a, b),
        lambda a, b: ModelOutputLike(logits=a, hidden=b),
    ],
    ids=["dataclass", "namedtuple", "model_output"],
)
def test_structured_outputs(wrap):
    def f(x):
        return wrap(x * 2, x + 1)

    x = torch.randn(3)
    trace = tl.trace(f, x)
    assert trace.output_labels == ["mul_1", "add_1"]
    assert type(trace.output) is type(wrap(x, x))
    assert [o.label for o in trace.outputs] == ["mul_1", "add_1"]
