"""``lint``: each graph invariant, broken on purpose, gives its own message naming the
record; a sound trace gives none. Validation's fast path must say exactly what the full
check says, so every message is pinned here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture.tree import ArgSlot
from torchlens.replay import check_trace, lint
from torchlens.trace import ArgRef


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        a, b = h.chunk(2, dim=1)
        return a * b + x[:, :2]


@pytest.fixture
def trace():
    trace = tl.trace(Net().eval(), torch.randn(3, 4))
    assert lint(trace) == []
    assert [op.label for op in trace.ops] == [
        "linear_1", "relu_1", "chunk_1:0", "chunk_1:1", "mul_1", "getitem_1", "add_1",
    ]  # fmt: skip
    return trace


def _duplicate_label(t):
    t["mul_1"].label = "relu_1"


def _index(t):
    t["relu_1"].index = 7


def _parents_disagree(t):
    t["relu_1"].parents = ()


def _own_parent(t):
    op = t["relu_1"]
    op.parents, op.parent_args = ("relu_1",), (ArgRef("relu_1", "0"),)


def _later_parent(t):
    op = t["relu_1"]
    op.parents, op.parent_args = ("add_1",), (ArgRef("add_1", "0"),)


def _missing_parent(t):
    op = t["relu_1"]
    op.parents, op.parent_args = ("ghost_1",), (ArgRef("ghost_1", "0"),)


def _parent_forgets_child(t):
    t["linear_1"].children.remove("relu_1")


def _position_twice(t):
    op = t["mul_1"]
    op.parent_args = (op.parent_args[0], ArgRef(op.parent_args[1].label, "0"))


def _template_slots(t):
    t["mul_1"].args_template = (ArgSlot(0), 2.0)


def _child_twice(t):
    t["relu_1"].children.append("chunk_1:0")


def _missing_child(t):
    t["relu_1"].children.append("ghost_1")


def _child_forgets_parent(t):
    t["relu_1"].children.append("add_1")


def _call_disagrees(t):
    t["chunk_1:1"].func_name = "split"


def _call_resumes(t):
    t["getitem_1"].call_index = t["chunk_1:0"].call_index


def _boundary(t):
    t.input_labels = ["fc.weight"]
    t.output_labels = ["ghost_2"]
    t.modules[0].ops = ["ghost_3"]


MUTATIONS = {
    "duplicate label": (_duplicate_label, [
        "relu_1: label used by 2 records",
        "relu_1: parent 'chunk_1:0' does not list it as a child",
        "relu_1: parent 'chunk_1:1' does not list it as a child",
        "add_1: parent 'mul_1' is not in the trace",
        "linear_1: child 'relu_1' does not list it as a parent",
        "relu_1: child 'add_1' does not list it as a parent",
        "chunk_1:0: child 'mul_1' is not in the trace",
        "chunk_1:1: child 'mul_1' is not in the trace",
        "mul_1: named by module call <root>:1 but not in the trace",
    ]),
    "index": (_index, ["relu_1: index 7 but position 1"]),
    "parents disagree": (_parents_disagree, [
        "relu_1: parents [] disagree with parent_args ['linear_1']",
        "linear_1: child 'relu_1' does not list it as a parent",
    ]),
    "own parent": (_own_parent, [
        "relu_1: is its own parent",
        "linear_1: child 'relu_1' does not list it as a parent",
    ]),
    "later parent": (_later_parent, [
        "relu_1: parent 'add_1' is a later op",
        "linear_1: child 'relu_1' does not list it as a parent",
    ]),
    "missing parent": (_missing_parent, [
        "relu_1: parent 'ghost_1' is not in the trace",
        "linear_1: child 'relu_1' does not list it as a parent",
    ]),
    "parent forgets child": (_parent_forgets_child, [
        "relu_1: parent 'linear_1' does not list it as a child",
    ]),
    "position twice": (_position_twice, [
        "mul_1: argument position '0' fed by 2 parents",
    ]),
    "template slots": (_template_slots, [
        "mul_1: argument templates hold slots [0] but the op has 2 tensor arguments",
    ]),
    "child twice": (_child_twice, ["relu_1: child 'chunk_1:0' listed 2 times"]),
    "missing child": (_missing_child, ["relu_1: child 'ghost_1' is not in the trace"]),
    "child forgets parent": (_child_forgets_parent, [
        "relu_1: child 'add_1' does not list it as a parent",
    ]),
    "call disagrees": (_call_disagrees, [
        "chunk_1:1: shares call 3 with chunk_1:0 but not its function and arguments",
    ]),
    "call resumes": (_call_resumes, ["getitem_1: call 3 resumes after other calls"]),
    "boundary": (_boundary, [
        "fc.weight: listed as an input but is not an input source",
        "ghost_2: listed as an output but is not in the trace",
        "ghost_3: named by module call <root>:1 but not in the trace",
    ]),
}  # fmt: skip


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_broken_invariant_has_its_message(trace, name):
    mutate, expected = MUTATIONS[name]
    mutate(trace)
    assert lint(trace) == expected


def test_lint_flags_through_validation_without_running_the_model(trace):
    _parent_forgets_child(trace)
    status = check_trace(trace)
    assert ("relu_1", "lint") in {(f.label, f.arm) for f in status.failures}
