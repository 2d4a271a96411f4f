"""The capture's parts, each on its own contract (docs/capture.md, "One capture path"): the
live map's entries, the write log's choice of a refresh's writes, and the sources."""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from torchlens.capture.builder import TraceBuilder
from torchlens.capture.live import LiveEntry, LiveVersions, live_entry
from torchlens.capture.sources import TRANSFORM_RESULT


def test_a_live_entry_names_its_fields_and_does_not_keep_its_tensor():
    tensor = torch.ones(3)
    entry = live_entry(tensor, "relu_1", tensor._version, 7)
    assert isinstance(entry, LiveEntry)
    assert entry() is tensor
    assert (entry.label, entry.version, entry.calls) == ("relu_1", 0, 7)
    del tensor
    assert entry() is None  # a weak reference: the map never keeps a value alive


def test_the_recording_and_the_trace_fill_the_live_map_with_live_entries():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    live = LiveVersions()
    live.remember(x)
    assert type(live.entries[id(x)]) is LiveEntry and live.entries[id(x)].label is None
    builder = TraceBuilder()
    builder.add_modules([("", lin)])
    label = builder.add_input("x", x)
    entry = builder.live.entries[id(x)]
    assert type(entry) is LiveEntry and (entry.label, entry.version) == (label, x._version)


def _write(live: LiveVersions, tensor: torch.Tensor, label: str, region: tuple) -> None:
    live.calls += 1
    live.wrote(("cpu", 1), label, region, tensor.dtype)


def test_the_write_log_keeps_the_writes_a_refresh_redoes_and_leaves_moot_ones_out(monkeypatch):
    monkeypatch.setattr("torchlens.capture.live.storage_key", lambda tensor: ("cpu", 1))
    tensor = torch.zeros(4, 4)
    whole = ((4, 4), (4, 1), 0)
    row0, row1 = ((1, 4), (4, 1), 0), ((1, 4), (4, 1), 4)
    live = LiveVersions()
    _write(live, tensor, "before_1", row0)  # before the stale value: not carried
    since = live.calls
    _write(live, tensor, "stale_1", row1)  # the stale value's own write: not a parent
    _write(live, tensor, "copy__1", row0)
    _write(live, tensor, "add__1", row1)
    _write(live, tensor, "mul__1", row0)  # the same place as copy__1: that one is moot
    writes, covered, count = live.writes_since(tensor, "stale_1", since, whole)
    assert writes == [("add__1", row1), ("mul__1", row0)]
    assert (covered, count) == (False, 3)
    _write(live, tensor, "zero__1", whole)  # covers the whole value: every earlier one moot
    _write(live, tensor, "add__2", row1)
    writes, covered, count = live.writes_since(tensor, "stale_1", since, whole)
    assert writes == [("zero__1", whole), ("add__2", row1)]
    assert (covered, count) == (True, 5)


def test_a_write_without_a_region_is_kept_and_never_makes_another_moot(monkeypatch):
    monkeypatch.setattr("torchlens.capture.live.storage_key", lambda tensor: ("cpu", 1))
    tensor = torch.zeros(2)
    live = LiveVersions()
    _write(live, tensor, "a_1", None)
    _write(live, tensor, "b_1", None)
    writes, covered, count = live.writes_since(tensor, "x", 0, ((2,), (1,), 0))
    assert (writes, covered, count) == ([("a_1", None), ("b_1", None)], False, 2)


def test_the_sources_name_weights_by_address_and_constants_by_how_they_were_seen():
    lin = nn.Linear(4, 4)
    builder = TraceBuilder()
    builder.add_modules([("", lin), ("lin", lin)])
    assert builder.named_modules == [("", lin), ("lin", lin)]
    x = torch.randn(2, 4)
    assert builder.add_input("x", x) == "input_1"
    assert builder.add_input("again", x) == "input_1"  # the same tensor twice: one source
    assert builder.label_of(lin.weight) == "weight"  # the first address named_parameters gives
    assert builder.label_of(lin.weight) == "weight"
    with torch.no_grad():
        first = builder.label_of(torch.ones(4))
    builder.note_transform_call()
    second = builder.label_of(torch.zeros(4))
    records = {source.label: source for source in builder.sources.records}
    assert [(s.kind, s.path) for s in records.values()] == [
        ("input", "x"),
        ("parameter", "weight"),
        ("constant", "closure"),
        ("constant", TRANSFORM_RESULT),
    ]
    assert builder.sources.without_grad == [first] and second != first
    assert builder.sources.model_buffers == []


def test_a_builder_holds_no_reference_cycle_through_its_parts():
    lin = nn.Linear(4, 4)
    builder = TraceBuilder()
    builder.add_modules([("", lin)])
    builder.add_input("x", torch.randn(2, 4))
    builder.label_of(lin.weight)
    builder.label_of(torch.ones(4))
    gc.disable()
    try:
        dead = weakref.ref(builder)
        del builder
        assert dead() is None  # freed by its count, before any garbage collection
    finally:
        gc.enable()
