"""Core capture: every op of an eager forward becomes one Op with the right edges and values."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.overrides import _get_current_function_mode_stack

import torchlens as tl
from torchlens.capture.api import trace_for_check
from torchlens.errors import PayloadUnavailableError, UnsupportedModelError
from torchlens.replay import check_trace


def tutorial_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


def module_outputs(model: nn.Module, *args) -> dict[str, torch.Tensor]:
    """Each submodule's output, collected independently with plain forward hooks."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        module.register_forward_hook(
            lambda m, i, o, name=name: seen.setdefault(name, o.detach().clone())
        )
        for name, module in model.named_modules()
        if name
    ]
    try:
        model(*args)
    finally:
        for handle in handles:
            handle.remove()
    return seen


# -- the tutorial model -----------------------------------------------------------------------


def test_tutorial_func_names_edges_and_modules():
    model, x = tutorial_model(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    assert [op.func_name for op in trace] == ["linear", "relu", "linear"]
    assert trace.labels == ["linear_1", "relu_1", "linear_2"]
    assert [op.module for op in trace] == ["0", "1", "2"]
    assert trace["linear_1"].parents == ("input_1", "0.weight", "0.bias")
    assert [(r.label, r.position) for r in trace["linear_2"].parent_args] == [
        ("relu_1", "0"),
        ("2.weight", "1"),
        ("2.bias", "2"),
    ]
    assert trace["relu_1"].children == ["linear_2"]
    assert trace["input_1"].children == ["linear_1"]
    assert trace["0.weight"].kind == "parameter"
    assert [op.index for op in trace] == [0, 1, 2]


def test_payloads_match_independent_hooks():
    model, x = tutorial_model(), torch.randn(2, 4)
    expected = module_outputs(model, x)
    trace = tl.trace(model, x)
    for op in trace:
        torch.testing.assert_close(op.out, expected[op.module], rtol=0, atol=0)
    assert torch.equal(trace.output, model(x))
    assert trace.outputs[0].label == "linear_2"


def test_op_metadata_fields():
    model, x = tutorial_model(), torch.randn(2, 4)
    op = tl.trace(model, x)["linear_1"]
    assert op.shape == (2, 3)
    assert op.dtype == torch.float32
    assert op.device == torch.device("cpu")
    assert op.requires_grad is True
    assert op.is_inplace is False
    assert op.call_index == 1 and op.output_index == 0
    assert op.module_stack == (("0", 1),)


# -- in-place ops ----------------------------------------------------------------------------


class InplaceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, y):
        h = self.fc(x)
        h = self.act(h)
        h += 1
        h[0] = y
        return h * 2


def test_inplace_ops_record_versions_and_keep_earlier_values():
    torch.manual_seed(0)
    model, x, y = InplaceNet().eval(), torch.randn(2, 4), torch.randn(4)
    trace = tl.trace(model, (x, y))
    assert [op.func_name for op in trace] == ["linear", "relu", "add_", "setitem", "mul"]
    assert [op.is_inplace for op in trace] == [False, True, True, True, False]
    linear = F.linear(x, model.fc.weight, model.fc.bias).detach()
    torch.testing.assert_close(trace["linear_1"].out, linear, rtol=0, atol=0)
    torch.testing.assert_close(trace["relu_1"].out, linear.relu(), rtol=0, atol=0)
    torch.testing.assert_close(trace["add__1"].out, linear.relu() + 1, rtol=0, atol=0)
    after_set = linear.relu() + 1
    after_set[0] = y
    torch.testing.assert_close(trace["setitem_1"].out, after_set, rtol=0, atol=0)
    # each version reads the previous one, and setitem also reads the written value
    assert trace["relu_1"].parents == ("linear_1",)
    assert trace["add__1"].parents == ("relu_1",)
    assert trace["setitem_1"].parents == ("add__1", "input_2")
    assert trace["mul_1"].parents == ("setitem_1",)


def test_write_through_a_view_records_a_refresh():
    def f(x):
        h = x * 1
        h.narrow(0, 0, 1).zero_()  # writes h through a view, out of sight of h itself
        return h + 1

    x = torch.randn(3, 2)
    trace = tl.trace(f, x)
    names = [op.func_name for op in trace]
    assert names == ["mul", "narrow", "zero_", "refresh", "add"]
    assert trace["refresh_1"].parents == ("mul_1", "zero__1")
    assert trace["add_1"].parents == ("refresh_1",)
    expected = x.clone()
    expected[0] = 0
    torch.testing.assert_close(trace["refresh_1"].out, expected, rtol=0, atol=0)
    torch.testing.assert_close(trace["mul_1"].out, x, rtol=0, atol=0)


def test_saved_slices_of_a_tensor_written_later_are_copied_once_with_it():
    """Before a write, the saved values sharing the written memory are copied: a slice
    lying inside a larger one becomes the same slice of that one's copy, so the memory
    they shared is copied once and every value stays what it was."""

    def f(x):
        h = x * 2
        rows = [h[i] * 1 for i in range(3)]  # each row read (saved as a view of h)
        col = h[:, 1]  # a strided view, inside h too
        h.mul_(10)  # the write: h and its views are copied first
        return torch.stack(rows).sum() + col.sum() + h.sum()

    x = torch.randn(3, 4)
    trace = tl.trace(f, x)
    whole = trace["mul_1"].out
    torch.testing.assert_close(whole, x * 2, rtol=0, atol=0)
    for i, label in enumerate(["getitem_1", "getitem_2", "getitem_3"]):
        row = trace[label].out
        torch.testing.assert_close(row, x[i] * 2, rtol=0, atol=0)
        assert row.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    col = trace["getitem_4"].out
    torch.testing.assert_close(col, x[:, 1] * 2, rtol=0, atol=0)
    assert col.stride() == (4,)
    assert col.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    assert tl.replay(f, x).state == "passed"


def test_editing_outputs_after_capture_is_reported_not_served():
    model, x = tutorial_model(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    before = trace["linear_2"].out.clone()
    trace.output.detach().add_(100)  # the user edits what the model returned
    torch.testing.assert_close(trace["linear_2"].out, before, rtol=0, atol=0)


def test_trace_for_check_keeps_inputs_and_outputs_as_aliases():
    model, x = tutorial_model(), torch.randn(2, 4)
    traced, checked = tl.trace(model, x), trace_for_check(model, x)
    assert [op.label for op in checked] == [op.label for op in traced]
    assert [op.parents for op in checked] == [op.parents for op in traced]
    for op in traced:
        torch.testing.assert_close(checked[op.label].out, op.out, rtol=0, atol=0)
    last = checked.output_labels[0]
    assert checked[last].out.data_ptr() == checked.output.data_ptr()  # no copy made
    assert traced[last].out.data_ptr() != traced.output.data_ptr()  # the caller's to edit
    source = checked.input_labels[0]
    assert checked[source].out.data_ptr() == x.data_ptr()
    assert traced[source].out.data_ptr() != x.data_ptr()
    assert check_trace(checked, reference=model(x)).state == "passed"


# -- views, indexing, multi-output -----------------------------------------------------------


def test_views_and_slicing():
    def f(x):
        return x.view(4, 3)[1:, ::2].transpose(0, 1).T.unsqueeze(0)

    x = torch.arange(12.0)
    trace = tl.trace(f, x)
    assert [op.func_name for op in trace] == ["view", "getitem", "transpose", "T", "unsqueeze"]
    assert trace["getitem_1"].out.shape == (3, 2)
    torch.testing.assert_close(trace.ops[-1].out, f(x), rtol=0, atol=0)
    assert trace["getitem_1"].args_template[1] == (slice(1, None), slice(None, None, 2))


@pytest.mark.parametrize(
    ("fn", "name", "n_out"),
    [
        (lambda x: x.split(2, dim=1), "split", 2),
        (lambda x: torch.chunk(x, 2, dim=0), "chunk", 2),
        (lambda x: x.max(dim=1), "max", 2),
        (lambda x: torch.unbind(x, 0), "unbind", 4),
    ],
)
def test_multi_output_calls(fn, name, n_out):
    x = torch.randn(4, 4)
    trace = tl.trace(fn, x)
    assert [op.label for op in trace] == [f"{name}_1:{i}" for i in range(n_out)]
    assert {op.call_index for op in trace} == {1}
    assert [op.output_index for op in trace] == list(range(n_out))
    expected = list(fn(x))
    for op, value in zip(trace, expected):
        assert torch.equal(op.out, value)


def test_lstm_outputs_and_parameters():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 5, batch_first=True).eval()
    x = torch.randn(2, 4, 3)
    trace = tl.trace(lstm, x)
    lstm_ops = [op for op in trace if op.func_name == "lstm"]
    assert [op.output_index for op in lstm_ops] == [0, 1, 2]
    assert "weight_ih_l0" in lstm_ops[0].parents
    out, (h, c) = lstm(x)
    for op, value in zip(lstm_ops, (out, h, c)):
        torch.testing.assert_close(op.out, value.detach(), rtol=0, atol=0)


# -- tensors made inside the forward ----------------------------------------------------------


def test_tensors_created_inside_forward():
    def f(x):
        z = torch.zeros(3) + torch.arange(3)
        n = torch.from_numpy(np.array([1.0, 2.0, 3.0], dtype=np.float32))
        return x * z + n

    x = torch.randn(3)
    trace = tl.trace(f, x)
    assert [op.func_name for op in trace] == ["zeros", "arange", "add", "mul", "add"]
    assert trace["zeros_1"].parents == ()
    assert trace["add_1"].parents == ("zeros_1", "arange_1")
    constant = trace["add_2"].parents[1]
    assert trace[constant].kind == "constant"
    assert torch.equal(trace[constant].out, torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(trace.output, f(x))


# -- module structure -------------------------------------------------------------------------


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        h = x
        for _ in range(3):
            h = torch.tanh(self.cell(h))
        return h


def test_recurrent_loop_call_numbers():
    torch.manual_seed(0)
    trace = tl.trace(Recurrent(), torch.randn(1, 4))
    linears = [op for op in trace if op.func_name == "linear"]
    assert [op.module_stack for op in linears] == [(("cell", n),) for n in (1, 2, 3)]
    assert [op.address for op in linears] == ["cell:1", "cell:2", "cell:3"]
    calls = trace.module_calls("cell")
    assert [c.call_index for c in calls] == [1, 2, 3]
    assert calls[1].inputs == ("tanh_1",) and calls[1].outputs == ("linear_2",)
    assert linears[1].parents == ("tanh_1", "cell.weight", "cell.bias")


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_nested_modules_stack_and_calls():
    torch.manual_seed(0)
    trace = tl.trace(Nested(), torch.randn(2, 4))
    assert trace["linear_2"].module_stack == (("blocks.1", 1), ("blocks.1.0", 1))
    assert trace["linear_2"].module == "blocks.1.0"
    block = trace.module_calls("blocks.1")[0]
    assert block.ops == ("linear_2", "relu_2")
    assert block.module_type == "Sequential"
    root = trace.modules[0]
    assert root.address == "" and root.ops == tuple(trace.labels)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_shared_parameters_are_one_source():
    torch.manual_seed(0)
    trace = tl.trace(Tied(), torch.randn(2, 4))
    assert trace["linear_1"].parents[1] == "a.weight"
    assert trace["linear_2"].parents[1] == "a.weight"
    assert trace["a.weight"].children == ["linear_1", "linear_2"]
    assert list(trace.parameters) == ["a.weight"]


def test_buffers_are_sources():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4).eval()
    trace = tl.trace(bn, torch.randn(3, 4))
    assert set(trace.buffers) == {"running_mean", "running_var"}
    assert trace["batch_norm_1"].parents == (
        "input_1",
        "running_mean",
        "running_var",
        "weight",
        "bias",
    )


# -- inputs, outputs, modes -------------------------------------------------------------------


def test_nested_containers_in_and_out():
    def f(batch):
        a, b = batch["pair"]
        return {"sum": a + b, "parts": [a * 2, (b - 1,)]}

    a, b = torch.randn(2), torch.randn(2)
    trace = tl.trace(f, [{"pair": (a, b)}])
    assert [s.path for s in trace.inputs] == ["args[0]['pair'][0]", "args[0]['pair'][1]"]
    assert trace.output_labels == ["add_1", "mul_1", "sub_1"]
    assert torch.equal(trace.output["parts"][1][0], b - 1)


def test_kwargs_only_inputs():
    def f(*, x, scale):
        return x * scale

    x, scale = torch.randn(3), torch.tensor(2.0)
    trace = tl.trace(f, kwargs={"x": x, "scale": scale})
    assert [s.path for s in trace.inputs] == ["kwargs['x']", "kwargs['scale']"]
    assert trace["mul_1"].parents == ("input_1", "input_2")


def test_train_and_eval_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    x = torch.randn(8, 4)
    train = tl.trace(model.train(), x)
    evaluated = tl.trace(model.eval(), x)
    assert train.meta["training"] is True and evaluated.meta["training"] is False
    # batch norm counts batches in place on a buffer in train mode only
    assert [op.func_name for op in train] == ["linear", "dropout", "add_", "batch_norm"]
    assert train["add__1"].parents == ("2.num_batches_tracked",)
    assert [op.func_name for op in evaluated] == ["linear", "dropout", "batch_norm"]
    assert train["dropout_1"].rng_state is not None
    assert evaluated["dropout_1"].rng_state is None  # draws nothing: no snapshot to keep
    torch.testing.assert_close(evaluated["dropout_1"].out, evaluated["linear_1"].out)


def test_random_calls_snapshot_the_generator_only_when_they_may_draw():
    q = torch.randn(1, 2, 4, 8)

    def f(x):
        a = F.dropout(x, 0.5, training=False) + F.dropout(x, 0.5)  # no flag: training
        b = F.scaled_dot_product_attention(x, x, x) + F.scaled_dot_product_attention(
            x, x, x, dropout_p=0.5
        )
        return a + b + torch.rand_like(x)

    torch.manual_seed(0)
    trace = tl.trace(f, q)
    snapshots = {op.label: op.rng_state is not None for op in trace if "rand" in op.label
                 or "dropout" in op.label or "attention" in op.label}  # fmt: skip
    assert snapshots == {
        "dropout_1": False, "dropout_2": True, "scaled_dot_product_attention_1": False,
        "scaled_dot_product_attention_2": True, "rand_like_1": True,
    }  # fmt: skip
    assert tl.validate(f, q, random_seed=0)


def test_no_grad_inside_forward():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x

    x = torch.randn(3, requires_grad=True)
    trace = tl.trace(f, x)
    assert trace["mul_1"].requires_grad is False
    assert trace["add_1"].requires_grad is True
    assert trace["add_1"].parents == ("mul_1", "input_1")


def test_property_reads_are_not_ops():
    def f(x):
        n = x.shape[0] + x.size(1) + x.dim()
        return x.sum() * n

    trace = tl.trace(f, torch.randn(2, 3))
    assert [op.func_name for op in trace] == ["sum", "mul"]


def test_structure_only_has_graph_without_payloads():
    model, x = tutorial_model(), torch.randn(2, 4)
    full = tl.trace(model, x)
    bare = tl.trace(model, x, structure_only=True)
    assert bare.labels == full.labels
    assert [op.parents for op in bare] == [op.parents for op in full]
    assert bare.structure_only
    with pytest.raises(PayloadUnavailableError) as err:
        bare["relu_1"].out
    assert err.value.code == "structure_only"
    assert "structure_only" in str(err.value)
    assert not bare["relu_1"].has_out


# -- the Trace container ----------------------------------------------------------------------


def test_trace_container_protocol():
    model, x = tutorial_model(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    assert len(trace) == 3
    assert trace[0] is trace["linear_1"] and trace[-1].label == "linear_2"
    assert "relu_1" in trace and "nope" not in trace
    assert [s.label for s in trace.inputs] == ["input_1"]
    assert {s.kind for s in trace.sources} == {"input", "parameter"}
    assert [m.name for m in trace.modules] == ["<root>:1", "0:1", "1:1", "2:1"]
    with pytest.raises(tl.errors.LookupFailedError) as err:
        trace["relu_9"]
    assert err.value.code == "not_found" and "relu_1" in str(err.value)
    with pytest.raises(tl.errors.LookupFailedError) as err:
        trace[1.5]
    assert err.value.code == "bad_key"


def test_summary_table_lists_every_op():
    model, x = tutorial_model(), torch.randn(2, 4)
    text = str(tl.trace(model, x))
    lines = text.splitlines()
    assert lines[0].startswith("Trace: 3 ops")
    assert lines[1].split() == ["op", "function", "module", "call", "shape", "dtype"]
    assert lines[3].split() == ["linear_1", "linear", "0:1", "(2,", "3)", "float32"]
    assert lines[-1] == "outputs: linear_2"


# -- refusals and cleanup ---------------------------------------------------------------------


def test_refuses_torchscript():
    scripted = torch.jit.script(nn.Linear(2, 2))
    with pytest.raises(UnsupportedModelError) as err:
        tl.trace(scripted, torch.randn(1, 2))
    assert err.value.code == "torchscript_module"
    assert "trace the eager source module instead" in str(err.value)


def test_refuses_torch_compile():
    compiled = torch.compile(nn.Linear(2, 2))
    with pytest.raises(UnsupportedModelError) as err:
        tl.trace(compiled, torch.randn(1, 2))
    assert err.value.code == "compiled_module"
    assert "trace the eager source module instead" in str(err.value)


@pytest.mark.parametrize("where", ["submodule", "in_place", "submodule_in_place"])
def test_refuses_compiled_submodules_and_modules_compiled_in_place(where):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    if where == "submodule":
        model[0] = torch.compile(model[0])
    elif where == "in_place":
        model.compile()
    else:
        model[0].compile()
    with pytest.raises(UnsupportedModelError) as err:  # before Dynamo sees any of it
        tl.trace(model, torch.randn(1, 2))
    assert err.value.code == "compiled_module"
    assert "trace the eager source module instead" in str(err.value)


def test_refuses_exported_program():
    exported = torch.export.export(nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(UnsupportedModelError) as err:
        tl.trace(exported, torch.randn(1, 2))
    assert err.value.code == "exported_program"
    assert "trace the eager source module instead" in str(err.value)


def test_refuses_non_callable():
    with pytest.raises(UnsupportedModelError) as err:
        tl.trace(42, torch.randn(1))
    assert err.value.code == "not_callable"


class Explodes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        x = self.fc(x)
        raise ValueError("boom")


def test_mode_and_hooks_removed_after_exception():
    model = Explodes()
    with pytest.raises(ValueError, match="boom"):
        tl.trace(model, torch.randn(1, 2))
    assert _get_current_function_mode_stack() == []
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert not module_hooks._global_forward_hooks
    assert not module_hooks._global_forward_pre_hooks
    assert [op.func_name for op in tl.trace(tutorial_model(), torch.randn(1, 4))] == [
        "linear",
        "relu",
        "linear",
    ]


def test_garbage_collector_is_paused_during_capture_and_restored_on_every_exit():
    seen = []

    def probe(x):
        seen.append(gc.isenabled())
        return x * 2

    assert gc.isenabled()
    tl.trace(probe, torch.randn(2))
    with pytest.raises(ValueError, match="boom"):
        tl.trace(Explodes(), torch.randn(1, 2))
    assert seen == [False] and gc.isenabled()
    gc.disable()  # a caller that paused it itself keeps it paused
    try:
        tl.trace(probe, torch.randn(2))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_hooks_removed_after_success():
    model = tutorial_model()
    tl.trace(model, torch.randn(1, 4))
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert "forward" not in module.__dict__  # the capture's forward wrapper is gone
    assert not module_hooks._global_forward_hooks
    assert not module_hooks._global_forward_pre_hooks


def test_forward_wrappers_removed_after_an_exception_and_a_halt():
    model = Explodes()
    with pytest.raises(ValueError, match="boom"):
        tl.trace(model, torch.randn(1, 2))
    tl.trace(tutorial_model(), torch.randn(1, 4), stop_after=tl.func("relu"))
    tl.record(model.fc, torch.randn(1, 2))
    for module in model.modules():
        assert "forward" not in module.__dict__


def test_an_instance_forward_of_the_models_own_is_followed_and_put_back():
    """A submodule whose ``forward`` was set on the instance (patched by the user or by a
    library) is still a module call, and keeps its own forward afterwards."""
    model = tutorial_model()
    patched = model[1]

    def doubled_relu(x):
        return torch.relu(x) * 2

    patched.forward = doubled_relu
    trace = tl.trace(model, torch.randn(1, 4))
    assert patched.__dict__["forward"] is doubled_relu
    call = trace.modules["1:1"]
    assert [trace[label].func_name for label in call.ops] == ["relu", "mul"]
    assert call.outputs == ("mul_1",)


def test_a_forward_replaced_during_the_capture_is_left_as_replaced():
    """The model's own assignment wins over the capture's wrapper, during and after it."""

    class Replaces(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tutorial_model()

        def forward(self, x):
            self.inner[1].forward = torch.tanh
            return self.inner(x)

    model = Replaces()
    trace = tl.trace(model, torch.randn(1, 4))
    assert model.inner[1].__dict__["forward"] is torch.tanh
    assert [op.func_name for op in trace.ops] == ["linear", "tanh", "linear"]
    assert [c.address for c in trace.modules] == ["", "inner", "inner.0", "inner.2"]


def test_the_signature_of_a_wrapped_forward_is_the_modules_own():
    import inspect

    seen = []

    class Asks(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _Scaled()

        def forward(self, x):
            seen.append(list(inspect.signature(self.inner.forward).parameters))
            return self.inner(x, scale=torch.ones(3))

    tl.trace(Asks(), torch.randn(3))
    assert seen == [["x", "scale"]]


def test_a_submodule_called_through_its_forward_is_a_module_call():
    class Direct(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc.forward(x)

    trace = tl.trace(Direct(), torch.randn(1, 2))
    assert trace.modules["fc:1"].ops == ("linear_1",)


class _Scaled(nn.Module):
    """Takes a keyword tensor and writes into it in place before reading it."""

    def forward(self, x, *, scale):
        scale.mul_(2)
        return x * scale


class _KeywordCaller(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Scaled()

    def forward(self, x, s):
        s = s + 1
        return self.inner(x, scale=s)


def test_keyword_inputs_of_a_module_call_are_named_as_they_were_when_it_began():
    """A module's wrapped forward sees its keyword arguments as the call begins: named by
    the label they held then, even when the call writes into them."""
    trace = tl.trace(_KeywordCaller(), (torch.randn(3), torch.randn(3)))
    call = trace.modules["inner:1"]
    assert call.inputs == ("input_1", "add_1")  # positional first, then keyword
    assert trace["mul__1"].parents == ("add_1",)
    assert trace["mul_1"].parents == ("input_1", "mul__1")
    assert call.outputs == ("mul_1",)


class _OneInput(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


def test_a_one_input_module_called_by_keyword_names_its_input_as_it_began():
    """``module(x=t)``: the input given by keyword is named by the label it held when the
    call began, though the call wrote into it."""

    class Caller(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _OneInput()

        def forward(self, t):
            t = t + 0
            return self.inner(x=t)

    trace = tl.trace(Caller(), torch.randn(3))
    call = trace.modules["inner:1"]
    assert call.inputs == ("add_1",)
    assert trace["mul__1"].parents == ("add_1",)
    assert call.outputs == ("add_2",)
    assert torch.equal(trace["add_2"].out, trace["add_1"].out * 2 + 1)


def test_keyword_parameter_and_constant_inputs_of_a_module_call():
    weight = torch.randn(3)

    class Uses(nn.Module):
        def forward(self, x, *, w, unused):
            return x * w

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(3))
            self.inner = Uses()

        def forward(self, x):
            return self.inner(x, w=self.bias, unused=weight)

    trace = tl.trace(Outer(), torch.randn(3))
    inputs = trace.modules["inner:1"].inputs
    assert inputs[:2] == ("input_1", "bias")
    assert trace[inputs[2]].kind == "constant"
    assert torch.equal(trace[inputs[2]].out, weight)


def test_a_module_with_hooks_of_its_own_keeps_its_hooks_ops_where_they_ran():
    """Its pre-hook runs before the call begins (it hands the call its input) and its
    forward hook inside it (the call returns what the hook made of the output), as when
    every module had hooks of its own."""
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model[0].register_forward_pre_hook(lambda module, args: (args[0] + 1,))
    model[0].register_forward_hook(lambda module, args, out: out * 3)
    x = torch.randn(1, 2)
    trace = tl.trace(model, x)
    assert [(op.func_name, op.module) for op in trace] == [
        ("add", ""), ("linear", "0"), ("mul", "0"), ("relu", "1"),
    ]  # fmt: skip
    assert trace.modules["0:1"].inputs == ("add_1",)
    assert trace.modules["0:1"].outputs == ("mul_1",)
    assert torch.equal(trace.output, model(x))


def test_reentrant_trace_is_refused():
    def inner(x):
        return tl.trace(torch.relu, x)

    with pytest.raises(tl.errors.ReentrantCaptureError) as err:
        tl.trace(inner, torch.randn(2))
    assert err.value.code == "reentrant_capture"
    assert _get_current_function_mode_stack() == []


def test_bad_kwargs_type():
    with pytest.raises(tl.errors.InvalidArgumentError) as err:
        tl.trace(torch.relu, torch.randn(2), kwargs=[1])
    assert err.value.code == "bad_kwargs"


def test_import_does_not_patch_torch():
    import subprocess
    import sys

    code = (
        "import torch, torch.nn.functional as F\n"
        "before = (torch.Tensor.__add__, F.linear, torch.relu, torch.nn.Module.__call__)\n"
        "import torchlens\n"
        "after = (torch.Tensor.__add__, F.linear, torch.relu, torch.nn.Module.__call__)\n"
        "from torch.overrides import _get_current_function_mode_stack as stack\n"
        "from torch.nn.modules import module as m\n"
        "assert before == after, 'torch functions were replaced'\n"
        "assert stack() == [], 'a function mode is active after import'\n"
        "assert not m._global_forward_hooks and not m._global_forward_pre_hooks\n"
        "print('clean')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "clean", result.stderr


def test_module_walk_equals_torchs_named_modules():
    """The capture's own walk gives what ``named_modules()`` gives: same addresses, same
    modules, same order, a shared module once, ``None`` children skipped, and an override
    of ``named_modules`` asked itself."""
    from torchlens.capture.walk import named_modules

    shared = nn.Linear(2, 2)
    tree = nn.Sequential(
        nn.Sequential(shared, nn.ReLU()),
        nn.ModuleDict({"a": shared, "b": nn.Sequential(nn.Tanh(), nn.Linear(2, 2))}),
        nn.LSTM(2, 2),
    )
    tree.register_module("empty", None)
    expected = list(tree.named_modules())
    assert [(a, id(m)) for a, m in named_modules(tree)] == [(a, id(m)) for a, m in expected]

    class OwnWalk(nn.Sequential):
        def named_modules(self, *args, **kwargs):
            yield "custom", self

    assert named_modules(nn.Sequential(OwnWalk(nn.ReLU())))[0][0] == ""
    assert [a for a, _ in named_modules(OwnWalk(nn.ReLU()))] == ["custom"]


def test_owned_tensors_are_named_as_named_parameters_and_named_buffers_name_them():
    from torchlens.capture.walk import named_modules, owned_tensors

    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.BatchNorm1d(2), nn.Sequential(shared, nn.BatchNorm1d(2)))
    owned = owned_tensors(named_modules(model))
    expected = {id(t): ("parameter", a) for a, t in model.named_parameters()}
    expected.update({id(t): ("buffer", a) for a, t in model.named_buffers()})
    assert {k: v[:2] for k, v in owned.items()} == expected
    assert all(v[2] is t for v, t in ((owned[id(t)], t) for t in model.parameters()))


def test_walk_at_every_address_equals_torchs_walk_without_removing_duplicates():
    """``every_address`` and ``named_tensors`` give what ``named_modules``,
    ``named_parameters`` and ``named_buffers`` give with ``remove_duplicate=False``: a shared
    module (and its tensors) at each of its addresses, in torch's order; a model that
    overrides the method is asked itself."""
    from torchlens.capture.walk import every_address, named_tensors

    shared = nn.Linear(2, 2)
    tree = nn.Sequential(
        nn.Sequential(shared, nn.BatchNorm1d(2)),
        nn.ModuleDict({"a": shared, "b": nn.Sequential(nn.Tanh(), nn.Linear(2, 2))}),
    )
    tree.register_module("empty", None)
    tree[0][1].register_buffer("nothing", None)
    expected = list(tree.named_modules(remove_duplicate=False))
    assert [(a, id(m)) for a, m in every_address(tree)] == [(a, id(m)) for a, m in expected]
    assert "1.a.weight" in named_tensors(tree, "_parameters")  # the shared one, again
    for members, method in (("_parameters", "named_parameters"), ("_buffers", "named_buffers")):
        found = named_tensors(tree, members)
        torchs = dict(getattr(tree, method)(remove_duplicate=False))
        assert list(found) == list(torchs) and all(found[k] is torchs[k] for k in found)

    class OwnParameters(nn.Sequential):
        def named_parameters(self, *args, **kwargs):
            yield "custom", shared.weight

    assert list(named_tensors(OwnParameters(nn.Linear(2, 2)), "_parameters")) == ["custom"]
    with pytest.raises(tl.errors.InvalidArgumentError) as caught:
        named_tensors(tree, "_modules")
    assert caught.value.code == "bad_members"


def test_saved_values_are_served_detached_and_faithful():
    """Values are kept undetached during capture (see builder._save) and detached when
    first read: what a reader gets holds no autograd graph and equals the value computed."""
    model = tutorial_model()  # parameters require grad: every op's output has a graph
    x = torch.randn(2, 4)
    trace = tl.trace(model, x)
    hidden = model[1](model[0](x)).detach()
    for op in trace:
        out = op.out
        assert not out.requires_grad and out.grad_fn is None
        assert out is op.out  # detached once, then served as is
    assert torch.equal(trace["relu_1"].out, hidden)
    weight = trace["0.weight"].out
    assert type(weight) is torch.Tensor and not weight.requires_grad
    assert torch.equal(weight, model[0].weight.detach())
    assert trace.output.requires_grad  # what the model returned is left as it was


@pytest.mark.parametrize("read_first", [True, False])
def test_parameter_edited_after_capture_is_refused_read_or_not(read_first):
    model = tutorial_model()
    trace = tl.trace(model, torch.randn(2, 4))
    if read_first:
        trace["0.weight"].out
    with torch.no_grad():
        model[0].weight.add_(1.0)  # an optimizer step, after capture
    with pytest.raises(PayloadUnavailableError) as caught:
        trace["0.weight"].out
    assert caught.value.code == "payload_overwritten"


class GathersAndFrees(nn.Module):
    """FSDP in small: the weight is gathered into a flat buffer for the forward, read
    through a view of it, and the buffer's memory is released after the forward (its
    storage resized to 0, which moves no version counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.shard = nn.Parameter(torch.randn(16))
        self.register_forward_hook(lambda module, args, out: module.gathered.resize_(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.gathered = torch.empty(16).untyped_storage()
        flat = torch.empty(0).set_(self.gathered).copy_(self.shard.detach())
        return x @ flat.view(4, 4)


def test_value_whose_memory_was_released_after_capture_is_refused_not_read():
    model = GathersAndFrees()
    x = torch.randn(2, 4)
    trace = tl.trace(model, x)
    released = [op for op in trace.ops if op.func_name == "view"]
    assert released
    for op in released:
        with pytest.raises(PayloadUnavailableError) as caught:
            op.out  # reading it would read freed memory (a segfault under FSDP2)
        assert caught.value.code == "payload_released"
        assert "reshard_after_forward=False" in str(caught.value)
    torch.testing.assert_close(trace.ops[-1].out, x @ model.shard.detach().view(4, 4))
    status = tl.replay(model, (x,))
    assert status.state == "unverified", status
    assert "was released after capture" in str(status)
