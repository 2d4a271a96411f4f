"""tl.extract / tl.load_extraction in one process: values, layout, reading back, bad input."""

from __future__ import annotations

import errno
import importlib
import inspect
import json
import os
import sys
from collections import UserDict
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

import torchlens as tl
from torchlens.errors import (
    ExtractionError,
    InvalidArgumentError,
    LookupFailedError,
    SelectorMatchError,
)
from torchlens.extract import _run as _run_module
from torchlens.extract import _store
from torchlens.extract._batches import to_device

try:
    from tests.models import ZOO_BY_NAME
except ImportError:  # repository root not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from models import ZOO_BY_NAME


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def _batches(n: int = 5, size: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(size, 4, generator=g) for _ in range(n)]


def _run(tmp_path, data=None, name="run", **options):
    options.setdefault("save", tl.func("relu"))
    options.setdefault("progress", False)
    return tl.extract(options.pop("model", None) or _mlp(), data or _batches(),
                      to=tmp_path / name, **options)  # fmt: skip


# -- values ---------------------------------------------------------------------------------
ZOO_CASES = [
    "mlp_sequential", "conv2d_net", "pooling", "batchnorm_eval", "norms", "residual_blocks",
    "squeeze_excitation", "transformer_encoder_layer", "relu_inplace", "float64_model",
    "bfloat16_model", "views_reshape_permute",
]  # fmt: skip


def _hook(saved: dict, address: str, module, args, output) -> None:
    tensors = [t for t in (output if isinstance(output, tuple) else (output,))
               if isinstance(t, torch.Tensor)]  # fmt: skip
    saved.setdefault(address, []).append(tensors[0].detach().clone())


@pytest.mark.parametrize("name", ZOO_CASES)
def test_matches_a_hooks_loop_on_the_zoo(tmp_path, name):
    case = ZOO_BY_NAME[name]
    model = case.make_model()
    args, _ = case.make_inputs()
    batches = [tuple(a + 0.25 * k for a in args) for k in range(3)]
    trace = tl.trace(model, batches[0])
    sites = {}  # module address -> the op label of its output
    for address, _ in list(model.named_modules())[1:]:
        try:
            calls = list(trace.module_calls(address))
        except LookupFailedError:  # a module that ran no tensor op
            continue
        if len(calls) == 1 and len(calls[0].outputs) == 1 and calls[0].outputs[0] in trace.labels:
            out = trace[calls[0].outputs[0]]
            if out.shape and out.shape[0] == args[0].shape[0]:
                sites[address] = out.label
    assert sites, f"{name}: no module output to compare"
    saved: dict[str, list[torch.Tensor]] = {}
    handles = [m.register_forward_hook(partial(_hook, saved, a))
               for a, m in model.named_modules() if a in sites]  # fmt: skip
    for batch in batches:  # with autograd on, as tl.extract's record does not take fused
        model(*batch)  # fast paths (nn.TransformerEncoderLayer's) either
    for handle in handles:
        handle.remove()
    ex = tl.extract(model, batches, save=tl.label(*sites.values()), to=tmp_path / "run",
                    progress=False, shard_mb=0)  # fmt: skip
    assert sorted(ex) == sorted(set(sites.values()))
    for address, label in sites.items():
        expected = torch.cat(saved[address])
        assert ex[label].shape == tuple(expected.shape) and ex[label].dtype == expected.dtype
        torch.testing.assert_close(ex[label][:], expected, rtol=0, atol=0)


def test_rows_are_examples_in_order_across_shards(tmp_path):
    data = _batches(5, 4) + [torch.randn(3, 4)]
    ex = _run(tmp_path, data, shard_mb=0)
    expected = torch.cat([_mlp()[:2](x) for x in data]).detach()
    arr = ex["relu_1"]
    assert len(arr) == ex.n_examples == 23 and arr.shape == (23, 8) and arr.ndim == 2
    assert len(ex.meta["shards"]) == 6
    assert torch.equal(arr[:], expected)
    assert torch.equal(arr[2:19:5], expected[2:19:5])
    assert torch.equal(arr[[22, 0, 7, 7]], expected[[22, 0, 7, 7]])
    assert torch.equal(arr[-1], expected[-1]) and torch.equal(arr[5, 2:4], expected[5, 2:4])
    assert np.array_equal(np.asarray(arr), expected.numpy())
    far = [21, 0, 22, 1, 0, 11]  # runs of nearby rows, a repeat, out of order
    assert torch.equal(arr[far], expected[far]) and torch.equal(
        arr[torch.tensor(far)], expected[far]
    )
    mask = torch.arange(23) % 4 == 1
    assert torch.equal(arr[mask], expected[mask]) and torch.equal(arr[np.array([5])], expected[[5]])
    with pytest.raises(IndexError):
        arr[23]


INDEXES = [
    2, -1, np.int64(3), torch.tensor(5), np.array(4), torch.tensor(-2), slice(None),
    slice(2, 9), slice(None, None, 3), (slice(None), 0), (slice(1, 4), 2), ([0, 5], 1),
    ([0, 5], [1, 2]), ([0, 5], slice(None), [1, 3]), (slice(None), slice(1, 3)), (-3, -1, -1),
    (np.arange(23) % 2 == 0, 0), ..., (Ellipsis, 0), (Ellipsis, 1, 2), (3, Ellipsis, -1),
    None, (None, 3), (slice(None), None, 0), np.array([[0, 1], [22, 3]]),
    torch.tensor([[0, 1], [-1, 3]]), [], torch.tensor([], dtype=torch.long), (2, [0, 2], 1),
    (torch.tensor(3), torch.tensor(1)), torch.tensor(True), (torch.tensor([1, 20, 21, 1]),),
    (slice(5, 5),), [True] * 23, (np.array([3, 22]), slice(None), torch.tensor([0, 3])), (),
]  # fmt: skip


def test_site_array_indexes_like_the_whole_tensor(tmp_path):
    x = torch.randn(23, 3, 4, generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Identity(), nn.ReLU())
    ex = _run(tmp_path, list(x.split(5)), model=model, shard_mb=0)
    arr, full = ex["relu_1"], torch.relu(x)
    assert torch.equal(arr[:], full)
    for index in INDEXES + [full[:, :, 0] > 0.5]:  # the last: a mask over rows and columns
        got, want = arr[index], full[index]
        assert got.shape == want.shape and torch.equal(got, want), index
    assert torch.equal(arr[::-2], torch.from_numpy(full.numpy()[::-2].copy()))  # as numpy
    for bad in (23, -24, [0, 23], (23, 0), [True] * 3, 2.5, "a"):
        with pytest.raises(IndexError):
            arr[bad]
    assert len(list(arr)) == 23  # iteration stops at the first row out of range


def test_manifest_names_sites_shapes_versions_and_count(tmp_path):
    _run(tmp_path, save=tl.func("relu", "linear"))
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["n_examples"] == 20 and manifest["n_batches"] == 5
    assert manifest["sites"] == {
        "linear_1": {"shape": [20, 8], "dtype": "F32"},
        "relu_1": {"shape": [20, 8], "dtype": "F32"},
        "linear_2": {"shape": [20, 3], "dtype": "F32"},
    }
    assert manifest["model"] == "torch.nn.modules.container.Sequential"
    assert manifest["torch_version"] == torch.__version__
    assert manifest["torchlens_version"] == tl.__version__
    assert manifest["args"]["save"] == "func('linear', 'relu')"


def test_inputs_and_targets_from_tuple_and_dict_batches(tmp_path):
    class TwoInputs(nn.Module):
        def forward(self, x, scale):
            return torch.relu(x * scale)

    xs = _batches(3)
    tuples = [(x, torch.arange(4) + 4 * k) for k, x in enumerate(xs)]
    ex = _run(tmp_path, tuples, inputs=0, targets=1)
    assert torch.equal(ex.targets[:], torch.arange(12))
    assert torch.equal(ex["relu_1"][:], torch.cat([_mlp()[:2](x) for x in xs]).detach())
    dicts = [{"x": x, "scale": torch.full((4, 1), 2.0)} for x in xs]
    ex = _run(tmp_path, dicts, name="dicts", model=TwoInputs(), targets=lambda b: b["x"][:, 0])
    assert torch.equal(ex["relu_1"][:], torch.relu(torch.cat(xs) * 2))
    assert torch.equal(ex.targets[:], torch.cat(xs)[:, 0])


def test_reductions_pool_before_storing(tmp_path):
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    images = [torch.randn(2, 3, 6, 6) for _ in range(2)]
    reduce = {"relu_1": "spatial_mean", tl.func("conv2d"): lambda t: t[:, :, 0, 0]}
    ex = _run(tmp_path, images, model=conv, save=tl.func("conv2d", "relu"), reduce=reduce)
    full = torch.cat([conv(x) for x in images]).detach()
    pre = torch.cat([conv[0](x) for x in images]).detach()
    assert torch.allclose(ex["relu_1"][:], full.mean(dim=(2, 3)))
    assert torch.equal(ex["conv2d_1"][:], pre[:, :, 0, 0])
    tokens = [torch.randn(2, 5, 4) for _ in range(2)]
    ex = _run(tmp_path, tokens, name="tokens", reduce="token_mean")
    assert torch.allclose(ex["relu_1"][:], torch.cat([_mlp()[:2](t) for t in tokens]).mean(1))
    masked = [{"x": t, "mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])} for t in tokens]

    def masked_mean(t, batch):  # a reduction that sees the batch: pool the real tokens only
        m = batch["mask"][..., None].to(t.dtype)
        return (t * m).sum(1) / m.sum(1)

    ex = _run(tmp_path, masked, name="masked", inputs="x", reduce=masked_mean)
    full = torch.cat([_mlp()[:2](t) for t in tokens]).detach()
    expected = torch.stack([full[0, :3].mean(0), full[1].mean(0), full[2, :3].mean(0),
                            full[3].mean(0)])  # fmt: skip
    assert torch.allclose(ex["relu_1"][:], expected)
    with pytest.raises(InvalidArgumentError) as err:
        _run(tmp_path, name="bad", reduce="median")
    assert err.value.code == "bad_reduce" and "spatial_mean" in str(err.value)


def test_stop_after_skips_the_rest_of_the_model(tmp_path):
    class Exploding(nn.Module):
        def forward(self, x):
            raise AssertionError("the forward went past stop_after")

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Exploding()).eval()
    ex = _run(tmp_path, model=model, stop_after=tl.func("relu"))
    assert ex["relu_1"].shape == (20, 8)
    assert list(ex) == ["relu_1"]


def test_dataset_view_feeds_a_linear_probe(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    ex = _run(tmp_path, loader, save=tl.func("linear"), inputs=0, targets=1)
    ds = ex.dataset("linear_1")
    feature, target = ds[5]
    assert len(ds) == 64 and torch.equal(feature, ex["linear_1"][5]) and target == y[5]
    feats, labels = zip(*DataLoader(ds, batch_size=32))  # a linear probe, by least squares
    feats, labels = torch.cat(feats), torch.cat(labels)
    design = torch.cat([feats, torch.ones(64, 1)], dim=1)
    w = torch.linalg.lstsq(design, 2.0 * labels[:, None] - 1).solution
    accuracy = ((design @ w)[:, 0] > 0).eq(labels.bool()).float().mean()
    assert accuracy >= 0.9


def test_progress_bar_only_when_asked_or_on_a_terminal(tmp_path, capsys):
    _run(tmp_path, name="quiet", progress=None)  # pytest's stderr is not a terminal
    assert "tl.extract" not in capsys.readouterr().err
    _run(tmp_path, name="shown", progress=True)
    err = capsys.readouterr().err
    assert "tl.extract" in err and "20/20" not in err and "20ex" in err.replace(" ", "")


# -- refusing to lose or mix data -----------------------------------------------------------
def test_finished_run_is_kept_unless_overwrite(tmp_path):
    first = _run(tmp_path)["relu_1"][:]
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path)
    assert err.value.code == "exists" and "overwrite=True" in str(err.value)
    assert torch.equal(tl.load_extraction(tmp_path / "run")["relu_1"][:], first)
    again = _run(tmp_path, [2 * b for b in _batches()], overwrite=True)
    assert torch.equal(again["relu_1"][:], torch.cat([_mlp()[:2](2 * b) for b in _batches()]))


def test_changed_arguments_are_refused_and_named(tmp_path):
    _run(tmp_path)
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, save=tl.func("linear"), reduce="flatten")
    message = str(err.value)
    assert err.value.code == "args_changed"
    assert "save: func('relu') on disk, func('linear') now" in message
    assert "reduce: None on disk, 'flatten' now" in message and "data" not in message
    other = _mlp()
    with torch.no_grad():
        other[0].weight.add_(1)
    with pytest.raises(ExtractionError, match="parameters:") as err:
        _run(tmp_path, model=other)
    assert err.value.code == "args_changed"


def test_directories_that_are_not_extractions(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    for path in (tmp_path / "other", tmp_path / "other" / "notes.txt"):
        with pytest.raises(ExtractionError) as err:
            tl.extract(_mlp(), _batches(), save=tl.func("relu"), to=path, progress=False)
        assert err.value.code == "not_an_extraction"
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ExtractionError) as err:
        tl.load_extraction(tmp_path / "other")
    assert err.value.code == "not_an_extraction"


def test_selector_matching_nothing(tmp_path):
    with pytest.raises(SelectorMatchError) as err:
        _run(tmp_path, save=tl.func("rleu"))
    assert err.value.code == "no_match" and "relu" in str(err.value)
    ex = _run(tmp_path, save=tl.func("relu"))  # nothing was written: no overwrite needed
    assert ex["relu_1"].shape == (20, 8)
    with pytest.raises(InvalidArgumentError) as err:
        _run(tmp_path, name="none", save=None)
    assert err.value.code == "bad_save"


def test_bad_inputs_targets_and_empty_data(tmp_path):
    pairs = [(x, torch.zeros(4)) for x in _batches()]
    for options, code in (({"inputs": 2}, "bad_inputs"), ({"inputs": 0, "targets": "y"},
                          "bad_targets")):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as err:
            _run(tmp_path, pairs, name=code, **options)
        assert err.value.code == code and "tuple batch" in str(err.value)
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, pairs, name="scalar", inputs=0, targets=lambda b: b[1].sum())
    assert err.value.code == "not_batched" and "'targets='" in str(err.value)
    with pytest.raises(InvalidArgumentError) as err:
        tl.extract(_mlp(), [], save=tl.func("relu"), to=tmp_path / "empty", progress=False)
    assert err.value.code == "empty_data"


def test_rejected_batch_keeps_earlier_batches_and_resumes(tmp_path):
    good = _batches()
    bad = good[:3] + [torch.randn(4, 5)] + good[4:]
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, bad, shard_mb=0)
    assert err.value.code == "bad_batch" and "batch 3 (rows 12 to 15)" in str(err.value)
    assert _store.done_batches(tmp_path / "run") == {0, 1, 2}
    with pytest.raises(ExtractionError) as err:
        tl.load_extraction(tmp_path / "run")
    assert err.value.code == "incomplete"
    ex = _run(tmp_path, good)
    assert torch.equal(ex["relu_1"][:], _run(tmp_path, good, name="ref")["relu_1"][:])


def test_site_shape_changing_between_batches(tmp_path):
    tokens = [torch.randn(2, 5, 4), torch.randn(2, 7, 4)]
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, tokens)
    message = str(err.value)
    assert err.value.code == "shape_changed"
    assert "'relu_1'" in message and "(7, 8)" in message and "(5, 8)" in message
    ex = _run(tmp_path, tokens, name="pooled", reduce="token_mean")
    assert ex["relu_1"].shape == (4, 8)


def test_site_without_a_batch_dimension(tmp_path):
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, reduce=lambda t: t.sum())
    assert err.value.code == "not_batched" and "'relu_1'" in str(err.value)


def test_full_disk_keeps_written_shards(tmp_path, monkeypatch):
    real, calls = os.fsync, []

    def filling(fd):
        calls.append(fd)
        if len(calls) == 4:  # the run record, two shards, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", filling)
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, shard_mb=0)
    assert err.value.code == "write_failed" and "disk is full" in str(err.value)
    assert _store.done_batches(tmp_path / "run") == {0, 1}
    assert sorted(p.name for p in (tmp_path / "run" / "shards").iterdir()) == [
        "shard-000000000.safetensors", "shard-000000001.safetensors"
    ]  # fmt: skip
    monkeypatch.setattr(os, "fsync", real)
    ex = _run(tmp_path, shard_mb=0)
    assert torch.equal(ex["relu_1"][:], torch.cat([_mlp()[:2](x) for x in _batches()]).detach())


class _Reshuffling(torch.utils.data.Sampler):
    """A sampler of its own that draws another order each time it is iterated."""

    def __iter__(self):
        return iter(torch.randperm(8).tolist())

    def __len__(self) -> int:
        return 8


def test_shuffled_or_presharded_loaders_are_refused(tmp_path):
    dataset = TensorDataset(torch.randn(8, 4))
    sharded = DataLoader(dataset, sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    for loader, code in ((DataLoader(dataset, shuffle=True), "shuffled_loader"),
                         (DataLoader(dataset, sampler=SubsetRandomSampler(range(8))),
                          "shuffled_loader"),
                         (DataLoader(dataset, sampler=WeightedRandomSampler([1.0] * 8, 8)),
                          "shuffled_loader"),
                         (DataLoader(dataset, sampler=_Reshuffling(), batch_size=2),
                          "shuffled_loader"),
                         (sharded, "sharded_loader")):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as err:
            _run(tmp_path, loader, inputs=0, overwrite=True)
        assert err.value.code == code
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_fixed_sampler_order_is_the_row_order(tmp_path):
    values = torch.arange(8.0)[:, None].repeat(1, 4)  # example i holds i everywhere
    order = [5, 0, 7, 2, 2, 1]
    loader = DataLoader(TensorDataset(values, torch.arange(8)), sampler=order, batch_size=4)
    ex = _run(tmp_path, loader, model=nn.Sequential(nn.Identity(), nn.ReLU()), inputs=0, targets=1)
    assert ex.targets[:].tolist() == order and ex["relu_1"][:, 0].tolist() == order


def test_damaged_runs_fail_typed_on_reading(tmp_path):
    _run(tmp_path, shard_mb=0)
    run = tmp_path / "run"
    (run / "shards" / "shard-000000003.safetensors").unlink()
    ex = tl.load_extraction(run)
    assert torch.equal(ex["relu_1"][:12], torch.cat([_mlp()[:2](x) for x in _batches()[:3]]))
    with pytest.raises(ExtractionError) as err:
        ex["relu_1"][:]
    assert err.value.code == "corrupt" and "shard-000000003" in str(err.value)
    (run / "manifest.json").write_text('{"format": "torchlens-extr')
    with pytest.raises(ExtractionError) as err:
        tl.load_extraction(run)
    assert err.value.code == "corrupt"


def test_public_signatures():
    assert str(inspect.signature(tl.extract)) == (
        "(model: 'Any', data: 'Any', *, save: 'Any', to: 'str | os.PathLike', "
        "inputs: 'Any' = None, targets: 'Any' = None, reduce: 'Any' = None, "
        "stop_after: 'Any' = None, device: 'str | torch.device | None' = None, "
        "overwrite: 'bool' = False, progress: 'bool | None' = None, shard_mb: 'float' = 16.0, "
        "flush_s: 'float | None' = 30.0) -> 'Extraction'"
    )
    assert (
        str(inspect.signature(tl.load_extraction)) == "(path: 'str | os.PathLike') -> 'Extraction'"
    )
    package = importlib.import_module("torchlens.extract")  # tl.extract is the function
    assert set(package.__all__) == {
        "extract", "load_extraction", "Extraction", "SiteArray", "REDUCTIONS"
    }  # fmt: skip


class _Counting(torch.utils.data.Dataset):
    """20 examples; counts the items loaded, and fails on one index while ``broken``."""

    def __init__(self) -> None:
        self.x, self.loaded, self.broken = torch.cat(_batches()), [], True

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.broken and i == 13:
            raise OSError("unreadable example 13")
        self.loaded.append(i)
        return self.x[i]


def test_resumed_loader_loads_only_the_batches_left(tmp_path):
    data = _Counting()
    with pytest.raises(OSError, match="unreadable example 13"):  # the loader's own error
        _run(tmp_path, DataLoader(data, batch_size=4), shard_mb=0)
    assert _store.done_batches(tmp_path / "run") == {0, 1, 2}
    data.loaded.clear()
    data.broken = False
    ex = _run(tmp_path, DataLoader(data, batch_size=4), shard_mb=0)
    assert data.loaded == list(range(12, 20))
    # batch by batch, as the extraction ran: a linear over 20 rows may round apart from
    # the same rows in batches of 4 (kernels block by batch size)
    expected = torch.cat([_mlp()[:2](batch) for batch in data.x.split(4)]).detach()
    assert torch.equal(ex["relu_1"][:], expected)


class _Encoding(UserDict):
    """Like Hugging Face's BatchEncoding: a mapping that is not a dict, with state of its own."""

    def __init__(self, data, encodings=None):
        super().__init__(data)
        self.encodings = encodings


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)

    def forward(self, input_ids, attention_mask):
        return torch.relu(self.embed(input_ids)) * attention_mask[..., None]


def test_mapping_batches_are_keyword_arguments(tmp_path):
    g = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(0, 10, (5,), generator=g),
              "attention_mask": torch.ones(5, dtype=torch.long)} for _ in range(6)]  # fmt: skip
    stacked = {k: torch.stack([item[k] for item in items]) for k in items[0]}
    expected = _Embed()(**stacked).detach().mean(1)

    def collate(rows):
        return _Encoding({k: torch.stack([r[k] for r in rows]) for k in rows[0]}, "tokens")

    loader = DataLoader(items, batch_size=4, collate_fn=collate)
    for name, data in (("list", [collate(items[:4]), collate(items[4:])]), ("loader", loader)):
        ex = _run(tmp_path, data, name=name, model=_Embed(), reduce="token_mean")
        assert torch.equal(ex["relu_1"][:], expected), name
    moved = to_device(collate(items), torch.device("meta"))  # a mapping's tensors move too
    assert type(moved) is _Encoding and moved.encodings == "tokens"
    assert {t.device.type for t in moved.values()} == {"meta"}


def test_an_error_without_a_message_says_where_it_was_raised(tmp_path):
    class Silent(nn.Module):
        def forward(self, x):
            raise AttributeError()

    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, model=Silent(), save=tl.func("relu"))
    assert err.value.code == "bad_batch"
    assert "AttributeError (no message; raised in forward at " in str(err.value)
    assert "test_extract.py:" in str(err.value)


def test_targets_that_are_not_numbers_are_refused(tmp_path):
    items = [{"x": torch.randn(4), "path": f"img_{i}.jpg", "pair": (i, i + 1)} for i in range(8)]
    for target, kind in (("path", "list of str"), ("pair", "list of Tensor")):
        with pytest.raises(InvalidArgumentError) as err:
            _run(tmp_path, DataLoader(items, batch_size=4), name=target, inputs="x",
                 targets=target)  # fmt: skip
        assert err.value.code == "bad_targets" and f"gave a {kind} in batch 0" in str(err.value)
    pairs = lambda b: torch.stack(b["pair"], 1)  # noqa: E731  (what the message suggests)
    ex = _run(tmp_path, DataLoader(items, batch_size=4), name="ok", inputs="x", targets=pairs)
    assert ex.targets[:].tolist() == [[i, i + 1] for i in range(8)]


def test_sites_are_listed_in_the_order_the_model_computed_them(tmp_path):
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(11)])
    ex = _run(tmp_path, model=model.eval(), save=tl.func("relu", "linear"))
    order = [f"{kind}_{i}" for i in range(1, 12) for kind in ("linear", "relu")]
    assert list(ex) == order and ex.meta["site_order"] == order
    rows = ex.dataset()[0]
    assert [tuple(r.shape) for r in rows] == [(4,)] * 22
    assert torch.equal(rows[-1], ex["relu_11"][0]) and torch.equal(rows[1], ex["relu_1"][0])


class _Offloaded(nn.Module):
    """Weights parked on the meta device and brought in by hooks at each call, as
    accelerate's cpu_offload does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()[:2]
        self.stored = {k: v.clone() for k, v in self.net[0].named_parameters()}
        self.net.to("meta")
        self.net[0].register_forward_pre_hook(self._bring_in)
        self.net[0].register_forward_hook(self._park)

    def _bring_in(self, module, args):
        for name, value in self.stored.items():
            module._parameters[name] = nn.Parameter(value, requires_grad=False)

    def _park(self, module, args, output):
        for name, value in self.stored.items():
            module._parameters[name] = nn.Parameter(value.to("meta"), requires_grad=False)

    def forward(self, x):
        return self.net(x)


def test_parameters_on_meta_lazy_or_sharded_do_not_stop_a_run(tmp_path):
    expected = torch.cat([_mlp()[:2](x) for x in _batches()]).detach()
    ex = _run(tmp_path, name="offloaded", model=_Offloaded())
    assert torch.equal(ex["relu_1"][:], expected)
    torch.manual_seed(0)
    lazy = nn.Sequential(nn.LazyLinear(8), nn.ReLU()).eval()
    ex = _run(tmp_path, name="lazy", model=lazy)
    by_batch = torch.cat([torch.relu(lazy[0](x)) for x in _batches()]).detach()
    assert torch.equal(ex["relu_1"][:], by_batch)
    torch.manual_seed(0)  # the same lazy model again: the same run, which is finished
    with pytest.raises(ExtractionError) as err:
        _run(tmp_path, name="lazy", model=nn.Sequential(nn.LazyLinear(8), nn.ReLU()).eval())
    assert err.value.code == "exists"


def test_dtensor_parameters_are_hashed_whole(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        pytest.skip("this torch has no FSDP2")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is unavailable or already in use")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        sharded = _mlp()
        fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
        assert type(sharded.state_dict()["0.weight"]).__name__ == "DTensor"
        ex = _run(tmp_path, model=sharded)
        assert ex.meta["args"]["parameters"] == _run_module._digest(_mlp())
        expected = torch.cat([_mlp()[:2](x) for x in _batches()]).detach()
        torch.testing.assert_close(ex["relu_1"][:], expected)
    finally:
        dist.destroy_process_group()


def test_shards_with_other_shapes_are_named_as_a_shape_change(tmp_path):
    root = tmp_path / "run"
    (root / "shards").mkdir(parents=True)
    writer = _store.ShardWriter(root, 0)  # as two ranks would write, each on its own
    writer.add(0, 0, 2, {"relu_1": torch.zeros(2, 12, 8)})
    writer.add(1, 2, 2, {"relu_1": torch.zeros(2, 16, 8)})
    with pytest.raises(ExtractionError) as err:
        _store.finalize(root, 2, 4, {})
    assert err.value.code == "shape_changed"
    assert "(16, 8) (F32) in batches [1]" in str(err.value)
    assert "(12, 8) (F32) in batches [0]" in str(err.value)
    writer.add(2, 4, 2, {"relu_2": torch.zeros(2, 12, 8)})
    (root / "shards" / "shard-000000001.safetensors").unlink()
    with pytest.raises(ExtractionError) as err:
        _store.finalize(root, 3, 6, {})
    assert err.value.code == "sites_changed"
