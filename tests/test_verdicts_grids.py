"""grid_sample with zero padding (issue 50, item 9): sample points that fall fully or
partly outside the input, or exactly on the kernel's edge, with the grid an input or
computed from the input (a spatial transformer's affine grid, a flow warp, deformable
sampling). No correct model is accused; an edge that provably reads no element is exempt
by a rule that says why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.replay.exemptions import unread_reason
from torchlens.replay.status import ReplayStatus

H, W = 5, 6


def _normalised(at: float, size: int, corners: bool) -> float:
    """The grid coordinate of pixel position ``at`` (unnormalised, as grid_sample reads)."""
    return 2 * at / (size - 1) - 1 if corners else (2 * at + 1) / size - 1


def _grid(kind: str, corners: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    rand = torch.rand(1, 3, 4, 2, generator=gen)
    if kind == "inside":
        return rand * 1.6 - 0.8
    if kind == "outside":
        return torch.full((1, 3, 4, 2), 3.0)
    if kind == "partly":
        return torch.cat([torch.full((1, 3, 2, 2), -3.0), rand[:, :, :2] - 0.5], 2)
    at = {"lower_edge": -1.0, "upper_edge": float(W)}[kind]  # a bilinear weight of 0
    xs = torch.full((1, 3, 4), _normalised(at, W, corners))
    return torch.stack([xs, rand[..., 1] - 0.5], -1)


class SampleGrid(nn.Module):
    """The grid is the model's input; the sampled image a convolution's output."""

    def __init__(self, mode: str, corners: bool) -> None:
        super().__init__()
        self.mode, self.corners = mode, corners
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x, grid):
        image = self.conv(x)
        return F.grid_sample(
            image, grid, mode=self.mode, padding_mode="zeros", align_corners=self.corners
        )  # fmt: skip


class SpatialTransformer(nn.Module):
    """theta predicted from the input, its affine grid sampled (zoomed out or shifted:
    points outside the input)."""

    def __init__(self, corners: bool, scale: float, shift: float) -> None:
        super().__init__()
        self.corners = corners
        self.localise = nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(4, 6),
        )  # fmt: skip
        with torch.no_grad():
            self.localise[-1].weight.mul_(0.01)
            self.localise[-1].bias.copy_(torch.tensor([scale, 0, shift, 0, scale, shift]))

    def forward(self, x):
        theta = self.localise(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=self.corners)
        return F.grid_sample(x, grid, padding_mode="zeros", align_corners=self.corners)


class FlowWarp(nn.Module):
    """grid = base + a predicted flow (optical-flow warping); ``offset`` moves every
    point, ``gain`` scales the flow."""

    def __init__(self, corners: bool, gain: float, offset: float) -> None:
        super().__init__()
        self.corners, self.gain, self.offset = corners, gain, offset
        self.flow = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        n, _, h, w = x.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        base = torch.stack([xs, ys], -1).expand(n, h, w, 2)
        flow = self.flow(x).permute(0, 2, 3, 1) * self.gain + self.offset
        return F.grid_sample(x, base + flow, padding_mode="zeros", align_corners=self.corners)


class DeformableSampling(nn.Module):
    """Three offset samples per pixel (offsets predicted, in pixels), averaged."""

    def __init__(self, corners: bool) -> None:
        super().__init__()
        self.corners = corners
        self.offsets = nn.Conv2d(2, 6, 3, padding=1)

    def forward(self, x):
        n, _, h, w = x.shape
        ys, xs = torch.meshgrid(
            torch.arange(h, dtype=x.dtype), torch.arange(w, dtype=x.dtype), indexing="ij"
        )
        offsets = self.offsets(x).view(n, 3, 2, h, w) * 3
        samples = []
        for k in range(3):
            gx = _normalised_tensor(xs + offsets[:, k, 0], w, self.corners)
            gy = _normalised_tensor(ys + offsets[:, k, 1], h, self.corners)
            grid = torch.stack([gx, gy], -1)
            samples.append(F.grid_sample(x, grid, padding_mode="zeros", align_corners=self.corners))
        return torch.stack(samples).mean(0)


def _normalised_tensor(at: torch.Tensor, size: int, corners: bool) -> torch.Tensor:
    return 2 * at / (size - 1) - 1 if corners else (2 * at + 1) / size - 1


def _checked(model: nn.Module, args) -> ReplayStatus:
    status = tl.replay(model, args)
    assert status.state == "passed", str(status)
    assert not status.failures and not status.unchecked
    return status


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("kind", ["inside", "outside", "partly", "lower_edge", "upper_edge"])
def test_a_grid_given_as_input_is_never_accused(mode, corners, kind):
    torch.manual_seed(0)
    model, x = SampleGrid(mode, corners), torch.randn(1, 2, H, W)
    status = _checked(model, (x, _grid(kind, corners)))
    for unread in status.unread:  # exempt only by the rule, only where nothing is read
        assert unread.label == "grid_sample_1"
        assert "no element of the input is read" in unread.reason
        assert not model(x, _grid(kind, corners)).any()


@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize(
    "make",
    [lambda c: SpatialTransformer(c, 1.0, 0.0), lambda c: SpatialTransformer(c, 2.5, 0.0),
     lambda c: SpatialTransformer(c, 1.0, 5.0), lambda c: SpatialTransformer(c, 1.0, 2.0),
     lambda c: FlowWarp(c, 1.0, 0.0), lambda c: FlowWarp(c, 3.0, 0.0),
     lambda c: FlowWarp(c, 0.01, 4.0), lambda c: FlowWarp(c, 0.0, 2.0),
     DeformableSampling],
    ids=["stn", "stn_zoomed_out", "stn_shifted_out", "stn_shifted_to_edge", "flow",
         "flow_large", "flow_all_outside", "flow_to_edge", "deformable"],
)  # fmt: skip
def test_a_grid_computed_from_the_input_is_never_accused(make, corners):
    torch.manual_seed(0)
    _checked(make(corners), torch.randn(1, 2, H, W))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("at", [-1.01, -1.0, -0.51, -0.5, 0.0, 5.0, 5.49, 5.5, 6.0, 6.5])
def test_the_rule_exempts_exactly_the_grids_that_read_no_element(mode, corners, at):
    # on the kernel's edge (bilinear at -1 or at the size, nearest at half a pixel) the
    # rule asks torch's own weights: exempt exactly when the output is zeros whatever the
    # input holds
    x = torch.randn(1, 2, H, W)
    ys = torch.rand(1, 3, 4, generator=torch.Generator().manual_seed(3)) - 0.5
    grid = torch.stack([torch.full((1, 3, 4), _normalised(at, W, corners)), ys], -1)
    kwargs = {"mode": mode, "padding_mode": "zeros", "align_corners": corners}
    op = SimpleNamespace(func_name="grid_sample")
    exempt = unread_reason(op, ["0"], (x, grid), kwargs) is not None
    reads = any(F.grid_sample(x * k, grid, **kwargs).any() for k in (1.0, -3.0))
    assert exempt == (not reads)
    assert unread_reason(op, ["1"], (x, grid), kwargs) is None  # the grid: never by this rule
