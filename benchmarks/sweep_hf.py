"""Validation across every ``transformers`` architecture that builds from a tiny config.

Validation must never accuse a correct capture. The zoo (``tests/realworld``) pins a few
dozen architectures with inputs chosen by hand; this sweep asks every base model type that
``transformers`` registers (``AutoModel``), built from its default config shrunk to a tiny
size with random weights and called on generic inputs (token ids with a padded row, an
image, a waveform or mel features, by the model's ``main_input_name``). A type whose plain
forward does not run on those inputs, or that is still large after shrinking, is skipped
with the reason; every other one goes through ``tl.replay``, and a state other than
``passed`` is printed with its first failures. The run exits 1 if any such state was seen.

Run: ``python benchmarks/sweep_hf.py [--attn eager|sdpa] [--train] [--types a,b,...]
[--jsonl FILE]`` (needs ``transformers``; every type takes under a second or two, the
whole sweep a few minutes on one core).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import warnings
from typing import Any

import torch

import torchlens as tl

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
MAX_PARAMETERS = 30_000_000  # a model still larger than this after shrinking is skipped
BUILD_SECONDS, REPLAY_SECONDS = 60, 240
SEQ, BATCH = 16, 2


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


def _build(model_type: str, attn: str, train: bool) -> tuple[Any, dict] | str:
    """``(model, kwargs)`` whose plain forward ran, or why the type is skipped."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type)
    _shrink(config)
    model = AutoModel.from_config(config, attn_implementation=attn).train(train)
    n_parameters = sum(p.numel() for p in model.parameters())
    if n_parameters > MAX_PARAMETERS:
        return f"{n_parameters / 1e6:.0f}M parameters after shrinking"
    kwargs = _inputs(model, config)
    if kwargs is None:
        return f"takes {model.main_input_name}"
    model(**kwargs)
    return model, kwargs


def sweep_one(model_type: str, attn: str, train: bool) -> dict[str, Any]:
    """One type's record: ``skip`` with the reason, or the replay ``state`` (and findings)."""
    record: dict[str, Any] = {"type": model_type}
    start = time.perf_counter()
    try:
        signal.alarm(BUILD_SECONDS)
        built = _build(model_type, attn, train)
    except BaseException as err:  # noqa: BLE001 - the model's own build or forward failed
        built = f"build or forward: {type(err).__name__}: {str(err)[:160]}"
    finally:
        signal.alarm(0)
    if isinstance(built, str):
        record["skip"] = built
        return record
    model, kwargs = built
    try:
        signal.alarm(REPLAY_SECONDS)
        status = tl.replay(model, (), kwargs)
        record["state"] = status.state
        record["failures"] = [list(map(str, f)) for f in status.failures[:3]]
        record["unchecked"] = [list(map(str, f)) for f in status.unchecked[:3]]
    except BaseException as err:  # noqa: BLE001 - torchlens raised: reported as such
        record["state"] = "raised"
        record["error"] = f"{type(err).__name__}: {str(err)[:400]}"
    finally:
        signal.alarm(0)
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attn", default="eager", help="attn_implementation (eager, sdpa)")
    parser.add_argument("--train", action="store_true", help="train mode (dropout on)")
    parser.add_argument("--types", default="", help="comma-separated model types (default all)")
    parser.add_argument("--jsonl", default="", help="also write one JSON line per type here")
    opts = parser.parse_args(argv)
    try:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    except ImportError:
        print("skipped: transformers is not installed (pip install transformers)")
        return 0
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)
    chosen = [t for t in opts.types.split(",") if t]
    types = sorted(chosen or MODEL_MAPPING_NAMES)
    counts: dict[str, int] = {}
    out = open(opts.jsonl, "w") if opts.jsonl else None  # noqa: SIM115 - closed below
    try:
        for model_type in types:
            record = sweep_one(model_type, opts.attn, opts.train)
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
    print(f"{len(types)} model types ({opts.attn}, {'train' if opts.train else 'eval'}): {summary}")
    return 0 if set(counts) <= {"passed", "skipped"} else 1


if __name__ == "__main__":
    sys.exit(main())
