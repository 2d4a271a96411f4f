"""The bound methods and pipelines users trace besides ``forward``: CLIP's
``get_image_features``, diffusers' ``AutoencoderKL.encode``/``decode``, timm's
``forward_features``/``forward_intermediates``, and a diffusion sampling loop as a plain
function. Each records its module calls at the owner's addresses, every weight as a
parameter source, and validates.
"""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from tests.realworld.cases import _tiny_vae, _unet_sampling_loop


def _weights_of_calls(trace, root, prefix=""):
    """The first address of each weight of ``root``'s modules that ran in ``trace`` (the
    capture's own root call, ``trace.modules[0]``, is no call of the owner)."""
    ran = {m.address for m in trace.modules[1:]}
    weights, seen = set(), set()
    for address, module in root.named_modules():
        full = ".".join(part for part in (prefix, address) if part)
        for name, param in module.named_parameters(recurse=False):
            if full in ran and id(param) not in seen:
                weights.add(f"{full}.{name}" if full else name)
            seen.add(id(param))
    return weights


def _parameters(trace):
    return {s.path for s in trace.sources if s.kind == "parameter"}


def _check(method, owner, *args, **kwargs):
    torch.manual_seed(3)
    trace = tl.trace(method, args, kwargs)
    assert trace.modules[0].module_type.startswith(type(owner).__name__ + ".")
    assert len(trace.modules) > 3
    addresses = {address for address, _ in owner.named_modules()}
    assert {m.address for m in trace.modules if not m.module_type.islower()} <= addresses
    assert _parameters(trace) == _weights_of_calls(trace, owner)
    assert not [s for s in trace.sources if s.kind == "constant"]
    torch.manual_seed(3)
    assert tl.validate(method, args, kwargs)
    return trace


def test_clip_get_image_features():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=37,
                         num_hidden_layers=2, num_attention_heads=4),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=37,
                           num_hidden_layers=2, num_attention_heads=4),
        projection_dim=16,
    )  # fmt: skip
    model = transformers.CLIPModel(config).eval()
    trace = _check(model.get_image_features, model, pixel_values=torch.randn(2, 3, 32, 32))
    assert "vision_model.encoder.layers.1.self_attn" in trace.modules.addresses()
    assert not any(a.startswith("text_model") for a in trace.modules.addresses())


def _vae():
    pytest.importorskip("diffusers")
    return _tiny_vae()


def test_autoencoder_kl_encode_and_decode():
    vae = _vae()
    encoded = _check(vae.encode, vae, torch.randn(1, 3, 16, 16), return_dict=False)
    assert all(
        a.split(".")[0] in ("", "encoder", "quant_conv") for a in encoded.modules.addresses()
    )
    decoded = _check(vae.decode, vae, torch.randn(1, 4, 8, 8), return_dict=False)
    assert "decoder.up_blocks.0" in decoded.modules.addresses()


@pytest.mark.parametrize("method", ["forward_features", "forward_intermediates"])
def test_timm_feature_methods(method):
    timm = pytest.importorskip("timm")  # (imports torchvision: the zoo environment)
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False).eval()
    trace = _check(getattr(model, method), model, torch.randn(1, 3, 64, 64))
    assert "layer4.1.conv2" in trace.modules.addresses()


def test_a_diffusion_sampling_loop_with_its_modules_named():
    pytest.importorskip("diffusers")
    sample, args, _ = _unet_sampling_loop()
    unet = sample.zoo_modules["UNet2DConditionModel"]
    torch.manual_seed(3)
    trace = tl.trace(sample, args, root={"unet": unet})
    assert [m.name for m in trace.module_calls("unet")] == ["unet:1", "unet:2", "unet:3"]
    assert _parameters(trace) == _weights_of_calls(trace, unet, "unet")
    assert len(_parameters(trace)) == len(list(unet.parameters()))
    torch.manual_seed(3)
    assert torch.equal(trace.output, sample(*args))  # the scheduler's noise: same seed
    torch.manual_seed(3)
    assert tl.validate(sample, args)
