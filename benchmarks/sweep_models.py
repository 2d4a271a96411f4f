"""Validation across whole model libraries: every architecture that builds small enough.

Validation must never accuse a correct capture. The zoo (``tests/realworld``) pins a few
dozen architectures with inputs chosen by hand; this sweep asks a whole library, with
random weights and generic inputs:

* ``transformers``: every base model type it registers (``AutoModel``), from its default
  config shrunk to a tiny size, called on token ids with a padded row, an image, a
  waveform or mel frames, by the model's ``main_input_name``;
* ``timm``: one model of each family (the smallest-looking name), on images of its
  configured size, at most 96 pixels unless the size is fixed;
* ``torchvision``: its classification, segmentation and video models, on small images or
  clips.

A model whose plain forward does not run on those inputs, or that has more than
:data:`MAX_PARAMETERS` parameters, is skipped with the reason; every other one goes through
``tl.replay``, and a state other than ``passed`` is printed with its first findings. The run
exits 1 if any such state was seen. ``--train`` runs train mode (dropout on; stochastic
depth too in timm). ``--dtype bfloat16`` (or ``float16``, ``float64``) casts the model and
its floating inputs, as users running reduced precision do; ``--channels-last`` puts the
model and its image inputs in the channels-last memory format (clips of video models in
its 3-d form). ``--grad no_grad`` (or ``inference``) runs the whole check inside
``torch.no_grad()`` (``torch.inference_mode()``), as users extracting activations do:
models then take their inference fast paths, and the values are inference tensors;
``--autocast bfloat16`` runs it under CPU autocast to that dtype (mixed precision).
``--task causal_lm`` (or another of :data:`TASKS`) sweeps the transformers models with that
head instead, called with labels so that the loss is computed inside the forward, as in
fine-tuning; ``--checkpointing non_reentrant`` (or ``reentrant``), with ``--train``, turns
on their gradient checkpointing.

Run: ``python benchmarks/sweep_models.py [--library transformers|timm|torchvision]
[--attn eager|sdpa] [--train] [--dtype D] [--channels-last]
[--grad enabled|no_grad|inference] [--autocast D] [--task T]
[--checkpointing non_reentrant|reentrant] [--names a,b,...] [--jsonl FILE]`` (needs the
library; most models take under a second or two, a whole library a few minutes on one
core).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import signal
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import torchlens as tl
from torchlens.capture.tree import fill, flatten

# config attributes set wherever a config has them (sub-configs too): a tiny model
TINY = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 128,
    "max_position_embeddings": 128, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64, "n_embd": 32, "n_layer": 2, "n_head": 2, "num_layers": 2,
    "num_heads": 2, "d_ff": 64, "d_kv": 16, "embed_dim": 32, "image_size": 32,
    "patch_size": 8, "num_channels": 3, "head_dim": 16, "num_experts": 4,
    "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "max_source_positions": 32,  # speech encoders (Whisper) then take 64 mel frames
}  # fmt: skip
SPECIAL_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
MAX_PARAMETERS = 40_000_000  # a model larger than this (after shrinking) is skipped
BUILD_SECONDS, REPLAY_SECONDS = 60, 240
SEQ, BATCH = 16, 2
IMAGE_SIDE = 96  # at most, where a model's input size is not fixed

Built = tuple[Any, tuple, dict]  # (model, args, kwargs) whose plain forward ran


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout(f"over the time limit (signal {signum})")


def _shrink(config: Any, depth: int = 0) -> None:
    """Set :data:`TINY` on ``config`` and its sub-configs (text, vision, audio towers)."""
    from transformers import PretrainedConfig

    for key, value in TINY.items():
        if hasattr(config, key):
            try:
                setattr(config, key, value)
            except Exception:  # noqa: BLE001 - a derived or per-layer attribute: left as is
                pass
    for i, key in enumerate(SPECIAL_TOKENS):  # token ids beyond the tiny vocabulary
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= 100:
            setattr(config, key, i)
    if depth < 2:
        for value in list(vars(config).values()):
            if isinstance(value, PretrainedConfig):
                _shrink(value, depth + 1)


def _inputs(model: Any, config: Any) -> dict[str, torch.Tensor] | None:
    """Generic inputs by the model's ``main_input_name``; None when it takes another kind."""
    name = getattr(model, "main_input_name", "input_ids")
    g = torch.Generator().manual_seed(0)
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    if name == "input_ids":
        vocab = min(getattr(config, "vocab_size", 128) or 128, 128)
        ids = torch.randint(3, vocab, (BATCH, SEQ), generator=g)
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[-1, -3:] = 0  # a padded row
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if encoder_decoder:
            kwargs["decoder_input_ids"] = ids[:, : SEQ // 2].clone()
        return kwargs
    if name == "pixel_values":
        size = getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else size[0]
        channels = getattr(config, "num_channels", 3)
        return {"pixel_values": torch.randn(BATCH, channels, size, size, generator=g)}
    if name == "input_values":
        return {"input_values": torch.randn(BATCH, 4000, generator=g)}
    if name == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 80)
        frames = 2 * getattr(config, "max_source_positions", 32)  # after a stride-2 conv
        kwargs = {"input_features": torch.randn(BATCH, bins, frames, generator=g)}
        if encoder_decoder:
            kwargs["decoder_input_ids"] = torch.randint(3, 100, (BATCH, SEQ // 2), generator=g)
        return kwargs
    return None


def _small_enough(model: Any) -> None:
    n_parameters = sum(p.numel() for p in model.parameters())
    if n_parameters > MAX_PARAMETERS:
        raise _Skip(f"{n_parameters / 1e6:.0f}M parameters")


class _Skip(Exception):
    """The model cannot be swept here (too large, or it takes other inputs)."""


# transformers' task heads (``--task``): the name of its model-type mapping and Auto class
TASKS: dict[str, tuple[str, str]] = {
    "base": ("MODEL_MAPPING_NAMES", "AutoModel"),
    "causal_lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "masked_lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "seq2seq": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "seq_cls": (
        "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification"
    ),
    "tok_cls": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification"),
    "qa": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering"),
    "img_cls": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification"),
}  # fmt: skip
NUM_LABELS = 3  # classes of the classification heads
IGNORED = -100  # the label transformers' losses skip: padded positions get it
CHECKPOINTING = ("non_reentrant", "reentrant")  # --checkpointing: torch.utils.checkpoint's


def task_labels(task: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` (from :func:`_inputs`) with the labels the ``task`` head takes, so that
    its loss is computed inside the forward, as in fine-tuning: the token ids as labels of
    a language model (padded positions ignored), the decoder ids as a seq2seq model's labels
    (the model shifts them itself), a class per row or per token, an answer span.

    Raises:
        _Skip: the head needs inputs of a kind ``inputs`` lacks (token labels of an image).

    Example:
        >>> ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
        >>> mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
        >>> task_labels("causal_lm", {"input_ids": ids, "attention_mask": mask})["labels"]
        tensor([[   5,    6,    7],
                [   5,    6, -100]])
    """
    inputs = dict(inputs)
    g = torch.Generator().manual_seed(1)
    ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
    if task in ("causal_lm", "masked_lm", "tok_cls", "qa") and ids is None:
        raise _Skip(f"a {task} head on {', '.join(inputs)}")
    if task in ("causal_lm", "masked_lm"):
        inputs["labels"] = ids.masked_fill(mask == 0, IGNORED) if mask is not None else ids
    elif task == "tok_cls":
        labels = torch.randint(0, NUM_LABELS, ids.shape, generator=g)
        inputs["labels"] = labels.masked_fill(mask == 0, IGNORED) if mask is not None else labels
    elif task == "qa":
        start = torch.randint(0, ids.shape[1] // 2, (ids.shape[0],), generator=g)
        inputs["start_positions"], inputs["end_positions"] = start, start + 2
    elif task in ("seq_cls", "img_cls"):
        rows = next(iter(inputs.values())).shape[0]
        inputs["labels"] = torch.randint(0, NUM_LABELS, (rows,), generator=g)
    elif task == "seq2seq":
        if "decoder_input_ids" not in inputs:
            raise _Skip(f"a seq2seq head without decoder inputs ({', '.join(inputs)})")
        inputs["labels"] = inputs.pop("decoder_input_ids")
    elif task != "base":
        raise ValueError(f"unknown task {task!r}; one of {sorted(TASKS)}")
    return inputs


def _transformers(
    model_type: str,
    attn: str,
    train: bool,
    task: str = "base",
    checkpointing: str | None = None,
) -> Built:
    """A tiny ``model_type`` with the ``task`` head (:data:`TASKS`), its inputs and labels;
    ``checkpointing`` (one of :data:`CHECKPOINTING`) turns on gradient checkpointing."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    _shrink(config)
    if task in ("seq_cls", "tok_cls", "img_cls"):
        config.num_labels = NUM_LABELS
    if task == "seq_cls" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0  # a sequence classifier finds each row's end by its pad
    if task == "seq2seq" and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = 0  # labels are shifted right behind it (T5: the pad)
    auto = getattr(transformers, TASKS[task][1])
    model = auto.from_config(config, attn_implementation=attn).train(train)
    _small_enough(model)
    if checkpointing is not None:
        if not model.supports_gradient_checkpointing:
            raise _Skip("no gradient checkpointing")
        options = {"use_reentrant": checkpointing == "reentrant"}
        if hasattr(model, "activation_checkpointing_enable"):  # its name since 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    kwargs = _inputs(model, config)
    if kwargs is None:
        raise _Skip(f"takes {model.main_input_name}")
    if task == "seq_cls" and "attention_mask" in kwargs:  # padded positions hold the pad
        kwargs["input_ids"] = kwargs["input_ids"].masked_fill(
            kwargs["attention_mask"] == 0, config.pad_token_id
        )
    return model, (), task_labels(task, kwargs)


def _transformers_names(task: str = "base") -> list[str]:
    from transformers.models.auto import modeling_auto

    return sorted(getattr(modeling_auto, TASKS[task][0]))


_SMALL_WORDS = ("atto", "femto", "pico", "nano", "tiny", "xxs", "xs", "small", "b0", "18")


def _timm_names() -> list[str]:
    """One model per family (the name up to its first digit or underscore)."""
    import timm

    families: dict[str, list[str]] = {}
    for name in timm.list_models():
        families.setdefault(re.split(r"[_\d]", name)[0], []).append(name)

    def smallness(name: str) -> tuple[int, int]:
        rank = next((i for i, w in enumerate(_SMALL_WORDS) if w in name), len(_SMALL_WORDS))
        return rank, len(name)

    return sorted(min(names, key=smallness) for names in families.values())


def _timm(name: str, attn: str, train: bool) -> Built:
    import timm

    try:
        rates = {"drop_rate": 0.1, "drop_path_rate": 0.1} if train else {}
        model = timm.create_model(name, pretrained=False, num_classes=10, **rates)
    except TypeError:  # a family without stochastic depth
        model = timm.create_model(name, pretrained=False, num_classes=10)
    model.train(train)
    _small_enough(model)
    config = model.pretrained_cfg or {}
    channels, height, width = config.get("input_size", (3, 224, 224))
    image = torch.randn(BATCH, channels, height, width, generator=torch.Generator().manual_seed(0))
    if config.get("fixed_input_size", False) or max(height, width) <= IMAGE_SIDE:
        return model, (image,), {}
    small = image[:, :, :IMAGE_SIDE, :IMAGE_SIDE].contiguous()
    try:
        with torch.no_grad():
            model(small)
    except Exception:  # noqa: BLE001 - a size its blocks need (halo attention): the full one
        return model, (image,), {}
    return model, (small,), {}


@functools.cache
def _torchvision_kinds() -> dict[str, frozenset[str]]:
    """torchvision's model names by kind (``classification``, ``segmentation``, ``video``),
    listed once for the names and for every build."""
    import torchvision.models as tvm

    modules = {"classification": tvm, "segmentation": tvm.segmentation, "video": tvm.video}
    return {kind: frozenset(tvm.list_models(module=m)) for kind, m in modules.items()}


def _torchvision_names() -> list[str]:
    return sorted(frozenset().union(*_torchvision_kinds().values()))


def _torchvision(name: str, attn: str, train: bool) -> Built:
    import torchvision.models as tvm

    kinds = _torchvision_kinds()
    video = name in kinds["video"]
    extra = {"weights_backbone": None} if name in kinds["segmentation"] else {}
    model = tvm.get_model(name, weights=None, num_classes=10, **extra).train(train)
    _small_enough(model)
    side = 64
    if name.startswith(("vit", "swin", "maxvit")):
        side = 224  # fixed by their position embeddings or windows
    elif name.startswith("inception"):
        side = 299
    shape = (BATCH, 3, 8, 32, 32) if video else (BATCH, 3, side, side)
    return model, (torch.randn(*shape, generator=torch.Generator().manual_seed(0)),), {}


LIBRARIES: dict[str, tuple[Callable[[], list[str]], Callable[[str, str, bool], Built]]] = {
    "transformers": (_transformers_names, _transformers),
    "timm": (_timm_names, _timm),
    "torchvision": (_torchvision_names, _torchvision),
}


def converted(build: Callable[[], Built], dtype: torch.dtype | None, channels_last: bool) -> Built:
    """``build()``'s model and inputs in ``dtype`` (floating tensors only: token ids and
    masks stay integers) and, with ``channels_last``, in that memory format: each 4-d
    weight and input in ``channels_last``, each 5-d one (3-d convolutions, video clips) in
    ``channels_last_3d``."""
    model, args, kwargs = build()
    if dtype is not None:
        model = model.to(dtype)
        args, kwargs = _map_tensors((args, kwargs), lambda t: t.to(dtype), torch.is_floating_point)
    if channels_last:
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.dim() in _LAST_LAYOUTS:
                tensor.data = _channels_last(tensor.data)
        args, kwargs = _map_tensors(
            (args, kwargs), _channels_last, lambda t: t.dim() in _LAST_LAYOUTS
        )
    return model, args, kwargs


_LAST_LAYOUTS = {4: torch.channels_last, 5: torch.channels_last_3d}  # by rank


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous(memory_format=_LAST_LAYOUTS[tensor.dim()])


def _map_tensors(tree: Any, change: Callable, applies: Callable) -> Any:
    """``tree`` (nested arguments) with each tensor for which ``applies`` holds replaced by
    ``change`` of it, through the capture's own flatten and fill."""
    leaves, template = flatten(tree)
    return fill(template, [change(t) if applies(t) else t for _, t in leaves])


# --grad: the grad mode the check runs in
GRAD_MODES: dict[str, Callable[[], Any]] = {
    "enabled": torch.enable_grad,
    "no_grad": torch.no_grad,
    "inference": torch.inference_mode,
}


def check_context(grad: str = "enabled", autocast: torch.dtype | None = None) -> Callable:
    """What the check runs inside: the grad mode ``grad`` (a :data:`GRAD_MODES` key) and,
    when ``autocast`` is given, CPU autocast to that dtype."""

    def context() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(GRAD_MODES[grad]())
        if autocast is not None:
            stack.enter_context(torch.autocast("cpu", dtype=autocast))
        return stack

    return context


def sweep_one(
    build: Callable[[], Built], name: str, context: Callable = contextlib.nullcontext
) -> dict[str, Any]:
    """One model's record: ``skip`` with the reason, or the replay ``state`` (and findings).
    The plain forward that decides the skip and the replay both run inside ``context()``
    (see :func:`check_context`)."""
    record: dict[str, Any] = {"name": name}
    start = time.perf_counter()
    try:
        signal.alarm(BUILD_SECONDS)
        torch.manual_seed(0)
        model, args, kwargs = build()
        with context():  # a forward that fails in the check's modes is the model's own
            model(*args, **kwargs)
    except _Skip as why:
        record["skip"] = str(why)
        return record
    except Exception as err:  # noqa: BLE001 - the model's own build or forward failed
        record["skip"] = f"build or forward: {type(err).__name__}: {str(err)[:160]}"
        return record
    finally:
        signal.alarm(0)
    try:
        signal.alarm(REPLAY_SECONDS)
        with context():
            status = tl.replay(model, args, kwargs)
        record["state"] = status.state
        record["failures"] = [list(map(str, f)) for f in status.failures[:3]]
        record["unchecked"] = [list(map(str, f)) for f in status.unchecked[:3]]
    except Exception as err:  # noqa: BLE001 - torchlens raised: reported as such
        record["state"] = "raised"
        record["error"] = f"{type(err).__name__}: {str(err)[:400]}"
    finally:
        signal.alarm(0)
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def _torch_dtype(name: str) -> torch.dtype:
    """``--dtype`` and ``--autocast``: a torch dtype by its name (``bfloat16``)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise argparse.ArgumentTypeError(f"{name!r} is not a torch dtype (try bfloat16)")
    return dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--library", choices=sorted(LIBRARIES), default="transformers")
    parser.add_argument("--attn", default="eager", help="transformers' attn_implementation")
    parser.add_argument("--train", action="store_true", help="train mode (dropout on)")
    parser.add_argument(
        "--dtype", type=_torch_dtype, help="cast model and floating inputs (bfloat16)"
    )
    parser.add_argument("--channels-last", action="store_true", help="channels-last memory")
    parser.add_argument(
        "--grad", choices=sorted(GRAD_MODES), default="enabled", help="grad mode of the check"
    )
    parser.add_argument(
        "--autocast", type=_torch_dtype, help="run the check under CPU autocast (bfloat16)"
    )
    parser.add_argument(
        "--task", choices=list(TASKS), default="base", help="transformers head, with labels"
    )
    parser.add_argument(
        "--checkpointing", choices=CHECKPOINTING, help="transformers: gradient checkpointing"
    )
    parser.add_argument("--names", default="", help="comma-separated models (default all)")
    parser.add_argument("--jsonl", default="", help="also write one JSON line per model here")
    opts = parser.parse_args(argv)
    list_names, builder = LIBRARIES[opts.library]
    if opts.task != "base" or opts.checkpointing:
        if opts.library != "transformers":
            parser.error("--task and --checkpointing are transformers' (--library transformers)")
        if opts.checkpointing and not opts.train:
            parser.error("gradient checkpointing recomputes only in train mode; add --train")
        list_names = functools.partial(_transformers_names, opts.task)
        builder = functools.partial(_transformers, task=opts.task, checkpointing=opts.checkpointing)
    context = check_context(opts.grad, opts.autocast)
    try:
        names = [n for n in opts.names.split(",") if n] or list_names()
    except Exception as err:  # noqa: BLE001 - not installed, or a build that fails to load
        # (PyPI's torchvision beside a CPU torch: its compiled ops raise at import)
        print(f"skipped: {opts.library} cannot be imported here ({type(err).__name__}: {err})")
        return 0
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    counts: dict[str, int] = {}
    out = open(opts.jsonl, "w") if opts.jsonl else None  # noqa: SIM115 - closed below
    try:
        for name in names:
            build = functools.partial(builder, name, opts.attn, opts.train)
            if opts.dtype is not None or opts.channels_last:
                build = functools.partial(converted, build, opts.dtype, opts.channels_last)
            record = sweep_one(build, name, context)
            outcome = record.get("state", "skipped")
            counts[outcome] = counts.get(outcome, 0) + 1
            if out is not None:
                out.write(json.dumps(record) + "\n")
            if outcome not in ("passed", "skipped"):
                print(json.dumps(record), flush=True)
    finally:
        if out is not None:
            out.close()
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    mode = ", ".join(
        ["train" if opts.train else "eval"]
        + ([_dtype_name(opts.dtype)] if opts.dtype else [])
        + (["channels last"] if opts.channels_last else [])
        + ([opts.grad.replace("_", " ")] if opts.grad != "enabled" else [])
        + ([f"autocast {_dtype_name(opts.autocast)}"] if opts.autocast else [])
        + ([f"{opts.task} head with labels"] if opts.task != "base" else [])
        + ([f"{opts.checkpointing} checkpointing"] if opts.checkpointing else [])
    )
    print(f"{len(names)} {opts.library} models ({mode}, attention {opts.attn}): {summary}")
    return 0 if set(counts) <= {"passed", "skipped"} else 1


if __name__ == "__main__":
    sys.exit(main())
