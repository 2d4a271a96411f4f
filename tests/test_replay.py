"""Replay validation: tl.validate / tl.replay / check_trace and the ReplayStatus they return."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.errors import InvalidArgumentError
from torchlens.replay import ReplayFailure, ReplayStatus, check_trace
from torchlens.replay.exemptions import PERTURBATION_EXEMPT, exempt_reason
from torchlens.replay.tolerances import mismatch, tolerance

try:
    from tests.models import ZOO_BY_NAME, zoo_params
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO_BY_NAME, zoo_params


def tutorial_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


# zoo models whose graph misses dependencies through escapes, which validation finds
HIDDEN_DEPENDENCIES = {
    "item_scalars": [
        "max_1 -> div_1 via .item()",
        "sum_1 -> add_1 via int()",
        "getitem_1 -> add_2 via .tolist()",
        "detach_1 -> add_3 via float()",
    ],
}


@pytest.mark.parametrize("case", zoo_params())
def test_zoo_validates(case):
    model = case.make_model()
    args, kwargs = case.make_inputs()
    torch.manual_seed(0)
    status = tl.replay(model, args, kwargs)
    if case.name in HIDDEN_DEPENDENCIES:  # values turned into Python numbers feed later ops
        # (issue 50: a dependency through Python values is "incomplete", never "failed")
        assert status.state == "incomplete", str(status)
        assert not status.failures
        assert [str(e).split(" at ")[0] for e in status.hidden_edges] == (
            HIDDEN_DEPENDENCIES[case.name]
        )
    else:
        assert status.state == "passed", str(status)
    assert status.replayed == status.ops
    assert status.perturbation_verified + status.exempt == status.ops
    # the completeness arm runs exactly when the forward read values in Python (escapes)
    escapes = bool(tl.trace(case.make_model(), *case.make_inputs()).escapes)
    assert status.arms == ("lint", "ground_truth", "replay", "perturbation") + (
        ("completeness",) if escapes else ()
    )


def test_validate_is_a_bool_of_the_status():
    model, x = tutorial_model(), torch.randn(2, 4)
    assert tl.validate(model, x, scope="forward") is True
    status = tl.replay(model, x)
    assert isinstance(status, ReplayStatus) and bool(status)
    assert (status.ops, status.replayed, status.perturbation_verified) == (3, 3, 3)


@pytest.mark.parametrize("state", ["failed", "unverified", "unavailable"])
def test_only_passed_is_true(state):
    assert not ReplayStatus(state)
    assert ReplayStatus("passed")


def test_status_rejects_unknown_state():
    with pytest.raises(ValueError):
        ReplayStatus("fine")


def test_status_prints_failures_with_label_and_arm():
    status = ReplayStatus("failed", ops=1, failures=[ReplayFailure("relu_1", "replay", "off")])
    text = str(status)
    assert "failed" in text and "relu_1 [replay]: off" in text


class Exempts(nn.Module):
    """An op of each kind: shape-only read, unread by a rule, no input, integer input."""

    def forward(self, x, other):
        zeros = torch.zeros_like(x)  # reads only x's shape: exempt
        kept = torch.where(x.abs() >= 0, x, other)  # `other` is never read: unread by a rule
        return kept + zeros + torch.arange(3)  # arange reads no tensor: exempt


def test_status_gives_each_op_its_verdict_arm_by_arm():
    args = (torch.randn(3), torch.randn(3))
    status = tl.replay(Exempts(), args)
    labels = tl.trace(Exempts(), args).labels
    assert status.state == "passed" and list(status.verdicts) == labels
    zeros = status.verdicts["zeros_like_1"]
    assert zeros.arms == {"lint": "passed", "replay": "passed", "perturbation": "exempt"}
    assert zeros.state == "passed" and "*_like factory" in zeros.reasons[0]
    assert status.verdicts["arange_1"].reasons == (
        "[perturbation] no tensor input: there is no edge for perturbation to prove",
    )
    where = status.verdicts["where_1"]
    assert where.arms["perturbation"] == "passed"  # x is proved; other is unread by a rule
    assert any("`other` is never read" in reason for reason in where.reasons)
    assert status.verdicts["add_2"].arms["ground_truth"] == "passed"  # the output
    assert "ground_truth" not in status.verdicts["abs_1"].arms  # only outputs are compared
    # the counts are the verdicts counted
    assert status.exemptions.keys() == {"zeros_like_1", "arange_1"} and status.exempt == 2
    assert "reads only the shape" in status.exemptions["zeros_like_1"][0]
    outcomes = [v.arms.get("perturbation") for v in status.verdicts.values()]
    assert outcomes.count("passed") == status.perturbation_verified == 5
    replayed = sum(v.arms.get("replay") == "passed" for v in status.verdicts.values())
    assert replayed == status.replayed == 7
    status.verdicts["abs_1"].arms["replay"] = "edited"  # each op has its own
    assert status.verdicts["ge_1"].arms["replay"] == "passed"
    assert pickle.loads(pickle.dumps(status)).verdicts["zeros_like_1"] == zeros


def test_an_op_whose_every_edge_is_unread_is_exempt_with_the_rules_reason():
    status = tl.replay(lambda x, y: x * float("nan") + y, (torch.randn(3), torch.randn(3)))
    assert status.exemptions == {"mul_1": (status.unread[0].reason,)}
    assert "NaN in every element" in status.verdicts["mul_1"].reasons[0]
    assert len(status.verdicts["mul_1"].reasons) == 1  # not also "no tensor input"


def test_verdicts_carry_failures_and_gaps_to_their_ops():
    model, x = tutorial_model(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    failed = check_trace(trace, reference=model(x) + 1).verdicts["linear_2"]
    assert failed.state == "failed" and failed.arms["ground_truth"] == "failed"
    assert failed.arms["replay"] == "passed" and failed.reasons[0].startswith("[ground_truth] ")
    trace.store.mark_missing("relu_1", "not_saved", "dropped for the test")
    status = check_trace(trace)
    gap = status.verdicts["relu_1"]
    assert (gap.state, gap.arms["replay"]) == ("unverified", "unverified")
    assert status.verdicts["linear_1"].state == "passed"
    assert str(gap).startswith("relu_1: unverified (lint passed, replay unverified, perturbation")


def test_status_printout_says_which_counts_are_ops_and_which_are_edges():
    text = str(tl.replay(Exempts(), (torch.randn(3), torch.randn(3))))
    first, ops, *_ = text.splitlines()
    assert first.startswith("ReplayStatus: passed (7 ops: 7 replayed, 5 perturbation-verified")
    assert "ops are recorded function calls" in ops
    assert "status.exemptions says why" in text
    edges = next(line for line in text.splitlines() if "edges exempt" in line)
    assert "an edge is one op reading one tensor): 3 need no proof" in edges
    assert "1 changed nothing under any probe" in edges


def test_structure_only_trace_is_unavailable_never_passed():
    model, x = tutorial_model(), torch.randn(2, 4)
    status = check_trace(tl.trace(model, x, structure_only=True), reference=model(x))
    assert status.state == "unavailable"
    assert not status and status.replayed == 0


def test_check_trace_ground_truth_compares_reference():
    model, x = tutorial_model(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    assert check_trace(trace, reference=model(x)).state == "passed"
    status = check_trace(trace, reference=model(x) + 1)
    assert status.state == "failed"
    assert [(f.label, f.arm) for f in status.failures] == [("linear_2", "ground_truth")]


def test_check_trace_without_reference_runs_payload_arms_only():
    model, x = tutorial_model(), torch.randn(2, 4)
    status = check_trace(tl.trace(model, x))
    assert status.state == "passed"
    assert status.arms == ("lint", "replay", "perturbation")


def test_missing_payload_is_unverified_not_passed():
    model, x = tutorial_model(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    trace.store.mark_missing("relu_1", "not_saved", "dropped for the test")
    status = check_trace(trace)
    assert status.state == "unverified"
    labels = {(gap.label, gap.arm) for gap in status.unchecked}
    assert ("relu_1", "replay") in labels  # its own value is missing
    assert ("linear_2", "replay") in labels  # its parent's value is missing
    assert status.unverified == 2


def test_validation_leaves_saved_values_untouched():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    trace = tl.trace(model, torch.randn(2, 4))
    before = {op.label: op.out.clone() for op in trace}
    assert check_trace(trace).state == "passed"
    for op in trace:
        assert torch.equal(op.out, before[op.label])


def test_check_trace_leaves_rng_state_as_it_was():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    trace = tl.trace(model, torch.randn(2, 4))
    state = torch.get_rng_state()
    assert check_trace(trace).state == "passed"
    assert torch.equal(torch.get_rng_state(), state)


def test_validate_advances_rng_like_one_plain_forward():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    x = torch.randn(2, 4)
    torch.manual_seed(1)
    model(x)
    after_forward = torch.get_rng_state()
    torch.manual_seed(1)
    assert tl.validate(model, x)
    assert torch.equal(torch.get_rng_state(), after_forward)


def test_dropout_replays_with_captured_rng():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2)).train()
    torch.manual_seed(3)
    status = tl.replay(model, torch.randn(4, 8))
    assert status.state == "passed", str(status)


def test_batchnorm_train_leaves_model_as_one_forward():
    case = ZOO_BY_NAME["batchnorm_train"]
    args, _ = case.make_inputs()
    plain = case.make_model()
    plain(*args)
    validated = case.make_model()
    assert tl.validate(validated, args)
    for (name, want), got in zip(plain.state_dict().items(), validated.state_dict().values()):
        assert torch.equal(want, got), name


def test_forward_that_mutates_its_input_validates_and_mutates_it_once():
    case = ZOO_BY_NAME["inplace_input_mutation"]
    args, _ = case.make_inputs()
    expected, _ = case.make_inputs()
    case.make_model()(*expected)
    assert tl.validate(case.make_model(), args)
    assert torch.equal(args[0], expected[0])


def test_bad_scope_is_refused_with_code():
    with pytest.raises(InvalidArgumentError) as err:
        tl.validate(tutorial_model(), torch.randn(2, 4), scope="sideways")
    assert err.value.code == "bad_scope"


def test_backward_scope_checks_gradients():
    status = tl.replay(tutorial_model(), torch.randn(2, 4), scope="backward")
    assert isinstance(status, ReplayStatus)
    assert status.state == "passed", status


def test_tolerance_table_is_exact_for_integers_and_overridable_for_floats():
    assert tolerance(torch.int64) == (0.0, 0.0)
    assert tolerance(torch.bool, atol=1.0) == (0.0, 0.0)
    assert tolerance(torch.float32) == (1.3e-6, 1e-5)
    assert tolerance(torch.float16, atol=0.1, rtol=0.2) == (0.2, 0.1)
    assert mismatch(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7])) is None
    assert "differ" in mismatch(torch.tensor([1.0]), torch.tensor([1.1]))
    assert "shape" in mismatch(torch.ones(2), torch.ones(3))


def test_shape_only_edges_are_exempt_not_verified():
    def fn(x):
        return torch.zeros_like(x) + 1

    status = tl.replay(fn, torch.randn(3))
    assert status.state == "passed", str(status)
    # zeros_like reads only x's shape (exempt); add depends on zeros_like's value (verified)
    assert (status.exempt, status.perturbation_verified) == (1, 1)
    assert "zeros_like" in PERTURBATION_EXEMPT


def test_batch_norm_running_stats_exempt_only_in_training():
    bn = nn.BatchNorm1d(3)
    for train, exempt in [(True, True), (False, False)]:
        trace = tl.trace(bn.train(train), torch.randn(4, 3))
        op = trace["batch_norm_1"]
        positions = [ref.position for ref in op.parent_args if ref.label == "running_mean"]
        assert (exempt_reason(op, positions) is not None) is exempt


def test_annihilated_edge_is_proved_at_another_point():
    """h starts at zero, so w_hh cannot matter at the recorded point; it does elsewhere."""

    def step(x, h, w_hh):
        return torch.tanh(x + F.linear(h, w_hh))

    status = tl.replay(step, (torch.randn(2, 3), torch.zeros(2, 3), torch.randn(3, 3)))
    assert status.state == "passed", str(status)


def test_buffer_changed_by_forward_is_rewound_for_the_rerun():
    class Drifting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return x * self.calls  # a second forward would give 2x: rewound, it must not

    assert tl.validate(Drifting(), torch.randn(3))


def test_forward_that_moves_its_parameters_is_checked_from_where_it_left_them():
    class SelfUpdating(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self, x):
            with torch.no_grad():
                self.weight.add_(1.0)
            return x * self.weight

    model = SelfUpdating()
    status = tl.replay(model, torch.randn(3))
    # the first rerun moved the weight: a second one starts from there, with the weight
    # kept, so the capture starts where that rerun did
    assert status.state == "passed", str(status)
    assert status.replayed == status.ops and not status.unchecked
    assert torch.equal(model.weight.detach(), torch.full((3,), 2.0))  # as one plain forward


def test_refusals_come_before_the_model_runs():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls += 1
            return x + 1

    scripted = torch.jit.script(Counting())
    with pytest.raises(tl.errors.UnsupportedModelError) as err:
        tl.validate(scripted, torch.randn(2))
    assert err.value.code == "torchscript_module"
    assert int(scripted.calls) == 0

    inner, refusals = Counting(), []

    class Outer(nn.Module):
        def forward(self, x):
            try:
                tl.validate(inner, x)
            except tl.errors.ReentrantCaptureError as refused:
                refusals.append(refused.code)
            return x * 2

    trace = tl.trace(Outer(), torch.randn(2))
    assert refusals == ["reentrant_capture"]
    assert int(inner.calls) == 0  # never ran, so nothing leaked into the outer trace
    assert [op.func_name for op in trace] == ["mul"]


class AutocastOffInside(nn.Module):
    """timm's efficientvit in small: a float32 region inside an autocast forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        with torch.autocast("cpu", enabled=False):
            return h.float() @ h.float().transpose(-1, -2)


def test_a_region_with_autocast_off_replays_off_under_the_callers_autocast():
    torch.manual_seed(0)
    model, x = AutocastOffInside().eval(), torch.randn(2, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        status = tl.replay(model, (x,))
    assert status.state == "passed", status


def test_matmul_replays_with_the_kernel_its_requires_grad_chose():
    # aten's matmul folds a batched product into one mm only when an operand needs a
    # gradient; in half precision the two paths round apart by far more than the
    # tolerance, so replay hands the operands back with the flags they had
    def product(a, w):
        return torch.matmul(a.transpose(1, 2), w * 1.0)

    torch.manual_seed(0)
    a = (torch.randn(2, 256, 32) * 10).half()
    w = (torch.randn(256, 32) * 3).half().requires_grad_()
    status = tl.replay(product, (a, w))
    assert status.state == "passed", status
