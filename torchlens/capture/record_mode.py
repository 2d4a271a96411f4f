"""The lean function mode behind ``tl.record``: count every op, do work only for matches.

Labels are counted exactly as :class:`~torchlens.capture.builder.TraceBuilder` counts them
(same names from :func:`~torchlens.capture.naming.func_info`, one counter per name, ``:k`` for
the outputs of multi-output calls), so a label means the same op in a recording and in a
trace. Nothing else is kept for an unmatched op: no graph, no parents, no argument templates.

The per-op path is ordered by cost. A function name that no rule can match (see
:attr:`~torchlens.selectors.Selector.func_names`) is dismissed with one dict lookup; for rules
that depend only on names and module addresses the answer is remembered per module path;
only the rest build an :class:`~torchlens.recording.OpView` to ask.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torchlens._tensors import storage_key, version_of
from torchlens.capture.composite import group_address, opened_body
from torchlens.capture.controls import Controls, Intervention, _Halt, apply_edit, original_key
from torchlens.capture.failures import note_record_error
from torchlens.capture.hooks import follow_calls
from torchlens.capture.mode import _inplace_targets, functorch_level
from torchlens.capture.naming import FUNC_INFOS, func_info
from torchlens.capture.record_exit import ExitTracker
from torchlens.capture.roots import Root, resolve_root
from torchlens.capture.special import SETTLES, SPECIAL_OUTPUTS
from torchlens.capture.tree import fill, flatten
from torchlens.recording import OpView
from torchlens.selectors import Selector
from torchlens.trace import MemoryPayloadStore

__all__ = ["RecordMode"]

Tensor = torch.Tensor
_UNSEEN = object()
_thread_id = threading.get_ident


class _Plan:
    """The rules that may match one function name: save, edits and stop, and whether their
    answers depend only on the name and the module path."""

    __slots__ = ("save", "edits", "stop", "static", "call_labels")

    def __init__(
        self,
        save: Selector | None,
        edits: list[tuple[int, Selector, Intervention]],
        stop: Selector | None,
    ) -> None:
        self.save, self.edits, self.stop = save, edits, stop
        rules = [s for s in (save, stop) if s is not None] + [s for _, s, _ in edits]
        self.static = all(s.static for s in rules)
        calls = [s.call_labels for s in rules]  # the calls any rule can match; None: any
        self.call_labels = None if None in calls else frozenset().union(*calls)

    def decide(self, view: OpView) -> tuple[bool, tuple[int, ...], bool] | None:
        """``(save, edit indices, stop)`` for one op, or ``None`` when nothing applies."""
        save = self.save is not None and self.save.matches(view)
        edits = tuple(i for i, sel, _ in self.edits if sel.matches(view))
        stop = self.stop is not None and self.stop.matches(view)
        return (save, edits, stop) if save or edits or stop else None


class RecordMode(TorchFunctionMode):
    """Counts ops like the full capture and keeps only what :class:`Controls` selects.

    Args:
        controls: the parsed ``save=``, ``intervene=`` and ``stop_after=``.
        clone: copy each kept value at once instead of aliasing it and copying only before
            an in-place write (the default, cheaper when few values are overwritten).
    """

    def __init__(self, controls: Controls, clone: bool = False) -> None:
        super().__init__()
        self.controls = controls
        self.clone = clone
        self.store = MemoryPayloadStore()
        self.kept: list[OpView] = []
        self.kept_views: dict[str, OpView] = {}  # the same, by label
        self.counts: dict[str, int] = {}
        self.n_ops = 0
        self.paused = False  # set by capture.session.suspended()
        self._plans: dict[str, _Plan | None] = {}
        self._memo: dict[tuple[str, int], Any] = {}
        self._aliases: dict[Any, list[str]] = {}
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
        self._thread = threading.get_ident()
        self.exits = ExitTracker(self) if controls.at_exit else None
        # stop_after matched, but a rule asks what module calls return: the forward goes on
        # until the next op or module call, so that the calls returning the halt op (a
        # block whose last op it is) end first and tl.module(...).output sees them return it
        self.halt_pending = False
        self._level = functorch_level()  # as CaptureMode: torch.func transforms unrecorded
        self.modules: list[tuple[str, nn.Module]] = []  # every module named, as they come

    # -- the per-op path ------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            info = FUNC_INFOS[func]
        except (KeyError, TypeError):  # not seen yet, or unhashable
            info = func_info(func)
        if info.never_tensor or functorch_level() != self._level:
            return func(*args, **kwargs) if kwargs else func(*args)
        if self.halt_pending:  # the op stop_after matched has left every call returning it
            raise _Halt
        if info.opens and (info.opens is True or info.opens(args, kwargs or {})):
            return self._open(info.name, func, args, kwargs or {})
        if self._aliases and (
            info.inplace or kwargs and ("out" in kwargs or kwargs.get("inplace") is True)
        ):  # a call that may write into a kept value (see _inplace_targets)
            self._protect(info.inplace, args, kwargs or {})
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as err:  # the model's own error: noted, never wrapped
            note_record_error(err, self.counts, self._frames, info.name)
            raise
        if info.settles:  # (a collective in flight: see special.SETTLES)
            SETTLES[func](result)
        name = info.name
        if isinstance(result, Tensor):
            n = 1
        else:
            special = SPECIAL_OUTPUTS.get(name)
            n = len(special(args, result) if special else flatten(result)[0])
            if not n:
                return result
        count = self.counts.get(name, 0) + 1
        self.counts[name] = count
        index = self.n_ops
        self.n_ops = index + n
        if self.exits is not None:  # rules on module outputs: name every tensor
            self.exits.note(name, count, index, args, result)
        plan = self._plans.get(name, _UNSEEN)
        if plan is _UNSEEN:
            plan = self._plans[name] = self._plan_for(name)
        if plan is None:
            return result
        return self._act(plan, name, count, index, n, (info.inplace, args, kwargs), result)

    def _plan_for(self, name: str) -> _Plan | None:
        c = self.controls

        def may(sel: Selector | None) -> bool:
            return sel is not None and (sel.func_names is None or name in sel.func_names)

        edits = [(i, sel, edit) for i, (sel, edit) in enumerate(c.edits) if may(sel)]
        save, stop = (c.save if may(c.save) else None), (c.stop if may(c.stop) else None)
        return _Plan(save, edits, stop) if save or stop or edits else None

    def _act(self, plan: _Plan, name: str, count: int, index: int, n: int, call, result):
        """A call whose name some rule may match: ask, then save, edit or halt."""
        if plan.call_labels is not None and f"{name}_{count}" not in plan.call_labels:
            return result  # rules by label that name other calls (tl.label("linear_3"))
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
                inplace = bool(_inplace_targets(inplace, args, kwargs or {}))
                for i in edits:
                    tensor = self._edit(view, tensor, i, inplace)
                if tensor is not tensors[k]:
                    tensors[k], replaced = tensor, True
            if save or edits or stop:  # the op a forward halts on is kept too
                self._keep(view, tensor)
            self.controls.saved += save
            if stop and halt_at is None:
                halt_at = label
        if halt_at is not None:
            self.controls.halted_at = halt_at
            if self.exits is None:
                raise _Halt
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
        value = tensor.detach()
        key = None if self.clone else storage_key(value)
        if key is None:
            value = value.clone()
        else:
            self._aliases.setdefault(key, []).append(view.label)
        self.store.set(view.label, value, version_of(value))
        if view._store is None:
            view._store = self.store
            self.kept.append(view)
            self.kept_views[view.label] = view

    def _protect(self, inplace: bool, args: tuple, kwargs: dict) -> None:
        """Copy kept values that alias a tensor about to be written in place."""
        for target in _inplace_targets(inplace, args, kwargs):
            self.protect(target)

    @property
    def aliased_storages(self) -> Mapping[Any, list[str]]:
        """Storage key -> labels of the kept values aliasing that storage (not copies)."""
        return self._aliases

    @property
    def has_aliases(self) -> bool:
        """Whether a kept value is an alias of a live tensor (not a copy)."""
        return bool(self._aliases)

    def protect(self, tensor: Tensor) -> None:
        """Copy kept values that share ``tensor``'s storage (it may be written later)."""
        key = storage_key(tensor)
        for label in self._aliases.pop(key, ()) if key is not None else ():
            value = self.store.values[label].clone()
            self.store.set(label, value, version_of(value))

    # -- module calls ---------------------------------------------------------------------
    def install_hooks(
        self,
        model: Any,
        modules: list[tuple[str, nn.Module]] | None = None,
        root: Root | None = None,
    ) -> list[Any]:
        """Follow the module calls of ``model`` as ``tl.trace`` does (``capture/hooks.py``):
        each module of its root with its ``forward`` wrapped, or a pair of hooks for one
        with hooks of its own, so that ops run by those hooks fall inside or outside the
        module call exactly as in ``tl.trace``; every other module called on this thread
        followed (``capture/follow.py``). ``modules``: the root's walk, when made already.
        Returns what to remove when the recording ends."""
        if root is None:
            root = resolve_root(model) if modules is None else _root_of(model, modules)
        self._type = root.type_name  # the root call's name, as the trace's root names it
        self.modules = list(root.modules)
        calls = _Calls(self._recorded_forward, self._enter, self._exit)
        return follow_calls(root, self, self.modules.extend, calls, with_kwargs=False)

    def _recorded_forward(
        self, module: nn.Module, address: str, forward: Callable[..., Any]
    ) -> Callable[..., Any]:
        thread, type_name = self._thread, type(module).__name__

        def forward_recorded(*args: Any, **kwargs: Any) -> Any:
            if self.paused or _thread_id() != thread:
                return forward(*args, **kwargs)
            self._push_frame(id(module), address, type_name)
            try:
                output = forward(*args, **kwargs)
            except BaseException:
                self._pop_frame(None)
                raise
            new = self._pop_frame(output)
            return output if new is None else new

        return forward_recorded

    def _enter(self, address: str, module: nn.Module, args: Any) -> None:
        """The pre-hook of a submodule with hooks of its own."""
        if not self.paused and _thread_id() == self._thread:
            self._push_frame(id(module), address, type(module).__name__)

    def _open(self, name: str, func: Any, args: tuple, kwargs: dict) -> Any:
        """A composite function's body, run with this mode on inside a group frame, as
        the full capture records it (``capture/composite.py``)."""
        parent = self._frames[-1][0] if self._frames else ""
        address = group_address(parent, name)
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
            raise _Halt
        call = self._calls[key] = self._calls.get(key, 0) + 1
        self._trail.append((self._frames, self._type, self._path))
        self._frames += ((address, call),)
        self._type = type_name
        if self._paths_needed:
            self._path = self._paths.setdefault((self._path, address), len(self._paths) + 1)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> Any:
        """The forward hook of a submodule with hooks of its own."""
        if self.paused or _thread_id() != self._thread or not self._frames:
            return None
        return self._pop_frame(output)

    def _pop_frame(self, output: Any) -> Any:
        """The innermost call returned ``output`` (``None``: it raised); returns a
        replacement for the output, or ``None`` to keep it."""
        frame, type_name = self._frames[-1], self._type
        self._frames, self._type, self._path = self._trail.pop()
        if self.exits is not None and output is not None:
            with torch._C.DisableTorchFunction():  # its own bookkeeping is not an op
                return self.exits.on_exit(frame, type_name, output)
        return None


class _Calls:
    """What :func:`~torchlens.capture.hooks.follow_calls` takes: the recording forward
    factory and the hook pair of a module with hooks of its own."""

    def __init__(self, traced_forward: Any, enter_own: Any, exit_own: Any) -> None:
        self.traced_forward, self.enter_own, self.exit_own = traced_forward, enter_own, exit_own


def _root_of(model: Any, modules: list[tuple[str, nn.Module]]) -> Root:
    """The root of ``model`` whose walk (``modules``) the caller made already."""
    if isinstance(model, nn.Module):
        return Root(modules, model, type(model).__name__)
    root = resolve_root(model)
    return Root(modules or root.modules, None, root.type_name)
