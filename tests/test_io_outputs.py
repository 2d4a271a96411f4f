"""Saved outputs come back with their structure: mappings, namedtuples and dataclasses."""

from __future__ import annotations

import dataclasses
import sys
from collections import OrderedDict, namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

try:
    from tests._trace_compare import assert_same_trace
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _trace_compare import assert_same_trace

import torchlens as tl

Pair = namedtuple("Pair", ["hidden", "logits"])


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    scale: float = 1.0


class Output(OrderedDict):
    """Like Hugging Face's ModelOutput: an OrderedDict subclass whose fields are required."""

    def __init__(self, *, logits, cache) -> None:
        super().__init__(logits=logits, cache=cache)


class Plain(dict):
    pass


class _Returns(nn.Module):
    def __init__(self, make) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.make = make

    def forward(self, x):
        return self.make(self.linear(x), torch.relu(x))


def _round_trip(make, tmp_path):
    torch.manual_seed(0)
    trace = tl.trace(_Returns(make), torch.randn(3, 4))
    loaded = tl.load(tl.save(trace, tmp_path / "t"))
    assert_same_trace(loaded, trace)
    return trace.output, loaded


def test_dict_subclasses_load_as_plain_mappings(tmp_path):
    out, loaded = _round_trip(lambda y, h: OrderedDict(logits=y, hidden=h), tmp_path / "a")
    assert type(loaded.output) is OrderedDict and list(loaded.output) == ["logits", "hidden"]
    assert torch.equal(loaded.output["logits"], out["logits"])
    assert "output_unavailable" not in loaded.meta
    _, loaded = _round_trip(lambda y, h: Output(logits=y, cache=None), tmp_path / "b")
    assert type(loaded.output) is OrderedDict and list(loaded.output) == ["logits", "cache"]
    assert loaded.output["cache"] is None and "output_unavailable" not in loaded.meta
    out, loaded = _round_trip(lambda y, h: Plain(b=h, a=[y, 2]), tmp_path / "c")
    assert type(loaded.output) is dict and list(loaded.output) == ["b", "a"]
    assert torch.equal(loaded.output["a"][0], out["a"][0]) and loaded.output["a"][1] == 2


def test_objects_inside_an_output_load_as_none(tmp_path):
    out, loaded = _round_trip(lambda y, h: Output(logits=y, cache=object()), tmp_path)
    assert list(loaded.output) == ["logits", "cache"] and loaded.output["cache"] is None
    assert torch.equal(loaded.output["logits"], out["logits"])
    assert "object" in loaded.meta["output_unavailable"]


def test_namedtuples_and_dataclasses_load_as_look_alikes(tmp_path):
    out, loaded = _round_trip(lambda y, h: (Pair(h, y), y.max(-1)), tmp_path / "a")
    pair, top = loaded.output
    assert type(pair).__name__ == "Pair" and pair._fields == ("hidden", "logits")
    assert torch.equal(pair.logits, out[0].logits) and torch.equal(pair.hidden, out[0].hidden)
    assert type(top).__name__ == "max" and top._fields == ("values", "indices")
    assert torch.equal(top.indices, out[1].indices)
    out, loaded = _round_trip(lambda y, h: Result(y, scale=0.5), tmp_path / "b")
    assert dataclasses.is_dataclass(loaded.output) and type(loaded.output).__name__ == "Result"
    assert torch.equal(loaded.output.logits, out.logits) and loaded.output.scale == 0.5


def test_hugging_face_model_output_loads_as_an_ordered_dict(tmp_path):
    outputs = pytest.importorskip("transformers.modeling_outputs")

    def make(y, h):
        return outputs.CausalLMOutputWithPast(logits=y, hidden_states=(h, h))

    out, loaded = _round_trip(make, tmp_path)
    assert type(loaded.output) is OrderedDict
    assert list(loaded.output) == list(out.keys()) == ["logits", "hidden_states"]
    assert torch.equal(loaded.output["logits"], out.logits)
    assert torch.equal(loaded.output["hidden_states"][1], out.hidden_states[1])
