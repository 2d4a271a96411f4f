"""What ``tl.record`` needs for ``tl.module(...).output`` rules: the label of each live
tensor an op produced, so that when a module call ends its outputs can be named, matched,
kept, edited or halted on. Built only when some rule selects module outputs, so the lean
path pays nothing otherwise."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from torchlens.capture.special import SPECIAL_OUTPUTS
from torchlens.capture.tree import fill, flatten
from torchlens.recording import OpView

__all__ = ["ExitTracker"]

Tensor = torch.Tensor


class ExitTracker:
    """Remembers which op produced each live tensor; acts on module outputs at exit."""

    def __init__(self, mode: Any) -> None:
        self.mode = weakref.proxy(mode)  # (the mode holds this tracker: no cycle)
        c = mode.controls
        self.save = c.save if c.save is not None and c.save.at_exit else None
        self.stop = c.stop if c.stop is not None and c.stop.at_exit else None
        self.edits = [(i, sel, edit) for i, (sel, edit) in enumerate(c.edits) if sel.at_exit]
        self.live: dict[int, tuple[weakref.ref, list]] = {}

    def note(self, name: str, count: int, index: int, args: tuple, result: Any) -> None:
        """An op call returned ``result``: remember its tensors' labels."""
        mode = self.mode
        if isinstance(result, Tensor):
            tensors = [result]
        else:
            special = SPECIAL_OUTPUTS.get(name)
            tensors = [t for _, t in (special(args, result) if special else flatten(result)[0])]
        multi = len(tensors) > 1
        for k, tensor in enumerate(tensors):
            label = f"{name}_{count}:{k}" if multi else f"{name}_{count}"
            entry = [label, index + k, name, k, mode._frames, mode._type, ()]
            self.live[id(tensor)] = (weakref.ref(tensor), entry)

    def on_exit(self, frame: tuple[str, int], type_name: str, output: Any) -> Any:
        """A module call ended with ``output``: the output with edited tensors put back,
        or None when nothing was replaced."""
        leaves, template = flatten(output)
        tensors = [t for _, t in leaves]
        new, mode, c = list(tensors), self.mode, self.mode.controls
        for k, tensor in enumerate(tensors):
            known = self.live.get(id(tensor))
            if known is None or known[0]() is not tensor:
                continue
            entry = known[1]
            entry[6] = (*entry[6], (frame[0], frame[1], type_name))
            view = OpView(entry[0], entry[1], entry[2], entry[3], entry[4], tensor, entry[5])
            view.returned_by = entry[6]
            keep = self.save is not None and self.save.matches(view)
            c.saved += keep
            for i, selector, _ in self.edits:
                if selector.matches(view):
                    new[k] = mode._edit(view, new[k], i, False)
                    keep = True
            if new[k] is not tensor:
                self.live[id(new[k])] = (weakref.ref(new[k]), entry)
            halt = self.stop is not None and self.stop.matches(view)
            if keep or halt:
                self._keep(view, new[k], edited=new[k] is not tensor)
            if halt and not mode.halt_pending:  # halts once the calls returning it end
                c.halted_at = view.label
                mode.halt_pending = True
        if all(a is b for a, b in zip(new, tensors)):
            return None
        return new[0] if isinstance(output, Tensor) else fill(template, new)

    def _keep(self, view: OpView, tensor: Tensor, edited: bool) -> None:
        mode = self.mode
        kept = mode.kept_views.get(view.label)
        if kept is not None:  # kept when it ran: now also returned by this call
            kept.returned_by = view.returned_by
            if edited:  # the value is now the edited one
                mode.store.set(view.label, tensor.detach().clone(), None)
        else:
            mode._keep(view, tensor)
