"""The per-item cost benchmark (``benchmarks/bench_breakdown.py``): its models differ from
their pairs in the one item they price, and a short run prints every item."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import torchlens as tl

try:
    from tests._benchmarks import load_benchmark
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _benchmarks import load_benchmark

bench = load_benchmark("bench_breakdown")


def _counts(model):
    trace = tl.trace(model, torch.randn(1, bench.WIDTH))
    parameters = sum(source.kind == "parameter" for source in trace.sources)
    return len(trace.ops), len(trace.modules), parameters


def test_each_model_differs_from_its_pair_in_its_item_only():
    n = 5
    models = bench.item_models(n)
    differences = {}
    for item, (model, pair) in models.items():
        if pair is not None:
            ops, calls, parameters = _counts(model)
            pair_ops, pair_calls, pair_parameters = _counts(pair)
            differences[item] = (ops - pair_ops, calls - pair_calls, parameters - pair_parameters)
    assert differences == {
        "op": (n, 0, 0),
        "functional op": (0, 0, 0),  # the same ops, reached another way
        "module call": (0, n, 0),
        "wrapped module": (0, 0, 0),  # wrapped, never called: no record at all
        "parameter": (0, 0, n - 1),
    }
    functional, direct = models["functional op"]
    x = torch.randn(1, bench.WIDTH)
    assert [op.func_name for op in tl.trace(functional, x)] == ["relu"] * n
    assert torch.equal(functional(x), direct(x))
    idle, idle_pair = models["wrapped module"]
    assert len(list(idle.modules())) - len(list(idle_pair.modules())) == n
    assert _counts(models["fixed"][0]) == (1, 1, 0)  # one op, the root call, no parameter


def test_a_short_run_prints_a_row_per_item(capsys):
    assert bench.main(["--items", "3", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line[:16].strip(): line[16:].split() for line in lines[2:]}
    assert list(rows) == list(bench.ITEMS)
    for cells in rows.values():
        assert len(cells) == 3 and all(float(cell) == float(cell) for cell in cells)


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--items", "0"])
    assert stop.value.code == 2
    assert "at least 1" in capsys.readouterr().err
