"""The logit lens: each layer's residual stream, decoded as if it were the last layer's.

With no readout given, the lens reuses what the model itself computed after its last layer
(for a transformers LM: the final norm and ``get_output_embeddings()``, e.g. ``ln_f`` and
``lm_head``; for BERT the MLM head): the last layer's output is replaced by each layer's
and that tail of the trace is rerun (:func:`~torchlens.edits.rerun`), so the last layer's
lens equals the model's logits by construction. A readout you pass (``hidden -> logits``)
is called on each layer's value instead.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchlens._table import dataframe
from torchlens.edits._helpers import replace
from torchlens.edits.labelled import LabelledTensor
from torchlens.edits.rerun import rerun
from torchlens.errors import InvalidArgumentError
from torchlens.selectors import as_selector, label
from torchlens.trace import Trace

__all__ = ["LogitLens", "logit_lens"]

Readout = Callable[[torch.Tensor], torch.Tensor]


class LogitLens:
    """Per-layer logits and their top tokens.

    Attributes:
        layers: the layer names (module addresses, or the keys given).
        logits: ``(layers, batch, positions, vocab)``.
        top_ids: ``(layers, batch, positions, k)`` token ids, most likely first.
        top_probs: their softmax probabilities.
        tokens: the top tokens decoded by the tokenizer given (nested lists), else None.
    """

    def __init__(self, layers: list[str], logits: torch.Tensor, top: int, tokenizer: Any) -> None:
        self.layers = layers
        self.logits = logits
        probs = logits.float().softmax(-1)
        self.top_probs, self.top_ids = probs.topk(min(top, logits.shape[-1]), dim=-1)
        self.tokens = None
        if tokenizer is not None:
            self.tokens = [[[[tokenizer.decode([i]) for i in ks] for ks in ts] for ts in bs]
                           for bs in self.top_ids.tolist()]  # fmt: skip

    def top(self, position: int = -1, batch: int = 0) -> LabelledTensor:
        """The top token ids at one position, as ``(layer, rank)``."""
        ids = self.top_ids[:, batch, position]
        coords = {"layer": self.layers, "rank": list(range(ids.shape[1]))}
        return LabelledTensor(ids, ("layer", "rank"), coords, name="token_id")

    def to_dicts(self) -> list[dict[str, Any]]:
        """One dict per layer, batch row, position and rank: the token id, its
        probability and (with a tokenizer) its text."""
        ids, probs = self.top_ids.tolist(), self.top_probs.tolist()
        rows = []
        for li, b, p, r in itertools.product(*map(range, self.top_ids.shape)):
            row = {"layer": self.layers[li], "batch": b, "position": p, "rank": r,
                   "token_id": ids[li][b][p][r], "prob": probs[li][b][p][r]}  # fmt: skip
            if self.tokens is not None:
                row["token"] = self.tokens[li][b][p][r]
            rows.append(row)
        return rows

    def to_pandas(self) -> Any:
        """:meth:`to_dicts` as a ``pandas.DataFrame``.

        Raises:
            MissingDependencyError: ``pandas_missing`` when pandas is not installed.
        """
        return dataframe(self.to_dicts())

    def __str__(self) -> str:
        """The top tokens of batch row 0 at the last position, a line per layer."""
        width = max(len(name) for name in self.layers)
        lines = []
        for li, name in enumerate(self.layers):
            words = self.tokens[li][0][-1] if self.tokens else self.top_ids[li, 0, -1].tolist()
            probs = self.top_probs[li, 0, -1].tolist()
            cells = "  ".join(f"{w!r} {p:.2f}" for w, p in zip(words, probs))
            lines.append(f"{name:<{width}}  {cells}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<LogitLens: {len(self.layers)} layers, logits {tuple(self.logits.shape)}>"


def logit_lens(
    trace: Trace,
    *,
    model: Any = None,
    readout: Readout | None = None,
    layers: Mapping[str, Any] | Sequence[Any] | None = None,
    top: int = 5,
    tokenizer: Any = None,
) -> LogitLens:
    """Decode each layer's residual stream into logits.

    Args:
        trace: a trace of the model with saved values.
        model: the model, to find the logits as the output of ``get_output_embeddings()``
            when its output holds more than one tensor.
        readout: ``hidden -> logits``; None reruns the model's own tail (see the module doc).
        layers: the residual-stream sites, ``{name: selector}`` or a list of selectors,
            each matching one op; None finds the model's stack of blocks (the longest run
            of sibling modules ``<list>.0``, ``<list>.1``... of one class) and takes each
            block's output.
        top: how many top tokens to keep.
        tokenizer: decodes the top tokens (anything with ``decode([id])``).

    Returns:
        A :class:`LogitLens`.

    Raises:
        InvalidArgumentError: ``lens_layers`` when no stack of blocks is found or a site
            does not match exactly one op; ``lens_readout`` when the logits cannot be told
            apart among the outputs (pass ``model=`` or ``readout=``).

    Example:
        >>> import torch, torchlens as tl
        >>> from torch import nn
        >>> blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        >>> model = nn.Sequential(*blocks, nn.LayerNorm(8), nn.Linear(8, 20))
        >>> trace = tl.trace(model, torch.randn(1, 4, 8))
        >>> lens = logit_lens(trace, layers=[tl.module(str(i)).output for i in range(3)])
        >>> torch.allclose(lens.logits[-1], trace.output)
        True
    """
    sites = _layer_sites(trace, layers)
    values = [trace[lab].out.detach() for _, lab in sites]
    with torch.no_grad():
        if readout is not None:
            logits = [readout(v) for v in values]
        else:
            logits_label = _logits_label(trace, model)
            last = sites[-1][1]
            logits = [rerun(trace, {label(last): replace(v)})[logits_label].out for v in values]
    return LogitLens([name for name, _ in sites], torch.stack(logits), top, tokenizer)


def _layer_sites(trace: Trace, layers: Any) -> list[tuple[str, str]]:
    """``(name, op label)`` per layer."""
    if layers is None:  # a block's residual stream: the first tensor it returned
        return [(call.address, call.outputs[0]) for call in _blocks(trace)]
    named = list(layers.items()) if isinstance(layers, Mapping) else [(repr(s), s) for s in layers]
    sites = []
    for name, select in named:
        selector = as_selector(select)
        labels = [op.label for op in trace.ops if op.func is not None and selector.matches(op)]
        if len(labels) != 1:
            raise InvalidArgumentError(
                f"the lens layer {name!r} matches {len(labels)} ops ({labels[:5]}), not one; "
                "pass layers= with a selector of exactly one op per layer (tl.label(...))",
                code="lens_layers",
            )
        sites.append((str(name), labels[0]))
    return sites


def _blocks(trace: Trace) -> list[Any]:
    """The first calls of the longest run of sibling blocks ``<list>.<i>`` of one class
    that returned a tensor, outermost runs only (not the experts inside each block)."""
    groups: dict[tuple[str, str], list[tuple[int, Any]]] = {}
    for call in trace.modules:
        match = re.fullmatch(r"(.*)\.(\d+)", call.address)
        if match and call.call_index == 1 and call.outputs:
            key = (match.group(1), call.module_type)
            groups.setdefault(key, []).append((int(match.group(2)), call))
    members = [call.address + "." for run in groups.values() for _, call in run]
    outer = [run for (prefix, _), run in groups.items()
             if not any((prefix + ".").startswith(m) for m in members)]  # fmt: skip
    if not outer:
        raise InvalidArgumentError(
            "found no stack of blocks (modules named <list>.0, <list>.1, ...) in the trace; "
            "pass layers= with a selector per layer, e.g. tl.module('h.0').output",
            code="lens_layers",
        )
    best = max(outer, key=len)
    return [call for _, call in sorted(best, key=lambda pair: pair[0])]


def _logits_label(trace: Trace, model: Any) -> str:
    """The op holding the logits: what ``get_output_embeddings()`` returned, or the one
    tensor the model returned."""
    head = getattr(model, "get_output_embeddings", lambda: None)() if model is not None else None
    if head is not None:
        address = next((name for name, m in model.named_modules() if m is head), None)
        calls = [c for c in trace.modules if c.address == address and c.outputs]
        if calls:
            return calls[-1].outputs[0]
    if len(trace.output_labels) == 1:
        return trace.output_labels[0]
    raise InvalidArgumentError(
        f"the model returned {len(trace.output_labels)} tensors and the logits cannot be "
        "told apart; pass model= (a transformers LM, for get_output_embeddings()) or "
        "readout= (hidden -> logits)",
        code="lens_readout",
    )
