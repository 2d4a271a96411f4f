"""A site's identity across batches: the same op in every batch, or a typed error.

Labels count ops by function name over the whole forward (``relu_2`` is the second relu
run), so a data-dependent branch that runs one more relu before a site in some batches
shifts every later label: ``relu_2`` is then another op, of the same shape. A site selected
by label in one batch must not silently take that other op's values.

An op's *key* is what stays the same when other parts of the forward change: its function,
the module calls it ran in (addresses with call numbers), which output of its call it is,
the model line that called it, and its place among the ops of that function, module call and
line (the k-th pass of a loop on that line). :class:`KeyedSave` wraps the ``save=`` selector
so that ``tl.record`` shows it every op of the functions the selector can match, in order;
it notes their keys and, after the first batch, also keeps the ops whose keys the first
batch's sites had, so that a site whose label moved is followed to its op.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from torchlens.capture import is_library_file
from torchlens.selectors import Candidates, Selector

__all__ = ["Key", "KeyedSave", "describe_key"]

# (func_name, module_stack, output_index, file name, line, k-th on that line in that call)
Key = tuple[str, tuple[tuple[str, int], ...], int, str, int, int]


class KeyedSave(Selector):
    """``save=`` as ``tl.extract`` hands it to ``tl.record``: the user's selector, plus the
    ops whose keys are in :attr:`wanted`; notes the key of every op it is asked about.

    Args:
        inner: the user's ``save=`` selector.
    """

    static = False  # asked once per op, in order: the keys count ops
    call_labels = None  # a label selector must still see the other ops of its function

    def __init__(self, inner: Selector) -> None:
        self.inner = inner
        self.func_names = inner.func_names
        self.at_exit = inner.at_exit
        self.wanted: frozenset[Key] = frozenset()
        self.keys: dict[str, Key] = {}  # label -> key, this batch
        self._seen: Counter = Counter()
        self._outer: Any = None  # the frame that ran the batch: the search stops there

    def start(self) -> None:
        """Forget the keys of the previous batch; the caller's frame bounds the search for
        the model's line (the line of ``tl.extract`` itself is no part of the model)."""
        self.keys, self._seen = {}, Counter()
        self._outer = sys._getframe(1)

    def finish(self) -> None:
        """Let go of the caller's frame (and the batch it holds)."""
        self._outer = None

    def key(self, op: Any) -> Key | None:
        """The key of ``op`` (an op this selector was asked about in this batch)."""
        return self.keys.get(op.label)

    def matches(self, op: Any) -> bool:
        names = self.func_names
        if names is not None and op.func_name not in names:  # asked when a call returned
            return self.inner.matches(op)
        key = self.keys.get(op.label)
        if key is None:
            file, line = self._model_line()
            group = (op.func_name, op.module_stack, op.output_index, file, line)
            self._seen[group] += 1
            key = self.keys[op.label] = (*group, self._seen[group])
        return self.inner.matches(op) or key in self.wanted

    def _model_line(self) -> tuple[str, int]:
        """(file name, line) of the model's code that called the op: the first frame out of
        torch and torchlens below the batch's call; ("", 0) when there is none (a model
        made of torch's modules only, whose module calls then tell ops apart)."""
        frame, outer = sys._getframe(2), self._outer
        while frame is not None and frame is not outer:
            code = frame.f_code
            if not is_library_file(code.co_filename):
                return os.path.basename(code.co_filename), frame.f_lineno
            frame = frame.f_back
        return "", 0

    def output_calls(self, op: Any) -> tuple[tuple[str, int, str], ...]:
        return self.inner.output_calls(op)

    def suggestions(self, seen: Candidates) -> list[str]:
        return self.inner.suggestions(seen)

    def __repr__(self) -> str:
        return repr(self.inner)


def describe_key(label: str, key: Key | None) -> str:
    """``label`` with what its key says: ``"relu_2 (relu in 'blocks.0:1', model.py:12)"``."""
    if key is None:
        return label
    func, stack, output, file, line, nth = key
    where = f"{stack[-1][0] or '(model)'}:{stack[-1][1]}" if stack else "(model)"
    output_part = f" output {output}" if output else ""
    pass_part = f", pass {nth}" if nth > 1 else ""
    at = f", {file}:{line}{pass_part}" if file else pass_part
    return f"{label} ({func}{output_part} in {where!r}{at})"
