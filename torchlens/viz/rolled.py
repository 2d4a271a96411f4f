"""The rolled view: each layer (``trace.layers``) drawn once, its later passes folded onto
its first, and the edges that carry a value from one pass to another labelled with the
passes they connect (``1→2 … 19→20``), so a 20-step loop draws as small as its body.

The folding reuses :class:`~torchlens.viz.repeats.Fold` (op -> the op drawn for it), so
the drawing code is the same as for folded repeats; what differs is where the fold comes
from (layers, not runs of module calls) and the pass labels on edges.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchlens.trace import Trace
from torchlens.viz.repeats import Fold

__all__ = ["roll_layers", "pass_text"]


def roll_layers(trace: Trace) -> Fold:
    """A :class:`Fold` mapping every op of pass 2 and later onto its layer's first op."""
    canonical = {
        op.label: ops[0].label for ops in trace.layers.values() if len(ops) > 1 for op in ops[1:]
    }
    return Fold([], canonical, {}, set())


def pass_text(pairs: Iterable[tuple[int, int]], parent_passes: int, child_passes: int) -> str:
    """The label of a rolled edge, from the (parent pass, child pass) pairs it stands for:
    ``""`` when every pass feeds the same pass (or a layer run once feeds every pass),
    else the passes it connects, e.g. ``"1→2 … 19→20"``, ``"pass 20"``, ``"into pass 1"``.

    Example:
        >>> pass_text([(k, k + 1) for k in range(1, 20)], 20, 20)
        '1→2 … 19→20'
        >>> pass_text([(20, 1)], 20, 1), pass_text([(1, 1)], 1, 20)
        ('pass 20', 'into pass 1')
    """
    pairs = sorted(set(pairs))
    if parent_passes == 1 and child_passes == 1:
        return ""
    if parent_passes == 1:  # a value from outside the loop
        passes = [c for _, c in pairs]
        return "" if len(passes) == child_passes else "into " + _passes(passes)
    if child_passes == 1:  # a value leaving the loop
        passes = [p for p, _ in pairs]
        return "" if len(passes) == parent_passes else _passes(passes)
    if all(p == c for p, c in pairs):
        return ""
    shown = [f"{p}→{c}" for p, c in pairs]
    return " … ".join([shown[0], shown[-1]]) if len(shown) > 2 else ", ".join(shown)


def _passes(passes: list[int]) -> str:
    if len(passes) == 1:
        return f"pass {passes[0]}"
    return f"passes {passes[0]}{'–' if len(passes) > 2 else ', '}{passes[-1]}"
