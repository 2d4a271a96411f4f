"""Sites chosen by layer and pass (``save=tl.layer("linear_1", passes=2)``).

Layers are grouped on a finished trace, while ``tl.extract`` records each batch op by op.
So a selector that asks for layers is answered once, on a trace of the first batch: it
becomes the labels of the ops it picks there (labels are the same in every run that takes
the same path through the code), and a site that is one pass of a layer run several times is
named ``"layer:pass"`` (any other keeps its label; a module's ``.output`` in such a selector
is picked as the op it returned, under that op's name).
"""

from __future__ import annotations

from typing import Any

import torch

from torchlens.capture import trace
from torchlens.selectors import Candidates, Selector, label, needs_trace, require_match

__all__ = ["resolve_layers"]


def resolve_layers(
    model: Any, args: Any, kwargs: Any, selector: Selector
) -> tuple[Selector, dict[str, str]]:
    """``(selector to record with, op label -> site name)``: ``selector`` itself and no
    names when it asks nothing of layers; else the labels it picks on a trace of
    ``args``, and ``"layer:pass"`` names for those that are passes of a repeated layer.

    Raises:
        SelectorMatchError: ``no_match`` when it picks no op of that trace.
    """
    if not needs_trace(selector):
        return selector, {}
    with torch.no_grad():
        first = trace(model, args, kwargs, structure_only=True)
    picked = [op for op in first.ops if selector.matches(op)]
    if not picked:
        seen = Candidates([op.func_name for op in first.ops], [], list(first.layers))
        require_match(selector, "save=", seen)  # raises no_match, naming close layers
    repeated = first.layers.repeated
    names = {op.label: f"{op.layer}:{op.pass_index}" for op in picked if op.layer in repeated}
    return label(*(op.label for op in picked)), names
