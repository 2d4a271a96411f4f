"""The model sweep's conversions, check modes and heads (``benchmarks/sweep_models.py
--dtype``, ``--channels-last``, ``--grad``, ``--autocast``, ``--task``, ``--checkpointing``)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

try:
    from tests._benchmarks import load_benchmark
except ImportError:  # repository root not on sys.path (e.g. bare `pytest`)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _benchmarks import load_benchmark

sweep = load_benchmark("sweep_models")


def _build():
    torch.manual_seed(0)
    image = torch.randn(2, 3, 8, 8)
    ids = torch.arange(6).reshape(2, 3)
    return nn.Conv2d(3, 4, 3), (image,), {"extra": [torch.randn(2, 3)], "ids": ids}


def test_dtype_casts_the_model_and_floating_inputs_only():
    model, args, kwargs = sweep.converted(_build, torch.bfloat16, channels_last=False)
    assert model.weight.dtype == torch.bfloat16
    assert args[0].dtype == torch.bfloat16
    assert kwargs["extra"][0].dtype == torch.bfloat16 and isinstance(kwargs["extra"], list)
    assert kwargs["ids"].dtype == torch.int64  # token ids stay integers
    assert torch.equal(args[0].float(), _build()[1][0].bfloat16().float())


def test_channels_last_converts_the_model_and_image_inputs():
    model, args, kwargs = sweep.converted(_build, None, channels_last=True)
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    assert not model.weight.is_contiguous()
    assert args[0].is_contiguous(memory_format=torch.channels_last)
    assert not args[0].is_contiguous()
    assert kwargs["extra"][0].is_contiguous()  # not 4-d: left as it was
    assert torch.equal(args[0], _build()[1][0])


def test_channels_last_takes_the_3d_format_for_5d_weights_and_clips():
    def build():
        model = nn.Sequential(nn.Conv3d(3, 4, 3), nn.Flatten(0, 1), nn.Conv2d(2, 2, 3))
        return model, (torch.randn(1, 3, 4, 6, 6),), {}

    model, args, _ = sweep.converted(build, None, channels_last=True)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert model[2].weight.is_contiguous(memory_format=torch.channels_last)
    assert not model[2].weight.is_contiguous()
    assert args[0].is_contiguous(memory_format=torch.channels_last_3d)
    assert not args[0].is_contiguous()
    assert isinstance(model[0].weight, nn.Parameter)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtype", "not_a_dtype"], "is not a torch dtype"),
        (["--grad", "sometimes"], "invalid choice"),
        (["--autocast", "half_and_half"], "is not a torch dtype"),
        (["--library", "timm", "--task", "seq_cls"], "--library transformers"),
        (["--library", "torchvision", "--checkpointing", "reentrant"], "--library transformers"),
        (["--checkpointing", "reentrant"], "only in train mode; add --train"),
        (["--task", "regression"], "invalid choice"),
    ],
)
def test_a_bad_option_is_refused_before_any_model_is_built(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        sweep.main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


class _SeesGradMode(nn.Module):
    """Notes the grad mode of each call it gets, and computes a little."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.seen: list[tuple[bool, bool, bool]] = []

    def forward(self, x):
        modes = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        self.seen.append((*modes, torch.is_autocast_enabled("cpu")))
        return self.linear(x).relu()


def test_the_check_runs_in_the_grad_mode_and_autocast_asked_for():
    for grad, autocast, expected in [
        ("enabled", None, (True, False, False)),
        ("no_grad", None, (False, False, False)),
        ("inference", None, (False, True, False)),
        ("no_grad", torch.bfloat16, (False, False, True)),
    ]:
        model = _SeesGradMode()

        def build(model=model):
            return model, (torch.randn(4, 3),), {}

        record = sweep.sweep_one(build, "sees", sweep.check_context(grad, autocast))
        assert record["state"] == "passed", record
        # the plain forward deciding the skip, the rerun and the capture: all in the modes
        assert len(model.seen) >= 3 and set(model.seen) == {expected}, (grad, model.seen)


class _FailsUnderAutocast(nn.Linear):
    def forward(self, x):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("value cannot be converted without overflow")
        return super().forward(x)


def test_a_model_whose_plain_forward_fails_in_the_check_modes_is_skipped():
    def build():
        return _FailsUnderAutocast(3, 2), (torch.randn(4, 3),), {}

    record = sweep.sweep_one(build, "fails", sweep.check_context("no_grad", torch.bfloat16))
    assert "state" not in record
    assert record["skip"].startswith("build or forward: RuntimeError: value cannot be")
    assert sweep.sweep_one(build, "fails", sweep.check_context())["state"] == "passed"


def _text_inputs():
    ids = torch.arange(12).reshape(2, 6) + 3
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, -2:] = 0  # the second row padded, as the sweep's inputs are
    return {"input_ids": ids, "attention_mask": mask}


def test_task_labels_give_each_head_the_labels_of_its_loss():
    inputs = _text_inputs()
    ids, padded = inputs["input_ids"], inputs["attention_mask"] == 0
    for task in ("causal_lm", "masked_lm"):
        labels = sweep.task_labels(task, inputs)["labels"]
        assert torch.equal(labels[~padded], ids[~padded])
        assert (labels[padded] == sweep.IGNORED).all() and padded.sum() == 2
    tokens = sweep.task_labels("tok_cls", inputs)["labels"]
    assert tokens.shape == ids.shape and (tokens[padded] == sweep.IGNORED).all()
    assert ((tokens[~padded] >= 0) & (tokens[~padded] < sweep.NUM_LABELS)).all()
    span = sweep.task_labels("qa", inputs)
    assert span["start_positions"].shape == (2,)
    assert torch.equal(span["end_positions"], span["start_positions"] + 2)
    assert (span["end_positions"] < ids.shape[1]).all()
    rows = sweep.task_labels("seq_cls", inputs)["labels"]
    assert rows.shape == (2,) and ((rows >= 0) & (rows < sweep.NUM_LABELS)).all()
    images = sweep.task_labels("img_cls", {"pixel_values": torch.randn(3, 3, 8, 8)})
    assert images["labels"].shape == (3,)
    decoder = ids[:, :3].clone()
    seq2seq = sweep.task_labels("seq2seq", {**inputs, "decoder_input_ids": decoder})
    assert seq2seq["labels"] is decoder and "decoder_input_ids" not in seq2seq
    assert sweep.task_labels("base", inputs) == inputs
    assert set(inputs) == {"input_ids", "attention_mask"}  # the caller's dict is not changed


def test_a_head_whose_inputs_are_missing_is_skipped_and_an_unknown_task_refused():
    with pytest.raises(sweep._Skip, match="tok_cls head on pixel_values"):
        sweep.task_labels("tok_cls", {"pixel_values": torch.randn(1, 3, 8, 8)})
    with pytest.raises(sweep._Skip, match="without decoder inputs"):
        sweep.task_labels("seq2seq", _text_inputs())
    with pytest.raises(ValueError, match="unknown task 'regression'"):
        sweep.task_labels("regression", _text_inputs())


def test_heads_with_labels_and_gradient_checkpointing_validate():
    pytest.importorskip("transformers")
    build = functools.partial(sweep._transformers, "gpt2", "eager", True, task="causal_lm")
    model, _, kwargs = build()
    assert torch.isfinite(model(**kwargs).loss)  # the loss is computed inside the forward
    assert sweep.sweep_one(build, "gpt2")["state"] == "passed"

    build = functools.partial(sweep._transformers, "bert", "eager", False, task="seq_cls")
    model, _, kwargs = build()
    padded = kwargs["attention_mask"] == 0
    assert (kwargs["input_ids"][padded] == model.config.pad_token_id).all() and padded.any()
    assert sweep.sweep_one(build, "bert")["state"] == "passed"

    for checkpointing in sweep.CHECKPOINTING:
        build = functools.partial(
            sweep._transformers, "llama", "eager", True, checkpointing=checkpointing
        )
        model, _, _ = build()
        layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
        assert layers and model.training
        assert sweep.sweep_one(build, "llama")["state"] == "passed", checkpointing
