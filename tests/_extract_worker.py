"""One ``tl.extract`` run for the extraction tests, run in a subprocess or under torchrun.

``python tests/_extract_worker.py OUT [--iterable] [--slow] [--both]``: a small CNN over a seeded
image dataset (50 examples, batches of 6: the last one holds 2). ``--iterable`` feeds a
generator instead of a ``DataLoader`` (every rank reads it whole); ``--slow`` sleeps between
batches and writes a shard per batch, so that a test can kill the run midway.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchlens as tl
from torchlens.extract import Extraction

N_EXAMPLES, BATCH = 50, 6


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = nn.functional.max_pool2d(h, 2)
        return self.fc(h.flatten(1))


def model() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    images = torch.randn(N_EXAMPLES, 3, 8, 8, generator=g)
    return TensorDataset(images, torch.arange(N_EXAMPLES) % 3)


def loader() -> DataLoader:
    return DataLoader(dataset(), batch_size=BATCH, shuffle=False)


def batches(delay: float = 0.0):
    """The loader's batches from a generator (a plain iterable)."""
    for batch in loader():
        if delay:
            time.sleep(delay)
        yield batch


SAVE = tl.func("relu", "linear")
REDUCE = {tl.func("relu"): "spatial_mean"}


def run(out: str, iterable: bool = False, slow: bool = False, **options) -> Extraction:
    data = batches(0.3 if slow else 0.0) if iterable else loader()
    return tl.extract(
        model(), data, save=SAVE, to=out, inputs=0, targets=1, reduce=REDUCE,
        progress=False, shard_mb=0 if slow else 64, **options,
    )  # fmt: skip


if __name__ == "__main__":
    if "--both" in sys.argv:  # one torchrun launch for both ways of splitting the data
        run(sys.argv[1] + "/loader")
        run(sys.argv[1] + "/iterable", iterable=True)
    else:
        run(sys.argv[1], iterable="--iterable" in sys.argv, slow="--slow" in sys.argv)
