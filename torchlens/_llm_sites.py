"""TransformerLens's vocabulary for transformers LLMs: ``resid_pre``, ``attn_out``, ``q``, ...

Interpretability users think in the hook names of TransformerLens
(``blocks.3.hook_resid_pre``, ``blocks.3.attn.hook_z``...). :func:`llm_sites` maps them onto
the modules and ops of a Hugging Face ``transformers`` model of a supported family, as
ordinary selectors: they work wherever one does (``save=``, ``intervene=``, ``stop_after=``,
``tl.extract``, ``edits.sweep``).

Each site is one op per layer:

- ``resid_pre(L)``: what block ``L`` reads (the embeddings for ``L = 0``, else block
  ``L - 1``'s output), ``resid_post(L)``: what block ``L`` returns, ``resid_mid(L)``: the
  residual stream between attention and MLP (the first residual ``add`` run directly in the
  block);
- ``attn_out(L)``, ``mlp_out(L)``: what the attention and MLP modules return;
- ``q(L)``, ``k(L)``, ``v(L)``: what attention reads, per head, after rotary embeddings
  (TransformerLens's ``hook_rot_q``/``hook_rot_k`` on rotary models), in the model's layout
  ``(batch, heads, pos, d_head)`` (TransformerLens's is ``(batch, pos, heads, d_head)``:
  ``.transpose(1, 2)``); ``k`` and ``v`` hold the key/value heads (fewer under GQA);
- ``z(L)``: the attention-weighted values, the ``scaled_dot_product_attention`` op,
  ``(batch, heads, pos, d_head)``;
- ``pattern(L)``: the same op, whose pattern ``tl.attention_pattern(op)`` reads,
  ``(batch, heads, query, key)``, and ``edits.edit_pattern`` edits.

A site counted by its place in a module call (``resid_mid``, ``q``, ``k``, ``v``) counts the
ops of its function in that call as it is asked about them, in order (``&`` and ``|`` ask
both sides of every op, so combining them is safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torchlens.errors import InvalidArgumentError, UnsupportedModelError
from torchlens.selectors import Selector, func, module

__all__ = ["LLMSites", "llm_sites", "FAMILIES"]


@dataclass(frozen=True)
class _Family:
    """Where one family keeps each part, ``{L}`` standing for the layer."""

    embed: str  # the module whose output is resid_pre(0)
    block: str
    attn: str
    mlp: str
    q: tuple[str, int]  # (function, k-th in the attention call) of the query attention reads
    k: tuple[str, int]
    v: tuple[str, int]


_GPT2 = _Family("transformer.drop", "transformer.h.{L}", "transformer.h.{L}.attn",
                "transformer.h.{L}.mlp", ("transpose", 3), ("transpose", 1),
                ("transpose", 2))  # fmt: skip
_LLAMA = _Family("model.embed_tokens", "model.layers.{L}", "model.layers.{L}.self_attn",
                 "model.layers.{L}.mlp", ("add", 1), ("add", 2), ("transpose", 3))  # fmt: skip

FAMILIES: dict[str, _Family] = {
    "gpt2": _GPT2,
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
}  # config.model_type -> where its parts are


class _Nth(Selector):
    """The ``n``-th op of function ``name`` run directly in each call of the module at
    ``address`` (not in a submodule): counted per call, afresh for each forward (a smaller
    ``op.index`` than the last one asked starts a new forward)."""

    def __init__(self, address: str, name: str, n: int) -> None:
        self.address, self.name, self.n = address, name, n
        self.func_names = frozenset({name})
        self._last = -1
        self._counts: dict[tuple[str, int], int] = {}
        self._answers: dict[int, bool] = {}

    def matches(self, op: Any) -> bool:
        if op.func_name != self.name or not op.module_stack:
            return False
        address, call = op.module_stack[-1]
        if address != self.address:
            return False
        if op.index in self._answers and op.index <= self._last:
            return self._answers[op.index]
        if op.index < self._last:  # another forward
            self._counts, self._answers = {}, {}
        self._last = op.index
        k = self._counts[address, call] = self._counts.get((address, call), 0) + 1
        self._answers[op.index] = answer = k == self.n
        return answer

    def __repr__(self) -> str:
        return f"nth({self.name!r}, {self.n}, in={self.address!r})"


_TL_NAME = re.compile(r"blocks\.(\d+)\.(?:(attn)\.)?hook_(\w+)")


class LLMSites:
    """TransformerLens-named sites of one model (see the module docstring)."""

    def __init__(self, family: str, parts: _Family, n_layers: int) -> None:
        self.family, self._parts, self.n_layers = family, parts, n_layers

    def _at(self, pattern: str, layer: int) -> str:
        if not isinstance(layer, int) or not -self.n_layers <= layer < self.n_layers:
            raise InvalidArgumentError(
                f"layer {layer!r} is not a layer of this {self.family} model of "
                f"{self.n_layers} layers; pass 0..{self.n_layers - 1}",
                code="bad_selector",
            )
        return pattern.format(L=layer % self.n_layers)

    def resid_pre(self, layer: int) -> Selector:
        """What block ``layer`` reads: the embeddings for 0, else the previous block's output."""
        if self._at("{L}", layer) == "0":
            return module(self._parts.embed).output
        return self.resid_post(layer % self.n_layers - 1)

    def resid_mid(self, layer: int) -> Selector:
        """The residual stream after attention's residual add, before the MLP."""
        return _Nth(self._at(self._parts.block, layer), "add", 1)

    def resid_post(self, layer: int) -> Selector:
        """What block ``layer`` returns."""
        return module(self._at(self._parts.block, layer)).output

    def attn_out(self, layer: int) -> Selector:
        """What the attention module returns (after its output projection)."""
        return module(self._at(self._parts.attn, layer)).output

    def mlp_out(self, layer: int) -> Selector:
        """What the MLP module returns."""
        return module(self._at(self._parts.mlp, layer)).output

    def q(self, layer: int) -> Selector:
        """The queries attention reads, after rotary, ``(batch, heads, pos, d_head)``."""
        return _Nth(self._at(self._parts.attn, layer), *self._parts.q)

    def k(self, layer: int) -> Selector:
        """The keys attention reads, after rotary, ``(batch, kv_heads, pos, d_head)``."""
        return _Nth(self._at(self._parts.attn, layer), *self._parts.k)

    def v(self, layer: int) -> Selector:
        """The values attention reads, ``(batch, kv_heads, pos, d_head)``."""
        return _Nth(self._at(self._parts.attn, layer), *self._parts.v)

    def z(self, layer: int) -> Selector:
        """The attention-weighted values per head: the attention op's output."""
        return func("scaled_dot_product_attention") & module(self._at(self._parts.attn, layer))

    def pattern(self, layer: int) -> Selector:
        """The attention op, whose pattern ``tl.attention_pattern(op)`` reads."""
        return self.z(layer)

    def __getitem__(self, name: str) -> Selector:
        """A site by its TransformerLens hook name: ``"blocks.3.hook_resid_pre"``,
        ``"blocks.3.attn.hook_z"`` (``hook_rot_q``/``hook_rot_k`` are ``q``/``k``)."""
        hit = _TL_NAME.fullmatch(name) if isinstance(name, str) else None
        kind = None if hit is None else hit.group(3).removeprefix("rot_")
        attn = {"q", "k", "v", "z", "pattern"}
        block = {"resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"}
        if hit is None or kind not in (attn if hit.group(2) else block):
            raise InvalidArgumentError(
                f"{name!r} is not a TransformerLens hook name this maps; use "
                f"blocks.L.hook_{{{','.join(sorted(block))}}} or "
                f"blocks.L.attn.hook_{{{','.join(sorted(attn))}}}",
                code="bad_selector",
            )
        return getattr(self, kind)(int(hit.group(1)))

    def __repr__(self) -> str:
        return f"LLMSites({self.family!r}, layers={self.n_layers})"


def llm_sites(model: Any) -> LLMSites:
    """TransformerLens-named sites (``resid_pre``, ``attn_out``, ``q``, ``z``, ...) of a
    ``transformers`` model, as selectors.

    Args:
        model: a Hugging Face ``transformers`` model (``config.model_type`` in
            :data:`FAMILIES`), a base model or one with a head.

    Returns:
        An :class:`LLMSites`: ``sites.resid_pre(3)``, ``sites["blocks.3.attn.hook_z"]``.

    Raises:
        UnsupportedModelError: ``unsupported_family`` for another model, naming the
            supported families.

    Example:
        >>> import torch, torchlens as tl
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2)).eval()
        >>> sites = tl.llm_sites(model)
        >>> rec = tl.record(model, torch.tensor([[1, 2, 3]]), save=sites.resid_post(1))
        >>> rec[rec.labels[0]].shape
        (1, 3, 16)
    """
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    parts = FAMILIES.get(family)
    if parts is None:
        raise UnsupportedModelError(
            f"tl.llm_sites knows the transformers families {sorted(FAMILIES)}; "
            f"{type(model).__name__} (model_type {family!r}) is not one: select its "
            "sites with tl.module(...).output and tl.func(...) instead",
            code="unsupported_family",
        )
    prefix = _prefix(model, parts)
    if prefix:
        parts = _Family(*(_prefixed(prefix, p) for p in vars(parts).values()))
    return LLMSites(family, parts, int(config.num_hidden_layers))


def _prefix(model: Any, parts: _Family) -> str:
    """``""`` for a model with a head (``transformer.h.0`` is there); for a base model,
    the part its head model adds (``transformer.``), dropped from every address."""
    names = dict(model.named_modules())
    first = parts.block.format(L=0)
    if first in names:
        return ""
    head, _, rest = first.partition(".")
    if rest in names:
        return head + "."
    raise UnsupportedModelError(
        f"{type(model).__name__} has no module {first!r} nor {rest!r}: not the layout of "
        "its transformers family; select its sites with tl.module(...) instead",
        code="unsupported_family",
    )


def _prefixed(prefix: str, part: Any) -> Any:
    """``part`` without ``prefix`` at the front (an address, or a (function, n) pair)."""
    return part.removeprefix(prefix) if isinstance(part, str) else part
