"""Replay as an interpreter over a trace, in the manner of ``torch.fx.Interpreter``.

:class:`Interpreter` walks the trace one recorded call at a time (the outputs of a
multi-output call are replayed together) and re-executes a call from values it is handed,
with one method per kind of op: ordinary calls, stochastic calls (the op's RNG snapshot is
restored around them, including a generator the call was handed) and ``refresh`` ops
(writes through other views, redone in order from the writers' recorded geometry). A call
recorded inside an autocast region runs under it again; a ``torch.autograd.grad`` (or
``Tensor.backward``) call is re-made by differentiating its recorded sub-graph
(:mod:`~torchlens.replay.grad_replay`). :class:`Checker` is the small variation that
validation runs: per-op replay from saved parent values, each call then handed to the
perturbation arm (:mod:`torchlens.replay.edges`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import Any

import torch

from torchlens._tensors import write_through
from torchlens.capture import (
    SETTLES,
    SPECIAL_OUTPUTS,
    UNSEEN_META,
    ArgSlot,
    autocast_applied,
    fill,
    flatten,
    is_atom,
    reapply,
    rng,
    slots_in_order,
)
from torchlens.errors import DistributedError, PayloadUnavailableError
from torchlens.replay.edges import EdgeProver
from torchlens.replay.exemptions import MAY_BE_UNINITIALIZED, may_write_arguments, value_exempt
from torchlens.replay.grad_replay import GRAD_FUNCS, differentiate, unseen_verdicts
from torchlens.replay.tolerances import mismatch
from torchlens.replay.written_over import MadeRefreshes

__all__ = ["Interpreter", "Checker", "Unreplayable", "calls", "settle_of", "LOCKSTEP", "RESTORES"]

# Calls that every process of a distributed run must rerun together (collectives):
# function -> ``check(op)``, run before each rerun of ``op``; it raises a typed error when
# the processes are not at the same call, instead of letting one wait on the others.
# Filled by ``torchlens.distributed``.
LOCKSTEP: dict[Any, Callable[[Any], None]] = {}
# Calls whose recorded arguments hold plain stand-ins for live objects (a collective's
# process group, kept by name and ranks: see torchlens.distributed.release): function ->
# ``restore(args, kwargs) -> (args, kwargs)`` with the live objects back, before each rerun.
RESTORES: dict[Any, Callable[[tuple, dict], tuple[tuple, dict]]] = {}

Tensor = torch.Tensor


class Unreplayable(Exception):
    """A recorded call that cannot be re-executed (no function, no geometry...)."""


def calls(trace: Any) -> Iterator[list[Any]]:
    """The trace's ops grouped by the function call that produced them, in order."""
    for _, group in groupby(trace.ops, key=attrgetter("call_index")):
        yield list(group)


class Interpreter:
    """Re-executes recorded calls. Subclasses override :meth:`visit`."""

    def __init__(self, trace: Any) -> None:
        self.trace = trace
        # id(op) -> (op, its call runner); holding the op keeps its id from being reused
        self._runners: dict[int, tuple[Any, Callable[[list[Tensor]], list[Tensor]]]] = {}

    def run(self) -> None:
        """Visit every recorded call in execution order, with the caller's autocast off: a
        call recorded outside autocast (or in an ``enabled=False`` region) runs as it ran,
        and one recorded inside runs under its own recorded state (:meth:`execute`)."""
        with autocast_applied(None):
            for ops in calls(self.trace):
                self.visit(ops)

    def visit(self, ops: list[Any]) -> None:
        raise NotImplementedError

    # labels of ops whose value an edit replaced (a what-if rerun): a gradient the forward
    # took through one cannot be re-made from the recorded graph (grad_replay.py)
    edited: list[str] | tuple[str, ...] = ()

    def parent_values(self, op: Any) -> list[Tensor]:
        """Saved values of the op's tensor arguments, slot order; raises if one is missing."""
        return [self.trace[ref.label].out for ref in op.parent_args]

    def value(self, label: str) -> Tensor:
        """The value this interpreter holds for ``label``: the saved one (a what-if rerun
        holds the values its edits changed)."""
        return self.trace[label].out

    def execute(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        """Run the call that produced ``op`` on ``values``; returns all its output tensors.

        A call recorded inside an autocast region runs under the same autocast state.
        """
        autocast = op.meta.get("autocast")
        if autocast is not None:
            with autocast_applied(autocast):
                return self._execute(op, values)
        return self._execute(op, values)

    def _execute(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        if op.func is None:
            if op.func_name == "refresh":
                return self.execute_refresh(op, values)
            raise Unreplayable(f"no function was recorded for {op.func_name!r}")
        if op.func in GRAD_FUNCS:  # re-made from its recorded sub-graph
            return differentiate(self, op, values)
        if op.rng_state is not None:
            return self.execute_stochastic(op, values)
        return self.execute_call(op, values)

    def execute_call(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        return self.call_runner(op, values)(values)

    def call_runner(
        self, op: Any, values: list[Tensor] | None = None
    ) -> Callable[[list[Tensor]], list[Tensor]]:
        """``op``'s call as a function of its tensor values, made once per op (argument
        fillers, special outputs): most calls are re-run several times."""
        known = self._runners.get(id(op))
        if known is not None:
            return known[1]
        run = self._make_runner(op)
        if op.func_name in READS_REQUIRES_GRAD:
            parents = [self.trace[ref.label] for ref in op.parent_args]
            flags = [getattr(parent, "requires_grad", False) for parent in parents]
            if any(flags) and _grad_flags_matter(op.func_name, parents, values):
                run = _with_grad_flags(run, flags)
        self._runners[id(op)] = (op, run)
        return run

    def _make_runner(self, op: Any) -> Callable[[list[Tensor]], list[Tensor]]:
        func, special = op.func, SPECIAL_OUTPUTS.get(op.func_name)
        args_template, kwargs_template = op.args_template, op.kwargs_template
        n = len(op.parent_args)
        settle = settle_of(func)
        if settle is not None:  # (a collective: each rerun waits for what it writes)
            func = _settled(func, settle, LOCKSTEP.get(func), op, RESTORES.get(func))
        if special is None and slots_in_order(args_template, kwargs_template, n):
            return _flat_runner(func, args_template[n:], kwargs_template)
        fill_args, fill_kwargs = _filler(args_template), _filler(kwargs_template)

        def run(values: list[Tensor]) -> list[Tensor]:
            args = fill_args(values)
            result = func(*args, **fill_kwargs(values))
            if special is None:
                return [result] if type(result) is Tensor else _tensors_of(result)
            return [tensor for _, tensor in special(args, result)]

        return run

    def execute_stochastic(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        with rng.restored(op.rng_state), _own_generator(op):
            return self.execute_call(op, values)

    def execute_refresh(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        """Redo writes made through other views: the stale value, then each writer's, in
        the order they were made."""
        if len(op.parent_args) < 2:
            raise Unreplayable("the tensor changed without a recorded writer")
        base = op.meta.get("geometry")
        regions = [self.trace[ref.label].meta.get("geometry") for ref in op.parent_args[1:]]
        if base is None or any(region is None for region in regions):
            raise Unreplayable("no storage geometry was recorded for this write")
        stale, written = values[0], values[1:]
        if any(value.dtype != stale.dtype for value in written):
            raise Unreplayable("the write reinterpreted the storage as another dtype")
        return [write_through(stale, list(zip(written, regions)), base)]


def settle_of(func: Any) -> Callable[[Any], None] | None:
    """What waits for a call of ``func`` to finish writing (a collective's: ``SETTLES``)."""
    try:
        return SETTLES.get(func)
    except TypeError:  # unhashable
        return None


def _settled(
    func: Callable[..., Any],
    settle: Callable[[Any], None],
    check: Callable | None,
    op: Any,
    restore: Callable | None = None,
) -> Callable[..., Any]:
    """``func`` that first checks that every process reruns it too (``LOCKSTEP``), and
    returns once what it writes is written (``SETTLES``); its arguments' stand-ins made
    live again first (``RESTORES``)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if restore is not None:
            args, kwargs = restore(args, kwargs)
        if check is not None:
            check(op)
        result = func(*args, **kwargs)
        settle(result)
        return result

    return call


def _flat_runner(func: Callable[..., Any], rest: tuple, kwargs: dict) -> Callable:
    """The call runner of a flat call (see :func:`~torchlens.capture.tree.slots_in_order`):
    the tensors go in as the first positional arguments, nothing is filled."""

    def run(values: list[Tensor]) -> list[Tensor]:
        result = func(*values, *rest, **kwargs)
        return [result] if type(result) is Tensor else _tensors_of(result)

    def run_bare(values: list[Tensor]) -> list[Tensor]:
        result = func(*values)
        return [result] if type(result) is Tensor else _tensors_of(result)

    return run if rest or kwargs else run_bare


# Functions whose kernel choice reads requires_grad of an argument, even under no_grad:
# on CPU, scaled_dot_product_attention takes another kernel for a mask that requires grad
# (a learned position bias, a Parameter), and matmul (so linear on 3-d inputs) folds a
# batched product into one mm only when no operand needs a gradient; the paths round
# differently (by an ulp in float32, more in half precision)
READS_REQUIRES_GRAD = frozenset({"scaled_dot_product_attention", "matmul", "linear"})


def _grad_flags_matter(name: str, parents: list[Any], values: list[Tensor] | None) -> bool:
    """Whether the kernel ``name`` takes at the recorded values can depend on
    ``requires_grad`` (flagging costs a little at every run of the call, which the
    perturbation arm makes many times). matmul folds a batched operand into one mm
    anyway when its leading dimensions are laid out contiguously, and linear reaches
    matmul only for such an input that is not (aten's should_fold and linear)."""
    if name not in ("matmul", "linear") or len(parents) < 2:
        return True
    try:  # the values the call is made with first (the recorded ones), else the saved
        a, b = values[:2] if values else (parents[0].out, parents[1].out)
    except Exception:  # noqa: BLE001 - a value not at hand (rerun): flag, to be safe
        return True
    if name == "linear":
        return a.dim() >= 3 and not _leading_contiguous(a)
    if a.dim() < b.dim():
        return b.dim() >= 3 and a.dim() <= 2  # (folded transposed: not worked out here)
    if not (a.dim() >= 3 and b.dim() <= 2):
        return False  # a batched product: no folding question
    return not (a.numel() == 0 or _leading_contiguous(a))  # else folded whatever the flag


def _leading_contiguous(t: Tensor) -> bool:
    """Whether ``t.view(-1, t.size(-1))`` needs no copy (its leading dimensions are laid
    out one after another)."""
    shape, stride = t.shape, t.stride()
    return all(stride[i] == stride[i + 1] * shape[i + 1] for i in range(t.dim() - 2))


def _with_grad_flags(run: Callable, flags: list[bool]) -> Callable:
    """``run`` given its values with ``requires_grad`` as the recorded parents had it.

    A call is run many times (each probe moves one argument): the flagged alias of the
    last value seen at each position is kept, so the unmoved ones are not made again.
    """
    positions = [i for i, flag in enumerate(flags) if flag]
    last: list[tuple[Tensor, Tensor] | None] = [None] * len(flags)

    def flagged(values: list[Tensor]) -> list[Tensor]:
        values = list(values)
        for i in positions:
            value = values[i]
            kept = last[i]
            if kept is not None and kept[0] is value:
                values[i] = kept[1]
            elif not value.requires_grad and value.is_floating_point():
                alias = value.detach().requires_grad_()
                last[i] = (value, alias)
                values[i] = alias
        return run(values)

    flagged.unflagged = run  # for points where kernel parity with the capture is moot
    return flagged


def _tensors_of(result: Any) -> list[Tensor]:
    """The output tensors of a call that did not return one plain tensor."""
    return [tensor for _, tensor in flatten(result)[0]]


Filler = Callable[[list[Tensor]], Any]
_first = itemgetter(0)  # an ArgRef's label


def _filler(template: Any) -> Filler:
    """``values -> fill(template, values)``; a flat tuple or dict of tensors and plain values
    (the usual call) is filled by position, without walking the template again."""
    kind = type(template)
    if kind is tuple:
        items = enumerate(template)
    elif kind is dict:
        items = template.items()
    else:
        return lambda values: fill(template, values)
    slots = []
    for key, item in items:
        if type(item) is ArgSlot:
            slots.append((key, item.index))
        elif not is_atom(item):  # nested: the general walk
            return lambda values: fill(template, values)
    if not slots:
        return lambda values: template
    make = list if kind is tuple else dict

    def filled(values: list[Tensor]) -> Any:
        out = make(template)
        for key, index in slots:
            out[key] = values[index]
        return out

    return filled


def _call_kind(op: Any) -> str:
    """``"copies"`` when the call may write into its arguments (they are copied first),
    ``"plain"`` when :meth:`Interpreter.execute` would only call the function, else
    ``"other"`` (stochastic, autocast, refresh and unreplayable calls). A refresh writes
    into a scratch copy of its own (:func:`write_through`), never into its arguments."""
    if op.func is None and op.func_name == "refresh" and not op.is_inplace:
        return "other"
    if op.is_inplace or op.func is None or may_write_arguments(op):
        return "copies"
    special = op.func in GRAD_FUNCS or op.rng_state is not None
    return "other" if special or op.meta.get("autocast") is not None else "plain"


def _written_slots(op: Any) -> frozenset[int] | None:
    """The argument slots an in-place call writes (its target, first; ``out=``), which
    replay copies first; None (copy every argument) for a call that may write others
    (:func:`~torchlens.replay.exemptions.may_write_arguments`, side writes), or whose
    target came by another keyword. A read-only argument is handed as saved: the call
    cannot reach it."""
    if not op.is_inplace or op.func is None or may_write_arguments(op):
        return None
    if op.func_name in SPECIAL_OUTPUTS and op.func_name != "setitem":
        return None
    written = frozenset(i for i, ref in enumerate(op.parent_args) if _is_target(ref[1]))
    return written or None  # (a target passed by another keyword: copy them all)


def _is_target(position: str) -> bool:
    """Whether an argument at ``position`` is an in-place call's target: the first
    argument (or a tensor in a first-argument list, ``_foreach_add_``), or ``out=``."""
    head = position.split(".", 1)[0]
    return head == "0" or head == "out"


def _own_generator(op: Any) -> Any:
    """The recorded state put on the ``torch.Generator`` the call was handed, if any."""
    return rng.generator_restored(op.rng_state, op.args_template, op.kwargs_template)


class Checker(Interpreter):
    """Per-op replay of every call, each call then handed to the perturbation arm
    (:class:`~torchlens.replay.edges.EdgeProver`); findings go to a ``Findings``."""

    def __init__(self, trace: Any, findings: Any, atol: float | None, rtol: float | None):
        super().__init__(trace)
        self.findings = findings
        self.atol, self.rtol = atol, rtol
        self.edges = EdgeProver(self)
        # whether any op was edited by intervene= (reapply has nothing to do otherwise)
        self._edited = any(op.meta.get("intervened") for op in trace.ops)
        # id(op) -> (op, how run_call runs it, its call runner when that is all it takes)
        self._kinds: dict[int, tuple] = {}
        # label -> saved value, read once: an op's value is read to compare its replay, then
        # again as a parent of each child (the store checks its version at every read, and
        # nothing writes into saved values while this runs: see run_call)
        self._saved: dict[str, Tensor] = {}
        self._made = MadeRefreshes(trace, self._saved)

    def run(self) -> None:
        """Check every call; the caller's RNG state is put back once, at the end."""
        with rng.restored(rng.snapshot()), autocast_applied(None):  # (finish too)
            super().run()
            self.edges.finish()

    def run_call(
        self, op: Any, values: list[Tensor], skip: set[int] = frozenset(), sliced: bool = False
    ) -> list:
        """The call's outputs on ``values``, copying first any value it may write into
        (except those at ``skip``, fresh values already), so saved values stay as saved.

        ``sliced``: a point of the perturbation arm's own (both its baseline and its probes
        run so), where matching the capture's kernel does not matter: the arguments go
        without the ``requires_grad`` flags that would pick it (see READS_REQUIRES_GRAD).
        """
        known = self._kinds.get(id(op))
        if known is None:  # the op is held, so its id is not reused while this runs
            kind = _call_kind(op)
            if kind == "plain":
                known = (op, kind, self.call_runner(op, values))
            else:  # (for "copies": the slots copied, None for all)
                known = (op, kind, None, _written_slots(op) if kind == "copies" else None)
            self._kinds[id(op)] = known
        plain = known[2]
        if plain is not None:  # most calls: straight to the function
            if sliced:
                plain = getattr(plain, "unflagged", plain)
            return plain(values)
        if known[1] == "copies":
            written = known[3]
            values = [
                v if i in skip or (written is not None and i not in written) else v.clone()
                for i, v in enumerate(values)
            ]
        return self.execute(op, values)

    def parent_values(self, op: Any) -> list[Tensor]:
        saved = self._saved
        try:
            return list(map(saved.__getitem__, map(_first, op.parent_args)))
        except KeyError:  # not read yet: a source, or a parent whose replay did not run
            pass
        for label in map(_first, op.parent_args):
            if label not in saved:
                saved[label] = self.trace[label].out
        return list(map(saved.__getitem__, map(_first, op.parent_args)))

    def execute_stochastic(self, op: Any, values: list[Tensor]) -> list[Tensor]:
        rng.restore(op.rng_state)  # no need to save the state between calls: see run()
        with _own_generator(op):
            return self.execute_call(op, values)

    def visit(self, ops: list[Any]) -> None:
        head, record = ops[0], self.findings
        if head.func is None and head.func_name == "refresh" and self._made_as_recorded(head):
            return
        unseen = head.meta.get(UNSEEN_META) if head.func is None else None
        if unseen is not None and not unseen["rerun"]:  # made out of sight, no function
            return unseen_verdicts(ops, self.findings)
        try:
            values = self.parent_values(head)
            baseline = self.run_call(head, values)
            # intervene= edits, as captured
            edited = reapply(self.trace, ops, baseline) if self._edited else baseline
        except (PayloadUnavailableError, Unreplayable) as err:
            for op in ops:
                record.unchecked(op.label, "replay", f"could not replay: {err}")
                record.unchecked(op.label, "perturbation", "needs a replayable call")
            return
        except DistributedError:  # the ranks are out of step: every one must stop
            raise
        except Exception as err:  # the recorded call does not run on its recorded inputs
            for op in ops:
                record.fail(op.label, "replay", f"replaying raised {type(err).__name__}: {err}")
            return
        for op in ops:
            self._compare(op, edited, values)
        self.edges.prove(ops, values, baseline)

    def _made_as_recorded(self, op: Any) -> bool:
        """Check a refresh whose saved value the store makes by redoing its recorded writes
        (see :mod:`~torchlens.replay.written_over`): when the recipe is the op's record as
        it stands, the value made is its replay. False: replay it as any call."""
        recipe = self._made.recipe(op)
        if recipe is None:
            return False
        try:
            value, values = self._made.value(op, recipe)
        except PayloadUnavailableError:
            return False  # (the replay says which value is missing)
        self.findings.replayed(op.label)
        self.edges.prove([op], values, [value])
        return True

    # -- arm 2: per-op replay -------------------------------------------------------------
    def _compare(self, op: Any, outputs: list[Tensor], parents: list[Tensor]) -> None:
        if op.output_index >= len(outputs):
            self.findings.fail(op.label, "replay", f"the call gave {len(outputs)} outputs")
            return
        actual = outputs[op.output_index]
        if op.func_name in MAY_BE_UNINITIALIZED and value_exempt(op, parents, actual):
            problem = None  # its shape and dtype only, without a pass over the values
            if tuple(actual.shape) != tuple(op.shape):
                problem = f"shape {tuple(actual.shape)} but recorded {tuple(op.shape)}"
            elif actual.dtype != op.dtype:
                problem = f"dtype {actual.dtype} but recorded {op.dtype}"
        else:
            try:
                expected = self._saved[op.label] = op.out
            except PayloadUnavailableError as err:
                self.findings.unchecked(op.label, "replay", f"no saved value: {err}")
                return
            problem = mismatch(actual, expected, self.atol, self.rtol)
        if problem:
            self.findings.fail(op.label, "replay", problem)
        else:
            self.findings.replayed(op.label)
