"""The sharded-model cases of ``tests/test_distributed.py``, run under torchrun (2 ranks, gloo).

``torchrun --nproc_per_node 2 tests/_distributed_worker.py OUT CASE...``. Each CASE is
``<kind>-<model>`` (kind ``fsdp``, ``tp``, ``sp`` or ``ddp``; model ``mlp`` or ``transformer``)
or one of ``diverge``, ``disagree``. Every rank writes one JSON line per case to
``OUT/results-rank{r}.jsonl``: the replay state, the recorded ops, parameter sources and
collectives, and the checks the test asserts; traces saved with ``save_rank`` go under
``OUT/<case>``. The process group is destroyed at the end, so an abort at teardown shows in the
exit code.
"""

from __future__ import annotations

import copy
import gc
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError

D, HEADS, T, B = 8, 2, 4, 2


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, 4 * D)
        self.fc2 = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: under tensor parallel each rank holds its own heads
        q, k, v = (
            f(x).view(b, t, -1, D // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v)
        )
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class NormMLP(MLP):
    """A layer norm, then the MLP (sequence parallel: the norm runs on a slice of the tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        return super().forward(self.norm(x))


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return {"mlp": MLP, "transformer": Block, "normmlp": NormMLP}[name]()


def inputs(name: str, rank: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1 + rank)
    if name == "mlp":
        return torch.randn(3, D, generator=g)
    return torch.randn(B, T, D, generator=g)


def tp_plan(name: str) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    mlp = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    if name == "mlp":
        return mlp
    plan = {f"attn.{p}": ColwiseParallel() for p in "qkv"}
    plan["attn.out"] = RowwiseParallel()
    plan.update({f"mlp.{k}": v for k, v in mlp.items()})
    return plan


def shard(kind: str, name: str, model: nn.Module, mesh) -> nn.Module:
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for child in (model.attn, model.mlp) if name == "transformer" else (model.fc1, model.fc2):
            fully_shard(child, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if kind == "tp":
        from torch.distributed.tensor.parallel import parallelize_module

        return parallelize_module(model, mesh, tp_plan(name))
    if kind == "sp":  # the norm on this rank's tokens, gathered for fc1, scattered after fc2
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        plan = {
            "norm": SequenceParallel(),
            "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1)),
        }
        return parallelize_module(model, mesh, plan)
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    raise ValueError(kind)


def _collectives(trace) -> list[dict]:
    return [
        {"label": op.label, "func": op.func_name, "parents": list(op.parents)}
        for op in trace
        if tl.distributed.is_collective(op)
    ]


def run_case(kind: str, name: str, out: Path, mesh) -> dict:
    rank = dist.get_rank()
    plain = build(name)
    model = shard(kind, name, copy.deepcopy(plain), mesh)
    # data parallel (fsdp, ddp): each rank its own batch; tensor parallel: the same on every
    # rank; sequence parallel: each rank its slice of the tokens
    x = inputs(name, rank if kind in ("fsdp", "ddp") else 0)
    expected = plain(x)
    if kind == "sp":
        x, expected = (t[:, rank * T // 2 : (rank + 1) * T // 2] for t in (x, expected))
    trace = tl.trace(model, x)
    output = trace.output.full_tensor() if hasattr(trace.output, "full_tensor") else trace.output
    status = tl.replay(model, x)
    prefix = "module." if kind == "ddp" else ""
    params = {}
    for source in trace.sources:
        if source.kind == "parameter":
            value = source.out
            params[source.label] = {
                "shape": list(source.shape),
                "local_shape": list(
                    (value.to_local() if hasattr(value, "to_local") else value).shape
                ),
                "equal_plain": bool(
                    torch.equal(
                        value.full_tensor() if hasattr(value, "full_tensor") else value,
                        plain.get_parameter(source.label.removeprefix(prefix)),
                    )
                ),
            }
    tl.distributed.save_rank(trace, out)
    dist.barrier()
    merged = {}
    if rank == 0:
        ranks = tl.distributed.load_ranks(out)
        last = trace.ops[-1].label
        merged = {"world_size": ranks.world_size, "last": last}
        if kind == "tp":  # the sharded output of the first colwise linear, reassembled
            first = next(op for op in trace if op.func_name == "linear")
            lin = plain.fc1 if name == "mlp" else plain.attn.q
            xin = x if name == "mlp" else plain.norm1(x)
            merged["colwise_global_equal"] = bool(
                torch.allclose(ranks.global_value(first.label), lin(xin), atol=1e-6)
            )
            merged["colwise_placement"] = ranks[first.label].placements[1]["placements"]
    dist.barrier()
    return {
        "state": status.state,
        "failures": [str(f) for f in [*status.failures, *status.unchecked]][:5],
        "output_equal": bool(torch.allclose(output, expected, atol=1e-5)),
        "funcs": [op.func_name for op in trace],
        "collectives": _collectives(trace),
        "params": params,
        "merged": merged,
    }


def diverge(out: Path, mesh) -> dict:
    """DDP with the same batch on both ranks, but rank 1's perturbed: diff names where."""
    rank = dist.get_rank()
    model = shard("ddp", "mlp", build("mlp"), mesh)
    x = inputs("mlp")
    if rank == 1:
        x = x.clone()
        x[0, 0] += 1.0
    tl.distributed.save_rank(tl.trace(model, x), out)
    dist.barrier()
    result = {}
    if rank == 0:
        first = tl.distributed.load_ranks(out).diff(0, 1).first_divergence
        result = {"first": first.label_a, "func": first.func_name, "status": first.status}
    dist.barrier()
    return result


def extract_tp(out: Path, mesh) -> dict:
    """tl.extract refuses a tensor-parallel model on several ranks, before any forward."""
    model = shard("tp", "mlp", build("mlp"), mesh)
    try:
        tl.extract(model, [inputs("mlp")] * 2, save=tl.func("relu"), to=out, progress=False)
    except TorchLensError as err:
        return {"code": err.code, "message": str(err)}
    return {"code": None}


def disagree(out: Path, mesh) -> dict:
    """Replays whose collectives disagree raise a typed error naming the rank on every rank
    that waits, instead of hanging: rank 0 checks a tensor-parallel trace of 3 rows, rank 1
    one of 5 rows (``ranks_differ``); then rank 0 checks it again while rank 1 checks a trace
    without collectives (``rank_timeout`` on rank 0, nothing to wait for on rank 1)."""
    from torchlens.distributed import lockstep
    from torchlens.replay import check_trace

    rank = dist.get_rank()
    model = shard("tp", "mlp", build("mlp"), mesh)
    short, long = (tl.trace(model, torch.randn(n, D)) for n in (3, 5))
    alone = tl.trace(build("mlp"), torch.randn(3, D))
    lockstep.TIMEOUT = 5.0
    outcome = {}
    for name, trace in (
        ("shapes", short if rank == 0 else long),
        ("missing", short if rank == 0 else alone),
    ):
        try:
            outcome[name] = {"state": check_trace(trace).state}
        except TorchLensError as err:
            outcome[name] = {"code": err.code, "message": str(err)}
        dist.barrier()
    return outcome


def main() -> None:
    out, cases = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = out / f"results-rank{rank}.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        try:
            if case == "diverge":
                result = diverge(out / case, mesh)
            elif case == "disagree":
                result = disagree(out / case, mesh)
            elif case == "extract_tp":
                result = extract_tp(out / case, mesh)
            else:
                kind, name = case.split("-")
                result = run_case(kind, name, out / case, mesh)
        except Exception:  # noqa: BLE001 - reported to the test
            result = {"error": traceback.format_exc()}
        with results.open("a") as f:
            f.write(json.dumps({"case": case, "rank": rank, **result}) + "\n")
    gc.collect()  # traces (and their autograd graphs) go before the group (docs/distributed.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
