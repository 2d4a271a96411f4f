"""The sharded-model cases of ``tests/test_distributed.py``, run under torchrun (2 ranks, gloo).

``torchrun --nproc_per_node 2 tests/_distributed_worker.py OUT CASE...``. Each CASE is
``<kind>-<model>`` (kind ``fsdp``, ``tp``, ``sp`` or ``ddp``; model ``mlp`` or ``transformer``)
or one of ``diverge``, ``disagree``, ``keep``, ``extract_tp-<model>``. Every rank writes one
JSON line per case to ``OUT/results-rank{r}.jsonl``: the replay state, the recorded ops,
parameter sources and collectives, and the checks the test asserts; traces saved with
``save_rank`` go under ``OUT/<case>``. The process group is destroyed at the end with the
traces of case ``keep`` still held, so an abort at teardown shows in the exit code.
"""

from __future__ import annotations

import copy
import gc
import json
import sys
import traceback
import types
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


def _hook_loop(model: nn.Module, name: str, batches: list) -> dict[str, torch.Tensor]:
    """What a forward-hook loop over the unsharded ``model`` gives for the sites the
    tensor-parallel extraction stores: each linear's output in call order (``linear_k``),
    the ReLU of the MLP's first linear, and (transformer) the attention's and MLP's output."""
    linears: list[torch.Tensor] = []
    found: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda _m, _i, o: linears.append(o))
             for m in model.modules() if isinstance(m, nn.Linear)]  # fmt: skip
    fc1 = model.fc1 if name == "mlp" else model.mlp.fc1
    hooks.append(fc1.register_forward_hook(lambda _m, _i, o: found.update(relu_1=o.relu())))
    for site in ("attn", "mlp") if name == "transformer" else ():
        hooks.append(model.get_submodule(site).register_forward_hook(
            lambda _m, _i, o, site=site: found.update({site: o})))  # fmt: skip
    rows: dict[str, list[torch.Tensor]] = {}
    try:
        for x in batches:
            linears.clear()
            found.clear()
            with torch.no_grad():
                model(x)
            found.update({f"linear_{k + 1}": t for k, t in enumerate(linears)})
            for site, value in found.items():
                rows.setdefault(site, []).append(value)
    finally:
        for hook in hooks:
            hook.remove()
    return {site: torch.cat(values) for site, values in rows.items()}


def extract_tp(out: Path, mesh, name: str) -> dict:
    """tl.extract on a tensor-parallel model: every rank runs every batch, rank 0 alone
    writes, and the stored sites are the global values, equal to a hook loop over the
    unsharded model (same weights). Then a resume: the manifest and the last shard removed
    (a run stopped there), the same call finishes it. A site that is a local shard of
    unknown layout (the attention's heads) is refused with ``tensor_parallel``."""
    from torchlens.extract import _store

    rank = dist.get_rank()
    plain = build(name).eval()
    model = shard("tp", name, copy.deepcopy(plain), mesh).eval()
    batches = [inputs(name, 10 + k) for k in range(3)]  # the same batches on every rank
    save = tl.func("linear") | tl.func("relu")
    if name == "transformer":
        save = save | tl.module("attn").output | tl.module("mlp").output
    writes = []
    write_file = _store._write_file
    _store._write_file = lambda path, data: (writes.append(path.name), write_file(path, data))
    try:
        ex = tl.extract(model, batches, save=save, to=out, progress=False, flush_s=0)
        dist.barrier()
        ran = len(writes)
        if rank == 0:  # a run stopped before its last batch was written
            (out / _store.MANIFEST).unlink()
            sorted((out / _store.SHARDS).iterdir())[-1].unlink()
        dist.barrier()
        resumed = tl.extract(model, batches, save=save, to=out, progress=False, flush_s=0)
    finally:
        _store._write_file = write_file
    expected = _hook_loop(plain, name, batches)
    result = {
        "writes": ran,
        "resume_writes": len(writes) - ran,
        "sites": sorted(ex),
        "max_diff": {
            site: float((got[site][:] - expected[site]).abs().max())
            for got in (resumed,)
            for site in expected
        },
        "first_equal": all(torch.equal(ex[site][:], resumed[site][:]) for site in expected),
    }
    if name == "transformer":
        try:
            tl.extract(model, batches, save=tl.func("scaled_dot_product_attention"),
                       to=out.with_name(out.name + "-heads"), progress=False)  # fmt: skip
            result["heads"] = {"code": None}
        except TorchLensError as err:
            result["heads"] = {"code": err.code, "message": str(err)}
    return result


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


class GroupReduce(MLP):
    """The MLP with its hidden activations summed over a process group (a c10d all-reduce);
    ``group=None``: no all-reduce (a rank outside the group)."""

    def __init__(self, group) -> None:
        super().__init__()
        self.group = group

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.group is not None:
            dist.all_reduce(h, group=self.group)
        return self.fc2(h)


def subgroups(out: Path, mesh) -> dict:
    """Collectives of subgroups replay in lockstep with their own group's ranks: a group of
    both ranks made with new_group, and a group of rank 0 alone, whose all-reduce rank 1
    never runs (checked with the whole world, rank 0 would wait for rank 1 until timeout)."""
    from torchlens.distributed import lockstep

    rank = dist.get_rank()
    pair, solo = dist.new_group([0, 1]), dist.new_group([0])
    result = {}
    lockstep.TIMEOUT, before = 20.0, lockstep.TIMEOUT
    try:
        for name, group in (("pair", pair), ("solo", solo if rank == 0 else None)):
            torch.manual_seed(0)
            model, x = GroupReduce(group), inputs("mlp", rank)
            trace = tl.trace(model, x)
            reduces = [op for op in trace if tl.distributed.is_collective(op)]
            result[name] = {
                "state": tl.replay(model, x).state,
                "groups": [list(lockstep.group_of(op)[1]) for op in reduces],
                "own_name": all(lockstep.group_of(op)[0] == group.group_name for op in reduces),
            }
            dist.barrier()
    finally:
        lockstep.TIMEOUT = before
    return result


KEPT: list = []  # traces and replay results kept past destroy_process_group (case "keep")


def _holds_the_run(roots: list) -> list[str]:
    """The kinds of torch.distributed object reachable from ``roots`` through references
    (a process group, FSDP's state, a Work): what would keep the run alive past
    destroy_process_group. Modules' and functions' globals are not followed."""
    wanted = {"ProcessGroup", "Work", "FSDPState", "FSDPParamGroup"}
    seen, stack, found = {id(r) for r in roots}, list(roots), set()
    while stack:
        obj = stack.pop()
        for ref in gc.get_referents(obj):
            if id(ref) in seen or isinstance(ref, (type, types.ModuleType, types.FunctionType)):
                continue
            seen.add(id(ref))
            name = type(ref).__name__
            if name in wanted:
                found.add(name)
                continue
            stack.append(ref)
    return sorted(found)


def keep(out: Path, mesh) -> dict:
    """Trace and validate an FSDP2 and a tensor-parallel model, keep the traces and
    results (``KEPT``, past destroy_process_group at exit), and say what they reach."""
    rank = dist.get_rank()
    for kind in ("fsdp", "tp"):
        model = shard(kind, "mlp", build("mlp"), mesh)
        x = inputs("mlp", rank if kind == "fsdp" else 0)
        KEPT.extend([tl.trace(model, x), tl.replay(model, x)])
    return {"reaches": _holds_the_run(KEPT)}


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
            elif case == "subgroups":
                result = subgroups(out / case, mesh)
            elif case == "keep":
                result = keep(out / case, mesh)
            elif case == "disagree":
                result = disagree(out / case, mesh)
            elif case.startswith("extract_tp-"):
                result = extract_tp(out / case, mesh, case.split("-")[1])
            else:
                kind, name = case.split("-")
                result = run_case(kind, name, out / case, mesh)
        except Exception:  # noqa: BLE001 - reported to the test
            result = {"error": traceback.format_exc()}
        with results.open("a") as f:
            f.write(json.dumps({"case": case, "rank": rank, **result}) + "\n")
    del mesh
    gc.collect()  # the models are gone; what KEPT holds outlives the group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
