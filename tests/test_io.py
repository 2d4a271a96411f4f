"""Saving and loading traces, and streaming capture: round trips are exact."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

try:
    from tests._trace_compare import assert_bits_equal, assert_same_trace
    from tests.models import ZOO_BY_NAME, zoo_params
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _trace_compare import assert_bits_equal, assert_same_trace
    from models import ZOO_BY_NAME, zoo_params

import torchlens as tl
from torchlens.errors import PayloadUnavailableError, TraceFileError
from torchlens.io._funcs import UnresolvableFunc, func_ref, resolve_func

_UNINITIALISED = {"empty", "empty_like", "new_empty"}  # values differ from run to run


def _trace(case, **kwargs):
    model = case.make_model()
    args, kw = case.make_inputs()
    torch.manual_seed(0)
    return tl.trace(model, args, kw, **kwargs)


def _files(root) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


@pytest.mark.parametrize("case", zoo_params())
def test_round_trip_is_exact(case, tmp_path):
    trace = _trace(case)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert_same_trace(loaded, trace)


_STREAM_CASES = [  # one of each kind of trouble: in-place, views, RNG, buffers, dtypes
    "mlp_tiny", "inplace_setitem", "inplace_on_view", "strided_views", "dropout_train",
    "random_in_forward", "batchnorm_train", "split_chunk_unbind", "lstm", "fft_complex",
    "bfloat16_model", "int_bool_arithmetic", "created_tensors", "returns_parameter",
    "nested_outputs", "empty_tensors",
]  # fmt: skip


@pytest.mark.parametrize("case", [p for p in zoo_params() if p.id in _STREAM_CASES])
def test_streamed_capture_matches_in_memory_capture(case, tmp_path):
    in_memory = _trace(case)
    streamed = _trace(case, stream_to=tmp_path / "s")
    loaded = tl.load(tmp_path / "s")
    assert not hasattr(streamed.store, "values")  # nothing kept in memory
    for result in (streamed, loaded):
        assert_same_trace(result, in_memory, payloads=False)
        for record in [*in_memory.sources, *in_memory.ops]:
            got = result[record.label]
            assert got.has_out == record.has_out, record.label
            if record.has_out and getattr(record, "func_name", "") not in _UNINITIALISED:
                assert_bits_equal(got.out, record.out, record.label)


@pytest.mark.parametrize("name", ["mlp_tiny", "dropout_train", "lstm", "fft_complex"])
def test_same_model_and_input_give_the_same_bytes(name, tmp_path):
    case = ZOO_BY_NAME[name]
    first = _files(tl.save(_trace(case), tmp_path / "a"))
    second = _files(tl.save(_trace(case), tmp_path / "b"))
    assert first == second
    for folder in ("c", "d"):
        _trace(case, stream_to=tmp_path / folder)
    assert _files(tmp_path / "c") == _files(tmp_path / "d")


def test_saving_over_a_trace_replaces_it(tmp_path):
    small = tl.trace(torch.nn.Linear(2, 2), torch.randn(1, 2))
    big = tl.trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.randn(1, 2))
    tl.save(big, tmp_path / "t")
    small.save(tmp_path / "t")  # the method and the function are the same verb
    assert tl.load(tmp_path / "t").labels == ["linear_1"]


def test_every_dtype_and_layout_comes_back_bit_identical(tmp_path):
    x = torch.randn(4, 6)

    def forward(x):
        nan = x.masked_fill(x > 0, float("nan"))
        return (
            nan,
            x.to(torch.bfloat16) * 3,
            x.half() - 1,
            x.double(),
            (x * 100).to(torch.int32),
            (x * 100).to(torch.int16),
            (x * 10).to(torch.int8),
            (x.abs() * 10).to(torch.uint8),
            x > 0,
            torch.complex(x, -x) * 2,
            torch.complex(x, x).to(torch.complex128).conj(),
            x.t(),  # non-contiguous
            x[:, ::2],  # strided
            x.sum(),  # 0-d
            x[:0],  # empty
        )

    trace = tl.trace(forward, x)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert_same_trace(loaded, trace)
    dtypes = {op.out.dtype for op in loaded}
    assert {torch.bfloat16, torch.float16, torch.complex64, torch.bool, torch.uint8} <= dtypes
    conj = loaded.ops[-5].out
    assert conj.dtype == torch.complex128 and not conj.is_conj()


def test_columns_of_zero_or_one_row_save_and_stream(tmp_path):
    # boxes[:, 0] of a detector that found 0 or 1 boxes: contiguous, with a stride of 4
    def forward(boxes):
        return boxes[:, 0] * 2, boxes[:1, 1] + 1

    boxes = torch.randn(0, 4), torch.randn(3, 4)
    for i, value in enumerate(boxes):
        trace = tl.trace(forward, value)
        getitem = trace["getitem_1" if i == 0 else "getitem_2"].out
        assert getitem.numel() == i and getitem.stride() == (4,) and getitem.is_contiguous()
        assert_same_trace(tl.load(tl.save(trace, tmp_path / f"t{i}")), trace)
        with torch.no_grad():
            streamed = tl.trace(forward, value, stream_to=tmp_path / f"s{i}")
        assert_same_trace(tl.load(tmp_path / f"s{i}"), streamed)


def test_values_load_lazily_and_survive_edits(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    trace = tl.trace(model, torch.randn(2, 3))
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert set(loaded.store._cache) == {"linear_2"}  # only the model's output was read
    assert_bits_equal(loaded.output, trace.output)
    value = loaded["relu_1"].out
    assert isinstance(value, torch.Tensor) and "relu_1" in loaded.store._cache
    value.add_(100)  # editing what was handed out does not change the trace
    assert_bits_equal(loaded["relu_1"].out, trace["relu_1"].out)


def test_output_structure_is_rebuilt(tmp_path):
    case = ZOO_BY_NAME["nested_outputs"]
    trace = _trace(case)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert type(loaded.output) is type(trace.output)
    assert loaded.output.keys() == trace.output.keys()


def test_structure_only_saves_no_values(tmp_path):
    case = ZOO_BY_NAME["mlp_tiny"]
    trace = _trace(case, structure_only=True)
    root = tl.save(trace, tmp_path / "t")
    loaded = tl.load(root)
    assert_same_trace(loaded, trace, payloads=False)
    assert loaded.structure_only
    with pytest.raises(PayloadUnavailableError) as err:
        loaded.ops[0].out
    assert err.value.code == "structure_only"
    assert loaded.output is None and "output_unavailable" in loaded.meta
    assert len((root / "payloads.safetensors").read_bytes()) < 64  # an empty file
    streamed = _trace(case, structure_only=True, stream_to=tmp_path / "s")
    with pytest.raises(PayloadUnavailableError) as err:
        streamed.ops[0].out
    assert err.value.code == "structure_only"
    assert os.listdir(tmp_path / "s" / "payloads") == []


def test_streaming_capture_that_fails_leaves_an_incomplete_trace(tmp_path):
    def broken(x):
        torch.relu(x) * 2
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tl.trace(broken, torch.randn(3), stream_to=tmp_path / "s")
    assert os.listdir(tmp_path / "s" / "payloads")  # values were written as produced
    with pytest.raises(TraceFileError) as err:
        tl.load(tmp_path / "s")
    assert err.value.code == "incomplete"
    good = tl.trace(torch.relu, torch.randn(3), stream_to=tmp_path / "s")  # reusable
    assert tl.load(tmp_path / "s").labels == good.labels == ["relu_1"]


def test_save_refuses_to_overwrite_user_files(tmp_path):
    trace = tl.trace(torch.relu, torch.randn(3))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "file").write_text("x")
    for target in (tmp_path / "mine", tmp_path / "file"):
        with pytest.raises(TraceFileError) as err:
            trace.save(target)
        assert err.value.code == "path_exists"
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    loaded = tl.load(trace.save(tmp_path / "t"))
    with pytest.raises(TraceFileError) as err:
        loaded.save(tmp_path / "t")  # it reads its values from there
    assert err.value.code == "path_exists"
    tl.load(loaded.save(tmp_path / "copy"))  # a loaded trace saves elsewhere


def test_unrepresentable_calls_load_without_a_function(tmp_path):
    gen = torch.Generator().manual_seed(0)

    def forward(x):
        return x + torch.rand(x.shape, generator=gen)  # a Generator has no file form

    trace = tl.trace(forward, torch.zeros(2))
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    rand = loaded.ops[0]
    assert rand.func is None and "Generator" in rand.meta["replay_unavailable"]
    assert loaded.ops[1].func is trace.ops[1].func


def test_functions_resolve_only_to_torch_operators():
    for func in (torch.nn.functional.relu, torch.Tensor.add, torch.relu, torch.fft.rfft):
        assert resolve_func(func_ref(func)) is func
    getter = resolve_func({"kind": "getter", "name": "T", "ns": "torch.Tensor"})
    assert torch.equal(
        getter(torch.eye(2) + torch.tensor([[0, 1], [0, 0]])), torch.tensor([[1.0, 0], [1, 1]])
    )
    hostile = [
        {"name": "load", "ns": "torch"},
        {"name": "save", "ns": "torch"},
        {"name": "manual_seed", "ns": "torch"},
        {"name": "set_num_threads", "ns": "torch"},
        {"name": "system", "ns": "os"},
        {"name": "__import__", "ns": "torch"},
        {"name": "nn.functional.relu", "ns": "torch"},
        {"name": "__class__", "ns": "torch.Tensor"},
        {"kind": "getter", "name": "__dict__", "ns": "torch.Tensor"},
        "torch.relu",
    ]
    for ref in hostile:
        with pytest.raises(UnresolvableFunc):
            resolve_func(ref)


@pytest.mark.parametrize(
    "name",
    ["mlp_tiny", "dropout_train", "lstm", "conv2d_net", "fft_complex", "inplace_setitem"],
)
def test_loaded_trace_passes_payload_only_replay(name, tmp_path):
    from torchlens.replay import check_trace

    case = ZOO_BY_NAME[name]
    trace = _trace(case)
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    before, after = check_trace(trace), check_trace(loaded)
    assert after.state == "passed", after
    assert str(after) == str(before)
    streamed = _trace(case, stream_to=tmp_path / "s")
    assert check_trace(streamed).state == "passed"


def test_loaded_trace_checks_against_a_fresh_reference(tmp_path):
    from torchlens.replay import check_trace

    model, x = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()), torch.randn(2, 4)
    loaded = tl.load(tl.save(tl.trace(model, x), tmp_path / "t"))
    assert check_trace(loaded, reference=model(x)).state == "passed"
    assert check_trace(loaded, reference=model(x) + 1).state == "failed"
