"""Values made out of the capture's sight (``torchlens/capture/unseen.py``): a TorchScript
helper or an extension called from an eager forward. Its result is linked back through
its autograd graph to the recorded values it came from, as one op."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl
from torchlens.capture.unseen import UNSEEN_META
from torchlens.replay import check_trace


@torch.jit.script
def fused_gate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.tanh(a) * torch.sigmoid(b)


@torch.jit.script
def scripted_silu(t: torch.Tensor) -> torch.Tensor:
    return t * torch.sigmoid(t)


@torch.jit.script
def scaled_silu(t: torch.Tensor, k: float) -> torch.Tensor:
    return t * torch.sigmoid(t) * k


@torch.jit.script
def masked(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h) * mask


class GatedBlock(nn.Module):
    """Two scripted helpers in a row; the first one's result is held in a variable."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        gate = fused_gate(self.a(x), self.b(x))
        return self.head(scripted_silu(gate))


def test_scripted_helpers_are_ops_with_their_parents_and_validate_passed():
    torch.manual_seed(0)
    model, x = GatedBlock(), torch.randn(3, 4)
    for _ in range(3):  # the profiling executor swaps in a fused graph after a few calls
        trace = tl.trace(model, x)
        gate = [op for op in trace if op.func_name == "script_fused_gate"]
        silu = [op for op in trace if op.func_name == "script_scripted_silu"]
        assert [op.parents for op in gate] == [("linear_1", "linear_2")]
        assert [op.parents for op in silu] == [(gate[0].label,)]
        assert silu[0].func is scripted_silu and silu[0].meta[UNSEEN_META]["rerun"]
        status = tl.replay(model, (x,))
        assert status.state == "passed", str(status)


class HeldAsAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.act = nn.Linear(4, 4), scripted_silu

    def forward(self, x):
        return self.act(self.lin(x)).sum(-1)


def test_a_scripted_function_held_as_an_attribute_is_found():
    torch.manual_seed(0)
    assert tl.validate(HeldAsAttribute(), torch.randn(3, 4))


class MasksWithItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return masked(self.lin(x), x)


def test_an_argument_autograd_does_not_track_is_found_from_the_calling_frame():
    torch.manual_seed(0)
    model, x = MasksWithItsInput(), torch.randn(3, 4)
    trace = tl.trace(model, x)
    (op,) = [op for op in trace if op.func_name == "script_masked"]
    assert op.parents == ("linear_1", "input_1")  # x has no autograd history
    assert tl.replay(model, (x,)).state == "passed"


class ScalesOutOfSight(nn.Module):
    """A helper with a float argument the capture cannot know: it cannot be re-run."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.b(scaled_silu(self.a(x), 2.0))


def test_a_helper_that_cannot_be_rerun_has_every_edge_proven_and_only_its_replay_unchecked():
    torch.manual_seed(0)
    model, x = ScalesOutOfSight(), torch.randn(3, 4)
    trace = tl.trace(model, x)
    made = trace[trace["linear_2"].parents[0]]
    assert made.func is None and made.parents == ("linear_1",)
    assert made.func_name == "script_scaled_silu"  # named on the line, not re-run
    assert made.meta[UNSEEN_META]["edges"] == {"linear_1": True}
    status = tl.replay(model, (x,))
    assert status.state == "unverified" and not status.failures, str(status)
    assert [(gap.label, gap.arm) for gap in status.unchecked] == [(made.label, "replay")]
    assert "cannot re-run" in status.unchecked[0].reason
    assert status.verdicts[made.label].arms["perturbation"] == "passed"


class ExtensionLike(nn.Module):
    """An op run below the function mode, as a C++ extension's kernel is."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        with torch._C.DisableTorchFunction():
            y = torch.relu(h) * 3
        return self.b(y)


def test_an_extension_op_is_named_after_its_grad_fn_and_its_edges_proven():
    torch.manual_seed(0)
    model, x = ExtensionLike(), torch.randn(3, 4)
    trace = tl.trace(model, x)
    made = trace[trace["linear_2"].parents[0]]
    assert made.func_name == "MulBackward0" and made.parents == ("linear_1",)
    status = tl.replay(model, (x,))
    assert [(gap.label, gap.arm) for gap in status.unchecked] == [(made.label, "replay")]
    assert not status.failures


def test_under_no_grad_a_value_made_out_of_sight_is_a_constant_and_the_verdict_says_so():
    torch.manual_seed(0)
    model, x = GatedBlock(), torch.randn(3, 4)
    with torch.no_grad():
        trace = tl.trace(model, x)
        status = tl.replay(model, (x,))
    source = trace[trace["linear_3"].parents[0]]
    assert source.kind == "constant"  # no history: nothing links it
    assert any(
        note.startswith(source.label) and "grad was off" in note for note in status.decisions
    ), status.decisions


def test_a_loaded_trace_keeps_the_proven_edges_and_names_what_it_cannot_rerun(tmp_path):
    torch.manual_seed(0)
    for model, path in [(ScalesOutOfSight(), "opaque"), (GatedBlock(), "scripted")]:
        tl.trace(model, torch.randn(3, 4)).save(tmp_path / path)
    opaque = check_trace(tl.load(tmp_path / "opaque"))  # edges kept from the capture
    assert [(gap.label, gap.arm) for gap in opaque.unchecked] == [
        ("script_scaled_silu_1", "replay")
    ]
    scripted = check_trace(tl.load(tmp_path / "scripted"))  # a TorchScript function: not saved
    assert scripted.state == "unverified" and not scripted.failures
    assert {gap.label for gap in scripted.unchecked} == {
        "script_fused_gate_1",
        "script_scripted_silu_1",
    }
