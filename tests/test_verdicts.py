"""Verdicts a user can act on (issue 50): hidden dependencies are ``incomplete``, not
``failed``; validation always returns (its extra forwards run under a budget); escaped
numbers are probed both ways; hidden edges are direct ones."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import torchlens as tl
from torchlens.replay.escape_values import (
    UNCHANGED,
    Budget,
    PerturbingMode,
    Plan,
    perturbed_down,
)
from torchlens.replay.status import ReplayStatus
from torchlens.trace import HiddenEdge

ROOT = Path(__file__).resolve().parent.parent


def _validated_in_a_child(name: str, timeout: float = 240) -> list[str]:
    """Validate ``tests._hangs.<name>`` in a child process, killed past ``timeout``
    seconds (the regression these tests guard against is a validation that never ends)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tests._hangs", name],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # (item 7: nothing printed of its own)
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    "name, why",
    [("Converge", "changed how long the run is (it was stopped past"),
     ("LongerByValue", "changed how long the run is (it was stopped past"),
     ("ValueAssert", "raised AssertionError (negative activation)"),
     ("CountDown", "changed which ops ran")],
)  # fmt: skip
def test_validation_returns_on_loops_and_asserts_a_perturbed_value_changes(name, why):
    state, *decisions = _validated_in_a_child(name)
    assert state == "passed"
    assert any(why in decision for decision in decisions), decisions


def test_the_budget_is_a_small_multiple_of_the_ground_truth_run():
    budget = Budget.of(ops=100, escapes=3, seconds=0.5)
    assert (budget.ops, budget.escapes) == (1_400, 76)
    assert budget.light == pytest.approx(6.0)
    budget.timed_capture(2.0)
    assert budget.captured == pytest.approx(10.0)


def _min_threshold(x):
    return (x > x.min().item()).float() * x


def _median_mask(x):
    return x * (x > x.median().item())


@pytest.mark.parametrize(
    "fn, edge",
    [(_min_threshold, "min_1 -> gt_1 via .item()"),
     (_median_mask, "median_1 -> gt_1 via .item()")],
)  # fmt: skip
def test_a_threshold_equal_to_an_escaped_value_is_found_by_probing_both_ways(fn, edge):
    torch.manual_seed(0)
    status = tl.replay(fn, torch.randn(6))
    assert status.state == "incomplete", str(status)
    assert [str(e).split(" at ")[0] for e in status.hidden_edges] == [edge]


@pytest.mark.parametrize(
    "use, taken",
    [(lambda x, w: x > w, True),  # a threshold
     (lambda x, w: torch.full((2,), w), True),  # a fill value
     (lambda x, w: x[:, : int(w)], False),  # a size made of it in Python: not watched
     (lambda x, w: torch.nan_to_num(x, posinf=w), True),  # a keyword
     (lambda x, w: x * 2 if w < 1e9 else x, False),  # only Python compares it
     (lambda x, w: x * 2, False)],  # read and dropped
    ids=["threshold", "fill", "python_made", "keyword", "python_only", "dropped"],
)  # fmt: skip
def test_only_numbers_that_come_back_into_torch_are_probed_the_other_way(use, taken):
    # the second direction costs a forward: it is run for a number a torch call takes
    # back (where a threshold equal to it decides elements), not for a fine-grained float
    # only Python reads
    torch.manual_seed(0)
    mode = PerturbingMode(Plan(None))
    x = torch.rand(3, 4) + 1
    with mode:
        width = float(x.sum())  # about 18, off the coarse grid
        use(x, width)
    assert mode.plan.downs == {0}
    assert mode.reentered == ({0} if taken else set())


@pytest.mark.parametrize("limit", [12, 11])
def test_a_count_only_python_compares_is_probed_both_ways(limit):
    # ``n <= limit`` with n == 12 == limit turns only when n moves up, ``n >= 12`` with
    # n == 12 only when it moves down: an int is probed the other way whatever reads it
    def count_capped(x):
        n = int((x > 0).sum())
        return x * 2 if n <= limit else x * 3

    x = torch.rand(3, 4) + 1
    mode = PerturbingMode(Plan(None))
    with mode:
        count_capped(x)
    assert mode.reentered == {0}
    status = tl.replay(count_capped, x)
    if limit == 12:
        assert status.state == "incomplete", str(status)
        assert [str(e).split(" at ")[0] for e in status.hidden_edges] == [
            "sum_1 -> mul_1 via int()"
        ]
    else:
        assert status.state == "incomplete", str(status)


def test_a_whole_float_only_python_reads_is_probed_the_other_way():
    # (assert y.min().item() >= 0.0: the constant Python compares with is likely the value)
    mode = PerturbingMode(Plan(None))
    with mode:
        low = torch.rand(3).relu().min().clamp(max=0.0).item()
        assert low == pytest.approx(0.0, abs=0.01)
    assert mode.reentered == {0}


@pytest.mark.parametrize(
    "value, expected",
    [(1.0, 0.989), (3, 4), (-3, -4), (0, UNCHANGED), (True, UNCHANGED), ([3, 5], UNCHANGED),
     ([2.0], [1.979]), ("text", UNCHANGED)],
)  # fmt: skip
def test_values_moved_the_other_way(value, expected):
    got = perturbed_down(value)
    if expected is UNCHANGED or isinstance(expected, int):
        assert got == expected or got is expected
    else:
        assert got == pytest.approx(expected)


def _escapes_twice(x):
    a = x.sum().item()
    b = torch.tensor(a) * 2
    c = b.exp().item()
    return x * c


def test_hidden_edges_are_direct_ones_only():
    torch.manual_seed(0)
    status = tl.replay(_escapes_twice, torch.randn(6))
    assert status.state == "incomplete"
    # not sum_1 -> mul_2: the graph carries it, through tensor_1, mul_1, exp_1 and an escape
    assert [str(e).split(" at ")[0] for e in status.hidden_edges] == [
        "sum_1 -> tensor_1 via .item()", "exp_1 -> mul_2 via .item()"
    ]  # fmt: skip
    assert {label for label, v in status.verdicts.items() if v.state == "incomplete"} == {
        "tensor_1", "mul_2"
    }  # fmt: skip


def test_incomplete_status_reads_as_such_and_can_be_accepted():
    edge = HiddenEdge("mean_1", "mul_1", "item", ("model.py", 12, "forward"))
    status = ReplayStatus("incomplete", ops=3, replayed=3, hidden_edges=[edge, edge])
    assert not status and not status.accepted() and status.accepted(accept_hidden_edges=True)
    text = str(status)
    assert text.startswith(
        "ReplayStatus: incomplete: 2 dependencies pass through Python values; every "
        "recorded op and edge is proven"
    )
    assert "  mean_1 -> mul_1 via .item() at model.py:12" in text
    assert ReplayStatus("passed").accepted() and not ReplayStatus("failed").accepted(True)


def test_validation_prints_no_warning_of_its_own():
    lin = torch.nn.Linear(4, 4)

    def fn(x):
        y = lin(x)  # requires grad: float() of it makes torch warn, once per process
        return y * float(y.sum())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tl.replay(fn, torch.randn(2, 4))
    assert [str(w.message) for w in caught if "torchlens" in w.filename] == []


class StepCounter(torch.nn.Module):
    """Advances a Python step counter at each call, which scales its output: two plain
    calls differ, and no capture is to blame."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.step = 0

    def forward(self, x):
        self.step += 1
        y = self.lin(x).relu()
        return y * self.step


def test_a_model_that_differs_from_itself_is_unverified_every_time_never_failed():
    model, x = StepCounter(), torch.randn(3, 4)
    states = []
    for _ in range(3):
        status = tl.replay(model, x)
        states.append(status.state)
        assert not status.failures
        [gap] = status.unchecked
        assert gap.arm == "ground_truth" and gap.label == "mul_1"
        assert gap.reason.startswith("the model's output differs between two plain calls")
        assert "the first op whose value differs from the capture's: mul_1" in gap.reason
        # the rerun, the capture and the one more plain call that tells the two apart
        assert status.model_calls == 3 and "model calls: 3" in str(status)
    assert states == ["unverified"] * 3
    assert model.step == 9


class ActNorm(torch.nn.Module):
    """Glow's ActNorm: its first forward initialises the parameters from the data and sets
    a buffer flag (data-dependent initialisation)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.loc = torch.nn.Parameter(torch.zeros(1, channels))
        self.logs = torch.nn.Parameter(torch.zeros(1, channels))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

    def forward(self, x):
        if self.initialized.item() == 0:
            with torch.no_grad():
                self.loc.data.copy_(-x.mean(0, keepdim=True))
                self.logs.data.copy_(torch.log(1 / (x.std(0, keepdim=True) + 1e-6)))
                self.initialized.fill_(1)
        return (x + self.loc) * torch.exp(self.logs)


def test_validation_leaves_the_model_as_one_plain_forward_does_and_repeats_its_verdict():
    torch.manual_seed(0)
    flow = torch.nn.Sequential(ActNorm(4), torch.nn.Linear(4, 4), ActNorm(4))
    twin = torch.nn.Sequential(ActNorm(4), torch.nn.Linear(4, 4), ActNorm(4))
    twin.load_state_dict(flow.state_dict())
    x = torch.randn(8, 4)
    states = [tl.replay(flow, x).state for _ in range(4)]
    assert states == ["passed"] * 4
    twin(x)  # one plain forward: the flag set, the parameters initialised from x
    for (name, mine), theirs in zip(flow.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(mine, theirs), name


@pytest.mark.parametrize(
    "grid_value, mode, corners, unread",
    [(3.0, "bilinear", False, True), (-1.8, "bilinear", True, True),
     (0.5, "bilinear", False, False), (1.3, "nearest", False, True),
     (1.1, "bicubic", False, False), (-1.5, "nearest", True, True)],
)  # fmt: skip
def test_grid_sample_reading_no_element_is_exempt_by_a_rule(grid_value, mode, corners, unread):
    from types import SimpleNamespace

    from torchlens.replay.exemptions import unread_reason

    x, grid = torch.randn(1, 2, 4, 4), torch.full((1, 3, 3, 2), grid_value)
    kwargs = {"mode": mode, "padding_mode": "zeros", "align_corners": corners}
    reason = unread_reason(SimpleNamespace(func_name="grid_sample"), ["0"], (x, grid), kwargs)
    assert (reason is not None) == unread
    if unread:  # the rule holds only where the output is zeros whatever the input holds
        assert "no element of the input is read" in reason
        out = torch.nn.functional.grid_sample(x, grid, **kwargs)
        assert not out.any()
    other = {**kwargs, "padding_mode": "border"}  # border padding reads the edge: never
    assert unread_reason(SimpleNamespace(func_name="grid_sample"), ["0"], (x, grid), other) is None


def _dropout_mask_at_p_zero(x):
    p = torch.zeros_like(x) * x  # a mask probability that is 0 in eval
    return x * torch.bernoulli(p)


def test_bernoulli_with_all_zero_probabilities_is_not_accused():
    torch.manual_seed(0)
    status = tl.replay(_dropout_mask_at_p_zero, torch.randn(3, 4))
    assert status.state == "passed", str(status)
    [unread] = status.unread
    assert unread.label == "bernoulli_1" and "p set to 1 draws 1 everywhere" in unread.reason


class ItemScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)  # training mode: its running statistics move

    def forward(self, x):
        s = self.a(x).abs().mean().item()
        return self.norm(self.b(x)) * s


def test_trace_with_validate_keeps_the_proof_and_the_hidden_edges(tmp_path):
    from torchlens.viz._viewer_data import viewer_data

    torch.manual_seed(0)
    model, x = ItemScale(), torch.randn(4, 8)
    twin = ItemScale()
    twin.load_state_dict(model.state_dict())
    trace = tl.trace(model, x, validate=True)
    assert trace.status.state == "incomplete"
    assert [(e.parent, e.child) for e in trace.hidden_edges] == [("mean_1", "mul_1")]
    assert trace.hidden_parents("mul_1") == ("mean_1",)
    assert '"mean_1" -> "mul_1" [style=dashed' in trace.to_dot()
    # the model is left as one plain forward leaves it (the running statistics moved once)
    twin(x)
    assert torch.equal(model.norm.running_mean, twin.norm.running_mean)
    assert int(model.norm.num_batches_tracked) == 1
    # the viewer: the hidden edge, the escape mark, counts from status.verdicts
    data = viewer_data(trace, status=trace.status, use_dot=False)
    index = {node["id"]: i for i, node in enumerate(data["nodes"])}
    assert data["hidden"] == [[index["mean_1"], index["mul_1"]]]
    assert data["counts"] == {"passed": len(trace.ops) - 1, "incomplete": 1}
    assert data["nodes"][index["mul_1"]]["v"] == "incomplete"
    assert "esc" in data["nodes"][index["mean_1"]]
    # save and load keep both
    loaded = tl.load(trace.save(tmp_path / "t"))
    assert loaded.hidden_edges == trace.hidden_edges
    assert loaded.status.state == "incomplete"
    assert loaded.status.hidden_edges == trace.status.hidden_edges
    assert str(loaded.status) == str(trace.status)
    assert loaded.status.verdicts["mul_1"].arms["completeness"] == "incomplete"


_CLI_MODEL = """
import torch
from torch import nn


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(x) * self.a(x).abs().mean().item()


def build():
    torch.manual_seed(0)
    return Scale().eval(), (torch.randn(2, 8),)
"""


def test_cli_trace_saves_and_draws_the_hidden_edges_it_found(tmp_path, capsys):
    from torchlens.cli import main

    path = tmp_path / "scale_model.py"
    path.write_text(_CLI_MODEL)
    saved, drawn = tmp_path / "saved", tmp_path / "graph.svg"
    code = main(["trace", f"{path}:build", "--save", str(saved), "--draw", str(drawn)])
    out = capsys.readouterr().out
    assert code == 1  # not passed: the graph is incomplete
    assert "validation: ReplayStatus: incomplete: 1 dependency passes through Python" in out
    loaded = tl.load(saved)
    assert [(e.parent, e.child) for e in loaded.hidden_edges] == [("mean_1", "mul_1")]
    assert loaded.status.state == "incomplete"
    assert "stroke-dasharray" in drawn.read_text()


class ManyBoxes(torch.nn.Module):
    """A detection-style loop reading every box's score with ``.item()``; only two scores
    feed the output, after the loop (so the nearest escape before is never the right one)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        out = self.head(x)
        scores = [out[i, 0].item() for i in range(out.shape[0])]
        return out[3, 1:] * scores[3] + out[11, 1:] * scores[11]


@pytest.mark.parametrize("boxes", [20, 96])
def test_many_escapes_are_attributed_by_group_testing(boxes):
    import math

    torch.manual_seed(0)
    status = tl.replay(ManyBoxes().eval(), torch.randn(boxes, 8))
    assert status.state == "incomplete", str(status)
    assert [str(e).split(" at ")[0] for e in status.hidden_edges] == [
        "getitem_4 -> mul_1 via .item()", "getitem_12 -> mul_2 via .item()"
    ]  # fmt: skip
    # 2 of n escapes matter: about 2 * 2 log2(n) captured forwards, not one per escape
    assert status.model_calls <= 6 + 4 * math.ceil(math.log2(boxes)), status.model_calls
