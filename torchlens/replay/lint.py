"""Graph integrity of a :class:`~torchlens.trace.Trace`, in the spirit of ``torch.fx``'s
``Graph.lint``: one function, one message per broken invariant, each naming the record.

Validation runs it before replaying anything, and the backend conformance suite runs it on
every backend's traces, so its messages are the shared vocabulary for "this graph is wrong".
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter
from typing import Any

from torchlens.capture import ArgSlot, is_atom, slots_in_order

__all__ = ["lint", "slot_indices"]


def lint(trace: Any) -> list[str]:
    """Check a trace's graph invariants; return one message per problem (empty when sound).

    Invariants: labels are unique across ops and sources; op indices follow execution order;
    the outputs of one call are consecutive and share its function and arguments;
    every parent is a source or an earlier op (so every op is reachable from a source or is a
    parentless factory op); ``parents`` lists exactly the labels in ``parent_args``, whose
    positions are unique and match the argument templates' slots; edges are symmetric
    (``child in parent.children`` iff ``parent in child.parents``); inputs, outputs and module
    calls name existing records.

    Args:
        trace: a :class:`~torchlens.trace.Trace` (or anything with ``ops``, ``sources``,
            ``input_labels``, ``output_labels`` and ``modules``).

    Returns:
        Messages such as ``"relu_1: parent 'linear_9' is not in the trace"``; ``[]`` when the
        graph is sound.

    Example:
        >>> import torch, torchlens as tl
        >>> trace = tl.trace(torch.nn.Linear(3, 2), torch.randn(1, 3))
        >>> lint(trace)
        []
        >>> trace["linear_1"].children.append("ghost_1")
        >>> lint(trace)
        ["linear_1: child 'ghost_1' is not in the trace"]
    """
    return [] if _sound(trace) else _problems(trace)


_label = attrgetter("label")
_children = attrgetter("children")
_parents = attrgetter("parents")


def _sound(trace: Any) -> bool:
    """Whether :func:`_problems` would find nothing, decided in one lean pass (validation
    lints every trace it checks); False only means "look closer", never a problem itself.

    Edge symmetry is counted rather than walked: each op's parents are checked to list it
    as a child, so the (parent, child) pairs the ``parents`` name are among those the
    ``children`` name; with labels and parents unique, equal totals leave no other pair
    and no repeated child.
    """
    ops, sources = trace.ops, trace.sources
    labels = [*map(_label, sources), *map(_label, ops)]
    records = dict(zip(labels, (*sources, *ops)))
    if len(records) != len(labels):
        return False  # a label used twice
    seen: dict[str, Any] = dict(zip(map(_label, sources), sources))  # what may be a parent
    calls: set[int] = set()
    previous = None
    for position, op in enumerate(ops):
        label, refs, parents = op.label, op.parent_args, op.parents
        if op.index != position or type(parents) is not tuple:
            return False
        if refs:
            ref_labels, positions = zip(*refs)
            if parents != tuple(dict.fromkeys(ref_labels)) or len(set(positions)) != len(refs):
                return False
            for parent in parents:
                record = seen.get(parent)
                if record is None or label not in record.children:
                    return False  # unknown, later, itself, or not listing the op back
        elif parents:
            return False
        if op.func is not None and not slots_in_order(
            op.args_template, op.kwargs_template, len(refs)
        ):
            if _call_slots(op.args_template, op.kwargs_template) != list(range(len(refs))):
                return False
        call = op.call_index
        if previous is not None and call == previous.call_index:
            if op.func_name != previous.func_name or refs != previous.parent_args:
                return False
        elif call in calls:
            return False
        calls.add(call)
        previous = seen[label] = op
    if sum(map(len, map(_children, records.values()))) != sum(map(len, map(_parents, ops))):
        return False  # a child listed that does not list its parent back, or listed twice
    if not all(
        getattr(records.get(label), "kind", None) == "input" for label in trace.input_labels
    ):
        return False
    if not seen.keys() >= set(trace.output_labels):
        return False
    return all(seen.keys() >= {*call.inputs, *call.outputs, *call.ops} for call in trace.modules)


def _problems(trace: Any) -> list[str]:
    """Every problem of the trace, each with its message (see :func:`lint`)."""
    problems: list[str] = []
    counts = Counter([s.label for s in trace.sources] + [op.label for op in trace.ops])
    for label, n in counts.items():
        if n > 1:
            problems.append(f"{label}: label used by {n} records")
    records: dict[str, Any] = {source.label: source for source in trace.sources}
    for position, op in enumerate(trace.ops):
        if op.index != position:
            problems.append(f"{op.label}: index {op.index} but position {position}")
        problems += _parent_problems(op, records, counts)
        records[op.label] = op
    for record in records.values():
        problems += _child_problems(record, records)
    problems += _call_problems(trace.ops)
    problems += _boundary_problems(trace, records)
    return problems


def _call_problems(ops: list[Any]) -> list[str]:
    """Outputs of one call are consecutive and agree on the function and its arguments."""
    problems, seen, previous = [], set(), None
    for op in ops:
        if previous is not None and op.call_index == previous.call_index:
            if op.func_name != previous.func_name or op.parent_args != previous.parent_args:
                problems.append(
                    f"{op.label}: shares call {op.call_index} with {previous.label} but not "
                    "its function and arguments"
                )
        elif op.call_index in seen:
            problems.append(f"{op.label}: call {op.call_index} resumes after other calls")
        seen.add(op.call_index)
        previous = op
    return problems


def _parent_problems(op: Any, records: dict[str, Any], known: Counter) -> list[str]:
    """Parents exist, precede the op, agree with ``parent_args`` and the templates."""
    problems = []
    ref_labels = [ref.label for ref in op.parent_args]
    if tuple(dict.fromkeys(ref_labels)) != tuple(op.parents):
        problems.append(
            f"{op.label}: parents {list(op.parents)} disagree with parent_args {ref_labels}"
        )
    for parent in op.parents:
        if parent == op.label:
            problems.append(f"{op.label}: is its own parent")
        elif parent not in records:
            where = "a later op" if parent in known else "not in the trace"
            problems.append(f"{op.label}: parent {parent!r} is {where}")
        elif op.label not in records[parent].children:
            problems.append(f"{op.label}: parent {parent!r} does not list it as a child")
    for position, n in Counter(ref.position for ref in op.parent_args).items():
        if n > 1:
            problems.append(f"{op.label}: argument position {position!r} fed by {n} parents")
    if op.func is not None:
        slots = _call_slots(op.args_template, op.kwargs_template)
        if slots != list(range(len(op.parent_args))):
            problems.append(
                f"{op.label}: argument templates hold slots {slots} but the op has "
                f"{len(op.parent_args)} tensor arguments"
            )
    return problems


def _child_problems(record: Any, records: dict[str, Any]) -> list[str]:
    """Every listed child exists and lists the record back as a parent, once."""
    problems = []
    for child, n in Counter(record.children).items():
        if n > 1:
            problems.append(f"{record.label}: child {child!r} listed {n} times")
        target = records.get(child)
        if target is None:
            problems.append(f"{record.label}: child {child!r} is not in the trace")
        elif record.label not in getattr(target, "parents", ()):
            problems.append(f"{record.label}: child {child!r} does not list it as a parent")
    return problems


def _boundary_problems(trace: Any, records: dict[str, Any]) -> list[str]:
    """Inputs are input sources; outputs and module-call members are records."""
    problems = []
    for label in trace.input_labels:
        source = records.get(label)
        if source is None or getattr(source, "kind", None) != "input":
            problems.append(f"{label}: listed as an input but is not an input source")
    for label in trace.output_labels:
        if label not in records:
            problems.append(f"{label}: listed as an output but is not in the trace")
    for call in trace.modules:
        for label in (*call.inputs, *call.outputs, *call.ops):
            if label not in records:
                problems.append(f"{label}: named by module call {call.name} but not in the trace")
    return problems


def slot_indices(template: Any) -> list[int]:
    """The ArgSlot indices of a call template (or a part of one), in order."""
    found: list[int] = []
    _collect_slots(template, found)
    return found


def _call_slots(args: tuple, kwargs: dict) -> list[int]:
    """:func:`slot_indices` of ``(args, kwargs)``; flat templates without a walk."""
    items = [*args, *kwargs.values()] if type(args) is tuple and type(kwargs) is dict else None
    if items is None or not all(type(item) is ArgSlot or is_atom(item) for item in items):
        return slot_indices((args, kwargs))
    return [item.index for item in items if type(item) is ArgSlot]


def _collect_slots(obj: Any, found: list[int]) -> None:
    if isinstance(obj, ArgSlot):
        found.append(obj.index)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _collect_slots(item, found)
    elif isinstance(obj, slice):  # a tensor as a bound: x[:, a:b]
        for item in (obj.start, obj.stop, obj.step):
            _collect_slots(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _collect_slots(item, found)
    elif hasattr(obj, "fields") and hasattr(obj, "cls"):  # tree's dataclass template
        for item in obj.fields.values():
            _collect_slots(item, found)
