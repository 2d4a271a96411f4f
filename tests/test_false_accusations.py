"""Correct models that validation once accused (issue 38, item 5), each with the general rule
that now decides it: ``param.data = value`` is a recorded write; an op that keeps no element
of a parent at a call exempts that edge; uninitialized memory is checked by shape only; a
write into a parameter during the forward is an op replayed from the value before it; and
loops of small writes through views of a large tensor validate at a cost that follows the
forward's (checked here by what decides the cost: no edge left to the full probe battery)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.replay import check_trace
from torchlens.replay.exemptions import exempt_reason, unread_reason, value_exempt
from torchlens.replay.ground_truth import ModelState
from torchlens.replay.memory import part_of, surviving_parents


class PowerIterationSN(nn.Module):
    """Early-GAN spectral normalization: the power-iteration vector is updated by
    ``param.data = ...`` inside the forward, then read again."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 5)
        self.u = nn.Parameter(torch.randn(5), requires_grad=False)

    def forward(self, x):
        w = self.lin.weight
        v = F.normalize(w.t() @ self.u.data, dim=0)
        self.u.data = F.normalize(w @ v, dim=0)
        sigma = self.u @ w @ v  # reads the parameter after its assignment
        return F.linear(x, w / sigma, self.lin.bias)


def test_data_assignment_is_a_recorded_write_and_validates():
    torch.manual_seed(0)
    model, x = PowerIterationSN(), torch.randn(3, 6)
    before = model.u.detach().clone()
    trace = tl.trace(model, x)
    write = trace["set_data_1"]
    assert write.is_inplace and write.parents == ("u", "normalize_2")
    assert trace["matmul_3"].parents[0] == "set_data_1"  # the read after it reads it
    torch.testing.assert_close(trace["u"].out, before, rtol=0, atol=0)  # the value before
    torch.testing.assert_close(write.out, trace["normalize_2"].out, rtol=0, atol=0)
    status = tl.replay(PowerIterationSN(), x)
    assert status.state == "passed", str(status)
    assert status.replayed == status.ops


def test_data_assignment_overwrites_its_target_whose_edge_is_exempt():
    trace = tl.trace(PowerIterationSN(), torch.randn(3, 6))
    write = trace["set_data_1"]
    assert "old values are never read" in exempt_reason(write, ["0"])
    assert exempt_reason(write, ["1"]) is None  # the assigned value is proved


def test_model_state_sees_a_parameter_given_other_memory():
    model = PowerIterationSN()
    state = ModelState(model, keep_parameters=True)
    model(torch.randn(3, 6))
    assert state.changed_parameters() == ["u"]  # no version moved: the memory did
    state.rewind_parameters()
    assert state.changed_parameters() == []


class RunningAverage(nn.Module):
    """A buffer given the memory of the value the forward returns (``buf.data = new``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("avg", torch.zeros(2, 4))

    def forward(self, x):
        new = 0.9 * self.avg + 0.1 * self.lin(x)
        self.avg.data = new
        return new


def test_a_buffer_given_the_output_memory_is_rewound_without_writing_into_it():
    model, x = RunningAverage(), torch.randn(2, 4)
    status = tl.replay(model, x)
    assert status.state == "passed", str(status)  # the rerun's output was not overwritten
    expected = 0.1 * model.lin(x).detach()  # one plain forward from zeros
    torch.testing.assert_close(model.avg, expected)


class ClippedLinear(nn.Module):
    """WGAN-style weight clipping inside the forward, and a write through a ``.data``
    alias, which moves neither the parameter's version counter nor its memory."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        self.lin.weight.data = self.lin.weight.data.clamp(-0.1, 0.1)
        y = self.lin(x)
        self.lin.bias.data.mul_(0.5)
        return y + self.lin.bias


def test_writes_through_data_aliases_of_parameters_validate():
    torch.manual_seed(0)
    model, x = ClippedLinear(), torch.randn(2, 4)
    bias = model.lin.bias.detach().clone()
    status = tl.replay(model, x)
    assert status.state == "passed", str(status)
    torch.testing.assert_close(model.lin.bias.detach(), bias * 0.5)  # one forward's worth
    trace = tl.trace(ClippedLinear(), x)
    assert trace["linear_1"].parents[1] == "set_data_1"
    assert trace["add_1"].parents[1] == "refresh_1"  # the bias after its write
    assert trace["refresh_1"].parents == ("lin.bias", "mul__1")


def test_data_assignment_replays_after_save_and_load(tmp_path):
    trace = tl.trace(PowerIterationSN(), torch.randn(3, 6))
    tl.save(trace, tmp_path / "sn")
    loaded = tl.load(tmp_path / "sn")
    assert loaded["set_data_1"].func is not None
    assert check_trace(loaded).state == "passed"


# -- an op that keeps no element of a parent ----------------------------------------------------


def _first_step_mask(x):
    """The 1x1 causal mask at the first step of an autoregressive loop."""
    return x + torch.triu(torch.full((1, 1), float("-inf")), 1)


def test_triu_keeping_no_element_is_unread_by_rule_never_failed():
    status = tl.replay(_first_step_mask, (torch.randn(1, 1),))
    assert status.state == "passed", status.failures
    (edge,) = status.unread
    assert edge.label == "triu_1" and "keeps no element of the input" in edge.reason


def test_tril_keeping_no_element_is_unread_by_rule():
    status = tl.replay(lambda x: torch.tril(x * 2, -3), (torch.randn(3, 5),))
    assert status.state == "passed", status.failures
    assert [edge.label for edge in status.unread] == ["tril_1"]


def test_the_rule_holds_only_where_nothing_is_kept():
    x = torch.randn(3, 5)
    trace = tl.trace(lambda x: (torch.triu(x, 4), torch.triu(x, 5), x.tril(-2), x.tril(-3)), x)
    kept = []
    for label in ("triu_1", "triu_2", "tril_1", "tril_2"):
        op = trace[label]
        args = (x, *op.args_template[1:])
        kept.append(unread_reason(op, ["0"], args, op.kwargs_template) is None)
    assert kept == [True, False, True, False]
    status = tl.replay(lambda x: torch.triu(x, 4), (x,))  # one element kept: proved
    assert status.state == "passed" and not status.unread


# -- uninitialized memory -----------------------------------------------------------------------


def _lrn_net():
    torch.manual_seed(4)
    return nn.Sequential(nn.Conv2d(3, 32, 5), nn.ReLU(), nn.CrossMapLRN2d(5)).eval()


def test_cross_map_lrn_validates():
    x = torch.randn(2, 3, 36, 36)
    status = tl.replay(_lrn_net(), x)
    assert status.state == "passed", status.failures
    assert status.replayed == status.ops == 258


def test_resize_as_growing_is_value_exempt_and_shrinking_is_not():
    trace = tl.trace(lambda x: x.new().resize_as_(x), (torch.randn(4, 6),))
    grow = trace["resize_as__1"]
    assert value_exempt(grow, [torch.zeros(0), torch.zeros(4, 6)], torch.zeros(4, 6))
    assert not value_exempt(grow, [torch.zeros(24), torch.zeros(4, 6)], torch.zeros(4, 6))
    assert "reads only the shape" in exempt_reason(grow, ["1"])  # the template


def test_set_onto_a_storage_is_value_exempt():
    # (Tensor.set_ does not reach torch function modes: a model's set_ shows as a refresh
    # with no recorded writer, unverified; an aten overload called directly is recorded)
    onto_storage = SimpleNamespace(func_name="set_", parent_args=[object()], shape=(4, 6))
    onto_tensor = SimpleNamespace(func_name="set_", parent_args=[object()] * 2, shape=(4, 6))
    emptied = SimpleNamespace(func_name="set_", parent_args=[object()], shape=(0,))
    assert value_exempt(onto_storage, [torch.zeros(0)], torch.zeros(4, 6))
    assert not value_exempt(onto_tensor, [torch.zeros(0), torch.ones(4, 6)], torch.ones(4, 6))
    assert not value_exempt(emptied, [torch.zeros(3)], torch.zeros(0))


def _overwritten_uninitialized(x):
    a = x.new()
    a.resize_as_(x)
    torch.pow(x, 2, out=a)  # every element overwritten
    b = torch.empty_like(x)
    b[:] = x + 1
    c = x.new_empty(x.shape).copy_(x)
    return a + b * c


def test_uninitialized_values_overwritten_downstream_poison_nothing():
    x = torch.randn(4, 64)
    status = tl.replay(_overwritten_uninitialized, (x,))
    assert status.state == "passed", status.failures
    assert status.replayed == status.ops


def test_a_corrupted_value_computed_over_uninitialized_memory_still_fails():
    trace = tl.trace(_overwritten_uninitialized, (torch.randn(4, 64),))
    bad = trace["pow_1"].out.clone()
    bad[0, 0] += 1
    trace.store.set("pow_1", bad, bad._version)
    assert ("pow_1", "replay") in {(f.label, f.arm) for f in check_trace(trace).failures}


# -- validation's cost follows the forward's --------------------------------------------------


def test_writes_overwritten_at_the_same_place_are_left_out_of_a_refresh():
    trace = tl.trace(_lrn_net(), torch.randn(2, 3, 36, 36))
    # the first channel: zero_, then three add_ through one view: the last holds them all
    assert trace["refresh_1"].parents == ("resize_as__2", "add__3")
    assert trace["refresh_2"].parents == ("refresh_1", "add__4")  # not copy__1 (overwritten)


def test_lrn_edges_are_all_proved_without_the_full_battery():
    """What made this model cost ~365 forwards: edges of writes overwritten later, each
    probed by the whole battery before being found unread. None is left."""
    status = tl.replay(_lrn_net(), torch.randn(2, 3, 36, 36))
    assert status.state == "passed" and status.unread == []


def test_surviving_parents_follow_the_geometry():
    def f(x):
        buf = x * 1.0
        left, right, lower = buf[:, :2], buf[:, 2:], buf[1:]
        left.mul_(2.0)
        right.add_(1.0)  # left and right together cover buf: its stale value is gone
        lower.neg_()
        return buf + 0

    trace = tl.trace(f, (torch.randn(3, 4),))
    refresh = trace["refresh_3"]  # buf: stale, then three writes
    assert refresh.parents == ("mul_1", "mul__1", "add__1", "neg__1")
    assert surviving_parents(refresh, trace) == {"mul__1", "add__1", "neg__1"}
    assert check_trace(trace).state == "passed"


# -- a write into a parameter during the forward --------------------------------------------


def test_max_norm_embedding_records_the_renorm_and_validates_in_eval_and_train():
    idx = torch.tensor([[1, 2, 3], [4, 5, 1]])
    for train in (False, True):
        torch.manual_seed(0)
        emb = nn.Embedding(20, 8, max_norm=1.0).train(train)
        before = emb.weight.detach().clone()
        trace = tl.trace(emb, idx)
        renorm = trace["embedding_renorm__1"]
        assert renorm.is_inplace and trace[renorm.parents[0]].parents == ("weight",)
        lookup = trace["embedding_1"]
        assert trace[lookup.parents[0]].parents == ("weight", "embedding_renorm__1")
        torch.testing.assert_close(trace["weight"].out, before, rtol=0, atol=0)
        torch.manual_seed(0)
        status = tl.replay(nn.Embedding(20, 8, max_norm=1.0).train(train), idx)
        assert status.state == "passed", str(status)
        assert status.replayed == status.ops and not status.unread


def test_a_tied_max_norm_weight_is_read_after_its_write():
    emb = nn.Embedding(20, 8, max_norm=1.0)

    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def forward(self, idx):
            return self.emb(idx) @ self.emb.weight.t()

    idx = torch.tensor([[1, 2, 3]])
    trace = tl.trace(TiedLM(), idx)
    assert trace["t_1"].parents == trace["embedding_1"].parents[:1]  # the written weight
    assert tl.replay(TiedLM(), idx).state == "passed"


def test_embeddings_without_max_norm_stay_one_op():
    trace = tl.trace(nn.Embedding(20, 8), torch.tensor([[1, 2]]))
    assert [op.func_name for op in trace.ops] == ["embedding"]
    assert [call.address for call in trace.modules] == [""]


def test_part_of_holds_for_views_into_a_dense_parent_only():
    base = torch.randn(2, 8, 4, 4)
    assert part_of(base.select(1, 3), base) and part_of(base[:, 2:5], base)
    assert part_of(base.permute(0, 2, 3, 1)[..., 1], base.permute(0, 2, 3, 1))
    assert not part_of(base.select(1, 3).clone(), base)  # a copy: its own memory
    assert not part_of(base.select(1, 3), base[:, ::2])  # a parent with gaps: not proved
    assert not part_of(base.view(torch.int32)[0], base)  # read as another dtype
    assert not part_of(base[:, :0], base)  # no elements


def test_bernoulli_with_a_number_p_reads_only_the_shape_of_its_tensor():
    """SpeechT5's prenet dropout: ``torch.bernoulli(x, p=0.5)`` (and ``x.bernoulli(0.5)``)
    draw with probability p; x's values are never read, so the edge is exempt, not failed.
    Without p, x holds the probabilities: that edge is still proved."""

    def masks(x):
        keep = torch.bernoulli(x[0], p=0.5)
        return torch.where(keep == 1, x, 0) * 2 + x.bernoulli(0.5)

    torch.manual_seed(0)
    status = tl.replay(masks, (torch.randn(2, 3, 4),))
    assert status.state == "passed", str(status)
    trace = tl.trace(masks, (torch.randn(2, 3, 4),))
    drawn = [op for op in trace.ops if op.func_name == "bernoulli"]
    assert len(drawn) == 2
    assert all("probability" in exempt_reason(op, ["0"]) for op in drawn)

    probabilities = tl.trace(torch.bernoulli, (torch.rand(3, 4),))
    assert exempt_reason(probabilities["bernoulli_1"], ["0"]) is None
    status = tl.replay(lambda p: torch.bernoulli(p) + p, (torch.rand(3, 4),))
    assert status.state == "passed" and status.perturbation_verified == status.ops, str(status)


def test_a_nan_source_added_into_nan_rows_is_proved_at_a_neutral_point():
    """DBRX in float64 with left padding: the padded token's rows are NaN, and an expert's
    NaN output is index-added into those rows only. No move of an all-NaN source shows at
    the recorded point (its rows of the target are NaN already); with the target made
    finite and the source halved (made finite), it does."""
    rows = torch.tensor([2, 3])

    def experts(x):
        out = torch.zeros(4, 3)
        out.index_add_(0, rows, x * 2.0)
        return out.index_add_(0, rows, x * 3.0)

    status = tl.replay(experts, (torch.full((2, 3), float("nan")),))
    assert status.state == "passed", str(status)
    assert not status.unread


def test_deepcopy_records_only_the_tensor_it_copies():
    """``copy.deepcopy`` of an object holding tensors (a diffusers scheduler copied inside a
    sampling loop) passes each tensor its memo, which holds the copies made so far and the
    originals: those are not read, so they are not parents, and the loop validates."""
    import copy

    class Holder:
        def __init__(self) -> None:
            self.a, self.b, self.c = (torch.linspace(i, i + 1, 5) for i in range(3))

    held = Holder()

    def step(x):
        own = copy.deepcopy(held)
        return x * own.a + own.b * own.c

    trace = tl.trace(step, (torch.randn(5),))
    copies = [op for op in trace.ops if op.func_name == "deepcopy"]
    assert len(copies) == 3 and all(len(op.parents) == 1 for op in copies)
    assert all(trace[op.parents[0]].kind == "constant" for op in copies)
    status = tl.replay(step, (torch.randn(5),))
    assert status.state == "passed", str(status)


def test_a_jagged_nested_tensor_chain_validates():
    """``torch.nested`` jagged tensors: ``_nested_view_from_jagged`` gets a dummy tensor
    that only carries its ragged size; its edge is exempt, not failed."""

    def nested(a, b):
        jagged = torch.nested.nested_tensor([a, b], layout=torch.jagged) * 2
        return torch.cat([t.sum(0, keepdim=True) for t in jagged.unbind()])

    args = (torch.randn(3, 4), torch.randn(5, 4))
    tl.trace(nested, args)  # (torch makes the dummy once, on first use)
    status = tl.replay(nested, args)
    assert status.state == "passed", str(status)
    trace = tl.trace(nested, args)
    views = [op for op in trace.ops if op.func_name == "_nested_view_from_jagged"]
    assert views and all("dummy" in exempt_reason(op, ["2"]) for op in views)


def test_a_write_through_a_view_of_another_dtype_is_unverified_never_failed():
    """``z.real.mul_(2)`` writes a complex tensor through a float view: its refresh is not
    replayed (writes are redone between views of one dtype), so it is unverified, with
    the reason, and the ground truth still checks the output."""

    def doubled_real(x):
        z = torch.complex(x, x * 2)
        z.real.mul_(2)
        return z.abs()

    status = tl.replay(doubled_real, (torch.randn(4),))
    assert status.state == "unverified" and not status.failures, str(status)
    assert any("another dtype" in gap.reason for gap in status.unchecked)
    assert "ground_truth" in status.arms
