"""Benchmark models for torchlens, built with random weights (nothing is downloaded).

Every factory returns ``(model, args)`` with the model in eval mode and ``args`` a
tuple of positional inputs, so a plain forward is ``model(*args)``.  Factories are
deterministic: each seeds torch with a fixed seed before building anything.

* :data:`BENCH_MODELS` -- small/medium models used for regular overhead benchmarks
  (a plain forward takes roughly 10-150 ms on a 2-core CPU).
* :data:`LARGE_MODELS` -- GPT-2-small-sized decoder and a ResNet-50-sized conv net,
  for occasional "realistic size" runs (a forward takes a fraction of a second to a
  few seconds on CPU; building GPT-2 small takes a couple of seconds).

Run ``python benchmarks/models.py`` to time a plain forward of every model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Factory = Callable[[], tuple[nn.Module, tuple]]


# ---------------------------------------------------------------------------
# MLP / conv net / transformer encoder / local response normalization
# ---------------------------------------------------------------------------


def mlp100() -> tuple[nn.Module, tuple]:
    """100 Linear(256, 256) + ReLU layers, batch 64."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(100):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers).eval()
    return model, (torch.randn(64, 256),)


class ConvNet8(nn.Module):
    """8 conv(3x3)-BatchNorm2d-ReLU blocks with 64 channels and a linear head.

    Blocks 0 and 4 use stride 2 (64x64 -> 32x32 -> 16x16) to keep the forward in the
    tens of milliseconds on a small CPU.
    """

    def __init__(self, channels: int = 64, n_blocks: int = 8, n_classes: int = 10):
        super().__init__()
        blocks = []
        in_ch = 3
        for i in range(n_blocks):
            stride = 2 if i in (0, n_blocks // 2) else 1
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(in_ch, channels, 3, stride=stride, padding=1, bias=False),
                    nn.BatchNorm2d(channels),
                    nn.ReLU(inplace=True),
                )
            )
            in_ch = channels
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x):
        return self.head(self.pool(self.blocks(x)).flatten(1))


def _randomize_bn(model: nn.Module) -> None:
    """Give BatchNorm layers non-trivial running stats and affine params."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)


def convnet8() -> tuple[nn.Module, tuple]:
    """8 conv-BN-ReLU blocks, 64 channels, input (8, 3, 64, 64)."""
    torch.manual_seed(1)
    model = ConvNet8()
    _randomize_bn(model)
    return model.eval(), (torch.randn(8, 3, 64, 64),)


def lrn_convnet(size: int = 36) -> tuple[nn.Module, tuple]:
    """``Conv2d(3, 32, 5) -> ReLU -> CrossMapLRN2d(5)``, input (2, 3, size, size): torch's
    own Python LRN, a loop of small in-place writes through channel views of one large
    tensor (258 ops, each reading a large parent through a small slice)."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 32, 5), nn.ReLU(), nn.CrossMapLRN2d(5))
    return model.eval(), (torch.randn(2, 3, size, size),)


def lrn_convnet_128() -> tuple[nn.Module, tuple]:
    """:func:`lrn_convnet` at 128 px: the same ops on tensors 13 times larger, where the
    forward's time is its kernels', not Python's."""
    return lrn_convnet(128)


def transformer_encoder() -> tuple[nn.Module, tuple]:
    """nn.TransformerEncoder: 6 layers, d_model=256, 8 heads, input (8, 64, 256)."""
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=6).eval()
    return model, (torch.randn(8, 64, 256),)


# ---------------------------------------------------------------------------
# GPT-style decoder (hand-written)
# ---------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, context: int):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.n_heads
        q = self.q(x).view(B, T, self.n_heads, hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_heads, hd).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, D)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class DecoderBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, context: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, context)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTDecoder(nn.Module):
    """GPT-2-style decoder: pre-LN blocks, learned positions, tied LM head."""

    def __init__(
        self,
        vocab_size: int = 1000,
        d_model: int = 128,
        n_layers: int = 4,
        n_heads: int = 4,
        context: int = 64,
    ):
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(
            [DecoderBlock(d_model, n_heads, context) for _ in range(n_layers)]
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens):
        B, T = tokens.shape
        assert T <= self.context
        pos = torch.arange(T, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_decoder() -> tuple[nn.Module, tuple]:
    """Small GPT: vocab 1000, d=128, 4 layers, 4 heads; tokens (4, 64)."""
    torch.manual_seed(3)
    model = GPTDecoder(vocab_size=1000, d_model=128, n_layers=4, n_heads=4, context=64)
    return model.eval(), (torch.randint(0, 1000, (4, 64)),)


def gpt2_small() -> tuple[nn.Module, tuple]:
    """GPT-2-small-sized GPTDecoder (~124M params); tokens (1, 128)."""
    torch.manual_seed(4)
    model = GPTDecoder(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, context=1024)
    return model.eval(), (torch.randint(0, 50257, (1, 128)),)


# ---------------------------------------------------------------------------
# ResNet-50-sized bottleneck network (hand-written)
# ---------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNetLike(nn.Module):
    def __init__(
        self,
        layers: tuple[int, ...] = (3, 4, 6, 3),
        widths: tuple[int, ...] = (64, 128, 256, 512),
        n_classes: int = 1000,
    ):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = 64
        stages = []
        for i, (n, width) in enumerate(zip(layers, widths)):
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(Bottleneck(in_ch, width, stride))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, n_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50_like() -> tuple[nn.Module, tuple]:
    """ResNet-50-sized bottleneck net (~25.6M params); input (1, 3, 224, 224)."""
    torch.manual_seed(5)
    model = ResNetLike()
    _randomize_bn(model)
    return model.eval(), (torch.randn(1, 3, 224, 224),)


BENCH_MODELS: dict[str, Factory] = {
    "mlp100": mlp100,
    "convnet8": convnet8,
    "transformer_encoder": transformer_encoder,
    "gpt_decoder": gpt_decoder,
}

LARGE_MODELS: dict[str, Factory] = {
    "gpt2_small": gpt2_small,
    "resnet50_like": resnet50_like,
}


def time_forward(model: nn.Module, args: tuple, repeats: int = 3, grad: bool = True) -> float:
    """Best-of-``repeats`` wall time (seconds) of a plain forward, after a warm-up.

    With ``grad=False`` the forward runs under ``torch.no_grad()`` (where
    ``nn.TransformerEncoder`` may take its fused fast path).
    """
    with torch.set_grad_enabled(grad):
        model(*args)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            model(*args)
            best = min(best, time.perf_counter() - start)
    return best


if __name__ == "__main__":
    for name, factory in {**BENCH_MODELS, **LARGE_MODELS}.items():
        start = time.perf_counter()
        model, args = factory()
        built = time.perf_counter() - start
        n_params = sum(p.numel() for p in model.parameters())
        with_grad = time_forward(model, args, grad=True)
        no_grad = time_forward(model, args, grad=False)
        print(
            f"{name:20s} params={n_params / 1e6:7.2f}M  build={built:6.2f}s  "
            f"forward={with_grad * 1000:8.1f} ms  (no_grad {no_grad * 1000:8.1f} ms)"
        )


# ---------------------------------------------------------------------------
# Force field: forces = -dE/dx by torch.autograd.grad inside the forward (issue 51)
# ---------------------------------------------------------------------------


class ForceField(nn.Module):
    """A small SchNet-like potential: Gaussian radial features of every atom pair, three
    interaction blocks, a per-atom energy; forces = -dE/dx with ``create_graph=True``."""

    def __init__(self, features: int = 64, basis: int = 16, blocks: int = 3) -> None:
        super().__init__()
        self.register_buffer("centers", torch.linspace(0.0, 4.0, basis))
        self.embed = nn.Linear(3, features)
        self.filters = nn.ModuleList(nn.Linear(basis, features) for _ in range(blocks))
        self.updates = nn.ModuleList(
            nn.Sequential(nn.Linear(features, features), nn.SiLU(), nn.Linear(features, features))
            for _ in range(blocks)
        )
        self.readout = nn.Sequential(nn.Linear(features, features // 2), nn.SiLU(),
                                     nn.Linear(features // 2, 1))  # fmt: skip

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            positions = positions.detach().requires_grad_(True)
            squared = (positions[:, :, None] - positions[:, None]).pow(2).sum(-1)
            radial = torch.exp(-(squared.unsqueeze(-1) - self.centers).pow(2))
            h = self.embed(positions)
            for filters, update in zip(self.filters, self.updates):
                message = (filters(radial) * h[:, None]).sum(2)
                h = h + update(message)
            energy = self.readout(h).sum()
            (grad,) = torch.autograd.grad(energy, positions, create_graph=True)
        return energy, -grad


def force_field() -> tuple[nn.Module, tuple]:
    """:class:`ForceField` on 4 molecules of 24 atoms, input (4, 24, 3)."""
    torch.manual_seed(5)
    return ForceField().eval(), (torch.randn(4, 24, 3),)
