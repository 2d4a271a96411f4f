"""The perturbation arm never crashes the process: the size sweep of issue 36.

``tl.replay`` validates nn.RNN, nn.LSTM and nn.GRU (one and two layers, bidirectional,
LSTM's proj_size, both layouts), RNNCell/LSTMCell/GRUCell loops, at hidden sizes 8 to 512
and batches 1 and 2, and a model calling each function a rule of
:data:`~torchlens.replay.cut_rules.CUT_RULES` names, at sizes where torch switches kernels.
Each group runs in a child process (``tests/_cut_sweep_worker.py``), two at a time, so a
kernel that crashes fails a test instead of the run; the crashed group is then rerun one
case per process to name the case. Every case must end ``passed``, and every function a
rule names must have been run at a cut point (a rule goes in the table with a test that
runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from torchlens.replay.cut_rules import CUT_RULES, VALUE_RULES, cut_points, rule_for

WORKER = Path(__file__).resolve().parent / "_cut_sweep_worker.py"
sys.path.insert(0, str(WORKER.parent))
import _cut_sweep_worker as worker  # noqa: E402

GROUPS = ("lstm", "gru", "ops", "rnn", "cells")  # the longest first: two run at a time
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER.parents[1]), ENV.get("PYTHONPATH")]))


def _child(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-X", "faulthandler", str(WORKER), *args]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=900)


def _run_group(group: str) -> dict:
    """The group's verdicts and cut functions; after a crash, each case in its own process
    (a crashed case's verdict names the signal and the last lines of its stderr)."""
    done = _child(group)
    if done.returncode == 0:
        return json.loads(done.stdout.splitlines()[-1])
    verdicts, cut = {}, set()
    for name in worker.cases(group):
        one = _child(group, name)
        if one.returncode == 0:
            result = json.loads(one.stdout.splitlines()[-1])
            verdicts.update(result["verdicts"])
            cut.update(result["cut"])
        else:
            lines = one.stderr.strip().splitlines()
            fatal = next((i for i, line in enumerate(lines) if "Fatal Python" in line), None)
            # faulthandler's error and the innermost frames, else the last lines
            shown = lines[fatal : fatal + 6] if fatal is not None else lines[-8:]
            verdicts[name] = f"crashed (exit {one.returncode}): {' | '.join(shown)}"
    return {"verdicts": verdicts, "cut": sorted(cut)}


@pytest.fixture(scope="module")
def sweep() -> dict[str, dict]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(GROUPS, pool.map(_run_group, GROUPS)))


@pytest.mark.parametrize("group", GROUPS)
def test_every_case_of_the_sweep_validates_passed_in_a_child_process(sweep, group):
    verdicts = sweep[group]["verdicts"]
    assert set(verdicts) == set(worker.cases(group))
    bad = {name: verdict for name, verdict in verdicts.items() if verdict != "passed"}
    assert not bad, json.dumps(bad, indent=1)


def test_every_function_a_cut_rule_names_is_run_at_a_cut_point(sweep):
    cut = set().union(*(set(result["cut"]) for result in sweep.values()))
    named = {name for rule in CUT_RULES for name in rule.functions}
    assert named - cut == set()
    for rule in CUT_RULES:  # a tagged family: some of its members
        if rule.tag is not None:
            members = {name for name in cut if rule_for(name) is rule}
            assert len(members) >= 3, (rule.name, members)
    # the whole-sequence recurrent kernels are never cut (probed at recorded shapes)
    assert not cut & {"gru", "lstm", "rnn_tanh", "rnn_relu"}
    assert {"gru_cell", "lstm_cell", "rnn_tanh_cell"} <= cut  # batched cells are


def test_the_issue_36_gru_validates_passed_in_a_child_process():
    code = (
        "import torch, torch.nn as nn, torchlens as tl; torch.manual_seed(0); "
        "m = nn.GRU(256, 256, batch_first=True).eval(); "
        "print(tl.replay(m, torch.randn(2, 8, 256)).state)"
    )
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["passed"]


def test_a_call_no_rule_names_gets_no_cut_point():
    x = torch.randn(2, 8, 256)
    assert cut_points(torch.gru, "gru", [x]) == ()
    assert cut_points(torch.lstm, "lstm", [x]) == ()
    assert cut_points(lambda t: t, "linear", [x]) == ()  # not torch's own function
    assert cut_points(None, "refresh", [x]) == ()
    assert cut_points(torch.gru_cell, "gru_cell", [x[0, 0]]) == ()  # an unbatched cell
    assert cut_points(torch.gru_cell, "gru_cell", [x[0]]) == ((2, False), (1, False))
    assert cut_points(torch.Tensor.add, "add", [x]) == rule_for("add").points
    assert rule_for("add").name == "pointwise" and rule_for("sum").name == "reductions"
    assert rule_for("no_such_function") is None and rule_for("__getitem__") is None


def test_docs_state_every_cut_rule_and_the_functions_it_names():
    text = (WORKER.parents[1] / "docs" / "validation.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for rule in CUT_RULES:
        row = next((line for line in rows if line.startswith(f"| {rule.name} |")), None)
        assert row is not None, rule.name
        for name in rule.functions:  # named whole, or as conv1d/`2d` and adaptive pools
            stem = name.rstrip("123d").rstrip("_")
            assert name in row or stem in row, (rule.name, name)
    for change, _ in VALUE_RULES:  # the calls of changed values: "perturbed parent (...)"
        assert any(line.startswith(f"| {change.split(' (')[0]} ") for line in rows), change
