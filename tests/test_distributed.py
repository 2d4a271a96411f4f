"""Sharded models under ``torchrun --nproc_per_node 2`` (gloo, CPU): FSDP2, tensor parallel and
DDP, each on an MLP and a small transformer block, trace with parameters at their own
addresses, record their collectives and validate ``passed`` on every rank; the ranks' saved
traces load as one view; a perturbed rank is found by ``diff``; replays whose collectives
disagree raise a typed error naming the rank instead of hanging (``tests/_distributed_worker.py``).

One torchrun launch runs every case; each test reads its lines. The launch has a timeout, so
a hang fails the tests, and every process must exit 0 with nothing aborted at teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torchlens as tl
from torchlens.distributed.placements import assemble
from torchlens.errors import DistributedError, UnsupportedModelError

WORKER = Path(__file__).resolve().parent / "_distributed_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
KINDS, MODELS = ("fsdp", "tp", "ddp"), ("mlp", "transformer")
CASES = [f"{k}-{m}" for k in KINDS for m in MODELS] + ["sp-normmlp"]

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with gloo is not available in this build",
)


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    # "disagree" last: its replays leave the ranks at different collective counts
    cases = [
        *CASES,
        "diverge",
        "extract_tp-mlp",
        "extract_tp-transformer",
        "keep",
        "subgroups",
        "disagree",
    ]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(WORKER), str(out), *cases]  # fmt: skip
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    results = {}
    for rank in (0, 1):
        path = out / f"results-rank{rank}.jsonl"
        for line in path.read_text().splitlines() if path.exists() else ():
            entry = json.loads(line)
            results[entry["case"], rank] = entry
    return done, results, out


def _result(launch, case: str, rank: int = 0) -> dict:
    """What rank ``rank`` wrote for ``case``."""
    return launch[1][case, rank]


@needs_gloo
def test_every_process_exits_cleanly(launch):
    done, _, _ = launch
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr and "Aborted" not in done.stderr
    assert "unwaited collective" not in done.stderr  # every collective waited for


@needs_gloo
@pytest.mark.parametrize("case", CASES)
def test_validates_passed_on_every_rank(launch, case):
    _, results, _ = launch
    for rank in (0, 1):
        result = results[case, rank]
        assert "error" not in result, result.get("error")
        assert result["state"] == "passed", result["failures"]
        assert result["output_equal"]  # the traced output is the unsharded model's


@needs_gloo
@pytest.mark.parametrize("model", MODELS)
def test_fsdp2_records_unsharded_parameters_and_its_all_gathers(launch, model):
    result = _result(launch, f"fsdp-{model}")
    params = result["params"]
    weight = "fc1.weight" if model == "mlp" else "mlp.fc1.weight"
    assert params[weight]["shape"] == params[weight]["local_shape"] == [32, 8]  # unsharded
    assert all(p["equal_plain"] for p in params.values())
    gathers = result["collectives"]
    assert len(gathers) == (2 if model == "mlp" else 3)  # one per fully_shard group
    assert {g["func"] for g in gathers} == {"c10d_all_gather_single"}
    # it reads the copied-in shards and fills the buffer: both are its parents
    assert all(any(p.startswith("all_gather_copy_in") for p in g["parents"]) for g in gathers)


@needs_gloo
@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_records_shards_placements_and_all_reduces(launch, model):
    result = _result(launch, f"tp-{model}")
    params = result["params"]
    fc1, fc2 = ("fc1", "fc2") if model == "mlp" else ("mlp.fc1", "mlp.fc2")
    assert params[f"{fc1}.weight"] == {
        "shape": [32, 8],
        "local_shape": [16, 8],
        "equal_plain": True,
    }
    assert params[f"{fc2}.weight"]["local_shape"] == [8, 16]  # rowwise: the input features
    reduces = result["collectives"]
    assert [c["func"] for c in reduces] == ["all_reduce"] * (1 if model == "mlp" else 2)
    # each all-reduce reads the rowwise linear's partial sum, unwrapped from its DTensor
    assert all(c["parents"][0].startswith("unwrap") for c in reduces)
    assert "wrap" in result["funcs"] and "unwrap" in result["funcs"]
    merged = result["merged"]
    assert merged["world_size"] == 2
    assert merged["colwise_global_equal"]  # shards reassembled into the unsharded output
    assert merged["colwise_placement"] == [{"shard": 1 if model == "mlp" else 2}]


@needs_gloo
def test_sequence_parallel_records_its_gather_and_scatter(launch):
    _, results, _ = launch
    for rank in (0, 1):
        result = results["sp-normmlp", rank]
        # the norm's tokens gathered before fc1, fc2's partial sums reduce-scattered after
        funcs = [c["func"] for c in result["collectives"]]
        assert funcs == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        assert result["params"]["norm.weight"]["local_shape"] == [8]  # replicated
        assert result["params"]["fc1.weight"]["local_shape"] == [16, 8]


@needs_gloo
@pytest.mark.parametrize("model", MODELS)
def test_ddp_records_parameters_under_module(launch, model):
    _, results, _ = launch
    params = results[f"ddp-{model}", 1]["params"]
    assert "module.fc1.weight" in params or "module.mlp.fc1.weight" in params
    assert all(p["equal_plain"] for p in params.values())


@needs_gloo
def test_diff_between_ranks_names_the_first_diverging_op(launch):
    _, results, out = launch
    assert results["diverge", 0] == {
        "case": "diverge", "rank": 0, "first": "linear_1", "func": "linear", "status": "differs"
    }  # fmt: skip
    ranks = tl.distributed.load_ranks(out / "diverge")  # loads here too, in one process
    assert ranks.world_size == 2 and list(ranks)[0] == "linear_1"
    with pytest.raises(DistributedError) as err:  # data parallel: each rank its own values
        ranks.global_value("linear_1")
    assert err.value.code == "ranks_differ"
    assert torch.equal(ranks["linear_2"].records[0].out, ranks.traces[0]["linear_2"].out)


@needs_gloo
def test_replays_that_disagree_raise_naming_the_rank(launch):
    _, results, _ = launch
    for rank, other in ((0, 1), (1, 0)):
        shapes = results["disagree", rank]["shapes"]
        assert shapes["code"] == "ranks_differ"
        assert f"rank {other} at all_reduce_1 (all_reduce, shape" in shapes["message"]
    missing = results["disagree", 0]["missing"]
    assert missing["code"] == "rank_timeout" and "for ranks [1]" in missing["message"]
    assert results["disagree", 1]["missing"] == {"state": "passed"}  # (it had nothing to wait for)


@needs_gloo
@pytest.mark.parametrize("model", MODELS)
def test_extract_stores_global_tensor_parallel_activations(launch, model):
    _, results, _ = launch
    sites = ["linear_1", "linear_2", "relu_1"]
    if model == "transformer":  # q, k, v, out, fc1, fc2 and the two modules' outputs
        sites = sorted([*sites, "linear_3", "linear_4", "linear_5", "linear_6", "attn", "mlp"])
    for rank in (0, 1):
        result = results[f"extract_tp-{model}", rank]
        assert "error" not in result, result.get("error")
        assert result["sites"] == sites
        # the global values: equal to a hook loop over the unsharded model, same weights
        assert set(result["max_diff"]) == set(sites)
        assert all(diff < 1e-5 for diff in result["max_diff"].values()), result["max_diff"]
        assert result["first_equal"]  # the resumed run stores what the first one did
    # rank 0 alone writes: 3 shards (one per batch), the run record and the manifest; the
    # resume writes the removed last shard and the manifest again
    writes = [(results[f"extract_tp-{model}", r]["writes"],
               results[f"extract_tp-{model}", r]["resume_writes"]) for r in (0, 1)]  # fmt: skip
    assert writes == [(5, 2), (0, 0)]


@needs_gloo
def test_extract_refuses_a_local_shard_of_unknown_layout(launch):
    _, results, _ = launch
    for rank in (0, 1):  # the attention's heads: reshaped after to_local()
        heads = results["extract_tp-transformer", rank]["heads"]
        assert heads["code"] == "tensor_parallel"
        assert "'scaled_dot_product_attention_1'" in heads["message"]


@needs_gloo
def test_traces_kept_past_destroy_hold_no_process_group(launch):
    """What torchlens keeps holds plain tensors and metadata only: no process group, FSDP
    state or Work reachable from the traces and replay results, which the worker keeps past
    destroy_process_group (test_every_process_exits_cleanly checks that exit)."""
    _, results, _ = launch
    for rank in (0, 1):
        assert "error" not in results["keep", rank], results["keep", rank].get("error")
        assert results["keep", rank]["reaches"] == []


@needs_gloo
def test_lockstep_waits_for_the_ranks_of_the_collectives_own_group(launch):
    _, results, _ = launch
    for rank in (0, 1):
        pair = results["subgroups", rank]["pair"]
        assert pair == {"state": "passed", "groups": [[0, 1]], "own_name": True}
    # a group of rank 0 alone: its all-reduce is checked with no one else
    assert results["subgroups", 0]["solo"] == {"state": "passed", "groups": [[0]], "own_name": True}
    assert results["subgroups", 1]["solo"] == {"state": "passed", "groups": [], "own_name": True}


def test_assemble_shards_partials_and_replicas():
    whole = torch.arange(24.0).reshape(4, 6)
    layout = {"mesh_shape": [2], "global_shape": [4, 6]}
    rows = [
        ({**layout, "placements": [{"shard": 0}], "coordinate": [r]}, whole[2 * r : 2 * r + 2])
        for r in (0, 1)
    ]
    assert torch.equal(assemble(rows), whole)
    parts = [
        ({**layout, "placements": [{"partial": "sum"}], "coordinate": [r]}, whole * (r + 1))
        for r in (0, 1)
    ]
    assert torch.equal(assemble(parts), whole * 3)
    same = [
        ({**layout, "placements": [{"replicate": True}], "coordinate": [r]}, whole) for r in (0, 1)
    ]
    assert torch.equal(assemble(same), whole)
    # a 2 x 2 mesh: rows over mesh dimension 0, columns over 1
    grid = {
        "mesh_shape": [2, 2],
        "global_shape": [4, 6],
        "placements": [{"shard": 0}, {"shard": 1}],
    }
    shards = [
        ({**grid, "coordinate": [i, j]}, whole[2 * i : 2 * i + 2, 3 * j : 3 * j + 3])
        for i in (0, 1)
        for j in (0, 1)
    ]
    assert torch.equal(assemble(shards), whole)


def test_assemble_refuses_shards_of_different_layouts():
    layout = {"mesh_shape": [2], "global_shape": [4, 6], "coordinate": [0]}
    a = ({**layout, "placements": [{"shard": 0}]}, torch.zeros(2, 6))
    b = ({**layout, "placements": [{"shard": 1}], "coordinate": [1]}, torch.zeros(4, 3))
    with pytest.raises(DistributedError) as err:
        assemble([a, b])
    assert err.value.code == "ranks_differ"
    short = ({**layout, "placements": [{"shard": 0}]}, torch.zeros(2, 6))  # one rank missing
    with pytest.raises(DistributedError) as err:
        assemble([short])
    assert err.value.code == "ranks_differ" and "global shape" in str(err.value)


def test_load_ranks_refuses_what_save_rank_did_not_write(tmp_path):
    with pytest.raises(DistributedError) as err:
        tl.distributed.load_ranks(tmp_path)
    assert err.value.code == "not_a_rank"
    tl.save(tl.trace(torch.nn.Linear(2, 2), torch.randn(1, 2)), tmp_path / "rank0")
    with pytest.raises(DistributedError) as err:  # a plain tl.save: no rank recorded
        tl.distributed.load_ranks(tmp_path)
    assert err.value.code == "not_a_rank"


def test_save_rank_needs_a_process_group():
    with pytest.raises(DistributedError) as err:
        tl.distributed.save_rank(tl.trace(torch.nn.Linear(2, 2), torch.randn(1, 2)), "x")
    assert err.value.code == "no_process_group"


def test_pipeline_parallel_is_refused():
    from torch.distributed.pipelining import pipe_split, pipeline

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            x = self.a(x)
            pipe_split()
            return self.b(x)

    x = torch.randn(2, 4)
    pipe = pipeline(Two(), mb_args=(x,))
    for run in (tl.trace, tl.validate):
        with pytest.raises(UnsupportedModelError) as err:
            run(pipe, x)
        assert err.value.code == "pipeline_parallel"
    with pytest.raises(UnsupportedModelError) as err:  # a bound method of one too
        tl.trace(pipe.forward, x)
    assert err.value.code == "pipeline_parallel"


def test_collectives_are_described_to_capture_and_replay():
    from torchlens.capture.naming import func_info
    from torchlens.capture.special import SETTLES, SPECIAL_OUTPUTS
    from torchlens.replay.exemptions import PROVEN_BY_RULE
    from torchlens.replay.interpreter import LOCKSTEP

    info = func_info(dist.all_gather_into_tensor)  # a c10d call: writes its first argument
    assert (info.name, info.inplace, info.settles) == ("c10d_all_gather_into_tensor", (0,), True)
    out, x = torch.zeros(2), torch.ones(2)
    assert [t for _, t in SPECIAL_OUTPUTS[info.name]((out, x), None)] == [out]
    reduce = torch.ops._c10d_functional.all_reduce.default  # functional: a new tensor
    assert func_info(reduce).name == "all_reduce" and func_info(reduce).settles
    for func in (dist.all_gather_into_tensor, reduce):
        assert func in SETTLES and func in PROVEN_BY_RULE and func in LOCKSTEP
    assert func_info(torch.add).settles is False


def test_lockstep_check_is_a_no_op_without_a_process_group():
    from torchlens.distributed.lockstep import check_lockstep

    assert not dist.is_initialized()
    trace = tl.trace(torch.nn.Linear(2, 2), torch.randn(1, 2))
    assert check_lockstep(trace.ops[0]) is None


def test_a_group_kept_by_name_that_is_gone_is_a_typed_error():
    from torchlens.distributed.release import GroupRef, restore_groups

    gone = GroupRef("no-such-group", (0, 1))
    with pytest.raises(DistributedError) as err:
        restore_groups((torch.ones(1),), {"group": gone})
    assert err.value.code == "no_process_group" and "'no-such-group'" in str(err.value)
    args, kwargs = restore_groups((1, "sum"), {"async_op": True})  # nothing to resolve
    assert args == (1, "sum") and kwargs == {"async_op": True}


def test_release_leaves_a_trace_alone_without_a_process_group():
    assert not dist.is_initialized()
    model, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
    out = model(x)
    trace = tl.trace(model, x)
    assert trace.output.grad_fn is not None  # the output as the model returned it
    assert torch.equal(trace.output, out)
