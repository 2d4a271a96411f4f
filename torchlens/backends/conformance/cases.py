"""The conformance corpus: small models, each with the op inventory a backend must record.

A case is a record in the spirit of PyTorch's ``OpInfo``: a model factory, an input factory
and the expected multiset of function names, written down by hand. The corpus ships inside
the package so ``python -m torchlens.backends.conformance`` needs nothing from ``tests/``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CASES", "CASES_BY_NAME", "ConformanceCase"]


@dataclass(frozen=True)
class ConformanceCase:
    """One model and input pair, with the function names its forward must record."""

    name: str
    make_model: Callable[[], Any]  # a fresh model (or function); seeded by the runner
    make_inputs: Callable[[], tuple[tuple, dict]]  # fresh (args, kwargs) for one forward
    expected_ops: Mapping[str, int]  # func name -> count: the op inventory
    seed: int = 0
    notes: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)

    def inventory(self) -> Counter:
        """``expected_ops`` as a :class:`collections.Counter`."""
        return Counter(self.expected_ops)


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(self.norm(x)))


class _Inplace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        y.relu_()
        y += 1.0
        return y * 2


class _Views(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.view(2, 3, 4).permute(0, 2, 1).reshape(2, 12)
        return y.transpose(0, 1).contiguous().sum(dim=0)


class _Indexing(nn.Module):
    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        picked = x[index]
        return picked[:, 1:] * x[0, :3]


class _Split(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.split(x, 2, dim=1)
        return torch.cat([b.tanh(), a.sigmoid()], dim=1)


class _Dropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x)).sum(dim=1)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / 8**0.5
        return torch.matmul(scores.softmax(dim=-1), v)


class _Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(tokens).mean(dim=1))


class _Kwargs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.fc(x)
        return {"hidden": h, "scaled": h * scale}


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(3 + 4, 4)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(xs.shape[0], 4)
        for t in range(xs.shape[1]):
            h = torch.tanh(self.cell(torch.cat([xs[:, t], h], dim=1)))
        return h


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()


def _plain_function(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.exp(x) * torch.sin(y) - x.abs()


def _inputs(*shape: int) -> Callable[[], tuple[tuple, dict]]:
    return lambda: ((torch.randn(*shape),), {})


CASES: tuple[ConformanceCase, ...] = (
    ConformanceCase(
        "mlp", _mlp, _inputs(2, 4), {"linear": 2, "relu": 1}, notes="the spec's tutorial model"
    ),
    ConformanceCase(
        "conv_bn_pool",
        lambda: _ConvNet().eval(),
        _inputs(1, 2, 4, 4),
        {"conv2d": 1, "batch_norm": 1, "relu": 1, "max_pool2d": 1, "flatten": 1, "linear": 1},
    ),
    ConformanceCase(
        "residual_layernorm_gelu",
        lambda: _Residual().eval(),
        _inputs(3, 6),
        {"layer_norm": 1, "linear": 1, "gelu": 1, "add": 1},
    ),
    ConformanceCase(
        "inplace",
        lambda: _Inplace().eval(),
        _inputs(2, 5),
        {"linear": 1, "relu_": 1, "add_": 1, "mul": 1},
        tags=frozenset({"inplace"}),
    ),
    ConformanceCase(
        "views",
        _Views,
        _inputs(24),
        {"view": 1, "permute": 1, "reshape": 1, "transpose": 1, "contiguous": 1, "sum": 1},
    ),
    ConformanceCase(
        "indexing",
        _Indexing,
        lambda: ((torch.randn(5, 4), torch.tensor([4, 0, 2])), {}),
        {"getitem": 3, "mul": 1},
    ),
    ConformanceCase(
        "split_multi_output",
        _Split,
        _inputs(3, 4),
        {"split": 2, "tanh": 1, "sigmoid": 1, "cat": 1},
    ),
    ConformanceCase(
        "dropout_train",
        lambda: _Dropout().train(),
        _inputs(4, 8),
        {"linear": 1, "dropout": 1, "sum": 1},
        notes="stochastic: needs the captured RNG state to replay",
        tags=frozenset({"stochastic"}),
    ),
    ConformanceCase(
        "attention",
        lambda: _Attention().eval(),
        _inputs(2, 5, 8),
        {"linear": 1, "chunk": 3, "transpose": 1, "matmul": 2, "div": 1, "softmax": 1},
    ),
    ConformanceCase(
        "embedding_int_input",
        lambda: _Embedding().eval(),
        lambda: ((torch.tensor([[1, 2, 3], [4, 5, 9]]),), {}),
        {"embedding": 1, "mean": 1, "linear": 1},
    ),
    ConformanceCase(
        "kwargs_dict_output",
        lambda: _Kwargs().eval(),
        lambda: ((torch.randn(2, 4),), {"scale": torch.randn(4)}),
        {"linear": 1, "mul": 1},
    ),
    ConformanceCase(
        "recurrent_loop",
        lambda: _Recurrent().eval(),
        _inputs(2, 3, 3),
        {"zeros": 1, "getitem": 3, "cat": 3, "linear": 3, "tanh": 3},
        notes="one module called three times, a tensor created inside forward",
    ),
    ConformanceCase(
        "plain_function",
        lambda: _plain_function,
        lambda: ((torch.randn(3), torch.randn(3)), {}),
        {"exp": 1, "sin": 1, "mul": 1, "abs": 1, "sub": 1},
    ),
)

CASES_BY_NAME: dict[str, ConformanceCase] = {case.name: case for case in CASES}
