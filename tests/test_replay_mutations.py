"""Mutation tests of the oracle: a trace corrupted on purpose must fail validation, naming
the op and the arm that caught it. This is how we know validation can fail at all."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.replay import check_trace
from torchlens.trace import ArgRef


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(6, 6)
        self.fc2 = nn.Linear(6, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = F.leaky_relu(self.fc1(x), 0.1)
        return self.fc2(self.drop(h)) * 2.0


def fresh_trace():
    model = Net().train()
    x = torch.randn(4, 6)
    torch.manual_seed(1)
    trace = tl.trace(model, x)
    assert check_trace(trace).state == "passed"
    return trace


def found(status) -> set[tuple[str, str]]:
    return {(f.label, f.arm) for f in status.failures}


def test_corrupted_payload_fails_replay_at_that_op():
    trace = fresh_trace()
    bad = trace["leaky_relu_1"].out + 0.5
    trace.store.set("leaky_relu_1", bad, bad._version)
    status = check_trace(trace)
    assert status.state == "failed"
    assert ("leaky_relu_1", "replay") in found(status)
    assert status.failures[0].label == "leaky_relu_1"


def test_swapped_parent_fails_replay_at_the_child():
    trace = fresh_trace()
    op, old, new = trace["linear_2"], "dropout_1", "leaky_relu_1"
    op.parent_args = tuple(
        ArgRef(new if r.label == old else r.label, r.position) for r in op.parent_args
    )
    op.parents = tuple(new if p == old else p for p in op.parents)
    trace[old].children.remove("linear_2")
    trace[new].children.append("linear_2")  # keep edges symmetric: lint stays quiet
    status = check_trace(trace)
    assert found(status) == {("linear_2", "replay")}


def test_corrupted_non_tensor_argument_fails_replay():
    trace = fresh_trace()
    op = trace["leaky_relu_1"]
    assert op.kwargs_template["negative_slope"] == 0.1
    op.kwargs_template = {**op.kwargs_template, "negative_slope": 0.3}
    status = check_trace(trace)
    assert ("leaky_relu_1", "replay") in found(status)


def test_corrupted_scalar_operand_fails_replay():
    trace = fresh_trace()
    op = trace["mul_1"]
    op.args_template = (op.args_template[0], 3.0)
    assert found(check_trace(trace)) == {("mul_1", "replay")}


def test_corrupted_rng_snapshot_fails_replay_of_the_stochastic_op():
    trace = fresh_trace()
    op = trace["dropout_1"]
    torch.manual_seed(12345)
    op.rng_state = {"cpu": torch.get_rng_state()}
    assert ("dropout_1", "replay") in found(check_trace(trace))


def test_edge_without_dependency_fails_perturbation():
    """The recorded function ignores its parent yet reproduces the saved value."""
    trace = fresh_trace()
    op = trace["mul_1"]
    saved = op.out.clone()
    op.func = lambda x, s: saved.clone()
    status = check_trace(trace)
    assert found(status) == {("mul_1", "perturbation")}
    assert "linear_2" in status.failures[0].reason


def test_broken_edge_symmetry_fails_lint_naming_the_op():
    trace = fresh_trace()
    trace["linear_1"].children.remove("leaky_relu_1")
    status = check_trace(trace)
    assert ("leaky_relu_1", "lint") in found(status)


def test_wrong_reference_fails_ground_truth_naming_the_output():
    model = Net().eval()
    x = torch.randn(4, 6)
    trace = tl.trace(model, x)
    status = check_trace(trace, reference=model(x * 2))
    assert found(status) == {("mul_1", "ground_truth")}
