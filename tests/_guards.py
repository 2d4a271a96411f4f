"""A model guarded by ``assert``, kept out of the test modules: pytest rewrites the asserts
of those, and a rewritten assert that fails formats its operands (``repr`` of a tensor,
an escape the plain model does not make). Here the assert is the one users write."""

from __future__ import annotations

import torch
from torch import nn


class NanGuard(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        assert not torch.isnan(x).any()
        return self.lin(x)
