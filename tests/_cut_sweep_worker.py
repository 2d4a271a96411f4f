"""Child process of tests/test_cut_sweep.py: validates the sweep's cases, prints verdicts.

``python tests/_cut_sweep_worker.py GROUP [CASE]`` runs ``tl.replay`` on every case of
GROUP (or the one CASE) and prints one JSON line: each case's state (or the error it
raised), and the functions the perturbation arm ran at a cut point. A crash of a kernel
kills this process only; the parent then reruns the group one case per process to name it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchlens as tl  # noqa: E402
from torchlens.replay import edges  # noqa: E402

Case = Callable[[], tuple[nn.Module, tuple]]
HIDDEN = (8, 64, 128, 256, 512)
BATCHES = (1, 2)
SEQ = 8


class Fn(nn.Module):
    """A module calling ``fn(x, *params)``: one function under test, with weights."""

    def __init__(self, fn: Callable, *shapes: tuple[int, ...]) -> None:
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList(nn.Parameter(torch.randn(s) * 0.1) for s in shapes)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs, *self.params)


def _rnn_cases(kind: str) -> dict[str, Case]:
    """nn.RNN/LSTM/GRU: every hidden size and batch, both layouts, one layer; then two
    layers, bidirectional, both, LSTM's proj_size, and input sizes unlike the hidden."""
    cls = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[kind]
    cases: dict[str, Case] = {}

    def add(name: str, inp: int, hidden: int, batch: int, first: bool, **kw) -> None:
        def make() -> tuple[nn.Module, tuple]:
            model = cls(inp, hidden, batch_first=first, **kw).eval()
            shape = (batch, SEQ, inp) if first else (SEQ, batch, inp)
            return model, (torch.randn(shape),)

        cases[f"{kind}-{name}-in{inp}-h{hidden}-b{batch}-{'bf' if first else 'sf'}"] = make

    for hidden in HIDDEN:
        for batch in BATCHES:
            for first in (True, False):
                add("1layer", hidden, hidden, batch, first)
    for hidden in (8, 256, 512):
        add("2layers", hidden, hidden, 2, True, num_layers=2)
        add("bidir", hidden, hidden, 2, False, bidirectional=True)
        add("2layers-bidir", hidden, hidden, 1, True, num_layers=2, bidirectional=True)
        if kind == "lstm":
            add("proj", hidden, hidden, 2, True, proj_size=max(hidden // 2, 1))
            add("proj-2layers-bidir", hidden, hidden, 2, False, proj_size=hidden // 4 or 1,
                num_layers=2, bidirectional=True)  # fmt: skip
    add("wide", 128, 512, 2, True)
    add("narrow", 512, 128, 2, False)
    return cases


class CellLoop(nn.Module):
    """A recurrent cell run over a sequence, as decoders and RAFT's update block do."""

    def __init__(self, cls: type, inp: int, hidden: int, **kw) -> None:
        super().__init__()
        self.cell = cls(inp, hidden, **kw)
        self.lstm = cls is nn.LSTMCell

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = None
        outs = []
        for step in x.unbind(1):
            state = self.cell(step, state)
            outs.append(state[0] if self.lstm else state)
        return torch.stack(outs, 1)


def _cell_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for cls in (nn.RNNCell, nn.LSTMCell, nn.GRUCell):
        for hidden in HIDDEN:
            for batch in BATCHES:

                def make(cls=cls, hidden=hidden, batch=batch) -> tuple[nn.Module, tuple]:
                    return CellLoop(cls, hidden, hidden).eval(), (torch.randn(batch, 4, hidden),)

                cases[f"{cls.__name__}-h{hidden}-b{batch}"] = make

        def unbatched(cls=cls) -> tuple[nn.Module, tuple]:  # 1-d input: not cut
            return _Unbatched(CellLoop(cls, 512, 512).eval()), (torch.randn(4, 512),)

        cases[f"{cls.__name__}-unbatched-h512"] = unbatched
    for hidden in (64, 512):

        def relu(hidden=hidden) -> tuple[nn.Module, tuple]:
            loop = CellLoop(nn.RNNCell, hidden, hidden, nonlinearity="relu").eval()
            return loop, (torch.randn(2, 4, hidden),)

        cases[f"RNNCell-relu-h{hidden}-b2"] = relu
    return cases


class _Unbatched(nn.Module):
    def __init__(self, loop: CellLoop) -> None:
        super().__init__()
        self.loop = loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state, outs = None, []
        for step in x.unbind(0):
            state = self.loop.cell(step, state)
            outs.append(state[0] if self.loop.lstm else state)
        return torch.stack(outs)


def _op_cases() -> dict[str, Case]:
    """Every function a rule of CUT_RULES names (and some of each tagged family), at a
    size just over the slicing threshold and at one where torch takes other kernels
    (blocked or parallel loops, mkldnn convolutions, flash attention on CPU)."""
    r = torch.randn
    c: dict[str, Case] = {}

    def fn(name: str, f: Callable, inputs: Callable[[], tuple], *shapes) -> None:
        c[name] = lambda: (Fn(f, *shapes).eval(), inputs())

    for n, d in ((2, 64), (8, 512)):  # sequences of n x 64 (x d) and n x 128
        x = lambda n=n, d=d: (r(n, 128, d),)  # noqa: E731
        fn(f"linear-{n}x{d}", lambda x, w, b: F.linear(x, w, b), x, (2 * d, d), (2 * d,))
        fn(f"linear2d-{n}x{d}", lambda x, w: F.linear(x, w), lambda d=d: (r(512, d),), (d, d))
        fn(f"matmul-{n}x{d}", lambda x, w: x @ w, x, (d, d))
        fn(f"mm-{n}x{d}", lambda x, w: torch.mm(x, w), lambda d=d: (r(512, d),), (d, d))
        fn(f"mv-{d}", lambda x, w: torch.mv(w, x), lambda d=d: (r(d),), (1024, d))
        fn(f"bmm-{n}x{d}", lambda x, w: torch.bmm(x, w), x, (n, d, d))
        fn(f"addmm-{d}", lambda x, w, b: torch.addmm(b, x, w), lambda d=d: (r(512, d),),
           (d, d), (d,))  # fmt: skip
        fn(f"baddbmm-{n}x{d}", lambda x, w, b: torch.baddbmm(b, x, w), x, (n, d, d),
           (n, 128, d))  # fmt: skip
        for name in ("relu", "gelu", "silu", "tanh", "hardswish", "hardsigmoid"):
            fn(f"{name}-{n}x{d}", getattr(F, name), x)
        fn(f"add-{n}x{d}", lambda x, w: x + w, x, (d,))
        fn(f"add_-{n}x{d}", lambda x, w: (x * 1).add_(w), x, (d,))
        fn(f"mul-{n}x{d}", lambda x, w: x * w, x, (d,))
        fn(f"sub-div-{n}x{d}", lambda x, w: (x - w) / (w.abs() + 1), x, (d,))
        fn(f"where-{n}x{d}", lambda x: torch.where(x > 0, x, -x), x)
        fn(f"masked_fill-{n}x{d}", lambda x: x.masked_fill(x > 1, 0.0), x)
        fn(f"reductions-{n}x{d}", lambda x: x.sum(-1) + x.mean(-1) + x.amax(-1), x)
        fn(f"softmax-{n}x{d}", lambda x: F.softmax(x, -1) + F.log_softmax(x, -1), x)
        fn(f"layer_norm-{n}x{d}", lambda x, w, b, d=d: F.layer_norm(x, (d,), w, b), x, (d,), (d,))
        fn(f"rms_norm-{n}x{d}", lambda x, w, d=d: F.rms_norm(x, (d,), w), x, (d,))
        fn(f"copies-{n}x{d}", lambda x: x.transpose(1, 2).contiguous().clone().to(
            torch.float64).float() * 2, x)  # fmt: skip
        fn(f"copy_-{n}x{d}", lambda x: torch.zeros_like(x).copy_(x) * 2, x)
        fn(f"joins-{n}x{d}", lambda x: torch.cat([x, x * 2], -1) + torch.stack([x, x], -1)
           .sum(-1).repeat(1, 1, 2), x)  # fmt: skip
        fn(f"splits-{n}x{d}", lambda x, d=d: sum(x.split(d // 4, -1)) + sum(x.chunk(4, -1)), x)
        fn(f"reshapes-{n}x{d}", lambda x: x.transpose(1, 2).flatten(1) * 2
           + x.transpose(1, 2).reshape(x.shape[0], -1), x)  # fmt: skip
        fn(f"getitem-{n}x{d}", lambda x: (x * 2)[:, torch.arange(64)] * 3, x)
        fn(f"setitem-{n}x{d}", _setitem, x)
        fn(f"sdpa-{n}x{d}", lambda q, m: F.scaled_dot_product_attention(q, q * 2, q * 3, m),
           lambda n=n, d=d: (r(n, 4, 128, d // 4),), (1, 1, 128, 128))  # fmt: skip
        fn(f"sdpa-causal-{n}x{d}", lambda q: F.scaled_dot_product_attention(q, q, q,
           is_causal=True), lambda n=n, d=d: (r(n, 4, 128, d // 4),))  # fmt: skip
        fn(f"embedding-{n}x{d}", lambda i, w: F.embedding(i, w) * 2,
           lambda n=n: (torch.randint(0, 1000, (n, 128)),), (1000, d))  # fmt: skip
    for n, ch, size in ((2, 16, 64), (4, 64, 32)):
        img = lambda n=n, ch=ch, size=size: (r(n, ch, size, size),)  # noqa: E731
        seq = lambda n=n, ch=ch, size=size: (r(n, ch, size * size // 4),)  # noqa: E731
        k = f"{n}x{ch}x{size}"
        fn(f"conv2d-{k}", lambda x, w, b: F.conv2d(x, w, b, padding=1), img, (ch, ch, 3, 3),
           (ch,))  # fmt: skip
        fn(f"conv2d-1x1-{k}", lambda x, w: F.conv2d(x, w), img, (2 * ch, ch, 1, 1))
        fn(f"conv2d-depthwise-{k}", lambda x, w, ch=ch: F.conv2d(x, w, padding=1, groups=ch), img,
           (ch, 1, 3, 3))  # fmt: skip
        fn(f"conv1d-{k}", lambda x, w: F.conv1d(x, w, padding=1), seq, (ch, ch, 3))
        fn(f"conv3d-{k}", lambda x, w: F.conv3d(x.unflatten(2, (4, -1)), w, padding=1), img,
           (ch, ch, 3, 3, 3))  # fmt: skip
        fn(f"conv_transpose1d-{k}", lambda x, w: F.conv_transpose1d(x, w), seq, (ch, 8, 2))
        fn(f"conv_transpose2d-{k}", lambda x, w: F.conv_transpose2d(x, w, stride=2), img,
           (ch, 8, 2, 2))  # fmt: skip
        fn(f"batch_norm-{k}", lambda x, w, b, ch=ch: F.batch_norm(x, torch.zeros(ch),
           torch.ones(ch), w, b), img, (ch,), (ch,))  # fmt: skip
        fn(f"instance_norm-{k}", lambda x, w, b: F.instance_norm(x, weight=w, bias=b), img,
           (ch,), (ch,))  # fmt: skip
        fn(f"group_norm-{k}", lambda x, w, b: F.group_norm(x, 4, w, b), img, (ch,), (ch,))
        fn(
            f"pool2d-{k}",
            lambda x, s=size // 2: (
                F.max_pool2d(x, 2)
                + F.avg_pool2d(x, 2)
                + F.adaptive_avg_pool2d(x, s)
                + F.adaptive_max_pool2d(x, s)
            ),
            img,
        )
        fn(f"pool1d-{k}", lambda x: F.max_pool1d(x, 2) + F.avg_pool1d(x, 2)
           + F.adaptive_avg_pool1d(x, x.shape[-1] // 2), seq)  # fmt: skip
        fn(f"resample-{k}", lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear")
           + F.pad(x * 2, (1, 1, 1, 1))[..., 1:-1, 1:-1].repeat(1, 1, 2, 2)
           + torch.roll(x, 1, -1).repeat(1, 1, 2, 2), img)  # fmt: skip
        fn(
            f"grid_sample-{k}",
            lambda x, g: F.grid_sample(x, g.tanh(), align_corners=False),
            lambda n=n, ch=ch, size=size: (r(n, ch, size, size),),
            (n, size, size, 2),
        )
    return c


def _setitem(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y[:, :8] = x[:, :8] * 3
    return y * 1


def cases(group: str) -> dict[str, Case]:
    """The cases of one group: ``rnn``, ``lstm``, ``gru``, ``cells`` or ``ops``."""
    if group in ("rnn", "lstm", "gru"):
        return _rnn_cases(group)
    if group == "cells":
        return _cell_cases()
    if group == "ops":
        return _op_cases()
    raise SystemExit(f"unknown group {group!r}")


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    group = argv[0]
    chosen = cases(group)
    if len(argv) > 1:
        chosen = {argv[1]: chosen[argv[1]]}
    cut: set[str] = set()
    original = edges._Points._run

    def run(self, plan, weights, dims):  # the functions the arm makes a cut call of
        cut.add(self._head.func_name)
        return original(self, plan, weights, dims)

    edges._Points._run = run
    verdicts: dict[str, str] = {}
    for name, make in chosen.items():
        torch.manual_seed(0)
        try:
            model, inputs = make()
            status = tl.replay(model, *inputs)
            verdicts[name] = status.state if status.state == "passed" else str(status)
        except Exception as err:  # noqa: BLE001 - reported as the case's verdict
            verdicts[name] = f"raised {type(err).__name__}: {err}"
    print(json.dumps({"verdicts": verdicts, "cut": sorted(cut)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
