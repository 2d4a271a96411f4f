"""The real-model zoo: real architectures from ``transformers``, ``timm`` and ``torchvision``.

Every entry of :data:`CASES` is a :class:`RealCase`: a name, a family, the packages it needs
and a ``build()`` that returns ``(model, args, kwargs)`` for one forward call. Models are
built from configs (Hugging Face) or with ``pretrained=False`` / ``weights=None`` (timm,
torchvision): random weights, nothing downloaded. Sizes are tiny (2 layers, hidden 32-64, a
vocabulary of 96, sequences of 8 tokens, images of 32-96 pixels) so the whole zoo runs in a
few minutes on two CPU cores. ``build()`` seeds torch itself, so two builds are identical.

Hugging Face attention: every model that has a choice is built with
``attn_implementation="eager"`` (the plain matmul/softmax path, the one every model has),
except the cases named ``*_sdpa``, which use ``"sdpa"`` on purpose.

Families (the benchmark groups by them): ``hf_decoder``, ``hf_encoder``, ``hf_encdec``,
``hf_vision``, ``hf_audio``, ``timm``, ``torchvision``, ``diffusers``.

What is covered besides plain forwards, by tag: ``kwargs`` (called with keyword arguments),
``mask`` (attention mask with padding), ``cache`` (``use_cache=True`` or a ``past_key_values``
cache passed in), ``train`` (train mode: dropout / drop-path draw random numbers),
``checkpointing`` (gradient checkpointing turned on, in train mode), ``moe``
(mixture-of-experts routing), ``ssm`` (state-space), ``detection`` (detection / segmentation),
``mutates_input`` (the forward changes an input object: call ``build()`` again per forward),
``labels`` (a task head called with labels: its loss is computed inside the forward),
``generate`` (``model.generate`` traced), ``inference_mode`` (the forward enters it),
``rooted`` (the traced callable is a bound method or a function over modules, or the
weights are offloaded: every module call and weight must be named, see
``test_realworld.py``), ``offload`` (accelerate offloading).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["CASES", "CASES_BY_NAME", "FAMILIES", "RealCase", "missing_packages"]

FAMILIES = (
    "hf_decoder", "hf_encoder", "hf_encdec", "hf_vision", "hf_audio", "timm", "torchvision",
    "diffusers",
)  # fmt: skip

VOCAB = 96
SEQ = 8
BATCH = 2
SEED = 0


@dataclass(frozen=True)
class RealCase:
    """One real model: ``build()`` gives a fresh ``(model, args, kwargs)``."""

    name: str
    family: str  # one of FAMILIES
    build: Callable[[], tuple[Any, tuple, dict]]
    needs: tuple[str, ...]  # importable packages the case requires
    tags: frozenset[str] = field(default_factory=frozenset)

    def __repr__(self) -> str:  # short pytest ids
        return f"RealCase({self.name!r})"


def missing_packages(case: RealCase) -> list[str]:
    """The packages of ``case.needs`` that cannot be imported here, with the error."""
    missing = []
    for name in case.needs:
        try:
            importlib.import_module(name)
        except Exception as error:  # torchvision fails with RuntimeError on a torch mismatch
            missing.append(f"{name} ({type(error).__name__}: {error})".splitlines()[0])
    return missing


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def _ids(batch: int = BATCH, seq: int = SEQ, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, seq))


def _padded_mask(batch: int = BATCH, seq: int = SEQ, pad: int = 3) -> torch.Tensor:
    """All ones except the last ``pad`` positions of the last row (right padding)."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - pad :] = 0
    return mask


def _left_padded_mask(batch: int = BATCH, seq: int = SEQ, pad: int = 3) -> torch.Tensor:
    """All ones except the first ``pad`` positions of the last row (left padding)."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, :pad] = 0
    return mask


def _image(size: int, batch: int = BATCH, channels: int = 3) -> torch.Tensor:
    return torch.randn(batch, channels, size, size)


# ---------------------------------------------------------------------------
# Hugging Face helpers
# ---------------------------------------------------------------------------

_TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
_LLAMA_LIKE = dict(**_TEXT, intermediate_size=64, num_key_value_heads=2, max_position_embeddings=64)


def _hf_model(model_class: str, config_class: str, attn: str | None = "eager", **config):
    """A randomly initialised ``transformers`` model from a tiny config, in eval mode."""
    import transformers

    torch.manual_seed(SEED)
    if attn is not None:
        config["attn_implementation"] = attn
    cfg = getattr(transformers, config_class)(**config)
    model = getattr(transformers, model_class)(cfg)
    return model.eval()


def _train(model, checkpointing: bool = False):
    model.train()
    if checkpointing:  # activation_checkpointing_enable: gradient_checkpointing_enable's new name
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    return model


def _lm(model_class: str, config_class: str, mask=_padded_mask, attn="eager", **config):
    """A builder for a causal LM called with ``input_ids`` (+ ``attention_mask``) kwargs."""

    def build():
        model = _hf_model(model_class, config_class, attn=attn, **config)
        torch.manual_seed(SEED + 1)
        kwargs = {"input_ids": _ids()}
        if mask is not None:
            kwargs["attention_mask"] = mask()
        return model, (), kwargs

    return build


def _gpt2_config(**extra):
    return dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **extra)


def _gpt2_past_key_values():
    """GPT-2 continuing from a cache: the forward extends the ``DynamicCache`` it is given."""
    model = _hf_model("GPT2LMHeadModel", "GPT2Config", **_gpt2_config())
    torch.manual_seed(SEED + 1)
    prefix = _ids(seq=5)
    with torch.no_grad():
        out = model(input_ids=prefix, use_cache=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    new = _ids(seq=3)
    mask = torch.ones(BATCH, 8, dtype=torch.long)
    # transformers 5.x renames ``past_key_values`` to ``cache`` (the old name goes in 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return model, (), {"input_ids": new, name: cache, "attention_mask": mask}


def _llama_use_cache():
    model = _hf_model("LlamaForCausalLM", "LlamaConfig", **_LLAMA_LIKE)
    torch.manual_seed(SEED + 1)
    return model, (), {"input_ids": _ids(), "attention_mask": _padded_mask(), "use_cache": True}


def _llama_cache_with_grad():
    """Llama's second step on the cache of a first step run with grad (no ``no_grad``): the
    cached tensors carry autograd history, which ``copy.deepcopy`` refuses."""
    model = _hf_model("LlamaForCausalLM", "LlamaConfig", **_LLAMA_LIKE)
    torch.manual_seed(SEED + 1)
    first = model(input_ids=_ids(seq=5), use_cache=True)
    cache = first["cache"] if "cache" in first else first["past_key_values"]
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    mask = torch.ones(BATCH, 6, dtype=torch.long)
    return model, (), {"input_ids": _ids(seq=1), name: cache, "attention_mask": mask}


def _generate(model_class: str, config_class: str, mask, config: dict, **options):
    """A builder for ``model.generate`` as the traced callable: a whole decoding loop, its
    cache growing step by step, token choices fed back as the next step's input ids."""

    def build():
        model = _hf_model(model_class, config_class, **config)

        def generate(input_ids, attention_mask):
            return model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3,
                pad_token_id=0, **options,
            )  # fmt: skip

        torch.manual_seed(SEED + 1)
        return generate, (_ids(), mask()), {}

    return build


def _inference_mode(build):
    """``build``'s model called inside ``torch.inference_mode()``, as extraction scripts do:
    every value the forward makes is an inference tensor, without a version counter."""

    def built():
        model, args, kwargs = build()

        def forward_in_inference_mode(*args, **kwargs):
            with torch.inference_mode():
                return model(*args, **kwargs)

        return forward_in_inference_mode, args, kwargs

    return built


def _wav2vec2_ctc_specaugment():
    """A CTC training step with SpecAugment: its time masks are drawn from ``np.random``."""
    import numpy as np

    config = {**_WAV2VEC2_LIKE, "mask_time_prob": 0.5, "mask_time_length": 2, "layerdrop": 0.0}
    model = _train(_hf_model("Wav2Vec2ForCTC", "Wav2Vec2Config", pad_token_id=0, **config))
    torch.manual_seed(SEED + 1)
    np.random.seed(SEED)
    return model, (torch.randn(BATCH, 400),), {"labels": torch.randint(1, VOCAB, (BATCH, 4))}


def _gpt2_train(checkpointing: bool):
    def build():
        model = _hf_model(
            "GPT2LMHeadModel", "GPT2Config", **_gpt2_config(resid_pdrop=0.1, attn_pdrop=0.1)
        )
        _train(model, checkpointing)
        torch.manual_seed(SEED + 1)
        ids = _ids()
        return model, (), {"input_ids": ids, "labels": ids, "use_cache": False}

    return build


def _llama_train_checkpointing():
    model = _hf_model("LlamaForCausalLM", "LlamaConfig", attention_dropout=0.1, **_LLAMA_LIKE)
    _train(model, checkpointing=True)
    torch.manual_seed(SEED + 1)
    return model, (), {"input_ids": _ids(), "use_cache": False}


def _llama_seq_cls_labels():
    """A sequence classifier fine-tuning step: the padded row's positions hold the pad token,
    through which the head finds each row's last token (a data-dependent gather), and the
    loss against the labels is computed inside the forward."""
    model = _hf_model(
        "LlamaForSequenceClassification", "LlamaConfig", num_labels=3, pad_token_id=0,
        attention_dropout=0.1, **_LLAMA_LIKE,
    )  # fmt: skip
    _train(model)
    torch.manual_seed(SEED + 1)
    mask = _padded_mask()
    ids = _ids().masked_fill(mask == 0, 0)
    return model, (), {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2])}


def _t5_labels():
    """T5 trained on labels: the model shifts them right into its decoder inputs (an ignored
    position, -100, becomes the pad) and computes the loss, with dropout on."""
    model = _hf_model("T5ForConditionalGeneration", "T5Config", **_T5_CONFIG, dropout_rate=0.1)
    _train(model)
    torch.manual_seed(SEED + 1)
    labels = _ids(seq=5)
    labels[-1, -2:] = -100
    return model, (), {"input_ids": _ids(), "attention_mask": _padded_mask(), "labels": labels}


def _encoder(
    model_class: str,
    config_class: str,
    token_types=False,
    train=False,
    checkpointing=False,
    mask=True,
    **config,
):
    def build():
        model = _hf_model(model_class, config_class, **config)
        if train:
            _train(model, checkpointing)
        torch.manual_seed(SEED + 1)
        kwargs = {"input_ids": _ids()}
        if mask:
            kwargs["attention_mask"] = _padded_mask()
        if token_types:
            kwargs["token_type_ids"] = torch.tensor([[0] * 4 + [1] * 4] * BATCH)
        return model, (), kwargs

    return build


_BERT_LIKE = dict(**_TEXT, intermediate_size=64, max_position_embeddings=64)


def _t5gemma2():
    """T5Gemma2: its encoder's sliding-window mask is built under ``torch.vmap``, and it
    writes an embedding through a token mask that selects nothing in this input."""
    import transformers

    text = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, head_dim=8, max_position_embeddings=64,
        sliding_window=4, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        image_size=16, patch_size=4,
    )  # fmt: skip
    torch.manual_seed(SEED)
    encoder = transformers.T5Gemma2EncoderConfig(
        text_config=text, vision_config=vision, mm_tokens_per_image=4
    )
    cfg = transformers.T5Gemma2Config(
        encoder=encoder, decoder=transformers.T5Gemma2DecoderConfig(**text), vocab_size=VOCAB,
        image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3,
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.T5Gemma2ForConditionalGeneration(cfg).eval()
    torch.manual_seed(SEED + 1)
    kwargs = {
        "input_ids": torch.randint(3, VOCAB - 3, (BATCH, SEQ)),
        "attention_mask": _padded_mask(),
        "decoder_input_ids": _ids(seq=5),
    }
    return model, (), kwargs


def _seq2seq(model_class: str, config_class: str, decoder_start: int = 0, **config):
    def build():
        model = _hf_model(model_class, config_class, **config)
        torch.manual_seed(SEED + 1)
        return (
            model,
            (),
            {
                "input_ids": _ids(),
                "attention_mask": _padded_mask(),
                "decoder_input_ids": _ids(seq=5),
            },
        )

    return build


_T5_CONFIG = dict(
    vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
    relative_attention_num_buckets=8, decoder_start_token_id=0,
)  # fmt: skip
_BART_LIKE = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=1,
    decoder_start_token_id=2,
)


def _whisper():
    model = _hf_model(
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        vocab_size=VOCAB,
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=1,
        decoder_start_token_id=2,
        bos_token_id=2,
        eos_token_id=3,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    torch.manual_seed(SEED + 1)
    features = torch.randn(BATCH, 16, 32)  # 2 * max_source_positions frames
    return model, (), {"input_features": features, "decoder_input_ids": _ids(seq=5)}


def _vision(model_class: str, config_class: str, size: int, attn="eager", train=False, **config):
    def build():
        model = _hf_model(model_class, config_class, attn=attn, **config)
        if train:
            _train(model)
        torch.manual_seed(SEED + 1)
        return model, (_image(size),), {}

    return build


_VIT_LIKE = dict(
    image_size=32,
    patch_size=8,
    num_channels=3,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)

_WAV2VEC2_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
    mask_time_prob=0.0,
)


def _audio(model_class: str, config_class: str, attn="eager", **config):
    def build():
        model = _hf_model(model_class, config_class, attn=attn, **config)
        torch.manual_seed(SEED + 1)
        values = torch.randn(BATCH, 400)
        mask = torch.ones(BATCH, 400, dtype=torch.long)
        mask[-1, 300:] = 0
        return model, (values,), {"attention_mask": mask}

    return build


def _clip_full():
    """CLIP text and vision towers together, called with kwargs (ids, mask, pixels)."""
    model = _hf_model(
        "CLIPModel",
        "CLIPConfig",
        text_config=dict(_TEXT, intermediate_size=64, max_position_embeddings=16),
        vision_config=dict(_VIT_LIKE),
        projection_dim=16,
    )
    torch.manual_seed(SEED + 1)
    kwargs = {"input_ids": _ids(), "attention_mask": _padded_mask(), "pixel_values": _image(32)}
    return model, (), kwargs


def _llama_inputs_embeds():
    model = _hf_model("LlamaForCausalLM", "LlamaConfig", **_LLAMA_LIKE)
    torch.manual_seed(SEED + 1)
    embeds = torch.randn(BATCH, SEQ, 32)
    return model, (), {"inputs_embeds": embeds, "attention_mask": _padded_mask()}


def _ast():
    model = _hf_model(
        "ASTModel",
        "ASTConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        patch_size=8,
        frequency_stride=8,
        time_stride=8,
        max_length=32,
        num_mel_bins=16,
    )
    torch.manual_seed(SEED + 1)
    return model, (torch.randn(BATCH, 32, 16),), {}


def _encodec():
    """EnCodec: conv encoder, LSTM, residual vector quantizer (argmin over codebooks), decoder."""
    model = _hf_model(
        "EncodecModel",
        "EncodecConfig",
        attn=None,
        hidden_size=16,
        num_filters=4,
        num_residual_layers=1,
        upsampling_ratios=[4, 2],
        codebook_size=16,
        codebook_dim=16,
        num_lstm_layers=1,
        target_bandwidths=[1.5],
        sampling_rate=800,
    )
    torch.manual_seed(SEED + 1)
    return model, (torch.randn(1, 1, 400),), {}


def _time_series():
    """PatchTST: a patching time-series transformer, called with past values."""
    model = _hf_model(
        "PatchTSTModel",
        "PatchTSTConfig",
        num_input_channels=3,
        context_length=32,
        patch_length=8,
        patch_stride=8,
        d_model=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
    )
    torch.manual_seed(SEED + 1)
    return model, (), {"past_values": torch.randn(BATCH, 32, 3)}


# ---------------------------------------------------------------------------
# timm and torchvision helpers
# ---------------------------------------------------------------------------


def _timm(name: str, size: int, train: bool = False, checkpointing: bool = False, **kwargs):
    def build():
        import timm

        torch.manual_seed(SEED)
        model = timm.create_model(name, pretrained=False, **kwargs)
        model.train(train)
        model.set_grad_checkpointing(checkpointing)
        torch.manual_seed(SEED + 1)
        return model, (_image(size),), {}

    return build


def _tv(name: str, size: int, train: bool = False, batch: int = BATCH, **kwargs):
    def build():
        import torchvision

        torch.manual_seed(SEED)
        model = getattr(torchvision.models, name)(weights=None, **kwargs)
        model.train(train)
        torch.manual_seed(SEED + 1)
        return model, (_image(size, batch=batch),), {}

    return build


def _tv_segmentation(name: str, size: int):
    def build():
        import torchvision

        torch.manual_seed(SEED)
        model = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, num_classes=3
        )
        model.eval()
        torch.manual_seed(SEED + 1)
        return model, (_image(size),), {}

    return build


_FEW_RCNN_BOXES = dict(
    rpn_pre_nms_top_n_test=50, rpn_post_nms_top_n_test=20, box_detections_per_img=5
)
_FEW_DENSE_BOXES = dict(topk_candidates=20, detections_per_img=5)


def _tv_detection(name: str, size: int, **kwargs):
    """A detection model in eval mode: images as a list, boxes out of NMS.

    ``kwargs`` keep the number of proposals and detections small (the heads' cost grows
    with them, and random weights give many)."""

    def build():
        import torchvision

        torch.manual_seed(SEED)
        model = getattr(torchvision.models.detection, name)(
            weights=None,
            weights_backbone=None,
            num_classes=3,
            min_size=size,
            max_size=size,
            **kwargs,
        )
        model.eval()
        torch.manual_seed(SEED + 1)
        images = [torch.rand(3, size, size)]
        return model, (images,), {}

    return build


def _tv_fpn_backbone():
    """The ResNet-18 + FPN backbone torchvision's detection models use."""
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    torch.manual_seed(SEED)
    model = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5)
    model.eval()
    torch.manual_seed(SEED + 1)
    return model, (_image(64),), {}


def _tv_googlenet_train():
    """GoogLeNet in train mode with its auxiliary classifiers (a namedtuple comes out)."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.googlenet(weights=None, aux_logits=True, init_weights=True)
    model.train()
    torch.manual_seed(SEED + 1)
    return model, (_image(64),), {}


def _tv_keypointrcnn():
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.detection.keypointrcnn_resnet50_fpn(
        weights=None,
        weights_backbone=None,
        num_classes=2,
        num_keypoints=5,
        min_size=64,
        max_size=64,
        **_FEW_RCNN_BOXES,
    )
    model.eval()
    torch.manual_seed(SEED + 1)
    return model, ([torch.rand(3, 64, 64)],), {}


def _tv_raft_small():
    """RAFT optical flow: correlation pyramid, grid_sample, an iterative GRU refinement."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.optical_flow.raft_small(weights=None)
    model.eval()
    torch.manual_seed(SEED + 1)
    images = (torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128))  # the smallest it takes
    return model, images, {"num_flow_updates": 2}


def _tv_r3d():
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.video.r3d_18(weights=None, num_classes=5)
    model.eval()
    torch.manual_seed(SEED + 1)
    return model, (torch.randn(1, 3, 4, 32, 32),), {}


def _tv_ssdlite():
    """SSDlite at its fixed 320-pixel transform, few detections kept."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3, topk_candidates=20, detections_per_img=5
    )
    model.eval()
    torch.manual_seed(SEED + 1)
    return model, ([torch.rand(3, 64, 64)],), {}


def _tv_quantizable_mobilenet():
    """MobileNetV3 made ready for quantization (QuantStub, FloatFunctional), not quantized."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.quantization.mobilenet_v3_large(weights=None, quantize=False)
    model.eval()
    torch.manual_seed(SEED + 1)
    return model, (_image(64),), {}


def _tv_r2plus1d():
    """(2+1)D video ResNet: spatial then temporal convolutions."""
    import torchvision

    torch.manual_seed(SEED)
    model = torchvision.models.video.r2plus1d_18(weights=None, num_classes=5)
    model.eval()
    torch.manual_seed(SEED + 1)
    return model, (torch.randn(1, 3, 4, 32, 32),), {}


# ---------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------

_HF = ("transformers",)
_TIMM = ("timm", "torchvision")  # timm imports torchvision
_TV = ("torchvision",)
_DIFFUSERS = ("diffusers",)
_ACCELERATE = ("transformers", "accelerate")


# ---------------------------------------------------------------------------
# Rooted captures: bound methods, functions over modules, offloaded weights (issue 37)
# ---------------------------------------------------------------------------
# ``build()`` returns the callable itself (``model.generate``, a sampling loop); a loop
# over modules it closes over names them in ``loop.zoo_modules`` ({fallback address:
# module}) for the zoo's check that every module call and weight is named.


def _generate_method(model_class: str, config_class: str, config: dict, **options):
    """``model.generate`` itself as the traced callable (its owner is the root)."""

    def build():
        model = _hf_model(model_class, config_class, **config)
        torch.manual_seed(SEED + 1)
        kwargs = {
            "input_ids": _ids(seq=6),
            "attention_mask": torch.ones(BATCH, 6, dtype=torch.long),
        }
        return model.generate, (), {**kwargs, "max_new_tokens": 3, "pad_token_id": 0, **options}

    return build


def _timm_intermediates():
    import timm

    torch.manual_seed(SEED)
    model = timm.create_model("resnet18", pretrained=False).eval()
    torch.manual_seed(SEED + 1)
    return model.forward_intermediates, (_image(64),), {}


def _tiny_vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(SEED)
    return AutoencoderKL(
        block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8,
        sample_size=16,
    ).eval()  # fmt: skip


def _vae_encode():
    vae = _tiny_vae()
    torch.manual_seed(SEED + 1)
    return vae.encode, (torch.randn(1, 3, 16, 16),), {"return_dict": False}


def _unet_sampling_loop():
    """A diffusers-style sampling loop as a plain function: a tiny UNet2DConditionModel
    stepped 3 times by a DDPMScheduler (its noise drawn from torch's generator)."""
    from diffusers import DDPMScheduler, UNet2DConditionModel

    torch.manual_seed(SEED)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8,
        norm_num_groups=4, attention_head_dim=2,
    ).eval()  # fmt: skip
    scheduler = DDPMScheduler(num_train_timesteps=10)

    def sample(latents, text):
        scheduler.set_timesteps(3)
        for step in scheduler.timesteps:
            noise = unet(latents, step, encoder_hidden_states=text).sample
            latents = scheduler.step(noise, step, latents).prev_sample
        return latents

    sample.zoo_modules = {"UNet2DConditionModel": unet}
    torch.manual_seed(SEED + 1)
    return sample, (torch.randn(1, 4, 8, 8), torch.randn(1, 3, 8)), {}


def _offloaded_llama(how: str):
    """A tiny Llama under accelerate's ``cpu_offload`` or ``disk_offload``: every weight
    waits on the meta device until a hook moves it in for its module's call."""

    def build():
        import tempfile

        import accelerate

        model = _hf_model("LlamaForCausalLM", "LlamaConfig", **_LLAMA_LIKE)
        if how == "cpu":
            accelerate.cpu_offload(model, execution_device="cpu")
        else:
            accelerate.disk_offload(model, tempfile.mkdtemp(prefix="zoo_offload_"), "cpu")
        torch.manual_seed(SEED + 1)
        return model, (), {"input_ids": _ids(), "attention_mask": _padded_mask()}

    return build


def _c(name, family, build, needs=_HF, tags=()):
    return RealCase(name, family, build, needs, frozenset(tags))


CASES: list[RealCase] = [
    # --- Hugging Face decoders -------------------------------------------------------------
    _c(
        "gpt2",
        "hf_decoder",
        _lm("GPT2LMHeadModel", "GPT2Config", **_gpt2_config()),
        tags={"kwargs", "mask"},
    ),
    _c(
        "gpt2_sdpa",
        "hf_decoder",
        _lm("GPT2LMHeadModel", "GPT2Config", attn="sdpa", **_gpt2_config()),
        tags={"kwargs", "mask"},
    ),
    _c(
        "gpt2_past_key_values",
        "hf_decoder",
        _gpt2_past_key_values,
        tags={"kwargs", "cache", "mutates_input"},
    ),
    _c("gpt2_train_dropout", "hf_decoder", _gpt2_train(False), tags={"kwargs", "train"}),
    _c(
        "llama_seq_cls_labels",
        "hf_decoder",
        _llama_seq_cls_labels,
        tags={"kwargs", "mask", "train", "labels"},
    ),
    _c(
        "gpt2_grad_checkpointing",
        "hf_decoder",
        _gpt2_train(True),
        tags={"kwargs", "train", "checkpointing"},
    ),
    _c(
        "llama",
        "hf_decoder",
        _lm("LlamaForCausalLM", "LlamaConfig", mask=_left_padded_mask, **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c("llama_use_cache", "hf_decoder", _llama_use_cache, tags={"kwargs", "mask", "cache"}),
    _c(
        "llama_cache_with_grad",
        "hf_decoder",
        _llama_cache_with_grad,
        tags={"kwargs", "cache", "mutates_input"},
    ),
    _c(
        "llama_grad_checkpointing",
        "hf_decoder",
        _llama_train_checkpointing,
        tags={"kwargs", "train", "checkpointing"},
    ),
    _c(
        "llama_generate_beam",
        "hf_decoder",
        _generate(
            "LlamaForCausalLM",
            "LlamaConfig",
            _left_padded_mask,
            _LLAMA_LIKE,
            num_beams=2,
            do_sample=False,
        ),
        tags={"mask", "cache", "generate"},
    ),
    _c(
        "llama_inference_mode",
        "hf_decoder",
        _inference_mode(
            _lm("LlamaForCausalLM", "LlamaConfig", mask=_left_padded_mask, **_LLAMA_LIKE)
        ),
        tags={"kwargs", "mask", "inference_mode"},
    ),
    _c(
        "mistral",
        "hf_decoder",
        _lm("MistralForCausalLM", "MistralConfig", sliding_window=4, **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "qwen2",
        "hf_decoder",
        _lm("Qwen2ForCausalLM", "Qwen2Config", **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "phi",
        "hf_decoder",
        _lm(
            "PhiForCausalLM",
            "PhiConfig",
            **_TEXT,
            intermediate_size=64,
            max_position_embeddings=64,
            partial_rotary_factor=0.5,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "phi3",
        "hf_decoder",
        _lm(
            "Phi3ForCausalLM",
            "Phi3Config",
            **_LLAMA_LIKE,
            pad_token_id=0,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "gemma",
        "hf_decoder",
        _lm("GemmaForCausalLM", "GemmaConfig", head_dim=8, **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "gpt_neox",
        "hf_decoder",
        _lm(
            "GPTNeoXForCausalLM",
            "GPTNeoXConfig",
            **_TEXT,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "opt",
        "hf_decoder",
        _lm(
            "OPTForCausalLM",
            "OPTConfig",
            **_TEXT,
            ffn_dim=64,
            max_position_embeddings=64,
            word_embed_proj_dim=32,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "bloom",
        "hf_decoder",
        _lm(
            "BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "falcon",
        "hf_decoder",
        _lm(
            "FalconForCausalLM",
            "FalconConfig",
            **_TEXT,
            new_decoder_architecture=False,
            multi_query=True,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "mixtral_moe",
        "hf_decoder",
        _lm(
            "MixtralForCausalLM",
            "MixtralConfig",
            **_LLAMA_LIKE,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        tags={"kwargs", "mask", "moe"},
    ),
    _c(
        "qwen2_moe",
        "hf_decoder",
        _lm(
            "Qwen2MoeForCausalLM",
            "Qwen2MoeConfig",
            **_LLAMA_LIKE,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        tags={"kwargs", "mask", "moe"},
    ),
    _c(
        "mamba",
        "hf_decoder",
        _lm(
            "MambaForCausalLM",
            "MambaConfig",
            mask=None,
            attn=None,
            vocab_size=VOCAB,
            hidden_size=32,
            state_size=8,
            num_hidden_layers=2,
            expand=2,
            conv_kernel=4,
            use_mambapy=False,
        ),
        tags={"kwargs", "ssm"},
    ),
    _c(
        "llama_sdpa",
        "hf_decoder",
        _lm("LlamaForCausalLM", "LlamaConfig", attn="sdpa", **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c("llama_inputs_embeds", "hf_decoder", _llama_inputs_embeds, tags={"kwargs", "mask"}),
    _c(
        "gemma2",
        "hf_decoder",
        _lm("Gemma2ForCausalLM", "Gemma2Config", head_dim=8, sliding_window=4, **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "starcoder2",
        "hf_decoder",
        _lm("Starcoder2ForCausalLM", "Starcoder2Config", sliding_window=4, **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "stablelm",
        "hf_decoder",
        _lm("StableLmForCausalLM", "StableLmConfig", **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "olmo",
        "hf_decoder",
        _lm("OlmoForCausalLM", "OlmoConfig", **_LLAMA_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "gpt_bigcode",
        "hf_decoder",
        _lm("GPTBigCodeForCausalLM", "GPTBigCodeConfig", **_gpt2_config(multi_query=True)),
        tags={"kwargs", "mask"},
    ),
    _c(
        "gptj",
        "hf_decoder",
        _lm(
            "GPTJForCausalLM",
            "GPTJConfig",
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            rotary_dim=4,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "codegen",
        "hf_decoder",
        _lm(
            "CodeGenForCausalLM",
            "CodeGenConfig",
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            n_ctx=64,
            rotary_dim=4,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "olmoe",
        "hf_decoder",
        _lm(
            "OlmoeForCausalLM",
            "OlmoeConfig",
            **_LLAMA_LIKE,
            num_experts=4,
            num_experts_per_tok=2,
        ),
        tags={"kwargs", "mask", "moe"},
    ),
    _c(
        "jamba",
        "hf_decoder",
        _lm(
            "JambaForCausalLM",
            "JambaConfig",
            **_LLAMA_LIKE,
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=2,
            attn_layer_offset=1,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            use_mamba_kernels=False,
        ),
        tags={"kwargs", "mask", "moe", "ssm"},
    ),
    _c(
        "recurrent_gemma",
        "hf_decoder",
        _lm(
            "RecurrentGemmaForCausalLM",
            "RecurrentGemmaConfig",
            attn=None,
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,
            lru_width=32,
            attention_window_size=4,
            block_types=["recurrent", "recurrent", "attention"],
        ),
        tags={"kwargs", "mask", "ssm"},
    ),
    _c(
        "mamba2",
        "hf_decoder",
        _lm(
            "Mamba2ForCausalLM",
            "Mamba2Config",
            mask=None,
            attn=None,
            vocab_size=VOCAB,
            hidden_size=32,
            state_size=8,
            num_hidden_layers=2,
            expand=2,
            head_dim=8,
            num_heads=8,
            n_groups=1,
            chunk_size=4,
            conv_kernel=4,
        ),
        tags={"kwargs", "ssm"},
    ),
    _c(
        "xlnet",
        "hf_decoder",
        _lm(
            "XLNetLMHeadModel",
            "XLNetConfig",
            attn=None,
            vocab_size=VOCAB,
            d_model=32,
            n_layer=2,
            n_head=4,
            d_inner=64,
        ),
        tags={"kwargs", "mask"},
    ),
    # --- Hugging Face encoders -------------------------------------------------------------
    _c(
        "bert",
        "hf_encoder",
        _encoder("BertModel", "BertConfig", token_types=True, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "bert_train_dropout",
        "hf_encoder",
        _encoder("BertForMaskedLM", "BertConfig", train=True, **_BERT_LIKE),
        tags={"kwargs", "mask", "train"},
    ),
    _c(
        "roberta",
        "hf_encoder",
        _encoder("RobertaModel", "RobertaConfig", pad_token_id=1, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "distilbert",
        "hf_encoder",
        _encoder(
            "DistilBertModel",
            "DistilBertConfig",
            vocab_size=VOCAB,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "albert",
        "hf_encoder",
        _encoder("AlbertModel", "AlbertConfig", embedding_size=16, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "deberta_v2",
        "hf_encoder",
        _encoder(
            "DebertaV2Model",
            "DebertaV2Config",
            attn=None,
            relative_attention=True,
            position_buckets=8,
            pos_att_type=["p2c", "c2p"],
            **_BERT_LIKE,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "electra",
        "hf_encoder",
        _encoder("ElectraModel", "ElectraConfig", embedding_size=16, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "bert_sdpa",
        "hf_encoder",
        _encoder("BertModel", "BertConfig", attn="sdpa", **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "bert_grad_checkpointing",
        "hf_encoder",
        _encoder("BertModel", "BertConfig", train=True, checkpointing=True, **_BERT_LIKE),
        tags={"kwargs", "mask", "train", "checkpointing"},
    ),
    _c(
        "xlm_roberta",
        "hf_encoder",
        _encoder("XLMRobertaModel", "XLMRobertaConfig", pad_token_id=1, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "mpnet",
        "hf_encoder",
        _encoder("MPNetModel", "MPNetConfig", attn=None, pad_token_id=1, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "convbert",
        "hf_encoder",
        _encoder("ConvBertModel", "ConvBertConfig", attn=None, embedding_size=32, **_BERT_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "deberta",
        "hf_encoder",
        _encoder(
            "DebertaModel",
            "DebertaConfig",
            attn=None,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            **_BERT_LIKE,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "fnet",
        "hf_encoder",
        _encoder(
            "FNetModel",
            "FNetConfig",
            attn=None,
            mask=False,
            **{k: v for k, v in _BERT_LIKE.items() if k != "num_attention_heads"},
        ),
        tags={"kwargs"},
    ),
    _c(
        "funnel",
        "hf_encoder",
        _encoder(
            "FunnelModel",
            "FunnelConfig",
            attn=None,
            vocab_size=VOCAB,
            block_sizes=[1, 1],
            num_decoder_layers=1,
            d_model=32,
            n_head=4,
            d_head=8,
            d_inner=64,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "big_bird",
        "hf_encoder",
        _encoder(
            "BigBirdModel", "BigBirdConfig", attn=None, attention_type="original_full", **_BERT_LIKE
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "squeezebert",
        "hf_encoder",
        _encoder(
            "SqueezeBertModel",
            "SqueezeBertConfig",
            attn=None,
            embedding_size=32,
            q_groups=2,
            k_groups=2,
            v_groups=2,
            post_attention_groups=2,
            intermediate_groups=2,
            output_groups=2,
            **_BERT_LIKE,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "reformer_lsh",  # LSH attention undoes its bucket sort into x.new(*sizes) memory
        "hf_encoder",
        _encoder(
            "ReformerModel",
            "ReformerConfig",
            attn=None,
            vocab_size=VOCAB,
            hidden_size=32,
            num_attention_heads=4,
            attention_head_size=8,
            attn_layers=["local", "lsh"],
            feed_forward_size=64,
            axial_pos_embds=False,
            max_position_embeddings=64,
            local_attn_chunk_length=4,
            lsh_attn_chunk_length=4,
            num_buckets=2,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "canine",
        "hf_encoder",
        _encoder(
            "CanineModel",
            "CanineConfig",
            attn=None,
            num_hash_buckets=64,
            downsampling_rate=2,
            local_transformer_stride=4,
            **_BERT_LIKE,
        ),
        tags={"kwargs", "mask"},
    ),
    # --- Hugging Face encoder-decoders -----------------------------------------------------
    _c(
        "t5",
        "hf_encdec",
        _seq2seq("T5ForConditionalGeneration", "T5Config", **_T5_CONFIG),
        tags={"kwargs", "mask"},
    ),
    _c("t5_labels", "hf_encdec", _t5_labels, tags={"kwargs", "mask", "train", "labels"}),
    _c("t5gemma2", "hf_encdec", _t5gemma2, tags={"kwargs", "mask"}),
    _c(
        "bart",
        "hf_encdec",
        _seq2seq("BartForConditionalGeneration", "BartConfig", **_BART_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "bart_generate_sampled",
        "hf_encdec",
        _generate(
            "BartForConditionalGeneration",
            "BartConfig",
            _padded_mask,
            _BART_LIKE,
            do_sample=True,
            top_k=5,
        ),
        tags={"mask", "cache", "generate", "sampling"},
    ),
    _c(
        "marian",
        "hf_encdec",
        _seq2seq("MarianMTModel", "MarianConfig", **_BART_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "pegasus",
        "hf_encdec",
        _seq2seq("PegasusForConditionalGeneration", "PegasusConfig", **_BART_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c("whisper", "hf_encdec", _whisper, tags={"kwargs"}),
    _c(
        "mbart",
        "hf_encdec",
        _seq2seq("MBartForConditionalGeneration", "MBartConfig", **_BART_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "m2m_100",
        "hf_encdec",
        _seq2seq("M2M100ForConditionalGeneration", "M2M100Config", **_BART_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "blenderbot_small",
        "hf_encdec",
        _seq2seq("BlenderbotSmallForConditionalGeneration", "BlenderbotSmallConfig", **_BART_LIKE),
        tags={"kwargs", "mask"},
    ),
    # --- Hugging Face vision ---------------------------------------------------------------
    _c("vit", "hf_vision", _vision("ViTModel", "ViTConfig", 32, **_VIT_LIKE)),
    _c(
        "deit",
        "hf_vision",
        _vision("DeiTForImageClassification", "DeiTConfig", 32, num_labels=5, **_VIT_LIKE),
    ),
    _c(
        "vit_train_dropout",
        "hf_vision",
        _vision(
            "ViTForImageClassification",
            "ViTConfig",
            32,
            train=True,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            **_VIT_LIKE,
        ),
        tags={"train"},
    ),
    _c(
        "clip_vision",
        "hf_vision",
        _vision(
            "CLIPVisionModel",
            "CLIPVisionConfig",
            32,
            **_VIT_LIKE,
        ),
    ),
    _c(
        "swin",
        "hf_vision",
        _vision(
            "SwinModel",
            "SwinConfig",
            32,
            image_size=32,
            patch_size=2,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
        ),
    ),
    _c(
        "convnext",
        "hf_vision",
        _vision(
            "ConvNextModel",
            "ConvNextConfig",
            32,
            attn=None,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_stages=2,
        ),
    ),
    _c(
        "resnet",
        "hf_vision",
        _vision(
            "ResNetModel",
            "ResNetConfig",
            32,
            attn=None,
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
        ),
    ),
    _c(
        "mobilevit",
        "hf_vision",
        _vision(
            "MobileViTModel",
            "MobileViTConfig",
            64,
            attn=None,
            image_size=64,
            hidden_sizes=[32, 40, 48],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
            num_attention_heads=2,
        ),
    ),
    _c(
        "beit",
        "hf_vision",
        _vision(
            "BeitModel", "BeitConfig", 32, attn=None, use_relative_position_bias=True, **_VIT_LIKE
        ),
    ),
    _c("dinov2", "hf_vision", _vision("Dinov2Model", "Dinov2Config", 32, **_VIT_LIKE)),
    _c(
        "segformer",
        "hf_vision",
        _vision(
            "SegformerModel",
            "SegformerConfig",
            32,
            attn=None,
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
        ),
    ),
    _c(
        "convnextv2",
        "hf_vision",
        _vision(
            "ConvNextV2Model",
            "ConvNextV2Config",
            32,
            attn=None,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_stages=2,
        ),
    ),
    _c(
        "regnet",
        "hf_vision",
        _vision(
            "RegNetModel",
            "RegNetConfig",
            32,
            attn=None,
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            groups_width=8,
        ),
    ),
    _c(
        "swinv2",
        "hf_vision",
        _vision(
            "Swinv2Model",
            "Swinv2Config",
            32,
            attn=None,
            image_size=32,
            patch_size=2,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
        ),
    ),
    _c("clip", "hf_vision", _clip_full, tags={"kwargs", "mask"}),
    # --- Hugging Face audio ----------------------------------------------------------------
    _c(
        "wav2vec2",
        "hf_audio",
        _audio("Wav2Vec2Model", "Wav2Vec2Config", **_WAV2VEC2_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c("wav2vec2_ctc_specaugment", "hf_audio", _wav2vec2_ctc_specaugment, tags={"train"}),
    _c(
        "hubert",
        "hf_audio",
        _audio("HubertModel", "HubertConfig", **_WAV2VEC2_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c(
        "wavlm",
        "hf_audio",
        _audio(
            "WavLMModel",
            "WavLMConfig",
            attn=None,
            num_buckets=16,
            max_bucket_distance=32,
            **_WAV2VEC2_LIKE,
        ),
        tags={"kwargs", "mask"},
    ),
    _c(
        "data2vec_audio",
        "hf_audio",
        _audio("Data2VecAudioModel", "Data2VecAudioConfig", **_WAV2VEC2_LIKE),
        tags={"kwargs", "mask"},
    ),
    _c("audio_spectrogram_transformer", "hf_audio", _ast),
    _c("encodec", "hf_audio", _encodec),
    _c("patchtst_time_series", "hf_encoder", _time_series, tags={"kwargs"}),
    # --- timm ------------------------------------------------------------------------------
    _c("timm_resnet18", "timm", _timm("resnet18", 64), _TIMM),
    _c("timm_vit_tiny", "timm", _timm("vit_tiny_patch16_224", 32, img_size=32), _TIMM),
    _c(
        "timm_vit_tiny_train_drop_path",
        "timm",
        _timm("vit_tiny_patch16_224", 32, train=True, img_size=32, drop_path_rate=0.1),
        _TIMM,
        tags={"train"},
    ),
    _c("timm_deit_tiny", "timm", _timm("deit_tiny_patch16_224", 32, img_size=32), _TIMM),
    _c("timm_convnext_atto", "timm", _timm("convnext_atto", 64), _TIMM),
    _c(
        "timm_efficientnet_b0_train_drop_path",
        "timm",
        _timm("efficientnet_b0", 64, train=True, drop_path_rate=0.1),
        _TIMM,
        tags={"train"},
    ),
    _c("timm_mobilenetv3", "timm", _timm("mobilenetv3_small_050", 64), _TIMM),
    _c("timm_regnetx_002", "timm", _timm("regnetx_002", 64), _TIMM),
    _c("timm_mobilevit_xxs", "timm", _timm("mobilevit_xxs", 64), _TIMM),
    _c(
        "timm_swin_tiny",
        "timm",
        _timm("swin_tiny_patch4_window7_224", 56, img_size=56, window_size=7),
        _TIMM,
    ),
    _c("timm_efficientvit_b0", "timm", _timm("efficientvit_b0", 64), _TIMM),
    _c("timm_levit_128s", "timm", _timm("levit_128s", 64, img_size=64), _TIMM),
    _c("timm_poolformer_s12", "timm", _timm("poolformer_s12", 64), _TIMM),
    _c("timm_cait_xxs24", "timm", _timm("cait_xxs24_224", 32, img_size=32, depth=4), _TIMM),
    _c("timm_ghostnet", "timm", _timm("ghostnet_050", 64), _TIMM),
    _c("timm_nf_resnet26", "timm", _timm("nf_resnet26", 32), _TIMM),
    _c("timm_coat_lite_tiny", "timm", _timm("coat_lite_tiny", 64, img_size=64), _TIMM),
    _c("timm_maxvit_nano", "timm", _timm("maxvit_nano_rw_256", 64, img_size=64), _TIMM),
    _c("timm_mixer_s32", "timm", _timm("mixer_s32_224", 64, img_size=64), _TIMM),
    _c(
        "timm_convnext_atto_grad_checkpointing",
        "timm",
        _timm("convnext_atto", 64, train=True, checkpointing=True, drop_path_rate=0.1),
        _TIMM,
        tags={"train", "checkpointing"},
    ),
    _c("timm_hrnet_w18_small", "timm", _timm("hrnet_w18_small", 64), _TIMM),
    _c("timm_sknet", "timm", _timm("skresnet18", 64), _TIMM),
    _c("timm_resnest14d", "timm", _timm("resnest14d", 64), _TIMM),
    _c("timm_res2net", "timm", _timm("res2net50_14w_8s", 32), _TIMM),
    _c("timm_repvgg_a0", "timm", _timm("repvgg_a0", 64), _TIMM),
    _c("timm_tresnet", "timm", _timm("tresnet_m", 64), _TIMM),
    _c("timm_crossvit_tiny", "timm", _timm("crossvit_tiny_240", 240), _TIMM),
    _c("timm_xcit_nano", "timm", _timm("xcit_nano_12_p16_224", 32, img_size=32), _TIMM),
    _c("timm_eva02_tiny", "timm", _timm("eva02_tiny_patch14_224", 28, img_size=28), _TIMM),
    _c("timm_fastvit_t8", "timm", _timm("fastvit_t8", 64), _TIMM),
    _c("timm_edgenext", "timm", _timm("edgenext_xx_small", 64), _TIMM),
    _c("timm_dla34", "timm", _timm("dla34", 64), _TIMM),
    # --- torchvision -----------------------------------------------------------------------
    _c("tv_resnet18", "torchvision", _tv("resnet18", 64), _TV),
    _c(
        "tv_googlenet",
        "torchvision",
        _tv("googlenet", 64, aux_logits=False, init_weights=True),
        _TV,
    ),
    _c(
        "tv_inception_v3",
        "torchvision",
        _tv("inception_v3", 75, batch=1, aux_logits=False, init_weights=True),
        _TV,
    ),
    _c("tv_mobilenet_v3_small", "torchvision", _tv("mobilenet_v3_small", 64), _TV),
    _c("tv_mobilenet_v3_large", "torchvision", _tv("mobilenet_v3_large", 64), _TV),
    _c("tv_efficientnet_b0", "torchvision", _tv("efficientnet_b0", 32), _TV),
    _c("tv_shufflenet_v2", "torchvision", _tv("shufflenet_v2_x0_5", 64), _TV),
    _c("tv_squeezenet", "torchvision", _tv("squeezenet1_1", 64), _TV),
    _c("tv_densenet121", "torchvision", _tv("densenet121", 32), _TV),
    _c("tv_mnasnet", "torchvision", _tv("mnasnet0_5", 64), _TV),
    _c(
        "tv_resnet18_train",
        "torchvision",
        _tv("resnet18", 64, train=True),
        _TV,
        tags={"train"},
    ),
    _c("tv_fpn_backbone", "torchvision", _tv_fpn_backbone, _TV, tags={"detection"}),
    _c(
        "tv_lraspp_mobilenet_v3",
        "torchvision",
        _tv_segmentation("lraspp_mobilenet_v3_large", 64),
        _TV,
        tags={"detection"},
    ),
    _c(
        "tv_fasterrcnn_mobilenet_v3",
        "torchvision",
        _tv_detection("fasterrcnn_mobilenet_v3_large_fpn", 64, **_FEW_RCNN_BOXES),
        _TV,
        tags={"detection"},
    ),
    _c("tv_googlenet_train_aux", "torchvision", _tv_googlenet_train, _TV, tags={"train"}),
    _c(
        "tv_inception_v3_train",  # its auxiliary head needs 299-pixel images: left off
        "torchvision",
        _tv("inception_v3", 80, train=True, aux_logits=False, init_weights=True),
        _TV,
        tags={"train"},
    ),
    _c("tv_regnet_y_400mf", "torchvision", _tv("regnet_y_400mf", 64), _TV),
    _c("tv_swin_t", "torchvision", _tv("swin_t", 64), _TV),
    _c("tv_convnext_tiny", "torchvision", _tv("convnext_tiny", 64), _TV),
    _c("tv_vit_b_16", "torchvision", _tv("vit_b_16", 32, image_size=32), _TV),
    _c(
        "tv_deeplabv3_mobilenet_v3",
        "torchvision",
        _tv_segmentation("deeplabv3_mobilenet_v3_large", 64),
        _TV,
        tags={"detection"},
    ),
    _c(
        "tv_retinanet_resnet50_fpn",
        "torchvision",
        _tv_detection("retinanet_resnet50_fpn", 64, **_FEW_DENSE_BOXES),
        _TV,
        tags={"detection"},
    ),
    _c(
        "tv_fcos_resnet50_fpn",
        "torchvision",
        _tv_detection("fcos_resnet50_fpn", 64, **_FEW_DENSE_BOXES),
        _TV,
        tags={"detection"},
    ),
    _c(
        "tv_maskrcnn_resnet50_fpn",
        "torchvision",
        _tv_detection("maskrcnn_resnet50_fpn", 64, **_FEW_RCNN_BOXES),
        _TV,
        tags={"detection"},
    ),
    _c("tv_keypointrcnn", "torchvision", _tv_keypointrcnn, _TV, tags={"detection"}),
    _c("tv_raft_small", "torchvision", _tv_raft_small, _TV, tags={"kwargs"}),
    _c("tv_r3d_18", "torchvision", _tv_r3d, _TV),
    _c(
        "tv_ssdlite320",
        "torchvision",
        _tv_ssdlite,
        _TV,
        tags={"detection"},
    ),
    _c(
        "tv_quantizable_mobilenet_v3",
        "torchvision",
        _tv_quantizable_mobilenet,
        _TV,
    ),
    _c("tv_r2plus1d_18", "torchvision", _tv_r2plus1d, _TV),
]

CASES += [  # rooted captures (issue 37): tagged "rooted", checked by test_rooted_case
    *(
        _c(
            f"{model}_generate_method_{mode}",
            "hf_decoder",
            _generate_method(model_class, config_class, config, **options),
            tags={"generate", "rooted", "cache", "kwargs"}
            | ({"sampling"} if "do_sample" in options and options["do_sample"] else set()),
        )
        for model, model_class, config_class, config in (
            ("llama", "LlamaForCausalLM", "LlamaConfig", _LLAMA_LIKE),
            ("gpt2", "GPT2LMHeadModel", "GPT2Config", _gpt2_config()),
        )
        for mode, options in (
            ("greedy", {"do_sample": False}),
            ("beam", {"do_sample": False, "num_beams": 2}),
            ("sampled", {"do_sample": True, "top_k": 20}),
        )
    ),
    _c("timm_resnet18_forward_intermediates", "timm", _timm_intermediates, _TIMM, tags={"rooted"}),
    _c("diffusers_vae_encode", "diffusers", _vae_encode, _DIFFUSERS, tags={"rooted", "kwargs"}),
    _c(
        "diffusers_unet_ddpm_loop",
        "diffusers",
        _unet_sampling_loop,
        _DIFFUSERS,
        tags={"rooted", "sampling"},
    ),
    _c(
        "llama_cpu_offload",
        "hf_decoder",
        _offloaded_llama("cpu"),
        _ACCELERATE,
        tags={"rooted", "kwargs", "mask", "offload"},
    ),
    _c(
        "llama_disk_offload",
        "hf_decoder",
        _offloaded_llama("disk"),
        _ACCELERATE,
        tags={"rooted", "kwargs", "mask", "offload"},
    ),
]

CASES_BY_NAME = {case.name: case for case in CASES}
