"""Held-out classes of issue 50 (item "Done means"): models whose escaped values carry
real dependencies come out ``incomplete``, with direct edges from the escaped record to the
op that reads the Python value; escapes that only pick branches that do not matter stay
``passed``. A detection head looping over boxes with ``int()``, an ODE solver whose fixed
grid comes from ``.item()`` values, graph and splatting models that index with
``.tolist()``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl


class DetHead(nn.Module):  # loops over predicted boxes with int()
    def __init__(s):
        super().__init__()
        s.backbone = nn.Conv2d(3, 8, 3, padding=1)
        s.boxes = nn.Linear(8, 4 * 5)
        s.cls = nn.Linear(8, 3)

    def forward(s, img):
        f = s.backbone(img).relu()  # (1, 8, 16, 16)
        raw = s.boxes(f.mean((2, 3))).view(5, 4).sigmoid()
        xy = raw[:, :2] * 10
        wh = raw[:, 2:] * 5 + 2
        boxes = torch.cat([xy, xy + wh], 1)
        outs = []
        for b in boxes:
            x0, y0, x1, y1 = int(b[0]), int(b[1]), int(b[2]), int(b[3])
            crop = f[:, :, y0 : y1 + 1, x0 : x1 + 1]
            outs.append(s.cls(F.adaptive_avg_pool2d(crop, 1).flatten(1)))
        return torch.cat(outs), boxes


class DetScoreFilter(nn.Module):  # escapes only pick which boxes to keep by score (branch)
    def __init__(s):
        super().__init__()
        s.head = nn.Linear(4, 6)

    def forward(s, x):
        scores = s.head(x).sigmoid()
        keep = []
        for i in range(scores.shape[1]):
            if scores[0, i].item() > -1.0:  # always true: branch that never flips materially
                keep.append(scores[:, i])
        return torch.stack(keep, 1)


class ODE(nn.Module):  # fixed grid built from .item() values
    def __init__(s):
        super().__init__()
        s.f = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(s, y0, t_span):
        t0, t1 = t_span[0].item(), t_span[1].item()
        n = int(round((t1 - t0) / 0.1))
        ts = torch.linspace(t0, t1, n + 1)
        y = y0
        for i in range(n):
            h = ts[i + 1] - ts[i]
            k1 = s.f(y)
            k2 = s.f(y + h / 2 * k1)
            y = y + h * k2
        return y


class ODEPyFloat(nn.Module):  # grid from Python floats: no escape
    def __init__(s):
        super().__init__()
        s.f = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(s, y0):
        ts = torch.linspace(0.0, 1.0, 11)
        y = y0
        for i in range(10):
            y = y + (ts[i + 1] - ts[i]) * s.f(y)
        return y


class ODEDt(nn.Module):  # step size escapes with float()
    def __init__(s):
        super().__init__()
        s.f = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(s, y0, t):
        dt = float(t[1] - t[0])
        y = y0
        for _ in range(t.shape[0] - 1):
            y = y + dt * s.f(y)
        return y


class Graph(nn.Module):  # message passing indexing with .tolist()
    def __init__(s):
        super().__init__()
        s.lin = nn.Linear(4, 4)

    def forward(s, h, edge_index):
        m = s.lin(h)
        out = torch.zeros_like(m)
        for src, dst in edge_index.t().tolist():
            out[dst] = out[dst] + m[src]
        return out.relu()


class GraphPredictedEdges(nn.Module):  # edges predicted from features (topk), indexed via tolist
    def __init__(s):
        super().__init__()
        s.lin = nn.Linear(4, 4)

    def forward(s, h):
        m = s.lin(h)
        sim = m @ m.t()
        nbr = sim.topk(2, dim=1).indices.tolist()
        rows = [m[js].mean(0) for js in nbr]
        return torch.stack(rows)


class Splat(nn.Module):  # forward splatting with .tolist() pixel coordinates
    def __init__(s):
        super().__init__()
        s.pos = nn.Linear(4, 2)
        s.feat = nn.Linear(4, 3)

    def forward(s, pts):
        xy = (s.pos(pts).sigmoid() * 7).round().long()
        f = s.feat(pts)
        canvas = torch.zeros(3, 8, 8)
        for (x, y), v in zip(xy.tolist(), f):
            canvas[:, y, x] += v
        return canvas


class BranchOnly(nn.Module):  # escapes that only pick branches that don't matter
    def __init__(s):
        super().__init__()
        s.lin = nn.Linear(4, 4)

    def forward(s, x, mask):
        y = s.lin(x)
        if mask.all():
            y = y * 1.0
        assert not torch.isnan(y).any()
        if y.shape[0] > 0 and bool((x.abs() < 1e9).all()):
            y = y + 0
        return y


def _replayed(model, args):
    torch.manual_seed(0)
    status = tl.replay(model, args)
    assert not status.failures, str(status)
    return status


def _direct(status, trace) -> None:
    """Every hidden edge is a direct one: the recorded graph has no path for it."""
    for edge in status.hidden_edges:
        assert edge.parent not in _ancestors(trace, edge.child), edge


def _ancestors(trace, label: str) -> set[str]:
    seen, stack = set(), [label]
    while stack:
        for parent in getattr(trace[stack.pop()], "parents", ()):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def _trace(model, args):
    torch.manual_seed(0)
    return tl.trace(model, args)


def test_a_detection_head_cropping_each_box_with_int_is_incomplete_with_one_edge_per_coordinate():
    torch.manual_seed(0)
    model, img = DetHead(), torch.randn(1, 3, 16, 16)
    status, trace = _replayed(model, img), _trace(model, img)
    assert status.state == "incomplete"
    assert len(status.hidden_edges) == 20  # 5 boxes, 4 coordinates each
    crops = {edge.child for edge in status.hidden_edges}
    assert len(crops) == 5
    for edge in status.hidden_edges:
        assert edge.via == "__int__"
        assert trace[edge.child].func_name == "getitem"  # the crop reads the coordinates
        assert trace[edge.parent].func_name == "getitem"  # one coordinate of one box
    _direct(status, trace)


def test_an_ode_grid_built_from_item_values_is_incomplete_at_the_linspace():
    torch.manual_seed(0)
    model, args = ODE(), (torch.randn(2, 3), torch.tensor([0.0, 1.0]))
    status, trace = _replayed(model, args), _trace(model, args)
    assert status.state == "incomplete"
    edges = {(e.parent, e.child, e.via) for e in status.hidden_edges}
    assert edges == {("getitem_1", "linspace_1", "item"), ("getitem_2", "linspace_1", "item")}
    _direct(status, trace)


def test_an_ode_step_read_with_float_is_incomplete_and_a_python_grid_passes():
    torch.manual_seed(0)
    status = _replayed(ODEDt(), (torch.randn(2, 3), torch.linspace(0, 1, 6)))
    assert status.state == "incomplete"
    assert [(e.parent, e.via) for e in status.hidden_edges] == [("sub_1", "__float__")]
    assert _replayed(ODEPyFloat(), torch.randn(2, 3)).state == "passed"


@pytest.mark.parametrize("predicted", [False, True])
def test_a_graph_indexing_with_tolist_is_incomplete_from_the_escaped_indices(predicted):
    torch.manual_seed(0)
    if predicted:
        model, args = GraphPredictedEdges(), torch.randn(6, 4)
    else:
        edge_index = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
        model, args = Graph(), (torch.randn(5, 4), edge_index)
    status, trace = _replayed(model, args), _trace(model, args)
    assert status.state == "incomplete"
    assert status.hidden_edges
    [escaped] = {e.parent for e in status.hidden_edges}  # the one record whose list escaped
    assert escaped == ("topk_1:1" if predicted else "t_1")
    for edge in status.hidden_edges:
        assert edge.via == "tolist" and trace[edge.child].func_name == "getitem"
    _direct(status, trace)


def test_splatting_at_tolist_coordinates_is_incomplete_at_the_canvas_write():
    torch.manual_seed(0)
    model, pts = Splat(), torch.randn(6, 4)
    status, trace = _replayed(model, pts), _trace(model, pts)
    assert status.state == "incomplete"
    [edge] = status.hidden_edges
    assert edge.via == "tolist" and trace[edge.parent].func_name == "long"
    _direct(status, trace)


@pytest.mark.parametrize("make", [DetScoreFilter, BranchOnly])
def test_escapes_that_only_pick_branches_that_do_not_matter_pass(make):
    torch.manual_seed(0)
    args = torch.randn(1, 4) if make is DetScoreFilter else (
        torch.randn(3, 4), torch.ones(3, dtype=torch.bool)
    )  # fmt: skip
    status = _replayed(make(), args)
    assert status.state == "passed" and not status.hidden_edges
