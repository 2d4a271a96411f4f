"""The lean function mode behind ``tl.record``: count every op, do work only for matches.

Labels are counted by the same :class:`~torchlens.capture.labels.Labeler` as
:class:`~torchlens.capture.builder.TraceBuilder` counts them (same names from
:func:`~torchlens.capture.naming.func_info`, one counter per name, ``:k`` for the outputs of
multi-output calls), and a value changed behind the capture's back is counted as the
``refresh`` op a trace records (:class:`~torchlens.capture.live.LiveVersions`), so a label
and an index mean the same op in a recording and in a trace. Nothing else is kept for an
unmatched op: no graph, no parents, no argument templates.

The per-op path is ordered by cost. A function name that no rule can match (see
:attr:`~torchlens.selectors.Selector.func_names`) is dismissed with one dict lookup; for rules
that depend only on names and module addresses the answer is remembered per module path;
only the rest build an :class:`~torchlens.recording.OpView` to ask.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torchlens.capture.builder import REFRESH_FUNC_NAME
from torchlens.capture.composite import group_address, opened_body
from torchlens.capture.controls import (
    Controls,
    Halt,
    Intervention,
    apply_edit,
    original_key,
    run_after_halt,
)
from torchlens.capture.escapes import escaped_tensors
from torchlens.capture.failures import note_model_error
from torchlens.capture.hooks import ModuleTracker, _call_inputs, _tensors_in
from torchlens.capture.labels import Labeler
from torchlens.capture.live import LiveEntry, LiveVersions, SeenByRecord, same_value
from torchlens.capture.mode import _read_arguments, functorch_level, inplace_targets
from torchlens.capture.naming import FUNC_INFOS, func_info
from torchlens.capture.payloads import PayloadKeeper
from torchlens.capture.record_exit import ExitTracker
from torchlens.capture.roots import Root, resolve_root
from torchlens.capture.special import SETTLES, SPECIAL_OUTPUTS
from torchlens.capture.tree import ATOMS, fill, flatten, flatten_call
from torchlens.capture.unseen import record_unseen
from torchlens.recording import OpView
from torchlens.selectors import Selector
from torchlens.trace import MemoryPayloadStore

__all__ = ["RecordMode"]

Tensor = torch.Tensor
_UNSEEN = object()
_thread_id = threading.get_ident
_Parameter = nn.Parameter
_no_torch_function = torch._C.DisableTorchFunction
_all_atoms = ATOMS.issuperset  # (of types: one C call for a tuple's items)


class _Plan:
    """The rules that may match one function name: save, edits and stop, and whether their
    answers depend only on the name and the module path."""

    __slots__ = ("save", "edits", "stop", "static", "counts")

    def __init__(
        self,
        name: str,
        save: Selector | None,
        edits: list[tuple[int, Selector, Intervention]],
        stop: Selector | None,
    ) -> None:
        self.save, self.edits, self.stop = save, edits, stop
        rules = [s for s in (save, stop) if s is not None] + [s for _, s, _ in edits]
        self.static = all(s.static for s in rules)
        calls = [s.call_labels for s in rules]  # the calls any rule can match; None: any
        # the counts of this name's calls they name (linear_3 -> 3): checked per op
        self.counts: frozenset[int] | None = None
        if None not in calls:
            head = f"{name}_"
            self.counts = frozenset(
                int(label[len(head) :])
                for label in frozenset().union(*calls)
                if label.startswith(head) and label[len(head) :].isdigit()
            )

    def decide(self, view: OpView) -> tuple[bool, tuple[int, ...], bool] | None:
        """``(save, edit indices, stop)`` for one op, or ``None`` when nothing applies."""
        save = self.save is not None and self.save.matches(view)
        edits = tuple(i for i, sel, _ in self.edits if sel.matches(view))
        stop = self.stop is not None and self.stop.matches(view)
        return (save, edits, stop) if save or edits or stop else None


class RecordMode(TorchFunctionMode):
    """Counts ops like the full capture and keeps only what :class:`Controls` selects.

    It is the counting every recording policy shares; what a policy does with the ops lies
    in four methods a subclass may override (``find_nonfinite``'s mode does): :meth:`plan_for`
    (which ops of a function name it looks at), :meth:`act` (what it does with one),
    :meth:`before_write` (before a call writes in place) and :meth:`refreshed` (an op the
    capture counts itself). Labels, indices and module calls stay the capture's.

    Args:
        controls: the parsed ``save=``, ``intervene=`` and ``stop_after=``.
        clone: copy each kept value at once instead of aliasing it and copying only before
            an in-place write (the default, cheaper when few values are overwritten).
    """

    def __init__(self, controls: Controls, clone: bool = False) -> None:
        super().__init__()
        self.controls = controls
        self.clone = clone
        self.payloads = PayloadKeeper(MemoryPayloadStore())  # the values kept, as a trace's
        self.store = self.payloads.store
        self.kept: list[OpView] = []
        self.kept_views: dict[str, OpView] = {}  # the same, by label
        self.labeler = Labeler()  # as tl.trace counts labels
        self.counts = self.labeler.counts
        self._reserved = self.labeler.reserved  # (the same set, filled by reserve())
        # which live tensor holds which version: refreshes and values made out of sight
        self.live = LiveVersions(self._refresh, self._unseen)
        self._inputs: list[int] = []  # ids of the forward's input tensors
        self.n_ops = 0
        self.tracker = ModuleTracker()  # its module calls (install_hooks)
        self._plans: dict[str, _Plan | None] = {}
        self._memo: dict[tuple[str, int], Any] = {}
        # the open calls as (address, call number), outermost first; the class name of the
        # innermost (the root's outside every call); and for each open call, the three as
        # they were before it, to pop back to in one step
        self._frames: tuple[tuple[str, int], ...] = ()
        self._type = ""
        self._path = 0  # id of the current module address path, for the memo
        self._trail: list[tuple[tuple[tuple[str, int], ...], str, int]] = []
        self._paths_needed = any(rule.static for rule in controls.rules)  # any memo at all
        self._paths: dict[tuple[int, str], int] = {}
        self._calls: dict[int | str, int] = {}  # module ids; addresses of opened groups
        self.exits = ExitTracker(self) if controls.at_exit else None
        # stop_after matched, but a rule asks what module calls return: the forward goes on
        # until the next op or module call, so that the calls returning the halt op (a
        # block whose last op it is) end first and tl.module(...).output sees them return it
        self.halt_pending = False
        self._level = functorch_level()  # as CaptureMode: torch.func transforms unrecorded
        self.modules: list[tuple[str, nn.Module]] = []  # every module named, as they come
        # what every wrapped forward reads (traced_forward): looked up once, not per module
        self._forward_context = (self.tracker, self.live, self.tracker.thread, self.exits is None)

    # -- the per-op path ------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            info = FUNC_INFOS[func]
        except (KeyError, TypeError):  # not seen yet, or unhashable
            info = func_info(func)
        if not info.plain:
            if info.never_tensor and info.escape is None:  # (x.shape, x.dim(): no op)
                return func(*args, **kwargs) if kwargs else func(*args)
            return self._call(info, func, args, kwargs)
        live = self.live
        if not live.slow and functorch_level() == self._level:
            # the common call: a plain function (FuncInfo.plain) whose tensor arguments each
            # hold the value counted, nothing kept that it could write, no rule on module
            # outputs (LiveVersions.read and .produced inline)
            entries, fast = live.entries, False
            try:
                for arg in args if not kwargs else (*args, *kwargs.values()):
                    entry = entries.get(id(arg))
                    if entry is not None and entry() is arg:  # a value counted
                        if entry.version != arg._version:
                            break  # written behind the capture's back
                    elif (kind := type(arg)) in ATOMS:
                        continue  # (before the tensors seen first: most calls have more)
                    elif kind is Tensor or kind is _Parameter:
                        if kind is Tensor and arg.grad_fn is not None:
                            break  # maybe made out of sight: LiveVersions.stale asks
                        version = arg._version  # (first: an inference tensor raises)
                        entry = entries[id(arg)] = LiveEntry(arg)
                        entry.label, entry.version, entry.calls = None, version, live.calls
                    elif not (kind is tuple and _all_atoms(map(type, arg))):
                        break  # (a tuple of atoms: a shape, conv2d's stride)
                else:
                    fast = not kwargs or "out" not in kwargs and kwargs.get("inplace") is not True
            except RuntimeError:  # an inference tensor has no version: stale() asks
                pass
            if fast:
                try:
                    result = func(*args, **kwargs) if kwargs else func(*args)
                except Exception as err:  # the model's own error: noted, never wrapped
                    note_model_error(err, self, info.name)
                    raise
                if type(result) is Tensor:
                    calls = live.calls = live.calls + 1
                    try:
                        version = result._version
                        entry = live.last = entries[id(result)] = LiveEntry(result)
                        entry.label, entry.version, entry.calls = None, version, calls
                    except RuntimeError:  # an inference tensor (a mode the model entered)
                        live.last = None
                        live.remember(result)
                    name = info.name  # _count inline: no reserved name, no exits (see _add_modules)
                    count = self.counts[name] = self.counts.get(name, 0) + 1
                    index = self.n_ops
                    self.n_ops = index + 1
                    plan = self._plans.get(name, _UNSEEN)
                    if plan is None:
                        return result
                    if plan is _UNSEEN:
                        plan = self._plans[name] = self.plan_for(name)
                        if plan is None:
                            return result
                    if type(plan) is _Plan and plan.counts is not None and count not in plan.counts:
                        return result  # rules by label that name other calls (linear_3)
                    return self.act(plan, name, count, index, 1, (False, args, kwargs), result)
                return self._counted_outputs(info, args, kwargs, result, False)
        return self._call(info, func, args, kwargs)

    def _call(self, info: Any, func: Any, args: tuple, kwargs: dict | None) -> Any:
        """Every call the fast path of :meth:`__torch_function__` does not take."""
        if info.never_tensor or functorch_level() != self._level:
            if info.escape is not None and functorch_level() == self._level:
                # a read into Python (.item()): its tensors are read as tl.trace reads an
                # escape's (a changed value is a refresh)
                value = func(*args, **kwargs) if kwargs else func(*args)
                self.read(escaped_tensors(args, kwargs))
                return value
            return func(*args, **kwargs) if kwargs else func(*args)
        if self.halt_pending:  # the op stop_after matched has left every call returning it
            return run_after_halt(Halt, func, args, kwargs)
        if info.opens and (info.opens is True or info.opens(args, kwargs or {})):
            return self._open(info.name, func, args, kwargs or {})
        # values changed behind the capture's back: refresh ops, as tl.trace records
        self.live.read(_read_arguments(func, args), kwargs)
        writes = info.inplace or kwargs and ("out" in kwargs or kwargs.get("inplace") is True)
        if writes:  # a call that may write into a kept value (see inplace_targets)
            writes = bool(inplace_targets(info.inplace, args, kwargs or {}))
            if self.payloads.aliases:
                self.before_write(info.inplace, args, kwargs or {})
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as err:  # the model's own error: noted, never wrapped
            note_model_error(err, self, info.name)
            raise
        if info.settles:  # (a collective in flight: see special.SETTLES)
            SETTLES[func](result)
        if isinstance(result, Tensor) and info.name not in SPECIAL_OUTPUTS:
            self.live.produced(info.name, [result], writes)
            return self._count(info, 1, args, kwargs, result)
        return self._counted_outputs(info, args, kwargs, result, writes)

    def _counted_outputs(self, info: Any, args: tuple, kwargs: Any, result: Any, writes) -> Any:
        """A call that made no tensor, several, or tensors it wrote among its arguments
        (``SPECIAL_OUTPUTS``): counted as that many ops, or none."""
        special = SPECIAL_OUTPUTS.get(info.name)
        tensors = [t for _, t in (special(args, result) if special else flatten(result)[0])]
        if not tensors:
            return result
        self.live.produced(info.name, tensors, writes)
        return self._count(info, len(tensors), args, kwargs, result)

    def _count(self, info: Any, n: int, args: tuple, kwargs: Any, result: Any) -> Any:
        """Count the call's ``n`` ops (one label, ``:k`` for each of several outputs) and
        let the rules that may match its name act."""
        name = info.name
        counts = self.counts
        count = counts.get(name, 0) + 1
        if self._reserved:  # a weight of the root named like a label
            count = self.labeler.count(name)
        counts[name] = count
        index = self.n_ops
        self.n_ops = index + n
        if self.exits is not None:  # rules on module outputs: name every tensor
            self.exits.note(name, count, index, args, result)
        plan = self._plans.get(name, _UNSEEN)
        if plan is _UNSEEN:
            plan = self._plans[name] = self.plan_for(name)
        if plan is None:
            return result
        if type(plan) is _Plan and plan.counts is not None and count not in plan.counts:
            return result  # rules by label that name other calls (tl.label("linear_3"))
        return self.act(plan, name, count, index, n, (info.inplace, args, kwargs), result)

    @property
    def module_stack(self) -> tuple[tuple[str, int], ...]:
        """The open module calls as ``(address, call number)``, outermost first."""
        return self._frames

    @property
    def module_type(self) -> str:
        """The class name of the innermost open module call (the root's outside any), as an
        op made now names it: for a mode that makes its own op views (find_nonfinite)."""
        return self._type

    def add_inputs(self, args: tuple, kwargs: dict) -> None:
        """The forward's inputs: their values are counted from the start, as a trace's
        input sources are."""
        for _, tensor in flatten(args)[0] + flatten(kwargs)[0]:
            self.live.remember(tensor)
            self._inputs.append(id(tensor))

    def _unseen(self, tensor: Tensor) -> None:
        """``tensor``, seen first now, was made during the forward out of the capture's
        sight: counted as the op ``tl.trace`` records for it (``capture/unseen.py``), or
        as a source (the same value under another object, or a value linked to nothing)."""
        if not same_value(self.live, tensor):
            host = SeenByRecord(self.live, self._count_unseen, self._inputs, self.modules)
            if record_unseen(host, tensor) is not None:
                return
        self.live.remember(tensor)

    def _count_unseen(self, name: str, tensor: Tensor) -> None:
        self.live.produced(name, [tensor], False)
        self._refresh(tensor, name)

    def read(self, tensors: list[Tensor] | tuple[Tensor, ...]) -> None:
        """``tensors`` are read outside an op (a module call's inputs or outputs, an
        escape, the forward's outputs): a value changed behind the capture's back is a
        refresh op there, as in ``tl.trace``. Called with no torch function mode on (a
        module wrapper turns this one off first)."""
        live = self.live
        if not live.slow:
            entries = live.entries
            for tensor in tensors:  # the common read: each holds the value counted (inline)
                entry = entries.get(id(tensor))
                if entry is None or entry() is not tensor or entry.version != tensor._version:
                    break
            else:
                return
        live.read_all(tensors)

    def _refresh(self, tensor: Tensor, name: str = REFRESH_FUNC_NAME) -> None:
        """Count the ``refresh`` op ``tl.trace`` records for ``tensor`` (see
        :class:`~torchlens.capture.live.LiveVersions`), or another op the capture records
        itself (``name``: a value made out of sight); keep it when save= selects it. Like
        a trace's, it is no call an edit or stop_after acts on."""
        count = self.labeler.count(name)
        index = self.n_ops
        self.n_ops = index + 1
        if self.exits is not None:
            self.exits.note(name, count, index, (), tensor)
        self.refreshed(name, count, index, tensor)

    def refreshed(self, name: str, count: int, index: int, tensor: Tensor) -> None:
        """What a recording does with an op the capture counts itself: keep it when
        ``save=`` selects it."""
        save = self.controls.save
        if save is None or save.func_names is not None and name not in save.func_names:
            return
        label = f"{name}_{count}"
        if save.call_labels is not None and label not in save.call_labels:
            return
        view = OpView(label, index, name, 0, self._frames, tensor, self._type)
        if save.matches(view):
            self._keep(view, tensor)
            self.controls.saved += 1

    def plan_for(self, name: str) -> _Plan | None:
        """The rules that may act on ops of function ``name`` (asked once per name);
        ``None``: its ops are only counted."""
        c = self.controls

        def may(sel: Selector | None) -> bool:
            return sel is not None and (sel.func_names is None or name in sel.func_names)

        edits = [(i, sel, edit) for i, (sel, edit) in enumerate(c.edits) if may(sel)]
        save, stop = (c.save if may(c.save) else None), (c.stop if may(c.stop) else None)
        return _Plan(name, save, edits, stop) if save or stop or edits else None

    def act(self, plan: _Plan, name: str, count: int, index: int, n: int, call, result):
        """A call some rule may match: ask, then save, edit or halt."""
        if plan.static:
            key = (name, self._path)
            decision = self._memo.get(key, _UNSEEN)
            if decision is None:
                return result
        inplace, args, kwargs = call
        if n == 1 and isinstance(result, Tensor):
            tensors = [result]
        else:
            special = SPECIAL_OUTPUTS.get(name)
            tensors = [t for _, t in (special(args, result) if special else flatten(result)[0])]
        halt_at, replaced = None, False
        for k, tensor in enumerate(tensors):
            label = f"{name}_{count}" if n == 1 else f"{name}_{count}:{k}"
            view = OpView(label, index + k, name, k, self._frames, tensor, self._type)
            if not plan.static or decision is _UNSEEN:
                decision = plan.decide(view)
                if plan.static:
                    self._memo[key] = decision
            if decision is None:
                continue
            save, edits, stop = decision
            if edits:
                inplace = bool(inplace_targets(inplace, args, kwargs or {}))
                for i in edits:
                    tensor = self._edit(view, tensor, i, inplace)
                if tensor is not tensors[k]:
                    tensors[k], replaced = tensor, True
                    self.live.remember(tensor)  # its readers read the edited value
            if save or edits or stop:  # the op a forward halts on is kept too
                self._keep(view, tensor)
            self.controls.saved += save
            if stop and halt_at is None:
                halt_at = label
        if halt_at is not None:
            self.controls.halted_at = halt_at
            if self.exits is None:
                raise Halt
            self.halt_pending = True  # after the calls that return it: .output rules see it
        if not replaced:
            return result
        if n == 1 and isinstance(result, Tensor):
            return tensors[0]
        return fill(flatten(result)[1], tensors)

    def _edit(self, view: OpView, tensor: Tensor, i: int, inplace: bool) -> Tensor:
        c = self.controls
        edit = c.edits[i][1]
        c.edit_hits[i] += 1
        if not c.first_edit(i, view.label):
            return tensor
        if edit.keep_original:
            key = original_key(view.label)
            self.store.set(key, tensor.detach().clone(), None)
            view.meta["original_key"] = key
        c.note_shape(i, view.label, tuple(tensor.shape))
        new = apply_edit(edit, tensor, view, inplace)
        view.meta["intervened"] = True
        if not c.intervened or c.intervened[-1] != view.label:
            c.intervened.append(view.label)
        view.shape, view.dtype, view.device = tuple(new.shape), new.dtype, new.device
        return new

    def _keep(self, view: OpView, tensor: Tensor) -> None:
        self.payloads.save(view.label, tensor.detach(), self.clone)
        if view.store is None:
            view.store = self.store
            self.kept.append(view)
            self.kept_views[view.label] = view

    def before_write(self, inplace: bool, args: tuple, kwargs: dict) -> None:
        """Copy kept values that alias a tensor about to be written in place."""
        for target in inplace_targets(inplace, args, kwargs):
            self.payloads.protect(target)

    # -- module calls ---------------------------------------------------------------------
    def install_hooks(
        self,
        model: Any,
        modules: list[tuple[str, nn.Module]] | None = None,
        root: Root | None = None,
    ) -> None:
        """Follow the module calls of ``model`` as ``tl.trace`` does (``capture/hooks.py``):
        each module of its root with its ``forward`` wrapped, or a pair of hooks for one
        with hooks of its own, so that ops run by those hooks fall inside or outside the
        module call exactly as in ``tl.trace``; every other module called on this thread
        followed (``capture/follow.py``). ``modules``: the root's walk, when made already.
        ``self.tracker.exit()`` removes them."""
        if root is None and modules is None:
            root = resolve_root(model)
        elif root is None:  # (find_nonfinite's walk of the module it runs)
            root = Root(modules, model, type(model).__name__)
        self._type = root.type_name  # the root call's name, as the trace's root names it
        self.modules = []
        self._add_modules(list(root.modules))
        self.tracker.enter(root, self, self._add_modules)

    def _add_modules(self, modules: list[tuple[str, nn.Module]]) -> None:
        """Modules named: the root's walk, then each first seen during the forward
        (``capture/follow.py``)."""
        self.modules.extend(modules)
        self.labeler.reserve(modules)
        if self.exits is not None or self._reserved:  # (names every tensor; counts by
            self.live.slow, self.live.last = True, None  # reserved names): no fast path

    def traced_forward(
        self, module: nn.Module, address: str, forward: Callable[..., Any]
    ) -> Callable[..., Any]:
        """The recording ``forward`` of ``module`` at ``address`` (the tracker's wrapper)."""
        tracker, live, thread, quiet = self._forward_context  # (quiet: no output named)
        key, type_name = id(module), type(module).__name__

        def forward_recorded(*args: Any, **kwargs: Any) -> Any:
            if not tracker.on or _thread_id() != thread:
                return forward(*args, **kwargs)
            # the tensor the latest counted call produced (LiveVersions.last), nothing
            # counted since: no write the capture sees can have changed it, so a module
            # call's one input or output is read without asking its version (which, with
            # this mode on, costs a torch function call). A write no mode sees (a
            # TorchScript function's) right before the call is then a refresh at the next
            # read instead.
            last = live.last
            if (
                last is not None
                and not kwargs
                and len(args) == 1
                and last() is args[0]
                and type(args[0]) is Tensor
                and not self.halt_pending
            ):  # (_push_frame inline)
                calls = self._calls
                call = calls[key] = calls.get(key, 0) + 1
                self._trail.append((self._frames, self._type, self._path))
                self._frames += ((address, call),)
                self._type = type_name
                if self._paths_needed:
                    self._path = self._paths.setdefault((self._path, address), len(self._paths) + 1)
            else:
                with _no_torch_function():  # its own bookkeeping is not an op
                    self.read(_call_inputs(args, kwargs))
                    self._push_frame(key, address, type_name)
            try:
                output = forward(*args, **kwargs)
            except BaseException:
                self._pop_frame(None)
                raise
            last = live.last
            if last is not None and last() is output and type(output) is Tensor and quiet:
                self._frames, self._type, self._path = self._trail.pop()
                return output
            with _no_torch_function():
                new = self._pop_frame(output)
            return output if new is None else new

        return forward_recorded

    def enter_own(self, address: str, module: nn.Module, args: Any, kwargs: dict) -> None:
        """The pre-hook of a submodule with hooks of its own (the tracker's hook pair)."""
        if self.tracker.on and _thread_id() == self.tracker.thread:
            with _no_torch_function():
                self.read(_call_inputs(args, kwargs))
                self._push_frame(id(module), address, type(module).__name__)

    def _open(self, name: str, func: Any, args: tuple, kwargs: dict) -> Any:
        """A composite function's body, run with this mode on inside a group frame, as
        the full capture records it (``capture/composite.py``)."""
        parent = self._frames[-1][0] if self._frames else ""
        address = group_address(parent, name)
        self.read([t for _, t in flatten_call(args, kwargs)[0]])
        self._push_frame(address, address, name)
        torch._C._push_on_torch_function_stack(self)
        try:
            result = opened_body(func)(*args, **kwargs)
        except BaseException:
            torch._C._pop_torch_function_stack()
            self._pop_frame(None)
            raise
        torch._C._pop_torch_function_stack()
        new = self._pop_frame(result)
        return result if new is None else new

    def _push_frame(self, key: int | str, address: str, type_name: str) -> None:
        """A call starts: ``key`` counts its calls (a module's id; a group's address)."""
        if self.halt_pending:
            raise Halt
        call = self._calls[key] = self._calls.get(key, 0) + 1
        self._trail.append((self._frames, self._type, self._path))
        self._frames += ((address, call),)
        self._type = type_name
        if self._paths_needed:
            self._path = self._paths.setdefault((self._path, address), len(self._paths) + 1)

    def exit_own(self, module: nn.Module, args: Any, kwargs: dict, output: Any) -> Any:
        """The forward hook of a submodule with hooks of its own."""
        if not self.tracker.on or _thread_id() != self.tracker.thread or not self._frames:
            return None
        with _no_torch_function():
            return self._pop_frame(output)

    def _pop_frame(self, output: Any) -> Any:
        """The innermost call returned ``output`` (``None``: it raised); returns a
        replacement for the output, or ``None`` to keep it."""
        frame, type_name = self._frames[-1], self._type
        self._frames, self._type, self._path = self._trail.pop()
        if output is not None:  # what it returned is read as it returns
            self.read([output] if isinstance(output, Tensor) else _tensors_in(output))
        if self.exits is not None and output is not None:
            return self.exits.on_exit(frame, type_name, output)
        return None
