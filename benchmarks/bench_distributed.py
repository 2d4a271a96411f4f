"""Trace cost per rank of a sharded model against the plain sharded forward (2 ranks, gloo).

For FSDP2, tensor parallel and DDP, on the MLP and the transformer block of
``tests/_distributed_worker.py`` made wider (``--width``, default 256; batch 8, 32 tokens),
each rank times, interleaved round by round, a plain forward of the sharded model and a
``tl.trace`` of it (both under ``torch.no_grad()``: what an activation read costs), and a
``tl.validate`` once per round. Reported per rank: the median over rounds of trace / plain
and validate / plain; the plain forward includes the model's own collectives (FSDP2's
all-gathers, tensor parallel's all-reduces), so the ratio is what tracing adds on top of a
sharded forward. torch runs on one thread per rank, and each run is timed by the process's
CPU time (steadier on a shared machine, and without the waits for the other rank, which a
busy machine makes long); ``--clock wall`` times wall clock.

Run: ``python benchmarks/bench_distributed.py [--rounds 7] [--width 256] [--clock wall]``
(it launches ``torchrun --nproc_per_node 2`` on itself); ``--json`` prints one JSON line per
case.

Measured (2 ranks, gloo, 2 shared cores, CPU time, 15 rounds, medians per rank): trace /
plain 1.2-1.3 for DDP, 1.4-1.8 for FSDP2, 1.5-1.7 for tensor parallel; validate / plain
3.4-4.3 (DDP), 5.3-6.3 (FSDP2), 6.4-9.6 (tensor parallel).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "tests"))


CLOCK = time.process_time  # --clock wall: time.perf_counter


def _time(fn, *args) -> float:
    start = CLOCK()
    fn(*args)
    return CLOCK() - start


def _validate_time(tl, model, x) -> float | str:
    try:
        return _time(tl.validate, model, x)
    except Exception as err:  # noqa: BLE001 - a tree that cannot validate it (the base)
        return f"{type(err).__name__}"


def worker(rounds: int, width: int, out: str, clock: str) -> None:
    global CLOCK
    CLOCK = time.perf_counter if clock == "wall" else time.process_time
    import _distributed_worker as w
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import torchlens as tl

    w.D = width
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for kind in ("fsdp", "tp", "ddp"):
        for name in ("mlp", "transformer"):
            model = w.shard(kind, name, copy.deepcopy(w.build(name)), mesh)
            g = torch.Generator().manual_seed(rank if kind != "tp" else 0)
            x = torch.randn(8, 32, width, generator=g)
            plain, traced, validated = [], [], []
            with torch.no_grad():
                model(x), tl.trace(model, x)  # warm up
                for _ in range(rounds):
                    plain.append(_time(model, x))
                    traced.append(_time(tl.trace, model, x))
            for _ in range(max(1, rounds // 3)):
                validated.append(_validate_time(tl, model, x))
            base = statistics.median(plain)
            ok = [v for v in validated if isinstance(v, float)]
            line = json.dumps({
                "case": f"{kind}-{name}", "rank": rank, "plain_ms": round(1e3 * base, 2),
                "trace_ratio": round(statistics.median(traced) / base, 2),
                "trace_ratio_range": [round(min(traced) / base, 2), round(max(traced) / base, 2)],
                "validate_ratio": round(statistics.median(ok) / base, 1) if ok else validated[0],
            })  # fmt: skip
            with open(f"{out}/rank{rank}.jsonl", "a") as f:  # (the ranks share one stdout)
                f.write(line + "\n")
            dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.width, args.worker, args.clock)
        return
    out = tempfile.mkdtemp()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(HERE), "--worker", out, "--rounds", str(args.rounds),
               "--width", str(args.width), "--clock", args.clock]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    lines = [json.loads(x) for f in sorted(Path(out).glob("rank*.jsonl")) for x in f.open()]
    if args.json:
        for line in lines:
            print(json.dumps(line))
        return
    head = f"{'case':<18}{'rank':>5}{'plain ms':>10}{'trace/plain':>13}{'range':>14}"
    print(f"{head}{'validate/plain':>16}")
    for r in sorted(lines, key=lambda r: (r["case"], r["rank"])):
        lo, hi = r["trace_ratio_range"]
        print(f"{r['case']:<18}{r['rank']:>5}{r['plain_ms']:>10}{r['trace_ratio']:>13}"
              f"{f'{lo}-{hi}':>14}{r['validate_ratio']:>16}")  # fmt: skip


if __name__ == "__main__":
    main()
