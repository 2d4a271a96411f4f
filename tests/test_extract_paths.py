"""tl.extract over batches whose forward takes different paths: a site is the same op in
every batch (its rows equal a forward-hook loop's), or the run stops with ``sites_changed``;
never another op's values under the site's name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import ExtractionError


class _Block(nn.Module):
    """A data-dependent relu before the site (``act``) and another after it, both run in
    the same module call as the site; ``direct`` is a relu called in place, not a module."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.fc(x)
        if x[0, 0] > 0:  # some batches run one more relu before the site
            h = torch.relu(h) - 0.5
        h = self.act(h)  # the site
        h = torch.relu(h * 2 - 1)  # "direct": a relu every batch runs, on its own line
        if x[0, 1] > 0:  # and some one more after it
            h = torch.relu(h - 0.1)
        return h.sum(-1)


class _Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = _Block()

    def forward(self, x):
        return self.block(x)


def _batch(before: bool, after: bool, seed: int) -> torch.Tensor:
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
    x[0, 0] = 1.0 if before else -1.0
    x[0, 1] = 1.0 if after else -1.0
    return x


# batch 0 labels the site relu_1; in batch 1 the extra relu before it takes that label
BATCHES = [_batch(False, True, 0), _batch(True, False, 1), _batch(True, True, 2),
           _batch(False, False, 3)]  # fmt: skip


def _hook_rows(model: nn.Module, module: nn.Module, batches) -> torch.Tensor:
    rows: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda m, a, out: rows.append(out.detach().clone()))
    try:
        with torch.no_grad():
            for x in batches:
                model(x)
    finally:
        handle.remove()
    return torch.cat(rows)


def _extract(tmp_path, save, name):
    return tl.extract(_Wrapped().eval(), BATCHES, save=save, to=tmp_path / name, progress=False)


def test_labels_shift_between_batches_here():
    """The premise: relu_1 is the site in batch 0 and another op in batch 1."""
    model = _Wrapped().eval()
    first = tl.trace(model, BATCHES[0])
    second = tl.trace(model, BATCHES[1])
    assert first["relu_1"].module == "block.act"
    assert second["relu_1"].module == "block" and second["relu_2"].module == "block.act"


@pytest.mark.parametrize(
    "save",
    [
        tl.label("relu_1"),
        tl.module("block.act"),
        tl.module("block.act").output,
        tl.where(lambda op: op.module == "block.act"),
        tl.module(type=nn.ReLU),
    ],
    ids=["label", "module", "module-output", "where", "module-type"],
)
def test_a_site_keeps_its_op_when_labels_shift(tmp_path, save):
    model = _Wrapped().eval()
    ex = _extract(tmp_path, save, "run")
    (name,) = list(ex)
    expected = _hook_rows(model, model.block.act, BATCHES)
    torch.testing.assert_close(torch.as_tensor(ex[name][:]), expected, rtol=0, atol=0)


def test_a_relu_called_in_place_keeps_its_op(tmp_path):
    """The site is ``torch.relu`` on its own line in the same module call as the branch's
    relus: told apart by the line, not only by the module call."""
    model = _Wrapped().eval()
    first = tl.trace(model, BATCHES[0])
    label = next(op.label for op in first if op.func_name == "relu" and op.module == "block"
                 and op.parents and first[op.parents[0]].func_name == "sub")  # fmt: skip
    assert label == "relu_2"
    ex = _extract(tmp_path, tl.label(label), "direct")
    act = _hook_rows(model, model.block.act, BATCHES)
    torch.testing.assert_close(torch.as_tensor(ex[label][:]), torch.relu(act * 2 - 1))


def test_a_selector_picking_a_new_op_stops_with_both_named(tmp_path):
    with pytest.raises(ExtractionError) as info:
        _extract(tmp_path, tl.func("relu"), "all")
    err = info.value
    assert err.code == "sites_changed"
    message = str(err)
    assert "batch 1" in message and "batch 0" in message
    assert "relu_1 (relu in 'block:1'" in message  # the op batch 0 did not run


def test_a_site_some_batch_does_not_run_names_both_ops(tmp_path):
    """The extra relu after the site: relu_3 in batch 0, absent in batch 1, where the label
    names the 'direct' relu (the line before)."""
    first = tl.trace(_Wrapped().eval(), BATCHES[0])
    assert first["relu_3"].module == "block"
    with pytest.raises(ExtractionError) as info:
        _extract(tmp_path, tl.label("relu_3"), "after")
    message = str(info.value)
    assert info.value.code == "sites_changed"
    assert "batch 1 did not run site relu_3 (relu in 'block:1'" in message
    assert "its label now names relu_3 (relu in 'block:1', test_extract_paths.py:29)" in message


def test_a_site_whose_label_now_names_another_op_names_it(tmp_path):
    """Batch 2 runs both extras: batch 0's relu_3 (after) is relu_4 there, and relu_3 is
    the 'direct' relu."""
    data = [BATCHES[0], BATCHES[3]]  # batch 1 runs neither extra: relu_3 is missing
    with pytest.raises(ExtractionError) as info:
        tl.extract(_Wrapped().eval(), data, save=tl.label("relu_3"), to=tmp_path / "x",
                   progress=False)  # fmt: skip
    assert info.value.code == "sites_changed" and "batch 1" in str(info.value)
    data = [BATCHES[0], BATCHES[2]]  # batch 1: relu_3 is "direct", relu_4 the site
    model = _Wrapped().eval()
    ex = tl.extract(model, data, save=tl.label("relu_3"), to=tmp_path / "y", progress=False)
    act = _hook_rows(model, model.block.act, data)
    expected = torch.relu(torch.relu(act * 2 - 1) - 0.1)
    torch.testing.assert_close(torch.as_tensor(ex["relu_3"][:]), expected)


def test_a_resumed_run_follows_the_ops_of_the_first_run(tmp_path):
    """The first run stops at batch 1 (a bad batch); the run resumed starts at batch 1,
    where relu_1 is the extra relu: it must follow batch 0's op, noted in the shards."""
    model = _Wrapped().eval()
    broken = [BATCHES[0], torch.randn(3, 5), *BATCHES[2:]]
    with pytest.raises(ExtractionError) as info:
        tl.extract(model, broken, save=tl.label("relu_1"), to=tmp_path / "run", progress=False)
    assert info.value.code == "bad_batch"
    ex = tl.extract(model, BATCHES, save=tl.label("relu_1"), to=tmp_path / "run", progress=False)
    expected = _hook_rows(model, model.block.act, BATCHES)
    torch.testing.assert_close(torch.as_tensor(ex["relu_1"][:]), expected, rtol=0, atol=0)
