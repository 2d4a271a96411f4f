"""A zoo of small hand-written PyTorch models shared by the torchlens tests.

Every entry of :data:`ZOO` is a :class:`ZooCase` describing one model ("case"):

* ``make_model()`` builds a fresh ``nn.Module`` (already in ``.train()`` mode when
  ``case.train`` is true, ``.eval()`` otherwise) or, for cases tagged ``"function"``,
  a plain Python callable.  Inputs do not require grad, except for the plain
  functions and ``identity_module`` (which have no parameters), so that every
  case has a differentiable output.
* ``make_inputs()`` builds fresh ``(args, kwargs)`` for one forward call:
  ``model(*args, **kwargs)``.  Call it again for every forward: a few cases
  (tag ``"mutates_input"``) modify their inputs in place.

Both factories seed torch with a fixed per-case seed, so two calls give identical
parameters / inputs.  Cases tagged ``"stochastic"`` draw random numbers in their
forward; seed torch (e.g. ``torch.manual_seed(0)``) right before each forward to
get reproducible outputs.  Cases tagged ``"buffers_update"`` change buffers during
the forward (their outputs do not depend on the buffer values they change, so two
forwards of the same model give the same result).

All models are tiny (a forward takes a few milliseconds on CPU) and only use
``torch``, ``numpy`` and the standard library.  Model classes, hooks and plain
functions are defined at module level, so models can be pickled (except the
``"parametrize"`` case, which torch refuses to pickle).

Tags used (a case can have several):

=================  ==============================================================
``buffers_update``  forward changes buffers (BatchNorm in train mode, counters)
``stochastic``      random ops in forward (dropout in train mode, rand, bernoulli)
``inplace``         in-place ops (``relu_``, ``+=``, ``mul_``, ``x[i] = y``, ...)
``views``           views / reshapes / permutes / slicing / expand / ``.T``
``indexing``        tensor and bool-mask indexing, gather / scatter, index_select
``multi_output``    ops returning several tensors (split, topk, sort, max(dim))
``rnn``             recurrent modules and hand-written recurrent loops
``attention``       attention layers (MHA, SDPA, hand-written, transformer layer)
``containers``      nested containers as inputs / outputs / module structure
``kwargs``          inputs passed (partly or only) as keyword arguments
``int``             integer / bool tensors (embeddings, integer arithmetic)
``complex``         complex tensors (fft, complex multiply)
``created``         tensors created inside forward (zeros, arange, tensor, ...)
``function``        the "model" is a plain Python function, not an nn.Module
``half``            float16 / bfloat16 models
``float64``         float64 model
``reuse``           the same module / parameter used several times (incl. tied)
``control_flow``    Python control flow depending on tensor values
``grad_mode``       ``torch.no_grad()`` / ``enable_grad`` / ``detach`` in forward
``python_scalar``   tensor values turned into Python numbers (``.item()``)
``mutates_input``   forward modifies one of its input tensors in place
``hooks``           forward (pre-)hooks registered on submodules
``parametrize``     ``torch.nn.utils.parametrize`` parametrizations
``custom_autograd`` a custom ``torch.autograd.Function``
``empty``           zero-sized tensors
``unused_input``    output does not depend on (some) input values
=================  ==============================================================
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


@dataclass(frozen=True)
class ZooCase:
    """One zoo model: factories for the model and for one forward's inputs."""

    name: str
    make_model: Callable[[], Callable]
    make_inputs: Callable[[], tuple[tuple, dict]]
    tags: frozenset[str] = field(default_factory=frozenset)
    train: bool = False

    def __repr__(self) -> str:  # short, readable pytest output
        return f"ZooCase({self.name!r})"


# ---------------------------------------------------------------------------
# Small shared helpers
# ---------------------------------------------------------------------------


def _a(*args, **kwargs) -> tuple[tuple, dict]:
    """Pack forward arguments as ``(args, kwargs)``."""
    return args, kwargs


def _mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------
# MLPs and basic layers
# ---------------------------------------------------------------------------


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ActivationZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.prelu = nn.PReLU(8)
        self.acts = nn.Sequential(nn.Tanh(), nn.SiLU(), nn.GELU(), nn.Mish())

    def forward(self, x):
        x = self.fc(x)
        outs = [
            F.elu(x),
            F.leaky_relu(x, 0.1),
            self.prelu(x),
            F.hardswish(x),
            F.softplus(x),
            F.logsigmoid(x),
            F.softsign(x),
            F.selu(x),
            F.celu(x),
            torch.sigmoid(x),
            F.hardtanh(x),
            F.relu6(x),
            self.acts(x),
            F.glu(x, dim=-1).repeat(1, 2),
        ]
        return torch.stack(outs).sum(0)


class BilinearNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(8, 6, 4)

    def forward(self, x, y):
        return self.bil(x, y)


class FunctionalParams(nn.Module):
    """Parameters held directly and used through torch.nn.functional."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, 8) * 0.3)
        self.b1 = nn.Parameter(torch.zeros(16))
        self.cw = nn.Parameter(torch.randn(4, 3, 3, 3) * 0.3)

    def forward(self, x, img):
        h = F.linear(x, self.w1, self.b1)
        c = F.conv2d(img, self.cw, padding=1)
        return h.relu().sum(-1), c.mean((2, 3))


# ---------------------------------------------------------------------------
# Convolutions, pooling
# ---------------------------------------------------------------------------


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 3, padding=1)
        self.c2 = nn.Conv1d(8, 8, 3, stride=2, padding=1, padding_mode="circular")
        self.pool = nn.MaxPool1d(2)
        self.head = nn.Linear(8 * 4, 4)

    def forward(self, x):
        x = self.pool(F.relu(self.c2(F.relu(self.c1(x)))))
        return self.head(x.flatten(1))


class Conv2dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding="same", padding_mode="reflect")
        self.pool = nn.MaxPool2d(2)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = F.relu(self.conv2(x))
        return self.fc(self.flat(self.pool(x)))


class Conv3dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(2, 4, 3, padding=1)
        self.pool = nn.AvgPool3d(2)
        self.fc = nn.Linear(4 * 2 * 2 * 2, 3)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.c(x))).flatten(1))


class ConvTransposeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 4, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1)
        self.up1d = nn.ConvTranspose1d(2, 2, 3, stride=2, output_padding=1)

    def forward(self, x, seq):
        return self.up(F.relu(self.down(x))), self.up1d(seq)


class GroupedDilatedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.depthwise = nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4)
        self.pointwise = nn.Conv2d(4, 8, 1, bias=False)
        self.strided = nn.Conv2d(8, 8, 3, stride=2, groups=2)

    def forward(self, x):
        return self.strided(self.pointwise(self.depthwise(x)))


class PoolingZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.maxp = nn.MaxPool2d(2)
        self.avgp = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.amax = nn.AdaptiveMaxPool2d((2, 3))
        self.aavg = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        x = self.conv(x)
        a = self.maxp(x)
        b = self.avgp(x)
        c = self.amax(x)
        d = self.aavg(x)
        e = F.lp_pool2d(x.abs() + 0.1, 2, 2)
        return a.sum((2, 3)) + b.mean((2, 3)) + c.flatten(2).sum(-1) + d.flatten(1) + e.mean((2, 3))


class MaxUnpoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)
        self.conv = nn.Conv2d(2, 2, 1)

    def forward(self, x):
        pooled, idx = self.pool(self.conv(x))
        return self.unpool(pooled, idx), idx


class UnfoldFold(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2 * 2 * 2, 2 * 2 * 2)

    def forward(self, x):
        cols = F.unfold(x, kernel_size=2, stride=2)  # (N, C*4, L)
        cols = self.proj(cols.transpose(1, 2)).transpose(1, 2)
        return F.fold(cols, output_size=x.shape[-2:], kernel_size=2, stride=2)


class SpatialTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(3 * 8 * 8, 6)
        nn.init.zeros_(self.loc.weight)
        with torch.no_grad():
            self.loc.bias.copy_(torch.tensor([1.0, 0.1, 0.0, -0.1, 1.0, 0.0]))

    def forward(self, x):
        theta = self.loc(x.flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)


# ---------------------------------------------------------------------------
# Normalization, dropout, randomness
# ---------------------------------------------------------------------------


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).mean((2, 3)))


class BN1dCumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8, momentum=None)

    def forward(self, x):
        return self.bn(self.fc(x))


class NormZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.ln = nn.LayerNorm([8, 8])
        self.ln_vec = nn.LayerNorm(8, elementwise_affine=False)

    def forward(self, x):
        x = self.conv(x)
        y = self.gn(x) + self.inorm(x) + self.ln(x)
        return self.ln_vec(y.mean((2, 3))), F.normalize(y.flatten(1), dim=1)


class InstanceNormTracked(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(4, track_running_stats=True, affine=True)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.norm(x))


class BufferCounter(nn.Module):
    """Increments a buffer in place on every call; output does not use it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x):
        self.calls += 1
        self.seen.add_(x.detach().mean(0))
        return self.fc(x)


class DropoutNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.5)
        self.drop2d = nn.Dropout2d(0.25)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        h = self.drop(F.relu(self.fc1(x)))
        h2 = self.drop2d(h.view(2, 4, 2, 4))
        return self.fc2(h2.reshape(2, 32)) + F.dropout(h, 0.1, self.training).sum()


class RandomInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        noise = torch.randn(h.shape) * 0.1 + torch.rand_like(h) * 0.01
        keep = torch.bernoulli(torch.full_like(h, 0.7))
        perm = torch.randperm(h.shape[1])
        ints = torch.randint(0, 3, (h.shape[0], 1)).float()
        return (h + noise) * keep + h[:, perm] + ints + torch.normal(0.0, 1.0, size=(1, 8))


# ---------------------------------------------------------------------------
# In-place operations
# ---------------------------------------------------------------------------


class ReluInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class InplaceArith(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h += 1
        h.mul_(2)
        h -= x
        h /= 3.0
        h.add_(x, alpha=0.5).clamp_(-2.0, 2.0)
        torch.sigmoid_(h)
        return F.relu_(h - 0.5)


class InplaceSetitem(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fc_y = nn.Linear(8, 8)

    def forward(self, x, y):
        h = self.fc(x)
        h[0] = self.fc_y(y)[1]
        h[:, :2] += 1
        h[1, 3] = 7.0
        h[h > 2.5] = 0.0
        h[:, torch.tensor([4, 6])] *= 2
        return h


class MaskedFillInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        h.masked_fill_(h < 0, 0.0)
        out = h.clone()
        out.masked_fill_(torch.eye(2, 8, dtype=torch.bool), -1.0)
        return out


class InputMutation(nn.Module):
    """Modifies its input tensor in place (x += 1) before using it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x += 1
        x.mul_(0.5)
        return self.fc(x)


class InplaceOnView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        v = h[:, 2:6]
        v.mul_(3)  # writes through the view into h
        h.transpose(0, 1)[0].zero_()
        d = h.diagonal()
        d.add_(10.0)
        return h, v


# ---------------------------------------------------------------------------
# Views, reshaping, slicing
# ---------------------------------------------------------------------------


class ViewsReshape(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):  # x: (2, 3, 4, 6)
        h = self.fc(x)
        a = h.view(2, 12, 6).reshape(2, 3, 24)
        b = h.permute(0, 3, 1, 2).contiguous().flatten(2)
        c = h.transpose(1, 2).movedim(-1, 1).swapaxes(2, 3)
        m = h[0, 0]  # (4, 6)
        t = m.T @ m.t().t()
        mt = h.mT.sum(-1)
        u = h.unflatten(-1, (2, 3)).sum(-1)
        return a.sum() + b.mean() + c.std() + t.sum() + mt.sum() + u.sum()


class SlicingExpand(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x):  # x: (4, 8)
        h = self.fc(x)
        s = h[1:3, ::2]
        n = h.narrow(1, 2, 4)
        e = self.bias.unsqueeze(0).expand(4, -1) + h
        f = h[..., None].expand(-1, -1, 3).sum(-1)
        g = h[None, :, 1].squeeze(0)
        ea = self.bias[:4].expand_as(n) * n
        sel = h.select(1, 0)
        last = h[-1, -3:]
        return s.sum() + e + f + ea.sum() + g.sum() + sel.sum() + last.sum()


class StridedViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)  # (2, 8)
        w = h.unfold(1, 3, 2)  # (2, 3, 3) sliding windows
        d = torch.diagonal(h[:, :2])
        a = h.as_strided((2, 2), (8, 2))
        r = h.view_as(h).unsqueeze(1).squeeze()
        return w.sum(-1), d, a, r.view(-1)


class EmptyTensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        empty = h[:, :0]
        cat = torch.cat([empty, h], dim=1)
        z = torch.zeros(0, 8)
        both = torch.cat([z, cat], dim=0)
        return both + empty.sum(), empty * 2, z.mean(0).nan_to_num()


# ---------------------------------------------------------------------------
# Indexing
# ---------------------------------------------------------------------------


class TensorIndexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, idx):
        h = self.fc(x)  # (4, 8)
        a = h[idx]
        b = h[:, idx]
        c = h[h > 0]
        d = h[torch.tensor([0, 2]), torch.tensor([1, 3])]
        e = h[[1, 3]]
        mask = torch.tensor([True, False, True, False])
        f = h[mask, 1:]
        return a.sum(0) + b.sum(1).sum(), c.sum() + d.sum() + e.sum() + f.sum()


class GatherScatter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, idx):  # idx: (2, 3) long in [0, 8)
        h = self.fc(x)
        g = torch.gather(h, 1, idx)
        s = torch.zeros_like(h).scatter(1, idx, g)
        sa = torch.zeros_like(h).scatter_add(1, idx, torch.ones_like(g))
        sr = torch.zeros(2, 8).scatter_reduce(1, idx, g, reduce="amax", include_self=False)
        isel = torch.index_select(h, 1, idx[0])
        iadd = torch.zeros(2, 8).index_add(1, idx[1], isel)
        ifill = h.index_fill(1, idx[0], -1.0)
        return s + sa + sr + iadd + ifill


class DataDependentIndexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        nz = torch.nonzero(h > 0)
        ms = torch.masked_select(h, h > 0)
        tad = torch.take_along_dim(h, h.argsort(dim=1), dim=1)
        t = torch.take(h, torch.tensor([0, 5, 9]))
        msc = h.masked_scatter(h < 0, torch.arange(16.0))
        return nz.float().sum() + ms.sum(), tad, t, msc


# ---------------------------------------------------------------------------
# Multi-output ops
# ---------------------------------------------------------------------------


class SplitChunkUnbind(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 12)

    def forward(self, x):
        h = self.fc(x)
        a, b, c = torch.split(h, [2, 4, 6], dim=1)
        p, q = h.chunk(2, dim=-1)
        rows = h.unbind(0)
        parts = h.tensor_split(3, dim=1)
        return a.sum(1) + b.mean(1) + c.amax(1), p * q, rows[0] - rows[1], parts[2]


class MaxTopkSort(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        mx, amx = h.max(dim=1)
        mn = torch.min(h, dim=1, keepdim=True).values
        top_v, top_i = torch.topk(h, 3, dim=1)
        srt, order = torch.sort(h, dim=1, descending=True)
        kth, _ = torch.kthvalue(h, 2, dim=1)
        med, _ = h.median(dim=1)
        return mx + mn.squeeze(1) + kth + med, amx, top_v * top_i, srt, order


class StatsMultiOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        std, mean = torch.std_mean(h, dim=0)
        var, _ = torch.var_mean(h, dim=1)
        lo, hi = torch.aminmax(h)
        cmax, cidx = torch.cummax(h, dim=1)
        rows, cols = torch.where(h > 0)
        uniq, counts = torch.unique(torch.tensor([3, 1, 3, 2, 1, 3]), return_counts=True)
        gx, gy = torch.meshgrid(torch.arange(2.0), torch.arange(3.0), indexing="ij")
        return std + mean, var, hi - lo, cmax, cidx, rows, cols, uniq * counts, gx + gy


# ---------------------------------------------------------------------------
# Recurrent models
# ---------------------------------------------------------------------------


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out[:, -1]), (h, c)


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 6, batch_first=True, bidirectional=True)

    def forward(self, x):
        out, h = self.gru(x)
        return out.mean(1), h


class ElmanRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(8, 10, num_layers=2, nonlinearity="relu")

    def forward(self, x, h0):  # x: (T, B, 8), h0: (2, B, 10)
        out, hn = self.rnn(x, h0)
        return out, hn


class PackedLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, _) = self.lstm(packed)
        padded, out_lengths = pad_packed_sequence(out, batch_first=True)
        return padded, h, out_lengths


class CellLoop(nn.Module):
    """The same LSTMCell / GRUCell called once per time step."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(4, 8)
        self.gru = nn.GRUCell(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):  # x: (T, B, 4)
        h = torch.zeros(x.shape[1], 8)
        c = torch.zeros(x.shape[1], 8)
        g = torch.zeros(x.shape[1], 8)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            g = self.gru(h, g)
            outs.append(self.head(g))
        return torch.stack(outs)


class HandRNN(nn.Module):
    """Hand-written Elman recurrence: the same two Linears applied per step."""

    def __init__(self):
        super().__init__()
        self.in2h = nn.Linear(4, 8)
        self.h2h = nn.Linear(8, 8, bias=False)

    def forward(self, x):  # x: (B, T, 4)
        h = x.new_zeros(x.shape[0], 8)
        for t in range(x.shape[1]):
            h = torch.tanh(self.in2h(x[:, t]) + self.h2h(h))
        return h


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


class MHANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        out, weights = self.mha(x, x, x)
        return out, weights


class MHAMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, kdim=8, vdim=8)

    def forward(self, q, kv, key_padding_mask=None):  # seq-first
        out, _ = self.mha(q, kv, kv, key_padding_mask=key_padding_mask, need_weights=False)
        return out


class HandAttention(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.heads

        def split(t):
            return t.view(B, T, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(causal, float("-inf"))
        att = F.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        return self.o(y)


class SDPANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, mask):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 2, 8).permute(2, 0, 3, 1, 4)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return (causal + masked).transpose(1, 2).flatten(2)


class TinyTransformerLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


# ---------------------------------------------------------------------------
# Reuse, sharing, containers
# ---------------------------------------------------------------------------


class RepeatedModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.Tanh()

    def forward(self, x):
        for _ in range(3):
            x = self.act(self.fc(x))
        return self.fc(x) + x


class TiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mix = nn.Linear(8, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight  # tied

    def forward(self, tokens):
        return self.out(torch.tanh(self.mix(self.emb(tokens))))


class SharedAliases(nn.Module):
    """One Linear registered under two names and one Parameter in two modules."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.a  # same module, two attribute names
        self.c = nn.Linear(8, 8)
        self.d = nn.Linear(8, 8)
        self.d.bias = self.c.bias  # one parameter shared by two modules

    def forward(self, x):
        return self.d(self.c(self.b(self.a(x))))


class NestedContainers(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict(
            {
                "enc": nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2)]),
                "dec": nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Tanh()))]),
            }
        )
        self.named = nn.Sequential(
            collections.OrderedDict([("inner", nn.Linear(8, 4)), ("act", nn.Sigmoid())])
        )
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(8)) for _ in range(2)])
        self.pdict = nn.ParameterDict({"scale": nn.Parameter(torch.ones(4))})

    def forward(self, x):
        for blk in self.blocks["enc"]:
            x = blk(x) + self.plist[0]
        for blk in self.blocks["dec"]:
            x = blk(x) * self.plist[1]
        return self.named(x) * self.pdict["scale"]


class NestedInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fa = nn.Linear(8, 4)
        self.fb = nn.Linear(6, 4)

    def forward(self, batch):
        # batch = {"pair": (a, b), "list": [c, (d,)], "meta": {"scale": 2.0}}
        a, b = batch["pair"]
        c, (d,) = batch["list"]
        scale = batch["meta"]["scale"]
        return self.fa(a) + self.fb(b) + scale * self.fa(c) - self.fb(d)


class NestedOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return {
            "logits": h,
            "pair": (h.relu(), [h.sigmoid(), {"deep": h.tanh()}]),
            "count": 3,
            "name": "nested",
            "none": None,
        }


class TupleOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h, h.sum(), [h * 2]


class DuplicateOutputs(nn.Module):
    """Returns the same tensor several times, plus an input passed through."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h, h, x, {"again": h}


ModelOutput = collections.namedtuple("ModelOutput", ["logits", "hidden"])


@dataclass
class DataclassOutput:
    logits: torch.Tensor
    hidden: torch.Tensor
    note: str = "zoo"


class NamedTupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return ModelOutput(logits=self.head(h), hidden=h)


class DataclassOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return DataclassOutput(logits=self.head(h), hidden=h)


class KwargsOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.fx = nn.Linear(8, 4)
        self.fy = nn.Linear(8, 4)

    def forward(self, *, x, y, scale=1.0):
        return self.fx(x) * scale + self.fy(y)


class ScaledBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, scale=1.0, shift=None):
        y = self.fc(x) * scale
        return y if shift is None else y + shift


class KwargsMixed(nn.Module):
    """Optional tensor / None kwargs; submodule called with keyword args."""

    def __init__(self):
        super().__init__()
        self.block = ScaledBlock()

    def forward(self, x, mask=None, bias=None, *, mode="sum"):
        h = self.block(x, scale=2.0, shift=bias)
        if mask is not None:
            h = h.masked_fill(~mask, 0.0)
        return h.sum(-1) if mode == "sum" else h


class NonTensorArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, n_steps: int, alpha: float, act: str, flag: bool, nothing=None):
        for _ in range(n_steps):
            x = self.fc(x) * alpha
        x = torch.tanh(x) if act == "tanh" else torch.relu(x)
        return -x if flag else x


# ---------------------------------------------------------------------------
# Control flow, grad mode, python scalars
# ---------------------------------------------------------------------------


class ConditionalOnValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.pos = nn.Linear(8, 8)
        self.neg = nn.Linear(8, 8)

    def forward(self, x):
        h = self.pos(x) if x.sum() > 0 else self.neg(x)
        if (h.abs() > 100).any():  # never taken
            h = h * 0
        if bool(h.mean() < 10):
            h = h + 1
        return h


class DataDependentLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x) * 10
        steps = 0
        while h.norm() > 1.0 and steps < 20:
            h = h / 2
            steps += 1
        return h


class ItemScalars(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        scale = h.abs().max().item()
        n = int(h.gt(0).sum())
        vals = h[0, :2].tolist()
        return h / scale + n + vals[0] * vals[1] + float(h.mean().detach())


class NoGradInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        with torch.no_grad():
            stat = h.abs().amax() + 1.0
            frozen = self.fc2(h)
            with torch.enable_grad():
                regrad = self.fc2(x)
        with torch.set_grad_enabled(False):
            other = h * 2
        return h / stat + frozen + regrad + other + h.detach()


class StraightThroughRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class CustomAutogradNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return StraightThroughRound.apply(self.fc(x) * 3) / 3


def _pre_hook_add_one(module, args):
    return (args[0] + 1,)


def _post_hook_double(module, args, output):
    return output * 2


class HookedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 4)
        self.fc1.register_forward_pre_hook(_pre_hook_add_one)
        self.fc2.register_forward_hook(_post_hook_double)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class WeightNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.utils.parametrizations.weight_norm(nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))


# ---------------------------------------------------------------------------
# Integer / bool / complex / dtype handling
# ---------------------------------------------------------------------------


class EmbeddingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 8, padding_idx=0)
        self.bag = nn.EmbeddingBag(30, 8, mode="mean")
        self.fc = nn.Linear(8, 2)

    def forward(self, tokens, flat, offsets):
        e = self.emb(tokens).mean(1)
        b = self.bag(flat, offsets)
        return self.fc(e + b)


class IntBoolArith(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, ints, x):  # ints: (2, 8) int64
        a = ints * 3 + 1
        b = a // 2 - a % 3
        c = (b & 6) | (ints ^ 1)
        bits = c << 1 >> 1
        mask = (ints > 2) & ~(ints == 5)
        cnt = mask.sum(dim=1)
        am = x.argmax(dim=1)
        oh = F.one_hot(ints.clamp(0, 9), num_classes=10).sum(1)
        bc = torch.bincount(ints.flatten(), minlength=10)
        h = self.fc(x) * mask + bits.float()
        return (
            h,
            cnt,
            am,
            oh,
            bc,
            mask.logical_or(ints < 1),
            torch.div(a, 4, rounding_mode="floor"),
        )


class DtypeConversions(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, ints):
        h = self.fc(x)
        d = h.double() + 1
        f = d.to(torch.float32)
        i = (h * 10).int().long()
        promoted = ints + h  # int64 + float32 -> float32
        p64 = h + d  # float32 + float64 -> float64
        b = h.bool().float() + i.type_as(h)
        return f + promoted + b, p64, i


class LossInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x, target, y):
        logits = self.fc(x)
        ce = F.cross_entropy(logits, target)
        nll = F.nll_loss(F.log_softmax(logits, dim=1), target)
        mse = F.mse_loss(logits, y)
        bce = F.binary_cross_entropy_with_logits(logits, (y > 0).float())
        return ce + nll + mse + bce


class FFTComplex(nn.Module):
    def __init__(self):
        super().__init__()
        self.filt = nn.Parameter(torch.randn(9, dtype=torch.complex64))
        self.fc = nn.Linear(16, 16)

    def forward(self, x):  # x: (2, 16)
        spec = torch.fft.rfft(self.fc(x))
        spec = spec * self.filt
        y = torch.fft.irfft(spec, n=16)
        full = torch.fft.fft(y.to(torch.complex64))
        return y, full.abs(), full.angle(), spec


class ComplexArith(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        h = self.fc(x).view(2, 8, 2)
        z = torch.view_as_complex(h.contiguous())
        w = torch.complex(x[:, :8], x[:, :8].flip(-1))
        prod = z * w.conj() + z.real - 1j * z.imag
        return torch.view_as_real(prod), prod.abs(), (z * z).real


class Float64Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x).softmax(-1)


class Float16Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = F.gelu(self.ln(self.fc1(x)))
        return self.fc2(h).softmax(-1), h.float().sum()


class BFloat16Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean((2, 3)))


# ---------------------------------------------------------------------------
# Tensors created in forward, shape-only use
# ---------------------------------------------------------------------------


class CreatedTensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        z = torch.zeros(2, 8)
        o = torch.ones(8)
        ar = torch.arange(8, dtype=torch.float32)
        lit = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
        npt = torch.from_numpy(np.array([0.5, -0.5] * 4, dtype=np.float32))
        full = torch.full((2, 8), 0.25)
        eye = torch.eye(8)
        lin = torch.linspace(0, 1, 8)
        filled = torch.empty(2, 8).fill_(3.0)
        like = torch.ones_like(h) + torch.zeros_like(h) + h.new_full((2, 8), 2.0)
        dev = torch.zeros(2, 8, dtype=h.dtype, device=h.device)
        return (h + z + o + ar + lit + npt + full + lin + filled + like + dev) @ eye


class ShapeOnly(nn.Module):
    """Output uses only x.shape, never x's values."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        n, d = x.shape
        base = torch.ones(n, d) * x.size(1) / x.numel() * x.dim()
        return self.fc(base + torch.arange(d, dtype=torch.float32))


class UnusedInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, unused, also_unused=None):
        return self.fc(x)


class ReturnsParameter(nn.Module):
    """Returns a parameter and a buffer directly, plus a constant output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.extra = nn.Parameter(torch.randn(4))
        self.register_buffer("const", torch.arange(4.0))

    def forward(self, x):
        return self.fc(x), self.extra, self.const


class BuffersRead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("mean", torch.randn(8))
        self.register_buffer("std", torch.rand(8) + 0.5)
        self.register_buffer("tmp", torch.full((8,), 0.1), persistent=False)

    def forward(self, x):
        return self.fc((x - self.mean) / self.std) + self.tmp


class PlainTensorAttr(nn.Module):
    """Uses a tensor attribute that is neither a parameter nor a buffer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = torch.linspace(0.5, 1.5, 8)
        self.offset = torch.randn(8)

    def forward(self, x):
        return self.fc(x) * self.scale + self.offset


# ---------------------------------------------------------------------------
# Op bags
# ---------------------------------------------------------------------------


class EinsumMatmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) * 0.3)
        self.bw = nn.Parameter(torch.randn(2, 8, 4) * 0.3)

    def forward(self, x):  # x: (2, 8)
        a = torch.einsum("bi,ij->bj", x, self.w)
        b = torch.einsum("bi,bj->bij", x, a)
        c = torch.bmm(b, self.bw)  # (2, 8, 4)
        d = torch.matmul(x.unsqueeze(1), c).squeeze(1)  # (2, 4)
        e = x @ self.w
        f = torch.mm(e, self.w.T)
        g = torch.addmm(torch.ones(8), x, self.w) + torch.baddbmm(b, b, b).sum(-1)
        return (
            d,
            f + g,
            torch.outer(x[0], x[1]),
            torch.kron(self.w[:2, :2], self.w[:2, :2]),
        )


class CumsumSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return (
            torch.cumsum(h, dim=1),
            h.cumprod(dim=1),
            torch.logcumsumexp(h, dim=1),
            F.softmax(h, dim=-1),
            F.log_softmax(h, dim=0),
            torch.logsumexp(h, dim=1),
        )


class ClampWhere(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        a = h.clamp(-0.5, 0.5) + torch.clip(h, min=0.0) + h.clamp(max=0.2)
        b = torch.where(h > 0, h, x)
        c = torch.where(h > 0, h, 0.0)  # scalar other
        d = torch.where(x < 0, 1.0, -1.0)  # both scalars
        e = h.masked_fill(h < -0.3, -1.0)
        f = torch.maximum(h, x) - torch.minimum(h, x)
        return a + b + c + d + e + f


class CatStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.fa = nn.Linear(8, 4)
        self.fb = nn.Linear(8, 4)

    def forward(self, x):
        a, b = self.fa(x), self.fb(x)
        return (
            torch.cat([a, b], dim=1),
            torch.stack([a, b], dim=0),
            torch.hstack([a, b]),
            torch.vstack([a, b]),
            torch.cat((a, a, a), dim=-1),
            torch.column_stack([a, b]),
        )


class Padding(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3)
        self.zpad = nn.ZeroPad2d(1)
        self.rpad = nn.ReflectionPad2d((1, 1, 2, 0))

    def forward(self, x):
        a = F.pad(x, (1, 1, 1, 1), value=0.5)
        b = F.pad(x, (2, 2, 2, 2), mode="reflect")
        c = F.pad(x, (1, 1, 1, 1), mode="replicate")
        d = F.pad(x, (1, 1, 1, 1), mode="circular")
        e = self.rpad(x)
        return (
            self.conv(a),
            self.conv(b),
            self.conv(c),
            self.conv(d),
            self.conv(self.zpad(x)),
            e,
        )


class InterpolateUpsample(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        a = self.up(x)
        b = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
        c = F.interpolate(x, scale_factor=0.5, mode="area")
        d = F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True)
        return self.conv(a + b + d), c


class PixelShuffleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)
        self.unshuffle = nn.PixelUnshuffle(2)

    def forward(self, x):
        up = self.shuffle(self.conv(x))  # (N, 3, 16, 16)
        return up, self.unshuffle(up)


class ResidualBlock(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class ResNetTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(ResidualBlock(8), ResidualBlock(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class SqueezeExcitation(nn.Module):
    def __init__(self, c: int = 8, r: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        h = self.conv(x)
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(self.pool(h)))))
        return h * s


class FlipRollRepeat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)  # (2, 8)
        return (
            torch.flip(h, dims=[1]) + h.fliplr(),
            torch.roll(h, shifts=2, dims=1) + h.roll(1, 0),
            h.repeat(2, 3),
            torch.tile(h, (2,)),
            h.repeat_interleave(2, dim=0),
            torch.rot90(h.view(2, 2, 4), 1, (1, 2)),
        )


class DiagTrilNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        sq = h.T @ h  # (8, 8)
        return (
            torch.diag(sq),
            torch.diag(h[0]),
            torch.tril(sq) - torch.triu(sq, diagonal=1),
            torch.norm(h),
            h.norm(p=1, dim=1),
            torch.linalg.vector_norm(h, ord=2, dim=0),
            torch.linalg.matrix_norm(sq),
            torch.trace(sq),
        )


class Reductions(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return (
            h.sum(),
            h.mean(dim=0, keepdim=True),
            torch.prod(h, 1),
            h.amax(1) - h.amin(1),
            h.std(dim=1),
            h.var(correction=0),
            (h > 0).all(dim=1),
            (h > 0).any(),
            h.argmin(dim=1),
            h.abs().nansum(),
        )


class ElementwiseMath(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        p = h.abs() + 0.1
        return (
            torch.exp(h) + torch.log1p(p) + torch.sqrt(p) + torch.rsqrt(p) + p.pow(1.5),
            torch.sign(h) + torch.floor(h) + torch.ceil(h) + torch.round(h, decimals=1),
            torch.trunc(h) + torch.frac(h) + torch.sin(h) * torch.cos(h),
            torch.atan2(h, x) + torch.lerp(h, x, 0.3) + torch.addcmul(h, h, x, value=0.5),
            torch.addcdiv(h, x, p) + torch.erf(h) + torch.reciprocal(p) + torch.log(p),
            torch.tanh(h).asin() + torch.hypot(h, x) + torch.fmod(h, 0.3),
        )


class ComparisonOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        bad = h / (h > 0).float()  # contains inf / nan-free infs
        return (
            h.eq(x),
            h != x,
            h < x,
            h >= 0,
            torch.isclose(h, x, atol=0.5),
            torch.isfinite(bad),
            torch.isinf(bad),
            torch.isnan(bad * 0),
            torch.nan_to_num(bad * 0, nan=0.0),
            torch.nan_to_num(bad, posinf=1.0, neginf=-1.0),
            torch.fmax(h, x),
            torch.equal(h, h),
        )


class PythonOperators(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, m):  # m: (8, 8)
        h = self.fc(x)
        a = (h + x - 1) * 2 / 3
        b = 2 - h
        c = 1 / (h.abs() + 1)
        d = 2**h + h**2
        e = h.detach() // 0.5 + h % 0.5  # floor_divide has no derivative
        f = -h + abs(h) + (+h)
        g = h @ m
        bits = (h > 0) & (x > 0) | ~(h < -1) ^ (x < 0)
        return a + b + c + d + e + f + g, bits


class DistanceOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, y):
        h = self.fc(x)
        return (
            torch.cdist(h, y),
            F.pairwise_distance(h, y[:2]),
            F.cosine_similarity(h, y[:2], dim=1),
        )


# ---------------------------------------------------------------------------
# Plain functions (tag "function")
# ---------------------------------------------------------------------------


def fn_elementwise(x, y):
    """A plain function: elementwise ops on two inputs."""
    return torch.sin(x) * y + x.exp().mean()


def fn_kwargs(x, *, scale=1.0, bias=None):
    """A plain function with keyword-only arguments (tensor and float)."""
    out = x.relu() * scale
    if bias is not None:
        out = out + bias
    return {"out": out, "total": out.sum()}


def fn_mlp(x, w1, b1, w2):
    """A plain function holding its weights via functools.partial."""
    return F.linear(torch.tanh(F.linear(x, w1, b1)), w2)


def _make_fn_mlp():
    w1 = (torch.randn(16, 8) * 0.3).requires_grad_()
    b1 = torch.zeros(16, requires_grad=True)
    w2 = (torch.randn(4, 16) * 0.3).requires_grad_()
    return functools.partial(fn_mlp, w1=w1, b1=b1, w2=w2)


def fn_multi_output(x):
    """A plain function returning a tuple and using multi-output ops."""
    vals, idx = x.sort(dim=-1)
    a, b = x.chunk(2, dim=-1)
    return vals, idx, a * b


# ---------------------------------------------------------------------------
# The zoo
# ---------------------------------------------------------------------------


def _case(
    name: str,
    model: Callable[[], Callable],
    inputs: Callable[[], tuple[tuple, dict]],
    tags: tuple[str, ...] | list[str] = (),
    train: bool = False,
) -> ZooCase:
    """Wrap raw factories so that they are seeded and set train/eval mode."""
    seed = zlib.crc32(name.encode()) & 0x7FFFFFFF

    def make_model():
        torch.manual_seed(seed)
        m = model()
        if isinstance(m, nn.Module):
            m.train(train)
        return m

    def make_inputs():
        torch.manual_seed(seed + 1)
        args, kwargs = inputs()
        return tuple(args), dict(kwargs)

    make_model.__name__ = f"make_model_{name}"
    make_inputs.__name__ = f"make_inputs_{name}"
    return ZooCase(name, make_model, make_inputs, frozenset(tags), train)


def _r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def _rg(*shape: int) -> torch.Tensor:
    """A random leaf input that requires grad."""
    return torch.randn(*shape).requires_grad_()


ZOO: list[ZooCase] = [
    # --- MLPs and basic layers ---------------------------------------------
    # Plain Linear-ReLU-Linear module with named submodules.
    _case("mlp_tiny", TinyMLP, lambda: _a(_r(2, 8))),
    # Deep nn.Sequential of Linear+ReLU built from a helper (integer child names).
    _case("mlp_sequential", lambda: _mlp(8, 16, 16, 8, 4), lambda: _a(_r(3, 8))),
    # Linear without bias, then a single 1-d (unbatched) input vector.
    _case(
        "linear_no_bias_unbatched",
        lambda: nn.Linear(8, 4, bias=False),
        lambda: _a(_r(8)),
    ),
    # Many activation functions (functional and module, incl. PReLU parameter, GLU).
    _case("activations", ActivationZoo, lambda: _a(_r(2, 8))),
    # nn.Bilinear: a layer with two tensor inputs.
    _case("bilinear_two_inputs", BilinearNet, lambda: _a(_r(2, 8), _r(2, 6))),
    # Raw nn.Parameters used through F.linear / F.conv2d (no layer modules).
    _case("functional_params", FunctionalParams, lambda: _a(_r(2, 8), _r(2, 3, 8, 8))),
    # Module is nn.Identity: output is the input itself, no ops at all.
    _case("identity_module", nn.Identity, lambda: _a(_rg(2, 8))),
    # --- convolutions & pooling ---------------------------------------------
    # Conv1d (incl. circular padding mode) + MaxPool1d + Linear head.
    _case("conv1d_net", Conv1dNet, lambda: _a(_r(2, 3, 16))),
    # Conv2d with padding="same"/reflect, MaxPool2d, nn.Flatten, Linear.
    _case("conv2d_net", Conv2dNet, lambda: _a(_r(2, 3, 16, 16))),
    # Conv3d + AvgPool3d.
    _case("conv3d_net", Conv3dNet, lambda: _a(_r(2, 2, 4, 4, 4))),
    # ConvTranspose2d (strided) and ConvTranspose1d with output_padding.
    _case("conv_transpose", ConvTransposeNet, lambda: _a(_r(2, 3, 8, 8), _r(2, 2, 5))),
    # Depthwise (groups=C) dilated conv, 1x1 conv without bias, grouped strided conv.
    _case("conv_grouped_dilated", GroupedDilatedConv, lambda: _a(_r(2, 4, 8, 8))),
    # Max / avg (count_include_pad=False) / adaptive max / adaptive avg / LP pooling.
    _case("pooling", PoolingZoo, lambda: _a(_r(2, 3, 8, 8))),
    # MaxPool2d(return_indices=True) + MaxUnpool2d: int64 index tensor flows on.
    _case(
        "maxpool_unpool",
        MaxUnpoolNet,
        lambda: _a(_r(2, 2, 8, 8)),
        ["multi_output", "int"],
    ),
    # F.unfold / F.fold (im2col) around a Linear.
    _case("unfold_fold", UnfoldFold, lambda: _a(_r(2, 2, 4, 4)), ["views"]),
    # affine_grid + grid_sample (spatial transformer).
    _case("spatial_transformer", SpatialTransformer, lambda: _a(_r(2, 3, 8, 8))),
    # --- normalization ------------------------------------------------------
    # Conv + BatchNorm2d in eval mode (uses running stats).
    _case("batchnorm_eval", ConvBN, lambda: _a(_r(2, 3, 8, 8))),
    # Conv + BatchNorm2d in train mode: running stats & num_batches_tracked update.
    _case(
        "batchnorm_train",
        ConvBN,
        lambda: _a(_r(4, 3, 8, 8)),
        ["buffers_update"],
        train=True,
    ),
    # BatchNorm1d(momentum=None) in train mode: cumulative moving average.
    _case(
        "batchnorm1d_cumulative_train",
        BN1dCumulative,
        lambda: _a(_r(4, 8)),
        ["buffers_update"],
        train=True,
    ),
    # GroupNorm, InstanceNorm2d(affine), LayerNorm over 2 dims / without affine, F.normalize.
    _case("norms", NormZoo, lambda: _a(_r(2, 3, 8, 8))),
    # InstanceNorm1d(track_running_stats=True) in train mode updates buffers.
    _case(
        "instancenorm_tracked_train",
        InstanceNormTracked,
        lambda: _a(_r(2, 4, 8)),
        ["buffers_update"],
        train=True,
    ),
    # Buffers modified in place by forward (counter += 1, add_), output independent of them.
    _case(
        "buffer_inplace_counter",
        BufferCounter,
        lambda: _a(_r(2, 8)),
        ["buffers_update", "inplace"],
        train=True,
    ),
    # Registered buffers (persistent and non-persistent) read in forward.
    _case("buffers_read", BuffersRead, lambda: _a(_r(2, 8))),
    # Plain tensor attribute (not a parameter, not a buffer) used in forward.
    _case("plain_tensor_attribute", PlainTensorAttr, lambda: _a(_r(2, 8))),
    # --- randomness ---------------------------------------------------------
    # Dropout / Dropout2d / F.dropout in train mode.
    _case("dropout_train", DropoutNet, lambda: _a(_r(2, 8)), ["stochastic"], train=True),
    # The same dropout model in eval mode: dropout is the identity.
    _case("dropout_eval", DropoutNet, lambda: _a(_r(2, 8))),
    # torch.randn / rand_like / bernoulli / randperm / randint / normal inside forward.
    _case(
        "random_in_forward",
        RandomInForward,
        lambda: _a(_r(2, 8)),
        ["stochastic", "created", "indexing"],
    ),
    # --- in-place -----------------------------------------------------------
    # nn.ReLU(inplace=True) applied to a Linear output.
    _case("relu_inplace", ReluInplace, lambda: _a(_r(2, 8)), ["inplace"]),
    # x += 1, mul_, -=, /=, add_(alpha).clamp_ chain, torch.sigmoid_, F.relu_.
    _case("inplace_arith", InplaceArith, lambda: _a(_r(2, 8)), ["inplace"]),
    # x[0] = y, x[:, :2] += 1, x[i, j] = scalar, x[mask] = 0, x[:, idx] *= 2.
    _case(
        "inplace_setitem",
        InplaceSetitem,
        lambda: _a(_r(2, 8), _r(2, 8)),
        ["inplace", "indexing", "views"],
    ),
    # masked_fill_ with a computed mask and with a created (eye) mask.
    _case("masked_fill_inplace", MaskedFillInplace, lambda: _a(_r(2, 8)), ["inplace"]),
    # The forward mutates its own input tensor (x += 1; x.mul_).
    _case(
        "inplace_input_mutation",
        InputMutation,
        lambda: _a(_r(2, 8)),
        ["inplace", "mutates_input"],
    ),
    # In-place ops on views write through to their base (mul_ on slice, zero_, diagonal add_).
    _case("inplace_on_view", InplaceOnView, lambda: _a(_r(8, 8)), ["inplace", "views"]),
    # --- views --------------------------------------------------------------
    # view, reshape, permute, contiguous, flatten, transpose, movedim, swapaxes, .T, .t(), .mT.
    _case("views_reshape_permute", ViewsReshape, lambda: _a(_r(2, 3, 4, 6)), ["views"]),
    # Slicing with steps, narrow, expand, unsqueeze, None/Ellipsis indexing, select.
    _case("slicing_expand", SlicingExpand, lambda: _a(_r(4, 8)), ["views"]),
    # unfold (sliding windows), diagonal, as_strided, view_as, squeeze of size-1 dim.
    _case("strided_views", StridedViews, lambda: _a(_r(2, 8)), ["views"]),
    # Zero-sized slices, cat with empty tensors, mean of empty -> nan -> nan_to_num.
    _case(
        "empty_tensors",
        EmptyTensors,
        lambda: _a(_r(2, 8)),
        ["empty", "views", "created"],
    ),
    # --- indexing -----------------------------------------------------------
    # Indexing with long tensors, bool masks, lists, and paired advanced indices.
    _case(
        "tensor_indexing",
        TensorIndexing,
        lambda: _a(_r(4, 8), torch.tensor([3, 0, 0, 2])),
        ["indexing", "int"],
    ),
    # gather, scatter, scatter_add, scatter_reduce, index_select, index_add, index_fill.
    _case(
        "gather_scatter",
        GatherScatter,
        lambda: _a(_r(2, 8), torch.tensor([[0, 3, 5], [7, 1, 1]])),
        ["indexing", "int"],
    ),
    # Data-dependent output shapes: nonzero, masked_select; take, take_along_dim, masked_scatter.
    _case(
        "data_dependent_indexing",
        DataDependentIndexing,
        lambda: _a(_r(2, 8)),
        ["indexing"],
    ),
    # --- multi-output -------------------------------------------------------
    # split with sizes, chunk, unbind, tensor_split.
    _case(
        "split_chunk_unbind",
        SplitChunkUnbind,
        lambda: _a(_r(2, 8)),
        ["multi_output", "views"],
    ),
    # max(dim), min(dim).values, topk, sort, kthvalue, median(dim) (values and indices).
    _case("max_topk_sort", MaxTopkSort, lambda: _a(_r(2, 8)), ["multi_output"]),
    # std_mean, var_mean, aminmax, cummax, where(cond), unique(return_counts), meshgrid.
    _case(
        "stats_multi_output",
        StatsMultiOutput,
        lambda: _a(_r(2, 8)),
        ["multi_output", "created"],
    ),
    # --- recurrent ----------------------------------------------------------
    # 2-layer batch_first LSTM returning (output, (h, c)).
    _case("lstm", LSTMNet, lambda: _a(_r(2, 5, 8)), ["rnn"]),
    # Bidirectional GRU.
    _case("gru_bidirectional", GRUNet, lambda: _a(_r(2, 5, 8)), ["rnn"]),
    # 2-layer ReLU RNN (seq-first) with an explicit initial hidden state input.
    _case("rnn_with_h0", ElmanRNN, lambda: _a(_r(5, 2, 8), _r(2, 2, 10)), ["rnn"]),
    # LSTM over a PackedSequence (pack_padded_sequence / pad_packed_sequence).
    _case(
        "lstm_packed",
        PackedLSTM,
        lambda: _a(_r(3, 5, 4), torch.tensor([5, 2, 3])),
        ["rnn", "int"],
    ),
    # LSTMCell and GRUCell each called once per time step in a Python loop.
    _case("rnn_cell_loop", CellLoop, lambda: _a(_r(4, 2, 4)), ["rnn", "reuse", "created"]),
    # Hand-written Elman recurrence reusing two Linears at every step.
    _case("hand_rnn_loop", HandRNN, lambda: _a(_r(2, 5, 4)), ["rnn", "reuse", "created"]),
    # --- attention ----------------------------------------------------------
    # nn.MultiheadAttention self-attention (batch_first) returning attention weights.
    _case(
        "multihead_attention",
        MHANet,
        lambda: _a(_r(2, 5, 16)),
        ["attention", "multi_output"],
    ),
    # MHA cross-attention with kdim/vdim and a bool key_padding_mask passed as kwarg.
    _case(
        "mha_key_padding_kwargs",
        MHAMasked,
        lambda: _a(
            _r(4, 2, 16),
            _r(6, 2, 8),
            key_padding_mask=torch.tensor([[False] * 6, [False] * 4 + [True] * 2]),
        ),
        ["attention", "kwargs"],
    ),
    # Hand-written multi-head causal attention (triu mask, masked_fill -inf, softmax).
    _case(
        "hand_attention",
        HandAttention,
        lambda: _a(_r(2, 5, 16)),
        ["attention", "created", "views"],
    ),
    # F.scaled_dot_product_attention with is_causal and with an additive float mask.
    _case(
        "sdpa",
        SDPANet,
        lambda: _a(_r(2, 5, 16), torch.randn(5, 5) * 0.1),
        ["attention", "views"],
    ),
    # Tiny nn.TransformerEncoderLayer (no dropout) + mean-pool head.
    _case(
        "transformer_encoder_layer",
        TinyTransformerLayer,
        lambda: _a(_r(2, 5, 16)),
        ["attention"],
    ),
    # --- reuse and sharing --------------------------------------------------
    # The same Linear submodule called four times.
    _case("repeated_submodule", RepeatedModule, lambda: _a(_r(2, 8)), ["reuse"]),
    # Embedding weight tied with the output projection; integer token input.
    _case(
        "tied_weights",
        TiedWeights,
        lambda: _a(torch.randint(0, 20, (2, 5))),
        ["reuse", "int"],
    ),
    # One module under two attribute names; one Parameter shared by two Linears.
    _case("shared_module_aliases", SharedAliases, lambda: _a(_r(2, 8)), ["reuse"]),
    # --- containers & kwargs ------------------------------------------------
    # Sequential in ModuleList in ModuleDict, OrderedDict-named Sequential, Parameter{List,Dict}.
    _case("nested_containers", NestedContainers, lambda: _a(_r(2, 8)), ["containers"]),
    # Input is a dict holding a tuple, a list containing a tuple, and a float.
    _case(
        "nested_inputs",
        NestedInputs,
        lambda: _a(
            {
                "pair": (_r(2, 8), _r(2, 6)),
                "list": [_r(2, 8), (_r(2, 6),)],
                "meta": {"scale": 2.0},
            }
        ),
        ["containers"],
    ),
    # Output is a dict with nested tuple/list/dict of tensors plus int, str and None.
    _case("nested_outputs", NestedOutputs, lambda: _a(_r(2, 8)), ["containers"]),
    # Output tuple: tensor, 0-d tensor, list with a tensor.
    _case("tuple_output", TupleOutput, lambda: _a(_r(2, 8)), ["containers"]),
    # The same tensor returned several times, and an input tensor returned unchanged.
    _case("duplicate_outputs", DuplicateOutputs, lambda: _a(_r(2, 8)), ["containers"]),
    # Output is a collections.namedtuple.
    _case("namedtuple_output", NamedTupleOut, lambda: _a(_r(2, 8)), ["containers"]),
    # Output is a @dataclass instance (with a non-tensor field).
    _case("dataclass_output", DataclassOut, lambda: _a(_r(2, 8)), ["containers"]),
    # Keyword-only forward (forward(self, *, x, y, scale)); all inputs as kwargs.
    _case(
        "kwargs_only",
        KwargsOnly,
        lambda: _a(x=_r(2, 8), y=_r(2, 8), scale=0.5),
        ["kwargs"],
    ),
    # Positional x plus tensor kwargs, a None kwarg, a str kwarg; submodule called with kwargs.
    _case(
        "kwargs_mixed",
        KwargsMixed,
        lambda: _a(_r(2, 8), mask=torch.rand(2, 8) > 0.3, bias=None, mode="sum"),
        ["kwargs"],
    ),
    # Non-tensor positional args (int loop count, float, str, bool) and a None default.
    _case(
        "non_tensor_args",
        NonTensorArgs,
        lambda: _a(_r(2, 8), 2, 0.5, "tanh", True),
        ["reuse", "kwargs"],
    ),
    # --- control flow / grad mode -------------------------------------------
    # Python `if` on tensor values (x.sum() > 0, .any(), bool(...)).
    _case(
        "conditional_on_value",
        ConditionalOnValue,
        lambda: _a(_r(2, 8).abs()),
        ["control_flow"],
    ),
    # while-loop whose trip count depends on tensor values (h.norm() > 1).
    _case("data_dependent_loop", DataDependentLoop, lambda: _a(_r(2, 8)), ["control_flow"]),
    # .item(), int(), .tolist(), float() turn tensor values into Python numbers used later.
    _case("item_scalars", ItemScalars, lambda: _a(_r(2, 8)), ["python_scalar"]),
    # torch.no_grad / nested enable_grad / set_grad_enabled(False) / detach inside forward.
    _case("no_grad_inside", NoGradInside, lambda: _a(_r(2, 8)), ["grad_mode"]),
    # A custom torch.autograd.Function (straight-through round).
    _case(
        "custom_autograd_function",
        CustomAutogradNet,
        lambda: _a(_r(2, 8)),
        ["custom_autograd"],
    ),
    # Forward pre-hook and forward hook that change inputs/outputs of submodules.
    _case("forward_hooks", HookedNet, lambda: _a(_r(2, 8)), ["hooks"]),
    # Weight-norm parametrization: the weight is recomputed on every access.
    _case("weight_norm_parametrized", WeightNormNet, lambda: _a(_r(2, 8)), ["parametrize"]),
    # --- integers, bools, dtypes --------------------------------------------
    # nn.Embedding(padding_idx) on int64 tokens and nn.EmbeddingBag with offsets.
    _case(
        "embedding_int",
        EmbeddingNet,
        lambda: _a(
            torch.randint(0, 30, (2, 5)),
            torch.randint(0, 30, (7,)),
            torch.tensor([0, 3]),
        ),
        ["int"],
    ),
    # Integer //, %, bitwise &|^~ and shifts, bool masks, sum of bools, argmax, one_hot, bincount.
    _case(
        "int_bool_arithmetic",
        IntBoolArith,
        lambda: _a(torch.randint(0, 10, (2, 8)), _r(2, 8)),
        ["int"],
    ),
    # .double(), .to(float32), .int().long(), type_as, bool->float, int+float / f32+f64 promotion.
    _case(
        "dtype_conversions",
        DtypeConversions,
        lambda: _a(_r(2, 8), torch.randint(-3, 3, (2, 8))),
        ["int"],
    ),
    # Losses inside forward with int64 class targets; scalar (0-d) output.
    _case(
        "loss_in_forward",
        LossInForward,
        lambda: _a(_r(4, 8), torch.tensor([0, 4, 2, 1]), _r(4, 5)),
        ["int"],
    ),
    # rfft, complex Parameter multiply, irfft, fft, abs, angle; complex output.
    _case("fft_complex", FFTComplex, lambda: _a(_r(2, 16)), ["complex"]),
    # view_as_complex/view_as_real, torch.complex, conj, .real/.imag, python complex scalar.
    _case("complex_arith", ComplexArith, lambda: _a(_r(2, 8)), ["complex", "views"]),
    # Whole model and input in float64.
    _case(
        "float64_model",
        lambda: Float64Net().double(),
        lambda: _a(_r(2, 8, dtype=torch.float64)),
        ["float64"],
    ),
    # float16 Linear / LayerNorm / GELU / softmax on CPU, plus a cast back to float32.
    _case(
        "float16_model",
        lambda: Float16Net().half(),
        lambda: _a(_r(2, 8, dtype=torch.float16)),
        ["half"],
    ),
    # bfloat16 Conv2d / BatchNorm2d (eval) / Linear on CPU.
    _case(
        "bfloat16_model",
        lambda: BFloat16Net().to(torch.bfloat16),
        lambda: _a(_r(2, 3, 8, 8, dtype=torch.bfloat16)),
        ["half"],
    ),
    # --- tensors created in forward, shape-only use -------------------------
    # zeros, ones, arange, tensor([...]), from_numpy, full, eye, linspace, empty().fill_, *_like.
    _case("created_tensors", CreatedTensors, lambda: _a(_r(2, 8)), ["created"]),
    # Output depends only on x.shape / size / numel / dim, never on x's values.
    _case("shape_only_input", ShapeOnly, lambda: _a(_r(2, 8)), ["created", "unused_input"]),
    # One positional input and one optional kwarg input are never used.
    _case(
        "unused_inputs",
        UnusedInput,
        lambda: _a(_r(2, 8), _r(2, 3), also_unused=_r(4)),
        ["unused_input", "kwargs"],
    ),
    # A Parameter and a buffer returned directly as outputs.
    _case("returns_parameter", ReturnsParameter, lambda: _a(_r(2, 8)), ["containers"]),
    # --- op bags ------------------------------------------------------------
    # einsum, bmm, matmul, @, mm, addmm, baddbmm, outer, kron.
    _case("einsum_matmul", EinsumMatmul, lambda: _a(_r(2, 8))),
    # cumsum, cumprod, logcumsumexp, softmax, log_softmax, logsumexp.
    _case("cumsum_softmax", CumsumSoftmax, lambda: _a(_r(2, 8))),
    # clamp/clip, torch.where (tensor, one scalar, two scalars), masked_fill, maximum/minimum.
    _case("clamp_where", ClampWhere, lambda: _a(_r(2, 8))),
    # cat, stack, hstack, vstack, column_stack, cat of the same tensor three times.
    _case("cat_stack", CatStack, lambda: _a(_r(2, 8))),
    # F.pad constant/reflect/replicate/circular, ZeroPad2d, ReflectionPad2d.
    _case("padding", Padding, lambda: _a(_r(2, 2, 6, 6))),
    # nn.Upsample, F.interpolate nearest/bilinear/area/bicubic.
    _case("interpolate_upsample", InterpolateUpsample, lambda: _a(_r(2, 3, 8, 8))),
    # PixelShuffle and PixelUnshuffle.
    _case("pixel_shuffle", PixelShuffleNet, lambda: _a(_r(2, 3, 8, 8)), ["views"]),
    # Residual blocks (conv-bn-relu-conv-bn + skip) in a Sequential.
    _case("residual_blocks", ResNetTiny, lambda: _a(_r(2, 3, 8, 8))),
    # Squeeze-excitation: global pool, 1x1 convs, sigmoid gate broadcast over H, W.
    _case("squeeze_excitation", SqueezeExcitation, lambda: _a(_r(2, 3, 8, 8))),
    # flip, fliplr, roll, repeat, tile, repeat_interleave, rot90.
    _case("flip_roll_repeat_tile", FlipRollRepeat, lambda: _a(_r(2, 8))),
    # diag (both directions), tril, triu, norm, vector_norm, matrix_norm, trace.
    _case("diag_tril_norm", DiagTrilNorm, lambda: _a(_r(2, 8))),
    # sum, mean(keepdim), prod, amax/amin, std, var, all, any, argmin, nansum.
    _case("reductions", Reductions, lambda: _a(_r(2, 8))),
    # exp, log, sqrt, rsqrt, pow, sign, floor, round, trig, atan2, lerp, addcmul, addcdiv, erf.
    _case("elementwise_math", ElementwiseMath, lambda: _a(_r(2, 8))),
    # Comparisons, isclose, isfinite/isinf/isnan on inf-containing tensors, nan_to_num, fmax.
    _case("comparison_ops", ComparisonOps, lambda: _a(_r(2, 8))),
    # Python operators incl. reflected ones (2 - x, 1 / x, 2 ** x), //, %, @, &, |, ^, ~.
    _case("python_operators", PythonOperators, lambda: _a(_r(2, 8), _r(8, 8))),
    # cdist, pairwise_distance, cosine_similarity.
    _case("distance_ops", DistanceOps, lambda: _a(_r(2, 8), _r(3, 8))),
    # --- plain functions ----------------------------------------------------
    # A plain function of two tensors.
    _case(
        "fn_elementwise",
        lambda: fn_elementwise,
        lambda: _a(_rg(2, 8), _r(2, 8)),
        ["function"],
    ),
    # A plain function with keyword-only tensor/float args returning a dict.
    _case(
        "fn_kwargs",
        lambda: fn_kwargs,
        lambda: _a(_rg(2, 8), scale=2.0, bias=_rg(8)),
        ["function", "kwargs", "containers"],
    ),
    # functools.partial of a plain function carrying weight tensors (no nn.Module).
    _case("fn_partial_weights", _make_fn_mlp, lambda: _a(_r(2, 8)), ["function"]),
    # A plain function using multi-output ops and returning a tuple.
    _case(
        "fn_multi_output",
        lambda: fn_multi_output,
        lambda: _a(_rg(2, 8)),
        ["function", "multi_output"],
    ),
]

ZOO_BY_NAME: dict[str, ZooCase] = {case.name: case for case in ZOO}

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
assert len(ZOO_BY_NAME) == len(ZOO), "duplicate zoo case names"
assert all(_NAME_RE.match(case.name) for case in ZOO), "zoo names must be snake_case"

ALL_TAGS: frozenset[str] = frozenset().union(*(case.tags for case in ZOO))


def zoo_cases(tag: str | None = None) -> list[ZooCase]:
    """Return the zoo cases, optionally only those carrying ``tag``."""
    return [case for case in ZOO if tag is None or tag in case.tags]


def zoo_params(tag: str | None = None) -> list:
    """``pytest.param(case, id=case.name)`` for every case (filtered by ``tag``)."""
    import pytest

    return [pytest.param(case, id=case.name) for case in zoo_cases(tag)]
