"""Models whose loops never end when an escaped value is perturbed, kept out of the test
modules so that a subprocess can import them (``tests/test_verdicts.py`` runs validation on
them in a child process with a timeout: on a regression it hangs, and the child is killed)."""

from __future__ import annotations

import torch
from torch import nn


class Converge(nn.Module):
    """An error-correction loop: halve and round until nothing is left. Perturbed, the
    error read by ``float`` is never 0.0 and the loop never ends."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x) * 8
        while True:
            y = torch.round(y * 0.5)
            err = y.abs().sum()
            if float(err) == 0.0:
                break
        return y + x


class CountDown(nn.Module):
    """A loop whose count is read with ``int`` each time round: perturbed at 0, the count
    reads 1 and the loop never ends."""

    def forward(self, x):
        y = x.abs() * 4
        while int((y >= 1).sum()) != 0:
            y = y * 0.5
        return y + x


class LongerByValue(nn.Module):
    """A loop whose length a value read with ``.item()`` decides: 4 steps at its value,
    millions at any other (and no escape inside the loop)."""

    def forward(self, x):
        gap = (x.max() - x.max()).item()
        y = x
        for _ in range(4 if gap == 0.0 else 10**9):
            y = y * 0.5 + 1
        return y


class ValueAssert(nn.Module):
    """An ``assert`` on a value read with ``.item()``: a relu's minimum is 0, and moved
    down it trips the assert."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x).relu()
        assert y.min().item() >= 0.0, "negative activation"
        return y * 2


def main(name: str) -> None:
    """Validate ``name`` (a model here) and print the state and the decisions."""
    import torchlens as tl

    torch.manual_seed(0)
    status = tl.replay(globals()[name]().eval(), torch.randn(2, 4))
    print(status.state)
    for decision in status.decisions:
        print(decision)


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
