"""``torch.autograd.grad`` called inside a forward: recorded as an op whose parents are the
outputs it differentiates, the inputs and ``grad_outputs``, replayed by differentiating its
recorded sub-graph, and its edges proven (``torchlens/replay/grad_replay.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.replay import check_trace


class ForceField(nn.Module):
    """A molecular force field: an energy, and forces = -dE/dx by autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 32)
        self.energy = nn.Sequential(nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 1))

    def forward(self, positions):
        with torch.enable_grad():
            if not positions.requires_grad:
                positions = positions.requires_grad_(True)
            squared = (positions[:, None] - positions[None]).pow(2).sum(-1)  # pairwise
            features = self.embed(positions) + torch.exp(-squared).sum(-1, keepdim=True)
            energy = self.energy(features).sum()
            (grad,) = torch.autograd.grad(energy, positions, create_graph=True)
        return energy, -grad


class InnerStep(nn.Module):
    """A meta-learning inner step on a functional copy of the weights
    (``torch.func.functional_call``), then the query loss with the adapted weights."""

    def __init__(self) -> None:
        super().__init__()
        self.learner = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, support, labels, query):
        weights = dict(self.learner.named_parameters())
        loss = nn.functional.mse_loss(
            torch.func.functional_call(self.learner, weights, support), labels
        )
        grads = torch.autograd.grad(loss, list(weights.values()), create_graph=True)
        adapted = {name: w - 0.1 * g for (name, w), g in zip(weights.items(), grads)}
        return torch.func.functional_call(self.learner, adapted, query)


class GradientPenalty(nn.Module):
    """A WGAN-GP critic's loss: the gradient penalty on interpolates, with ``grad_outputs``."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, real, fake, alpha):
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        score = self.critic(mixed)
        (grad,) = torch.autograd.grad(
            score, mixed, grad_outputs=torch.ones_like(score), create_graph=True
        )
        penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
        return self.critic(fake).mean() - self.critic(real).mean() + 10 * penalty


def _status(model, *args):
    return tl.replay(model, args)


def test_a_force_field_validates_passed():
    torch.manual_seed(0)
    status = _status(ForceField(), torch.randn(5, 3))
    assert status.state == "passed", str(status)
    assert not status.unchecked


def test_the_grad_op_has_its_outputs_and_inputs_as_parents_and_replays():
    torch.manual_seed(0)
    trace = tl.trace(ForceField(), torch.randn(5, 3))
    (grad,) = [op for op in trace if op.func_name == "grad"]
    energy, positions = grad.parents
    assert trace[energy].func_name == "sum"
    assert trace[positions].func_name == "requires_grad_"
    assert trace[grad.children[0]].func_name == "neg"  # the forces


def test_a_meta_learning_inner_step_validates_passed():
    torch.manual_seed(0)
    model = InnerStep()
    status = _status(model, torch.randn(6, 4), torch.randn(6, 2), torch.randn(3, 4))
    assert status.state == "passed", str(status)


def test_a_gradient_penalty_with_grad_outputs_validates_passed():
    torch.manual_seed(0)
    real, fake, alpha = torch.randn(4, 6), torch.randn(4, 6), torch.rand(4, 1)
    trace = tl.trace(GradientPenalty(), (real, fake, alpha))
    (grad,) = [op for op in trace if op.func_name == "grad"]
    assert trace[grad.parents[-1]].func_name == "ones_like"  # grad_outputs is a parent
    status = _status(GradientPenalty(), real, fake, alpha)
    assert status.state == "passed", str(status)


def test_a_recorded_gradient_the_graph_does_not_imply_fails_replay():
    torch.manual_seed(0)
    trace = tl.trace(ForceField(), torch.randn(5, 3))
    (grad,) = [op for op in trace if op.func_name == "grad"]
    store = grad._store
    store.set(grad.label, grad.out * 1.5, None)  # not what the recorded graph implies
    status = check_trace(trace)
    assert status.state == "failed"
    assert (grad.label, "replay") in {(f.label, f.arm) for f in status.failures}


def test_create_graph_results_feed_later_ops_that_stay_provable():
    torch.manual_seed(0)
    model, x = ForceField(), torch.randn(5, 3)
    trace = tl.trace(model, x)
    (grad,) = [op for op in trace if op.func_name == "grad"]
    assert grad.requires_grad  # create_graph=True: the forces carry a graph
    status = tl.replay(model, (x,))
    later = [op.label for op in trace if op.index > grad.index]
    assert later  # the forces, -grad
    for label in [grad.label, *later]:
        verdict = status.verdicts[label]
        assert verdict.arms["replay"] == "passed", verdict
        assert verdict.arms["perturbation"] == "passed", verdict


def test_second_order_trace_backward_through_a_force_field_is_right():
    torch.manual_seed(0)
    model, x = ForceField(), torch.randn(5, 3)

    def loss_fn(out):  # a force-matching loss: second order in the weights
        energy, forces = out
        return energy + forces.pow(2).sum()

    plain = x.clone()
    want = torch.autograd.grad(loss_fn(model(plain)), [*model.parameters(), plain])
    trace = tl.trace(model, x.clone(), save_grads=True)
    trace.backward(loss_fn)
    names = [name for name, _ in model.named_parameters()]
    for name, expected in zip(names, want):
        torch.testing.assert_close(trace[name].grad, expected, msg=name)
    torch.testing.assert_close(trace["requires_grad__1"].grad, want[-1])


class Hamiltonian(nn.Module):
    """A Hamiltonian network: dq/dt = dH/dp, dp/dt = -dH/dq, by ``Tensor.backward``."""

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, state):
        with torch.enable_grad():
            state = state.detach().requires_grad_(True)
            self.h(state).sum().backward(create_graph=True, inputs=[state])
            dq, dp = state.grad.chunk(2, dim=-1)
        return torch.cat([dp, -dq], dim=-1)


def test_tensor_backward_with_create_graph_is_an_op_writing_the_grads():
    torch.manual_seed(0)
    model, x = Hamiltonian(), torch.randn(3, 4)
    trace = tl.trace(model, x)
    (backward,) = [op for op in trace if op.func_name == "backward"]
    assert trace[backward.parents[0]].func_name == "sum"
    assert trace[backward.parents[1]].func_name == "requires_grad_"
    assert trace[backward.children[0]].func_name == "chunk"
    status = tl.replay(model, (x,))
    assert status.state == "passed", str(status)


class LinearEnergy(nn.Module):
    """A quadratic energy: the gradient is linear in the input, and the gradient of the
    linear term a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x):
        x = x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.lin(x).sum(), x, create_graph=True)
        return grad * 2


def test_a_gradient_constant_in_its_input_still_has_every_edge_proven():
    torch.manual_seed(0)
    status = tl.replay(LinearEnergy(), (torch.randn(4, 3),))
    assert status.state == "passed", str(status)


class TwoInnerSteps(nn.Module):
    """MAML with manual functional weights: two inner steps, the second differentiating
    through the first (a grad op inside another's sub-graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 2))
        self.b = nn.Parameter(torch.zeros(2))

    def forward(self, support, labels, query):
        w, b = self.w, self.b
        for _ in range(2):
            loss = ((support @ w + b - labels) ** 2).mean()
            gw, gb = torch.autograd.grad(loss, (w, b), create_graph=True)
            w, b = w - 0.1 * gw, b - 0.1 * gb
        return query @ w + b


def test_nested_inner_steps_validate_and_their_second_order_grads_are_right():
    torch.manual_seed(0)
    model = TwoInnerSteps()
    args = (torch.randn(6, 4), torch.randn(6, 2), torch.randn(3, 4))
    trace = tl.trace(model, args, save_grads=True)
    grads = [op for op in trace if op.func_name == "grad"]
    assert len(grads) == 4 and {op.output_index for op in grads} == {0, 1}  # (gw, gb) x 2
    second = {op.call_index for op in grads[2:]}
    first = {op.label for op in grads[:2]}
    assert len(second) == 1 and first & _ancestors(trace, grads[2].label)
    status = tl.replay(model, args)
    assert status.state == "passed", str(status)
    trace.backward()
    want = torch.autograd.grad(model(*args).sum(), [model.w, model.b])
    torch.testing.assert_close(trace["w"].grad, want[0])
    torch.testing.assert_close(trace["b"].grad, want[1])


def _ancestors(trace, label: str) -> set[str]:
    found, stack = set(), list(trace[label].parents)
    while stack:
        parent = stack.pop()
        if parent not in found:
            found.add(parent)
            stack += list(getattr(trace[parent], "parents", ()))
    return found


class AccumulatesIntoWeights(nn.Module):
    """``backward`` without ``inputs=``: it also accumulates into the weights' ``.grad``,
    which the ground-truth rerun has set by the time the capture runs."""

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        x = x.detach().requires_grad_()
        self.h(x).sum().backward(create_graph=True)
        return x.grad * 2


def test_a_backward_accumulating_into_set_grads_leaves_what_it_wrote_linked_not_replayed():
    torch.manual_seed(0)
    model, x = AccumulatesIntoWeights(), torch.randn(4, 3)
    status = tl.replay(model, (x,))
    assert status.state == "unverified" and not status.failures, str(status)
    [gap] = status.unchecked  # x.grad: made out of sight, its edges proven by autograd
    assert gap.arm == "replay" and "made out of the capture's sight" in gap.reason
    trace = tl.trace(model, x)
    made = trace[gap.label]
    assert set(made.parents) == {"h.0.weight", "tanh_1", "h.2.weight"}  # what dE/dx reads
    for p in model.parameters():
        p.grad = None


def test_rerun_remakes_a_gradient_downstream_of_an_edit_and_refuses_one_inside_its_graph():
    torch.manual_seed(0)
    model = GradientPenalty()
    real, fake, alpha = torch.randn(4, 6), torch.randn(4, 6), torch.rand(4, 1)
    trace = tl.trace(model, (real, fake, alpha))
    assert trace["mul_1"].parents == ("input_3", "input_1")  # alpha * real
    edited = trace.rerun({tl.label("mul_1"): lambda value, op: value * 0.5})
    mixed = (0.5 * alpha * real + (1 - alpha) * fake).requires_grad_(True)
    score = model.critic(mixed)
    (grad,) = torch.autograd.grad(score, mixed, torch.ones_like(score), create_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    want = model.critic(fake).mean() - model.critic(real).mean() + 10 * penalty
    torch.testing.assert_close(edited.output, want.detach())
    inside = next(op.label for op in trace if op.func_name == "leaky_relu")
    with pytest.raises(tl.errors.InterventionError) as caught:
        trace.rerun({tl.label(inside): lambda value, op: value * 2})
    assert caught.value.code == "not_replayable" and inside in str(caught.value)


class ScalesWithoutGrad(nn.Module):
    """A factor computed under ``no_grad`` inside the differentiated graph: the forward's
    gradient does not flow through it, and neither does replay's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x = x.detach().requires_grad_()
        h = self.lin(x)
        with torch.no_grad():
            scale = h.norm()
        (grad,) = torch.autograd.grad((h * scale).tanh().sum(), x, create_graph=True)
        return grad


def test_a_value_made_without_grad_inside_the_differentiated_graph_stays_without():
    torch.manual_seed(0)
    status = tl.replay(ScalesWithoutGrad(), (torch.randn(4, 3),))
    assert status.state == "passed", str(status)


class _StraightThrough(torch.autograd.Function):
    """Rounding whose backward passes the gradient through unchanged."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class QuantizedEnergy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x = x.detach().requires_grad_()
        energy = _StraightThrough.apply(self.lin(x)).pow(2).sum()
        (grad,) = torch.autograd.grad(energy, x, create_graph=True)
        return grad


def test_a_custom_autograd_function_inside_the_differentiated_graph_is_unverified_not_failed():
    torch.manual_seed(0)
    status = tl.replay(QuantizedEnergy(), (torch.randn(4, 3),))
    assert status.state == "unverified" and not status.failures, str(status)
    gaps = {(gap.label, gap.arm) for gap in status.unchecked}
    assert gaps == {("grad_1", "replay"), ("grad_1", "perturbation")}
    assert "custom autograd.Function" in status.unchecked[0].reason


class RetainsGrad(nn.Module):
    """``backward()`` without ``inputs=`` while a non-leaf retains its grad: naming the
    leaves would leave that ``.grad`` unwritten, so the call is left as the forward made it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x = x.detach().requires_grad_()
        h = self.lin(x)
        h.retain_grad()
        h.tanh().sum().backward(create_graph=True)
        return h.grad * 2


def test_a_backward_beside_a_retained_grad_runs_as_the_forward_made_it():
    torch.manual_seed(0)
    model, x = RetainsGrad(), torch.randn(4, 3)
    want = model(x.clone())
    model.zero_grad(set_to_none=True)
    trace = tl.trace(model, x)
    torch.testing.assert_close(trace.output, want)  # h.grad was written
    assert not any(op.func_name == "backward" for op in trace)
    status = tl.replay(model, (x,))
    assert not status.failures, str(status)


def test_a_saved_and_loaded_trace_replays_its_gradient_op(tmp_path):
    torch.manual_seed(0)
    trace = tl.trace(ForceField(), torch.randn(5, 3))
    trace.save(tmp_path / "force_field")
    loaded = tl.load(tmp_path / "force_field")
    assert next(op for op in loaded if op.func_name == "grad").func is torch.autograd.grad
    assert check_trace(loaded).state == "passed"


class FunctionalBackward(nn.Module):
    """``torch.autograd.backward`` with ``grad_tensors``, then the ``.grad`` it wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x, weights):
        x = x.detach().requires_grad_()
        out = torch.tanh(self.lin(x))
        torch.autograd.backward(out, grad_tensors=weights, create_graph=True, inputs=[x])
        return x.grad.pow(2).sum(-1)


def test_torch_autograd_backward_is_an_op_too_with_its_grad_tensors_as_parents():
    torch.manual_seed(0)
    model, args = FunctionalBackward(), (torch.randn(4, 3), torch.rand(4, 2))
    trace = tl.trace(model, args)
    (backward,) = [op for op in trace if op.func_name == "backward"]
    assert [trace[p].func_name for p in backward.parents[:1]] == ["tanh"]
    assert "input_2" in backward.parents  # grad_tensors
    status = tl.replay(model, args)
    assert status.state == "passed", str(status)
