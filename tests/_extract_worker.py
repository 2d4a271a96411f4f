"""One ``tl.extract`` run for the extraction tests, run in a subprocess or under torchrun.

``python tests/_extract_worker.py OUT [--iterable] [--slow] [--both]``: a small CNN over a seeded
image dataset (50 examples, batches of 6: the last one holds 2). ``--iterable`` feeds a
generator instead of a ``DataLoader`` (every rank reads it whole); ``--slow`` sleeps between
batches and writes a shard per batch, so that a test can kill the run midway.

``--hold N [--flush S] [--pause K:S]`` holds the run inside the forward of the N-th batch
it runs (see ``held``), for a test to send it a signal there; the same command without
``--hold`` resumes the run (the hold changes none of its arguments).

``--ranks`` (under torchrun) runs the cases where ranks disagree or one rank fails, an FSDP2
model, a run that talks through a gloo group of its own (as beside NCCL), then destroys the
process group itself; each rank writes one JSON line per case to
``OUT/outcomes-rank{r}.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.extract import Extraction, _distributed

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


def _case(out: str, name: str, call) -> None:
    """Run one case; add this rank's outcome (the error code, or what the case returned) to
    ``OUT/outcomes-rank{r}.jsonl``."""
    rank = int(os.environ["RANK"])
    try:
        outcome = {"code": "ok", "value": call()}
    except TorchLensError as err:
        outcome = {"code": err.code, "message": str(err)}
    with open(f"{out}/outcomes-rank{rank}.jsonl", "a") as f:
        f.write(json.dumps({"rank": rank, "case": name, **outcome}) + "\n")


class _Batches(torch.utils.data.Sampler):
    """A fixed list of batches (dataset indices)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@contextmanager
def _rank0_late(rank: int, seconds: float = 1.0) -> Iterator[None]:
    """Rank 0 sleeps once every rank sees the run directory, so the other ranks' shards
    are on disk before rank 0 starts (the order a loaded machine may give by chance)."""
    real = _distributed.check_shared

    def late(world: int, root) -> None:
        real(world, root)
        if rank == 0:
            time.sleep(seconds)

    _distributed.check_shared = late
    try:
        yield
    finally:
        _distributed.check_shared = real


def ranks(out: str) -> None:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    extract = partial(tl.extract, save=tl.func("relu"), progress=False)
    _case(out, "own_dirs", lambda: run(f"{out}/own_dirs/rank{rank}") and None)
    g = torch.Generator().manual_seed(rank)  # a different fixed order on each rank
    order = _Batches(torch.randperm(N_EXAMPLES, generator=g).view(-1, 5).tolist())
    _case(out, "own_order", lambda: extract(model(), DataLoader(dataset(), batch_sampler=order),
                                       inputs=0, to=f"{out}/own_order") and None)  # fmt: skip
    half = torch.utils.data.Subset(dataset(), range(25 * rank, 25 * rank + 25))  # pre-split
    _case(out, "own_subset", lambda: extract(model(), DataLoader(half, batch_size=5), inputs=0,
                                             to=f"{out}/own_subset") and None)  # fmt: skip
    torch.manual_seed(0)  # the same weights on every rank
    tokens = nn.Sequential(nn.Embedding(50, 8), nn.ReLU()).eval()  # rank 0 gets length 12,
    lengths = [torch.randint(0, 50, (4, n)) for n in (12, 16, 12, 16)]  # rank 1 length 16
    with _rank0_late(rank):  # rank 1 then writes its shard first: rank 0 must not read it
        _case(
            out, "split_shapes", lambda: extract(tokens, lengths, to=f"{out}/split_shapes") and None
        )
    linear = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    bad = [torch.ones(2, 4), torch.ones(2, 5), torch.ones(2, 4)]  # batch 1 (rank 1's) is bad
    _case(out, "rank1_fails", lambda: extract(linear, bad, to=f"{out}/rank1_fails") and None)
    _case(out, "fsdp2", lambda: _fsdp2(f"{out}/fsdp2"))
    real = dist.get_backend
    dist.get_backend = lambda group=None: "nccl"  # the messages then go through a gloo group
    try:
        ex = partial(extract, linear, [torch.ones(2, 4)] * 3, to=f"{out}/side_group")
        _case(out, "side_group", lambda: [ex().n_examples, _distributed._SIDE["group"] is not None])
    finally:
        dist.get_backend = real
    dist.destroy_process_group()  # as torch's docs recommend: tl.extract must not do it again


def _fsdp2(out: str) -> list:
    """relu(linear) rows of an FSDP2-sharded model (DTensor parameters), and the reference."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 6), nn.ReLU()).eval()
    sharded = nn.Sequential(nn.Linear(4, 6), nn.ReLU()).eval()
    sharded.load_state_dict(plain.state_dict())
    fully_shard(sharded, mesh=init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),)))
    x = torch.randn(10, 4, generator=torch.Generator().manual_seed(3))
    ex = tl.extract(sharded, list(x.split(3)), save=tl.func("relu"), to=out, progress=False)
    return [ex["relu_1"][:].tolist(), plain(x).tolist(), ex.meta["args"]["parameters"]]


def reference() -> dict[str, torch.Tensor]:
    """Every row of the run's sites from a plain forward-hook loop (no torchlens)."""
    net, rows = model(), {"relu_1": [], "linear_1": [], "targets": []}
    net.conv.register_forward_hook(
        lambda m, i, out: rows["relu_1"].append(torch.relu(out).mean(dim=(2, 3)))
    )
    net.fc.register_forward_hook(lambda m, i, out: rows["linear_1"].append(out))
    with torch.no_grad():
        for x, y in loader():
            net(x)
            rows["targets"].append(y)
    return {k: torch.cat(v) for k, v in rows.items()}


def held(out: str, hold: int, flush: float | None, pause: tuple[int, float] | None) -> None:
    """The run with a holdup inside the forward: the ``pause[0]``-th batch this process runs
    (1 for its first) sleeps ``pause[1]`` seconds first; the ``hold``-th writes
    ``OUT.hold-rank{r}`` and waits there for a signal. Rows are flushed by ``flush`` seconds
    only (64 MB shards), so what is on disk at the signal is what it made the run write."""
    net, calls = model(), [0]
    marker = f"{out}.hold-rank{os.environ.get('RANK', '0')}"

    def holdup(module, args) -> None:
        calls[0] += 1
        if pause is not None and calls[0] == pause[0]:
            time.sleep(pause[1])
        if calls[0] == hold:
            open(marker, "w").close()
            while True:
                time.sleep(0.05)

    net.fc.register_forward_pre_hook(holdup)
    tl.extract(net, loader(), save=SAVE, to=out, inputs=0, targets=1, reduce=REDUCE,
               progress=False, shard_mb=64, flush_s=flush)  # fmt: skip


def _option(name: str, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if __name__ == "__main__":
    if "--hold" in sys.argv or "--flush" in sys.argv:  # --hold N [--flush S] [--pause N:S]
        flush, pause = _option("--flush"), _option("--pause")
        held(
            sys.argv[1],
            int(_option("--hold", 0)),
            None if flush is None else float(flush),
            None if pause is None else (int(pause.split(":")[0]), float(pause.split(":")[1])),
        )
    elif "--ranks" in sys.argv:
        ranks(sys.argv[1])
    elif "--both" in sys.argv:  # one torchrun launch for both ways of splitting the data
        run(sys.argv[1] + "/loader")
        run(sys.argv[1] + "/iterable", iterable=True)
    else:
        run(sys.argv[1], iterable="--iterable" in sys.argv, slow="--slow" in sys.argv)
