"""Find runs of identical module calls (e.g. 12 transformer layers) so they draw as one.

Two calls are identical when they are calls of the same module type that ran the same ops
(function, shape, nesting, wiring) in the same order. A run is a sequence of such calls that
follow each other directly inside the same parent call, with no op of the parent between
them, each reading what the one before computed (a stack, not parallel branches), so folding
blocks 2..N onto block 1 loses no edge of the parent.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from torchlens.trace import ModuleCall, Trace

__all__ = ["CallKey", "Fold", "Repeat", "find_repeats", "fold_repeats"]

CallKey = tuple[str, int]  # (module address, call number), as in ``Op.module_stack``


@dataclass(frozen=True)
class Repeat:
    """One run of identical consecutive calls; ``calls[0]`` is the one that is drawn."""

    calls: tuple[CallKey, ...]
    module_type: str
    n_ops: int  # ops in the whole run, nested calls included

    @property
    def count(self) -> int:
        """How many calls the run folds together."""
        return len(self.calls)


@dataclass
class Fold:
    """How runs fold onto their first block, as the drawing needs it."""

    repeats: list[Repeat]  # the runs that are drawn folded (none nested in a folded block)
    canonical: dict[str, str]  # op label -> label of the op drawn for it (folded ops only)
    blocks: dict[str, dict[int, int]]  # op label -> {run index: block index}
    hidden: set[CallKey]  # calls of blocks 2..N and everything nested in them

    def crosses_blocks(self, a: str, b: str) -> bool:
        """Whether an edge a -> b runs between two blocks of one run (block k -> k+1)."""
        blocks_a, blocks_b = self.blocks.get(a, {}), self.blocks.get(b, {})
        return any(blocks_b.get(run, block) != block for run, block in blocks_a.items())


def find_repeats(trace: Trace) -> list[Repeat]:
    """Every run of two or more identical consecutive sibling module calls, outer runs first.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
        >>> [(r.module_type, r.count) for r in find_repeats(tl.trace(model, torch.ones(1, 4)))]
        [('Linear', 3)]
    """
    by_key = {(m.address, m.call_index): m for m in trace.modules[1:]}

    @functools.cache
    def signature(key: CallKey) -> tuple:
        return _signature(trace, by_key[key])

    repeats: list[Repeat] = []
    for items in _children_by_parent(trace).values():
        run: list[CallKey] = []
        for item in [*items, None]:
            if (
                item is not None
                and run
                and signature(item) == signature(run[0])
                and _feeds(trace, by_key[run[-1]], by_key[item])
            ):
                run.append(item)
                continue
            if len(run) > 1:
                n_ops = sum(len(by_key[key].ops) for key in run)
                repeats.append(Repeat(tuple(run), by_key[run[0]].module_type, n_ops))
            run = [item] if item is not None else []
    return sorted(repeats, key=lambda r: (trace[by_key[r.calls[0]].ops[0]].index, -r.n_ops))


def fold_repeats(trace: Trace, repeats: Sequence[Repeat]) -> Fold:
    """Map every op of blocks 2..N of each run onto the matching op of block 1."""
    by_key = {(m.address, m.call_index): m for m in trace.modules[1:]}
    fold = Fold([], {}, {}, set())
    for repeat in repeats:
        if repeat.calls[0] in fold.hidden:
            continue  # nested in a block that is folded away already
        run_index = len(fold.repeats)
        fold.repeats.append(repeat)
        first = by_key[repeat.calls[0]].ops
        for block_index, key in enumerate(repeat.calls):
            for i, label in enumerate(by_key[key].ops):
                fold.blocks.setdefault(label, {})[run_index] = block_index
                if block_index:
                    fold.canonical[label] = first[i]
                    fold.hidden.update(trace[label].module_stack)
        fold.hidden.difference_update(_outer_calls(trace, by_key[repeat.calls[1]]))
    for label, target in fold.canonical.items():  # compose folds of nested runs
        while True:
            for run, block in fold.blocks.get(target, {}).items():
                fold.blocks[label].setdefault(run, block)
            if target not in fold.canonical:
                break
            target = fold.canonical[target]
        fold.canonical[label] = target
    return fold


def _feeds(trace: Trace, before: ModuleCall, after: ModuleCall) -> bool:
    """Whether ``after`` reads something ``before`` computed: blocks stack, not branch."""
    produced = set(before.ops)
    return any(p in produced for label in after.ops for p in trace[label].parents)


def _outer_calls(trace: Trace, call: ModuleCall) -> tuple[CallKey, ...]:
    """The calls enclosing ``call`` (not itself): they stay visible when it is folded."""
    stack = trace[call.ops[0]].module_stack
    return stack[: stack.index((call.address, call.call_index))]


def _children_by_parent(trace: Trace) -> dict[tuple[CallKey, ...], list[CallKey | None]]:
    """For each call path, its children in order: child call keys, or ``None`` for an op."""
    children: dict[tuple[CallKey, ...], list[CallKey | None]] = {}
    for op in trace.ops:
        stack = op.module_stack
        for depth in range(len(stack) + 1):
            items = children.setdefault(stack[:depth], [])
            item = stack[depth] if depth < len(stack) else None
            if item is None or not items or items[-1] != item:
                items.append(item)
    return children


def _signature(trace: Trace, call: ModuleCall) -> tuple:
    """What must match for two calls to be drawn as one: types, ops, wiring, shapes."""
    depth = len(_outer_calls(trace, call)) + 1
    position = {label: i for i, label in enumerate(call.ops)}
    prefix = call.address + "."
    parts: list[tuple] = [(call.module_type,)]
    for label in call.ops:
        op = trace[label]
        inner = tuple(_relative(address, prefix) for address, _ in op.module_stack[depth:])
        parents = tuple(_parent_code(p, position, prefix) for p in op.parents)
        parts.append((op.func_name, op.shape, str(op.dtype), inner, parents))
    return tuple(parts)


def _parent_code(label: str, position: dict[str, int], prefix: str) -> object:
    if label in position:
        return position[label]
    if label.startswith(prefix):
        return _relative(label, prefix)  # the block's own parameter or buffer
    return "outside"


def _relative(address: str, prefix: str) -> str:
    return address[len(prefix) :] if address.startswith(prefix) else address
