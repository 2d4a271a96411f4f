"""Roots and module calls: every module that runs is recorded, whatever is traced.

A traced module is its own root; a bound method's owner is the root of the method; a
function's modules are named with ``root=``, else by class. Weights read inside any
recorded module are parameter sources with their addresses, also when a hook puts them in
place during the forward (accelerate's offloading). Nothing stays patched afterwards.
"""

from __future__ import annotations

import functools
import threading

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError

TORCH_CALL = nn.Module.__call__


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return self.b(self.a(x))

    def twice(self, x):
        return self(self(x)) * 2

    def training_step(self, batch, batch_idx):
        """A Lightning-style step: the loss is computed inside the method."""
        x, y = batch
        return nn.functional.mse_loss(self(x), y)


def _sources(trace, kind):
    return sorted(s.path for s in trace.sources if s.kind == kind)


def _param_paths(model):
    return sorted(name for name, _ in model.named_parameters())


def test_a_bound_method_records_its_owners_calls_and_weights():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4)
    trace = tl.trace(model.twice, x)
    calls = [m.name for m in trace.modules]
    assert calls[:2] == ["<root>:0", "<root>:1"]  # the capture, then the owner's first call
    assert [m.name for m in trace.module_calls("b.0")] == ["b.0:1", "b.0:2"]
    assert trace.modules[0].module_type == "Net.twice"
    assert trace.modules["<root>:2"].module_type == "Net"
    assert _sources(trace, "parameter") == _param_paths(model)
    assert _sources(trace, "constant") == []
    # each op inside the owner's second call carries ("", 2) on its stack
    second = [op.label for op in trace if ("", 2) in op.module_stack]
    assert second == ["linear_3", "linear_4", "relu_2"]
    assert trace["linear_4"].module == "b.0"
    assert torch.equal(trace.output, model.twice(x))
    assert tl.validate(model.twice, x)


def test_call_picks_one_call_of_the_owner():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4)
    trace = tl.trace(model.twice, x, save=tl.module("", call=2))
    assert [op.label for op in trace if op.has_out] == ["linear_3", "linear_4", "relu_2"]
    rec = tl.record(model.twice, x, save=tl.module("b.0"))
    assert rec.labels == ["linear_2", "linear_4"]
    for label in rec.labels:
        assert torch.equal(rec[label].out, tl.trace(model.twice, x)[label].out)


def test_a_partial_of_a_bound_method_has_the_same_root():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4)
    trace = tl.trace(functools.partial(model.twice), x)
    assert _sources(trace, "parameter") == _param_paths(model)
    assert "b.0:2" in [m.name for m in trace.modules]


def test_a_lightning_style_training_step_records_the_loss_and_parameter_gradients():
    torch.manual_seed(0)
    model = Net().train()
    batch = (torch.randn(3, 4), torch.randn(3, 4))
    trace = tl.trace(model.training_step, (batch, 0), save_grads=True)
    assert trace.ops[-1].func_name == "mse_loss"
    assert trace.meta["training"] is True
    trace.backward()
    model.zero_grad()
    model.training_step(batch, 0).backward()
    for name, param in model.named_parameters():
        assert torch.allclose(trace.grads[name], param.grad), name
    assert tl.validate(model.training_step, (batch, 0))


def test_a_function_names_its_modules_by_class_or_by_root():
    torch.manual_seed(0)
    enc, dec = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)

    def fn(x):
        return dec(enc(x)) + enc.weight.sum()  # a weight read outside its module's call

    plain = tl.trace(fn, x)
    assert [m.name for m in plain.modules] == [
        "<root>:1", "Linear:1", "Sequential:1", "Sequential.0:1", "Sequential.1:1",
    ]  # fmt: skip
    assert _sources(plain, "parameter") == [
        "Linear.bias", "Linear.weight", "Sequential.0.bias", "Sequential.0.weight",
    ]  # fmt: skip
    assert plain.meta["fallback_modules"] == ["Linear", "Sequential"]
    assert "root={'name': module}" in str(plain)
    named = tl.trace(fn, x, root={"enc": enc, "dec": dec})
    assert [m.name for m in named.modules][1:] == ["enc:1", "dec:1", "dec.0:1", "dec.1:1"]
    assert _sources(named, "parameter") == ["dec.0.bias", "dec.0.weight", "enc.bias", "enc.weight"]
    assert "fallback_modules" not in named.meta and "root=" not in str(named)
    assert tl.validate(fn, x)


def test_a_second_instance_of_a_class_gets_a_numbered_fallback_name():
    torch.manual_seed(0)
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    trace = tl.trace(lambda x: second(first(x)) + first(x), torch.randn(1, 2))
    assert [m.name for m in trace.modules][1:] == ["Linear:1", "Linear_2:1", "Linear:2"]


def test_root_takes_one_module_as_an_owner():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4)
    trace = tl.trace(lambda x: model(x) + 1, x, root=model)
    assert [m.name for m in trace.modules][:2] == ["<root>:0", "<root>:1"]
    assert _sources(trace, "parameter") == _param_paths(model)


def test_a_module_made_during_the_forward_is_addressed_below_the_root():
    class Lazy(nn.Module):
        def forward(self, x):
            if not hasattr(self, "late"):
                self.late = nn.Linear(2, 2)
            return self.late(x)

    model = Lazy()
    trace = tl.trace(model.forward, torch.randn(1, 2))  # (a method: every call followed)
    assert [m.name for m in trace.modules] == ["<root>:1", "late:1"]
    # its weights were computed in the forward (initialised in place): the edges stay
    linear = next(op for op in trace if op.func_name == "linear")
    assert linear.module == "late"
    assert linear.parents == ("input_1", "kaiming_uniform__1", "uniform__1")
    again = tl.trace(model, torch.randn(1, 2))  # in the tree now: a parameter like any other
    assert _sources(again, "parameter") == ["late.bias", "late.weight"]


def test_a_module_kept_outside_the_tree_is_recorded_too():
    helper = nn.Linear(2, 2)

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.ReLU()
            self.helpers = [helper]  # a plain list: not a submodule

        def forward(self, x):
            return self.inner(self.helpers[0](x))

    holder = Holder()
    trace = tl.trace(holder.forward, torch.randn(1, 2))  # a method: every call followed
    assert [m.name for m in trace.modules] == ["<root>:1", "Linear:1", "inner:1"]
    assert _sources(trace, "parameter") == ["Linear.bias", "Linear.weight"]
    # a traced module follows its own tree only (the fast path): the helper's call is not
    # a module call, its weights are constants
    fast = tl.trace(holder, torch.randn(1, 2))
    assert [m.name for m in fast.modules] == ["<root>:1", "inner:1"]
    assert nn.Module.__call__ is TORCH_CALL


@pytest.mark.parametrize(
    "root, code",
    [(nn.Linear(1, 1), "bad_root"), ({"a.b": nn.ReLU()}, "bad_root"), ({"a": 3}, "bad_root"),
     (["x"], "bad_root")],
)  # fmt: skip
def test_bad_roots_are_refused_with_a_code(root, code):
    model = nn.ReLU()
    target = model if isinstance(root, nn.Module) else (lambda x: model(x))
    with pytest.raises(InvalidArgumentError) as caught:
        tl.trace(target, torch.randn(2), root=root)
    assert caught.value.code == code


def test_nothing_stays_patched_on_any_way_out():
    model, x = Net(), torch.randn(2, 4)
    tl.trace(model.twice, x)
    assert nn.Module.__call__ is TORCH_CALL
    tl.record(model.twice, x, save=tl.func("relu"))
    assert nn.Module.__call__ is TORCH_CALL
    tl.trace(model.twice, x, stop_after=tl.func("relu"))
    assert nn.Module.__call__ is TORCH_CALL

    def broken(x):
        model(x)
        raise ValueError("boom")

    with pytest.raises(ValueError):
        tl.trace(broken, x)
    assert nn.Module.__call__ is TORCH_CALL
    assert "forward" not in model.a.__dict__


def test_module_calls_of_another_thread_are_not_recorded():
    torch.manual_seed(0)
    other = nn.Linear(2, 2)
    started, finish = threading.Event(), threading.Event()
    calls = []

    def elsewhere():
        started.wait()
        calls.append(other(torch.randn(1, 2)))  # runs while the capture below is open
        finish.set()

    def fn(x):
        started.set()
        finish.wait(timeout=10)
        return x + 1

    worker = threading.Thread(target=elsewhere)
    worker.start()
    trace = tl.trace(fn, torch.randn(1, 2))
    worker.join()
    assert calls and [m.name for m in trace.modules] == ["<root>:1"]
    assert [op.func_name for op in trace] == ["add"]


# -- weights put in place during the forward (accelerate's offloading) --------------------


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()


def _offload(model, how, tmp_path):
    accelerate = pytest.importorskip("accelerate")
    if how == "cpu":
        accelerate.cpu_offload(model, execution_device="cpu")
    else:
        accelerate.disk_offload(model, str(tmp_path), execution_device="cpu")
    return model


@pytest.mark.parametrize("how", ["cpu", "disk"])
def test_offloaded_weights_are_parameter_sources(how, tmp_path):
    model = _mlp()
    names = _param_paths(model)
    x = torch.randn(3, 4)
    expected = model(x)
    _offload(model, how, tmp_path)
    assert all(p.device.type == "meta" for p in model.parameters())  # until a call
    trace = tl.trace(model, x)
    assert _sources(trace, "parameter") == names
    linear = [op for op in trace if op.func_name == "linear"]
    assert [op.parents[1:] for op in linear] == [("0.weight", "0.bias"), ("2.weight", "2.bias")]
    assert [op.module for op in linear] == ["0", "2"]
    assert torch.allclose(trace.output, expected)
    assert tl.validate(model, x)


@pytest.mark.parametrize("how", ["cpu", "disk"])
def test_an_offloaded_llama_names_every_weight(how, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    names = _param_paths(model)
    ids = torch.randint(3, 96, (2, 8))
    _offload(model, how, tmp_path)
    trace = tl.trace(model, kwargs={"input_ids": ids})
    assert _sources(trace, "parameter") == names
    attention = trace.modules["model.layers.1.self_attn"]
    assert attention.module_type == "LlamaAttention"
    q_proj = next(
        op
        for op in trace
        if op.module == "model.layers.0.self_attn.q_proj" and op.func_name == "linear"
    )
    assert "model.layers.0.self_attn.q_proj.weight" in q_proj.parents
    assert tl.validate(model, kwargs={"input_ids": ids})
