"""Layers and passes: the ops that are the same code run again, grouped after capture.

A pass over a finished :class:`~torchlens.trace.Trace`, like ``viz/repeats.py``: nothing is
added to the capture's hot path, and the grouping is computed on first use
(``trace.layers``, ``op.layer``, ``op.pass_index``), in O(ops), from what capture already
records. The rule (``docs/loops.md``):

1. Every op has a *token*: its function, which output of the call it is, and the parameters
   and buffers it reads. With ``tl.trace(source=True)`` its source line is part of the token
   when loops are looked for (step 2), not in the layer's key: an op inside ``nn.Linear``
   has the line that called the module, and a module called from two lines is one code.
2. Every op has a *scope*: the address of its innermost module call, without the call
   number (``None`` for code of the traced callable itself), and a *place* in that call's
   own body (its direct ops and nested calls, in order). The place is
   - the op's slot in the loop of that body, when the body repeats: an *anchor* occurs two
     or more times in it (a nested module called again, an op reading the same parameter
     again, or, with source lines, the same line run again), and the stretches between
     consecutive anchors are the same sequence of tokens (nested calls by class), or
     repeat with a period (an iteration that runs the anchor several times). The stretches
     of one iteration are its body (its start aligned with the ops before the first anchor
     and its end with those after the last), so the weight-free ops of a loop body line up;
   - otherwise its ordinal among the body's other ops with the same token (the 2nd
     ``relu`` of the body), so the same code in two calls of one module lines up, and the
     same function written twice in one body is two layers.
3. A layer is every op with the same (scope, place, token); its ops in execution order are
   its passes, numbered from 1. Its label is the label of its first pass; ``"layer:pass"``
   (``"linear_1:2"``) names one pass.

So a module called again (a Python loop over a cell, an RNN cell unrolled, a siamese
encoder, a layer shared across depth, the model's forward at each step of ``generate``)
gives each of its ops one layer whose passes are its calls; two modules of one class are
two addresses and never merge; the same function written twice in a body without an anchor
between never merges (two ordinals). Without source lines a loop whose body calls no module
and reads no parameter is the same record as code written out several times, and is not
folded; with ``source=True`` the repeated line is the anchor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torchlens._gc import collector_paused
from torchlens.errors import LookupFailedError

__all__ = ["Layers", "group_layers", "split_pass_key"]

_CANDIDATES = 4  # anchors tried per body before settling for the best partial alignment


class Layers(Mapping[str, tuple[Any, ...]]):
    """Layer label -> its ops in pass order; also each op's layer and pass.

    Example:
        >>> import torch, torchlens as tl
        >>> cell = torch.nn.Linear(4, 4)
        >>> trace = tl.trace(lambda x: cell(cell(x)), torch.ones(1, 4), root=cell)
        >>> {name: [op.label for op in ops] for name, ops in trace.layers.items()}
        {'linear_1': ['linear_1', 'linear_2']}
    """

    def __init__(self, groups: dict[str, tuple[Any, ...]]) -> None:
        self._groups = groups
        # op label -> layer label, and -> pass for ops of later passes (strs and ints: no
        # per-op object for the garbage collector to walk)
        self._layer: dict[str, str] = {}
        self._pass: dict[str, int] = {}
        for name, ops in groups.items():
            if len(ops) == 1:
                self._layer[name] = name
            else:
                for i, op in enumerate(ops, 1):
                    self._layer[op.label] = name
                    if i > 1:
                        self._pass[op.label] = i

    def of(self, label: str) -> tuple[str, int]:
        """``(layer label, pass)`` of the op ``label``."""
        return self._layer[label], self._pass.get(label, 1)

    def __getitem__(self, name: str) -> tuple[Any, ...]:
        ops = self._groups.get(name)
        if ops is None:
            raise LookupFailedError(f"no layer {name!r}; layers are named by their first op")
        return ops

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def repeated(self) -> dict[str, int]:
        """Layers of two or more passes, with their pass counts, in order of first pass."""
        return {name: len(ops) for name, ops in self._groups.items() if len(ops) > 1}

    def find(self, key: str) -> Any:
        """The op that ``"layer:pass"`` names, or ``None`` when ``key`` is no such name.

        Raises:
            LookupFailedError: ``not_found`` for a layer that has fewer passes.
        """
        name, number = split_pass_key(key)
        ops = self._groups.get(name) if number is not None else None
        if ops is None:
            return None
        if not 1 <= number <= len(ops):
            raise LookupFailedError(
                f"layer {name!r} has {len(ops)} pass(es), numbered from 1; {key!r} is not one"
            )
        return ops[number - 1]


def split_pass_key(key: str) -> tuple[str, int | None]:
    """``"linear_1:2"`` -> ``("linear_1", 2)``; ``(key, None)`` without a pass number."""
    name, sep, number = key.rpartition(":")
    if sep and number.isdigit():
        return name, int(number)
    return key, None


def group_layers(trace: Any) -> Layers:
    """Group the ops of ``trace`` into layers (the rule is in this module's docstring).

    Args:
        trace: a finished :class:`~torchlens.trace.Trace`.

    Returns:
        The :class:`Layers`, in order of each layer's first pass.
    """
    with collector_paused():
        held = {s.label for s in trace.sources if s.kind in ("parameter", "buffer")}
        types = {m.address: m.module_type for m in trace.modules}
        numbered: dict[tuple, int] = {}
        bodies = _bodies(trace.ops, held, types, numbered)
        tokens = _Tokens(numbered)
        code = tokens.code
        groups: dict[tuple, list[Any]] = {}
        seen: dict[tuple[int, ...], list[tuple]] = {}  # the places of a body, by its tokens
        for call, (items, ids) in bodies.items():
            scope = call[0] if call else None
            places = _ONE
            if len(ids) > 1:  # each call of a cell runs the same tokens: worked out once
                run = tuple(ids)
                places = seen.get(run)
                if places is None:
                    places = seen[run] = _places(ids, tokens)
            for item, place, token in zip(items, places, ids):
                if item is not None:  # an op, not a nested call
                    key = (scope, place, code[token])
                    group = groups.get(key)
                    if group is None:
                        groups[key] = [item]
                    else:
                        group.append(item)
        ordered = sorted(groups.values(), key=lambda ops: ops[0].index)
        return Layers({ops[0].label: _in_order(ops) for ops in ordered})


def _in_order(ops: list[Any]) -> tuple[Any, ...]:
    if len(ops) == 1:
        return (ops[0],)
    indices = [op.index for op in ops]
    if indices == sorted(indices):  # the calls of one scope run one after another
        return tuple(ops)
    return tuple(sorted(ops, key=lambda op: op.index))  # a module that calls itself


class _Tokens:
    """Each distinct token as a small int, and what the rule asks of it by that int.

    Tokens are compared, counted and hashed per op; as ints that is cheap. The token
    without its source line (the layer's key) is worked out once per token; the anchor
    kind and the call's class only for the bodies that repeat.
    """

    def __init__(self, ids: dict[tuple, int]) -> None:
        """Take over ``ids`` (token -> its int, numbered from 0 in order of insertion)."""
        self.ids = ids
        self.tuples: list[tuple] = list(ids)  # int -> token
        self.code: list[int] = list(range(len(ids)))  # int -> its token without the line
        self._alike: dict[int, int] = {}  # int -> the int a stretch compares (see alike)
        for token in [token for token in self.tuples if len(token) > 4]:  # source lines
            self.code[ids[token]] = self.add(token[:4])

    def add(self, token: tuple) -> int:
        """The int of ``token``, registered on first sight."""
        number = self.ids.get(token)
        if number is None:
            number = self.ids[token] = len(self.tuples)
            self.tuples.append(token)
            self.code.append(number)
            if len(token) > 4:  # an op with its source line
                self.code[number] = self.add(token[:4])
        return number

    def kind(self, number: int) -> int:
        """How strongly a recurring token marks an iteration: 0 a nested call, 1 an op that
        reads parameters, 2 an op with a source line, 3 none (never an anchor)."""
        token = self.tuples[number]
        if token[0] == "call":
            return 0
        return 1 if token[3] else 2 if len(token) > 4 else 3

    def alike(self, ids: list[int]) -> list[int]:
        """``ids`` as stretches compare them: a nested call by its class, an op as itself."""
        found, out = self._alike, []
        for number in ids:
            same = found.get(number)
            if same is None:
                token = self.tuples[number]
                same = self.add(("class", token[2])) if token[0] == "call" else number
                found[number] = same
            out.append(same)
        return out


def _bodies(
    ops: Sequence[Any], held: set[str], types: Mapping[str, str], ids: dict[tuple, int]
) -> dict[tuple, tuple[list, list[int]]]:
    """Each call's own body, by the call (its ``(address, call number)``, ``()`` for the
    traced callable's own code): ``(items, tokens)``, the items its direct
    ops and ``None`` for each nested call, in order, with their tokens' ints (a nested
    call's token is ``("call", address, class name)``); ``ids`` gets each token's int, in
    order of first sight."""
    bodies: dict[tuple, tuple[list, list[int]]] = {}
    previous: tuple = ()
    items, numbers = bodies[()] = ([], [])
    for op in ops:
        stack = op.module_stack
        if stack != previous:
            common = len(stack)  # calls still running (a call never resumes once left)
            while common and stack[common - 1] not in bodies:
                common -= 1
            for depth in range(common, len(stack)):  # the calls entered here
                caller = stack[depth - 1] if depth else ()
                outer = bodies.setdefault(caller, ([], []))
                address = stack[depth][0]
                entered = ("call", address, types.get(address, ""))
                outer[0].append(None)
                outer[1].append(ids.setdefault(entered, len(ids)))
            previous = stack
            call = stack[-1] if stack else ()  # one call of a module: one stack
            items, numbers = bodies.setdefault(call, ([], []))
        parents = op.parents
        reads = () if held.isdisjoint(parents) else tuple([p for p in parents if p in held])
        token = ("op", op.func_name, op.output_index, reads)
        where = op.meta.get("source") if op.meta else None
        if where is not None:
            token = (*token, (where[0], where[1]))
        items.append(op)
        numbers.append(ids.setdefault(token, len(ids)))
    if not bodies[()][0]:
        del bodies[()]
    return bodies


def _places(ids: list[int], tokens: _Tokens) -> list[tuple]:
    """The place of each item of one body: its slot in the body's loop, or its ordinal
    among the items of the same token."""
    places: list[tuple | None] = [None] * len(ids)
    anchor, slots = _find_loop(ids, tokens) if len(set(ids)) < len(ids) else (None, {})
    for i, slot in slots.items():
        places[i] = ("loop", anchor, slot)
    seen: dict[int, int] = {}
    code = tokens.code
    for i, token in enumerate(ids):
        if places[i] is None:  # counted without the line: ops of a module called from two
            key = code[token]  # lines are the same code (the line is the caller's)
            seen[key] = number = seen.get(key, 0) + 1
            places[i] = _ATS[number] if number < len(_ATS) else ("at", number)
    return places  # type: ignore[return-value]


_ATS = [("at", n) for n in range(64)]  # one object for the small ordinals most ops have
_ONE = (_ATS[1],)


def _anchors(ids: list[int], tokens: _Tokens) -> list[int]:
    """Tokens that mark an iteration when they recur: a nested call's address, an op that
    reads parameters, an op with a source line; most frequent first within each kind."""
    counts = Counter(ids)
    kind = {t: tokens.kind(t) for t, n in counts.items() if n > 1}
    found = [t for t, k in kind.items() if k < 3]
    if not found:  # repeated weight-free ops only: no loop
        return []
    first: dict[int, int] = {}
    for i, token in enumerate(ids):
        first.setdefault(token, i)
    return sorted(found, key=lambda t: (kind[t], -counts[t], first[t]))[:_CANDIDATES]


def _find_loop(ids: list[int], tokens: _Tokens) -> tuple[int | None, dict[int, object]]:
    """The anchor that lines up the most items, and item position -> slot in the loop
    body for it; ``(None, {})`` when the body has no anchor."""
    best: tuple[int | None, dict[int, object]] = (None, {})
    alike = tokens.alike(ids)
    for anchor in _anchors(ids, tokens):
        slots = _align(ids, alike, anchor)
        if len(slots) > len(best[1]):
            best = (anchor, slots)
    return best


def _align(ids: list[int], alike: list[int], anchor: int) -> dict[int, object]:
    """Slots of the items that line up across the iterations that ``anchor`` marks.

    An iteration may hold the anchor several times (a loop over steps calling one cell
    three times a step): the stretches between anchors then repeat with a period, and an
    item's slot is its stretch's phase in that period and its place in the stretch.
    Stretches compare ``alike``: nested calls by class, so a step may call its own norm
    (norm1_0, norm1_1, ...) around shared code whose ops still line up; the calls' own ops
    are keyed by address, so those modules never merge.
    """
    at = [i for i, token in enumerate(ids) if token == anchor]
    gaps = [tuple(alike[a + 1 : b]) for a, b in zip(at, at[1:])]
    period = _period(gaps)
    if period:
        wrap, complete = gaps[period - 1], len(at) % period == 0
        same = [True] * len(gaps)
    else:  # irregular: line up the stretches like the most common one
        period, wrap, complete = 1, Counter(gaps).most_common(1)[0][0], True
        same = [gap == wrap for gap in gaps]
    slots: dict[int, object] = {i: ("anchor", n % period) for n, i in enumerate(at)}
    for n, (a, gap) in enumerate(zip(at, gaps)):
        if same[n]:
            slots.update({a + 1 + j: (n % period, j) for j in range(len(gap))})
    before, after = alike[: at[0]], alike[at[-1] + 1 :] if complete else []
    tail, _, head = _cut(wrap, before, after)
    m, last = len(wrap), period - 1
    slots.update({at[-1] + 1 + j: (last, j) for j in range(tail)})  # the last iteration's tail
    slots.update({at[0] - (m - j): (last, j) for j in range(m - head, m)})  # the first's head
    return slots


_PERIODS = 8  # anchors per iteration looked for


def _period(gaps: list[tuple]) -> int:
    """The fewest anchors per iteration such that the stretches repeat exactly (``1``: all
    alike); ``0`` when they do not repeat with any period up to :data:`_PERIODS`."""
    for period in range(1, min(_PERIODS, len(gaps) // 2) + 1):
        if all(gaps[i] == gaps[i + period] for i in range(len(gaps) - period)):
            return period
    return 1 if len(gaps) == 1 else 0


def _cut(template: tuple, before: list[int], after: list[int]) -> tuple[int, int, int]:
    """Where an iteration's tail (the items after its anchor) ends and the next one's head
    begins, chosen so that the most items line up: the code after the loop starting with
    the tail, the code before it ending with the head (the first step may lack part of it).

    Returns:
        ``(tail items matched after the loop, cut, head items matched before it)``.
    """
    m = len(template)
    same = 0  # how far the code after the loop follows the template
    while same < min(m, len(after)) and after[same] == template[same]:
        same += 1
    back = 0  # how far the code before the loop ends like the template
    while back < min(m, len(before)) and before[-1 - back] == template[-1 - back]:
        back += 1
    best = (0, 0, 0)
    for cut in range(m + 1):
        tail, head = min(same, cut), min(back, m - cut)
        if tail + head > best[0] + best[2]:
            best = (tail, cut, head)
    return best
