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

Families differ where their models do (the table in docs/interpretability.md): GPT-NeoX
and Phi rotate part of each head, so their ``q``/``k`` are the ``cat`` of the rotated and the
passed features; a parallel block (Phi, GPT-NeoX's default) has no ``resid_mid``; OPT scales
the query before its heads, so it has no ``q``; BERT is post-LN and follows TransformerLens's
BERT block (``resid_mid``/``resid_post`` before the LayerNorm after each residual add, so
``resid_pre(L + 1)`` is the LayerNorm of ``resid_post(L)``). A site a family has no exact op
for raises ``UnsupportedModelError`` ``unsupported_site``, never another op.

A site counted by its place in a module call (``resid_mid``, ``q``, ``k``, ``v``) counts the
ops of its function in that call as it is asked about them, in order (``&`` and ``|`` ask
both sides of every op, so combining them is safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from torchlens.errors import InvalidArgumentError, UnsupportedModelError
from torchlens.selectors import Selector, func, module

__all__ = ["LLMSites", "llm_sites", "FAMILIES"]


_Where = tuple[str, str, int]  # (module address, function, k-th op of it run directly there)


@dataclass(frozen=True)
class _Family:
    """Where one family keeps each part, ``{L}`` standing for the layer."""

    embed: str  # the module whose output is resid_pre(0)
    block: str
    attn: str  # the module that computes q, k, v and the attention op
    attn_out: str  # the module whose output is attn_out
    mlp_out: str  # the module whose output is mlp_out
    q: tuple[str, int]  # (function, k-th in the attention call) of the query attention reads
    k: tuple[str, int]
    v: tuple[str, int]
    resid_mid: _Where | None  # None: attention and MLP read the same stream (parallel)
    resid_post: _Where | None = None  # None: what the block returns
    embed_op: _Where | None = None  # resid_pre(0) when no module returns it
    missing: tuple[tuple[str, str], ...] = ()  # (site, why this family has no exact op)


_PARALLEL = "attention and MLP both read resid_pre (a parallel block): there is no resid_mid"
_GPT2 = _Family("transformer.drop", "transformer.h.{L}", "transformer.h.{L}.attn",
                "transformer.h.{L}.attn", "transformer.h.{L}.mlp", ("transpose", 3),
                ("transpose", 1), ("transpose", 2),
                ("transformer.h.{L}", "add", 1))  # fmt: skip
_LLAMA = _Family("model.embed_tokens", "model.layers.{L}", "model.layers.{L}.self_attn",
                 "model.layers.{L}.self_attn", "model.layers.{L}.mlp", ("add", 1), ("add", 2),
                 ("transpose", 3), ("model.layers.{L}", "add", 1))  # fmt: skip
# partial rotary: the query attention reads is the ``cat`` of its rotated and its passed part
_NEOX = _Family("gpt_neox.emb_dropout", "gpt_neox.layers.{L}", "gpt_neox.layers.{L}.attention",
                "gpt_neox.layers.{L}.attention", "gpt_neox.layers.{L}.mlp", ("cat", 3),
                ("cat", 4), ("chunk", 3), ("gpt_neox.layers.{L}", "add", 1))  # fmt: skip
_PHI = _Family("model.embed_dropout", "model.layers.{L}", "model.layers.{L}.self_attn",
               "model.layers.{L}.self_attn", "model.layers.{L}.mlp", ("cat", 3), ("cat", 4),
               ("transpose", 3), None, missing=(("resid_mid", _PARALLEL),))  # fmt: skip
# OPT has no MLP module (fc1, fc2 run in the block) and scales the query before its heads
_OPT = _Family("", "model.decoder.layers.{L}", "model.decoder.layers.{L}.self_attn",
               "model.decoder.layers.{L}.self_attn", "model.decoder.layers.{L}.fc2",
               ("transpose", 1), ("transpose", 2), ("transpose", 3),
               ("model.decoder.layers.{L}", "add", 1), embed_op=("model.decoder", "add", 1),
               missing=(("q", "OPT multiplies the query by d_head**-0.5 before splitting it into "
                         "heads, so no op holds TransformerLens's hook_q; its value is "
                         "tl.module('<attention>.q_proj').output, (batch, pos, heads * d_head)"),
                        ("mlp_out", "OPT runs its MLP on (batch * pos, d_model) rows, so no op "
                         "holds TransformerLens's hook_mlp_out by position (positions= would "
                         "pick rows, not positions); its value is "
                         "tl.module('<block>.fc2').output, (batch * pos, d_model)"),
                        ))  # fmt: skip
# BERT is post-LN: TransformerLens's hooks are before each LayerNorm (see the module docstring)
_BERT = _Family("bert.embeddings", "bert.encoder.layer.{L}",
                "bert.encoder.layer.{L}.attention.self",
                "bert.encoder.layer.{L}.attention.output.dense",
                "bert.encoder.layer.{L}.output.dense", ("transpose", 1), ("transpose", 2),
                ("transpose", 3), ("bert.encoder.layer.{L}.attention.output", "add", 1),
                ("bert.encoder.layer.{L}.output", "add", 1))  # fmt: skip

FAMILIES: dict[str, _Family] = {
    "bert": _BERT,
    "gemma": _LLAMA,
    "gpt2": _GPT2,
    "gpt_neox": _NEOX,
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "opt": _OPT,
    "phi": _PHI,
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

    def _nth(self, where: _Where, layer: int) -> Selector:
        address, name, n = where
        return _Nth(self._at(address, layer), name, n)

    def _exact(self, site: str) -> None:
        why = dict(self._parts.missing).get(site)
        if why is not None:
            raise UnsupportedModelError(
                f"tl.llm_sites has no {site} for this {self.family} model: {why}",
                code="unsupported_site",
            )

    def resid_pre(self, layer: int) -> Selector:
        """What block ``layer`` reads: the embeddings for 0, else the previous block's output."""
        if self._at("{L}", layer) != "0":
            return module(self._at(self._parts.block, layer % self.n_layers - 1)).output
        if self._parts.embed_op is not None:
            return self._nth(self._parts.embed_op, 0)
        return module(self._parts.embed).output

    def resid_mid(self, layer: int) -> Selector:
        """The residual stream after attention's residual add, before the MLP (BERT: before
        the LayerNorm that follows that add).

        Raises:
            UnsupportedModelError: ``unsupported_site`` for a parallel block (GPT-NeoX with
                ``use_parallel_residual``, Phi), which has none.
        """
        self._exact("resid_mid")
        assert self._parts.resid_mid is not None
        return self._nth(self._parts.resid_mid, layer)

    def resid_post(self, layer: int) -> Selector:
        """What block ``layer`` returns (BERT: the residual add before its last LayerNorm)."""
        if self._parts.resid_post is not None:
            return self._nth(self._parts.resid_post, layer)
        return module(self._at(self._parts.block, layer)).output

    def attn_out(self, layer: int) -> Selector:
        """What attention adds to the residual stream (after its output projection)."""
        return module(self._at(self._parts.attn_out, layer)).output

    def mlp_out(self, layer: int) -> Selector:
        """What the MLP adds to the residual stream, ``(batch, pos, d_model)``.

        Raises:
            UnsupportedModelError: ``unsupported_site`` for OPT, whose MLP runs on
                ``(batch * pos, d_model)`` rows.
        """
        self._exact("mlp_out")
        return module(self._at(self._parts.mlp_out, layer)).output

    def q(self, layer: int) -> Selector:
        """The queries attention reads, after rotary, ``(batch, heads, pos, d_head)``.

        Raises:
            UnsupportedModelError: ``unsupported_site`` for OPT, which scales the query
                before splitting it into heads.
        """
        self._exact("q")
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
    if family == "opt" and not getattr(config, "do_layer_norm_before", True):
        parts = None  # post-LN OPT (opt-350m): its block order is another family's
    if parts is None:
        raise UnsupportedModelError(
            f"tl.llm_sites knows the transformers families {sorted(FAMILIES)} (OPT with "
            f"do_layer_norm_before only); {type(model).__name__} (model_type {family!r}) "
            "is not one: select its sites with tl.module(...).output and tl.func(...) instead",
            code="unsupported_family",
        )
    if family == "gpt_neox" and getattr(config, "use_parallel_residual", True):
        parts = replace(parts, resid_mid=None, missing=(("resid_mid", _PARALLEL),))
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
    """``part`` without ``prefix`` at the front (an address, or an (address, function, n)
    triple; (function, n) pairs and the reasons in ``missing`` are left as they are)."""
    if isinstance(part, str):
        return part.removeprefix(prefix)
    if isinstance(part, tuple) and len(part) == 3:
        return (_prefixed(prefix, part[0]), *part[1:])
    return part
