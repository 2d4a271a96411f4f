"""Dataset-scale extraction: ``tl.extract`` against a hand-written forward-hook loop.

Both write the same sites, reduced the same way, through the same shard writer into the same
on-disk format (safetensors shards + manifest), so the ratio is the cost of extracting with
torchlens rather than with hooks. Sites are those of ``bench_record.py``: every 3rd conv
output of ``convnet8`` (spatial mean), every 2nd layer norm of ``transformer_encoder`` (token
mean). Data is synthetic, made per example from its index, so it takes no memory of its own.

* speed: examples/s of each, runs interleaved round by round; ratio = median over rounds of
  extract time / hooks time (target: at most 1.10 on both models). torch runs on one thread
  and runs are timed by process CPU time (steadier on a shared machine; ``--clock wall``
  for wall time, which adds the disk writes' waits);
* memory: peak RSS of ``tl.extract`` in a fresh process at 1k and at 10k examples, from
  after the set-up (target: flat). Rows are buffered up to ``--shard-mb`` (default 16, as
  ``tl.extract``) and writing a shard briefly doubles that, so the peak rises until the
  buffer fills, then stays flat; ``--shard-mb 1`` shows the flat part at these sizes.

Run: ``python benchmarks/bench_extract.py [--examples 512] [--rounds 5] [--rss 1000,10000]
[--clock wall]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import SELECTION, _output_labels, _selected_modules  # noqa: E402
from models import BENCH_MODELS  # noqa: E402
from timing import pin_allocator  # noqa: E402

import torchlens as tl  # noqa: E402
from torchlens.extract import REDUCTIONS, _store  # noqa: E402

REDUCE = {"convnet8": "spatial_mean", "transformer_encoder": "token_mean"}
TARGET = 1.10  # extract / hooks
BATCH = 32


class Synthetic(Dataset):
    """``n`` examples shaped like ``example``, each drawn from a generator seeded by its index."""

    def __init__(self, n: int, example: torch.Tensor) -> None:
        self.n, self.shape = n, tuple(example.shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randn(self.shape, generator=torch.Generator().manual_seed(i))


def setup(name: str, n: int):
    model, args = BENCH_MODELS[name]()
    kind, every = SELECTION[name]
    modules = _selected_modules(model, kind, every)
    trace = tl.trace(model, args, structure_only=True)
    labels = dict(zip(modules, _output_labels(trace, list(modules))))
    loader = DataLoader(Synthetic(n, args[0][0]), batch_size=BATCH)
    return model, modules, labels, loader


def run_extract(name, model, labels, loader, out: Path, shard_mb: float = 16.0) -> None:
    tl.extract(model, loader, save=tl.label(*labels.values()), to=out, reduce=REDUCE[name],
               progress=False, overwrite=True, shard_mb=shard_mb)  # fmt: skip


def _keep(saved: dict, label: str, reduce, module, args, output) -> None:
    saved[label] = reduce(output.detach())  # reduced at once: before any in-place op


def run_hooks(name, model, modules, labels, loader, out: Path) -> None:
    """What users write by hand: hooks, a loop, and the same shards and manifest."""
    shutil.rmtree(out, ignore_errors=True)
    (out / "shards").mkdir(parents=True)
    reduce, saved = REDUCTIONS[REDUCE[name]], {}
    handles = [m.register_forward_hook(partial(_keep, saved, labels[a], reduce))
               for a, m in modules.items()]  # fmt: skip
    writer, start = _store.ShardWriter(out, 16 * 2**20), 0
    try:
        with torch.no_grad():
            for b, x in enumerate(loader):
                model(x)
                writer.add(b, start, len(x), {k: v.contiguous() for k, v in saved.items()})
                start += len(x)
    finally:
        for handle in handles:
            handle.remove()
    writer.flush()
    _store.finalize(out, b + 1, start, {"model": type(model).__qualname__})


def bench_speed(name: str, n: int, rounds: int, folder: Path, clock=time.process_time) -> dict:
    model, modules, labels, loader = setup(name, n)
    runs = {
        "extract": partial(run_extract, name, model, labels, loader, folder / "extract"),
        "hooks": partial(run_hooks, name, model, modules, labels, loader, folder / "hooks"),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():  # warm-up, and the two stores must agree
        fn()
    a, b = tl.load_extraction(folder / "extract"), tl.load_extraction(folder / "hooks")
    for site in labels.values():  # torch's fused attention path (taken by the hook loop
        torch.testing.assert_close(a[site][:], b[site][:])  # only) rounds differently
    for _ in range(rounds):
        for k, fn in runs.items():
            start = clock()
            fn()
            times[k].append(clock() - start)
    ratio = statistics.median(x / y for x, y in zip(times["extract"], times["hooks"]))
    rate = {k: n / statistics.median(v) for k, v in times.items()}
    return {"model": name, "examples": n, "sites": len(labels), "ratio": ratio, **rate}


def _reset_peak() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux), so the peak seen afterwards
    is the extraction's own rather than the set-up's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_rss(name: str, n: int, folder: str, shard_mb: float) -> None:
    model, _, labels, loader = setup(name, n)
    setup_mb = _peak_mb()
    reset = _reset_peak()
    start = time.perf_counter()
    run_extract(name, model, labels, loader, Path(folder) / "run", shard_mb)
    seconds = time.perf_counter() - start
    print(json.dumps({"examples": n, "peak_mb": _peak_mb(), "setup_mb": setup_mb,
                      "reset": reset, "ex_per_s": n / seconds}))  # fmt: skip


def bench_rss(name: str, sizes: list[int], shard_mb: float) -> list[dict]:
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as folder:
            cmd = [sys.executable, __file__, "--child-rss", str(n), "--models", name,
                   "--shard-mb", str(shard_mb), folder]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="convnet8,transformer_encoder")
    parser.add_argument("--rss", default="1000,10000", help="example counts, '' to skip")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--shard-mb", type=float, default=16.0, help="for the RSS runs")
    parser.add_argument("--child-rss", type=int, help=argparse.SUPPRESS)
    parser.add_argument("folder", nargs="?", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = opts.models.split(",")
    if opts.child_rss:
        child_rss(names[0], opts.child_rss, opts.folder, opts.shard_mb)
        return 0
    failed = False
    pin_allocator()  # (speed only: the RSS runs, in their own processes, keep glibc's rules)
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            clock = time.process_time if opts.clock == "cpu" else time.perf_counter
            r = bench_speed(name, opts.examples, opts.rounds, Path(folder), clock)
            ok = r["ratio"] <= TARGET
            failed |= not ok
            print(f"{name:20s} {r['examples']} examples, {r['sites']} sites: extract "
                  f"{r['extract']:.0f} ex/s, hooks {r['hooks']:.0f} ex/s, ratio "
                  f"{r['ratio']:.3f} (target <= {TARGET}) {'ok' if ok else 'MISSED'}")  # fmt: skip
    sizes = [int(s) for s in opts.rss.split(",") if s]
    if sizes:
        rows = bench_rss(names[0], sizes, opts.shard_mb)
        for row in rows:
            during = "during extraction" if row["reset"] else "whole process"
            print(f"{names[0]:20s} peak RSS at {row['examples']:6d} examples: "
                  f"{row['peak_mb']:.0f} MB {during} (set-up peak {row['setup_mb']:.0f} MB), "
                  f"{row['ex_per_s']:.0f} ex/s")  # fmt: skip
        growth = rows[-1]["peak_mb"] - rows[0]["peak_mb"]
        print(f"peak RSS growth {sizes[0]} -> {sizes[-1]} examples: {growth:+.0f} MB")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
