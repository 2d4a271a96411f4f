"""The mutable recorder behind a capture: ops, sources, module calls and payloads.

The capture mode and module wrappers feed a :class:`TraceBuilder`; :meth:`TraceBuilder.finish`
freezes what was recorded into a :class:`~torchlens.trace.Trace`. The builder is the only
place that knows which live tensor is which record:

* every tensor it has seen maps (by identity, checked through a weak reference) to the label
  of the record that produced its current value and the version counter at that moment;
* a tensor whose version counter moved without the builder seeing the write (a view written
  in place, a buffer updated inside ``batch_norm``) gets a ``refresh`` op, so no edge ever
  points at a stale value;
* payloads are saved as aliases (the tensor itself, detached when first read), and cloned
  only just before something writes into their storage, so a saved value is always the
  value at the time it was produced.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from torchlens._escapes import short_repr
from torchlens._store import STRUCTURE_ONLY
from torchlens._tensors import geometry as _geometry
from torchlens._tensors import (
    storage_key,
    version_of,
)
from torchlens.capture.composite import group_address
from torchlens.capture.escapes import EscapeHook, type_name
from torchlens.capture.labels import Labeler
from torchlens.capture.live import LiveEntry, LiveVersions, live_entry
from torchlens.capture.module_stack import ModuleStack
from torchlens.capture.naming import SET_DATA, UNSHARING
from torchlens.capture.payloads import ASK, PayloadKeeper
from torchlens.capture.sinks import PayloadSink
from torchlens.capture.source import caller_line
from torchlens.capture.sources import TRANSFORM_RESULT, UNSEEN_COMPUTATION, Sources
from torchlens.capture.tree import _POSITIONS, _SLOTS, ATOMS, flatten_call, plain_slice
from torchlens.capture.wrappers import Wrappers
from torchlens.trace import (
    ArgRef,
    Escape,
    MemoryPayloadStore,
    ModuleCall,
    Op,
    Source,
    Trace,
)

__all__ = [
    "TraceBuilder",
    "REFRESH_FUNC_NAME",
    "TRANSFORM_RESULT",
    "UNSEEN_COMPUTATION",
    "WITHOUT_GRAD",
]

Tensor = torch.Tensor
REFRESH_FUNC_NAME = "refresh"  # a value changed by a write the capture could not attribute
WITHOUT_GRAD = "constants_seen_without_grad"  # trace.meta key: their labels
_ASK = ASK  # an argument the callee reads itself (a version counter not read yet)
# the version noted for an op's output (not in place) that is an nn.Parameter the capture
# did not know (an offloading hook making a module's weight): its next read asks label_of,
# which finds whether it sits in an open module's _parameters by then (Sources.current_weight)
_FRESH_WEIGHT: Any = object()
_Parameter = nn.Parameter
_arg_ref = tuple.__new__  # ArgRef(label, position) without the Python-level __new__
_first = operator.itemgetter(0)  # (the per-op path: map with these runs no Python frame)
_label = operator.attrgetter("label")


class TraceBuilder:
    """Records one forward pass; see the module docstring for the invariants it keeps.

    Args:
        save_payloads: keep a value for each op and source (``False`` for
            ``structure_only=True``).
        payload_filter: when given, only ops for which it returns True keep a value.
        sink: a :class:`~torchlens.capture.sinks.PayloadSink` that takes each value as it
            is produced (streaming capture); values then never stay in memory.
    """

    # the escapes recorded (record_escape), and the hook that may replace escaped values:
    # class defaults, set on the instance only when used: one more instance attribute
    # would take the builder past the size at which CPython shares attribute keys, and
    # every attribute read of the per-op path would get slower (+2.6% instructions per op)
    escapes: Sequence[Escape] = ()
    escape_hook: EscapeHook | None = None

    def __init__(
        self,
        *,
        save_payloads: bool = True,
        payload_filter: Callable[[Op], bool] | None = None,
        sink: PayloadSink | None = None,
    ) -> None:
        self.ops: list[Op] = []
        self.sources = Sources()  # inputs, weights, constants (sources.py)
        # the values kept: to a sink as produced, when one is given, instead of memory
        store = MemoryPayloadStore(default_missing=None if save_payloads else STRUCTURE_ONLY)
        self.payloads = PayloadKeeper(store, sink)
        self.store, self.sink = self.payloads.store, sink
        self._values, self._versions = self.payloads.values, self.payloads.versions
        self.save_payloads = save_payloads
        self.payload_filter = payload_filter
        # called as observe(record, live tensor, alias_of) each time a record takes a tensor;
        # alias_of is the label the tensor held with the same value (an op returned its input)
        self.observers: list[Callable[[Op | Source, Tensor, str | None], None]] = []
        # called as hook(call, output tensors) when a module call (or group) ends; may return
        # replacement tensors (edits of what the call returned, tl.module(...).output)
        self.exit_hooks: list[Callable[[ModuleCall, list[Tensor]], list[Tensor] | None]] = []
        # called as selected(op, live tensor) when save= selects an op only once a module
        # call has returned its value (tl.module(...).output): gradients are kept for it
        self.late_selected: list[Callable[[Op, Tensor], None]] = []
        # set by stop_after= (capture/controls.py) once it matched: the forward goes on to
        # its next op or module call, which raise it, so that the calls returning the op
        # halted on end first and count as returning it (as tl.record's)
        self.halt_pending: type[BaseException] | None = None
        self.stack = ModuleStack()  # the module calls
        self._records: dict[str, Op | Source] = {}
        # which live tensor holds which value, and the writes into each storage (live.py)
        self.live = LiveVersions()
        self._live, self._writers = self.live.entries, self.live.writers
        self._wrappers = Wrappers()  # recorded wrapper subclass values (wrappers.py)
        self.labeler = Labeler(self._records)  # op labels, as every capture counts them

    @property
    def module_stack(self) -> tuple[tuple[str, int], ...]:
        """The open module calls as ``(address, call number)``, outermost first."""
        return self.stack.frames

    # -- sources (sources.py) ----------------------------------------------------------
    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        """The modules known so far, as ``(address, module)``: see :meth:`add_modules`."""
        return self.sources.named_modules

    @property
    def input_labels(self) -> list[str]:
        """The labels of the forward's inputs, in order: see :meth:`add_input`."""
        return self.sources.input_labels

    def add_modules(self, modules: list[tuple[str, nn.Module]]) -> None:
        """Know modules (``(address, module)``), so their parameters and buffers are named
        by address: the walk of the capture's root (``capture/roots.py``), which serves the
        hooks too (``self.named_modules``), then each module first seen during the forward."""
        self.sources.add_modules(modules)
        self.labeler.reserve(modules)

    def add_input(self, path: str, tensor: Tensor) -> str:
        """Record a tensor passed to the traced callable; returns its label."""
        return self.sources.add_input(self, path, tensor)

    def note_transform_call(self) -> None:
        """A call ran inside a ``torch.func`` transform, unrecorded (its values are
        per-sample views): a constant first seen from now on may be what the transform
        returned, with its dependencies out of the record."""
        self.sources.transformed = True

    # -- identity -------------------------------------------------------------------------
    def _remember(self, tensor: Tensor, label: str, version: Any = _ASK) -> None:
        key = id(tensor)
        if version is _ASK:
            version = version_of(tensor)
        if self.observers:
            before = self._live.get(key)
            same = before is not None and before() is tensor and before.version == version
            for observe in self.observers:
                observe(self._records[label], tensor, before.label if same else None)
        self._live[key] = live_entry(tensor, label, version, self.live.calls)

    def _current_label(self, tensor: Tensor) -> str | None:
        entry = self._live.get(id(tensor))
        return entry.label if entry is not None and entry() is tensor else None

    def label_of(self, tensor: Tensor) -> str:
        """The label of the record holding ``tensor``'s current value, creating a source
        (parameter, buffer or constant) or a ``refresh`` op when needed."""
        entry = self._live.get(id(tensor))
        if entry is not None and entry() is tensor:
            if entry.version is None:  # an inference tensor: no version counter
                return self._unversioned(tensor, entry.label, entry.calls)
            if entry.version == tensor._version:  # version_of inline: every tensor argument
                return entry.label
            if entry.version is _FRESH_WEIGHT:
                return self._fresh_weight(tensor, entry)
            return self._refresh(tensor, entry.label, entry.calls, entry.version)
        return self.sources.first_seen(self, tensor)

    def _fresh_weight(self, tensor: Tensor, entry: LiveEntry) -> str:
        """:meth:`label_of` of a parameter an op made (``_FRESH_WEIGHT``): a parameter
        source when a module whose call is open holds it now, else the op's value, or a
        refresh of it if it was written since."""
        weight = self.sources.current_weight(self, tensor)
        if weight is not None:
            return weight
        label = entry.label
        if self._versions.get(label, version_of(tensor)) == version_of(tensor):
            return label
        return self._refresh(tensor, label, entry.calls)

    def arguments(self, args: tuple, kwargs: dict) -> tuple[list[ArgRef], tuple, dict]:
        """A call's tensor arguments as :class:`ArgRef` (each labelled as :meth:`label_of`
        does), and its argument templates (:func:`~torchlens.capture.tree.flatten_call`).

        The common call, tensors and atoms side by side (keywords, if any, all atoms such as
        ``dim=-1``), is walked here in one pass with the identity check of :meth:`label_of`
        inline: this runs for every call.
        """
        flat = len(args) <= len(_SLOTS)
        if flat and kwargs:
            for value in kwargs.values():
                if type(value) not in ATOMS:
                    flat = False
                    break
        if flat:
            refs: list[ArgRef] = []
            template: list[Any] = []
            live = self._live
            try:
                for i, arg in enumerate(args):
                    kind = type(arg)
                    if kind is Tensor or kind is _Parameter:
                        entry = live.get(id(arg))
                        if (
                            entry is not None
                            and entry() is arg
                            and entry.version is not None  # an inference tensor: label_of asks
                            and entry.version == arg._version
                        ):
                            label = entry.label
                        else:
                            label = self.label_of(arg)
                        template.append(_SLOTS[len(refs)])
                        refs.append(_arg_ref(ArgRef, (label, _POSITIONS[i])))
                    elif kind in ATOMS or kind is slice and plain_slice(arg):
                        template.append(arg)
                    else:
                        break  # nested: walked below
                else:
                    return refs, tuple(template), dict(kwargs) if kwargs else {}
            except RuntimeError:  # an inference tensor has no version: label_of knows
                pass
        return self._walked_arguments(args, kwargs)

    def _walked_arguments(self, args: tuple, kwargs: dict) -> tuple[list[ArgRef], tuple, dict]:
        """:meth:`arguments` of any call: the tree walked, each tensor :meth:`label_of`."""
        leaves, args_template, kwargs_template = flatten_call(args, kwargs)
        label_of = self.label_of
        refs = [_arg_ref(ArgRef, (label_of(t), pos)) for pos, t in leaves]
        return refs, args_template, kwargs_template

    def _note_unshared(self, tensor: Tensor) -> None:
        """``tensor`` came from ``x.data``: its storage's versions are no longer to be
        trusted alone. From the first such alias on, every argument is labelled by
        :meth:`_label_of_unshared` (the per-op path of a forward without ``.data`` stays as
        it is: these methods are replaced on this builder only)."""
        if self.live.note_unshared(tensor):
            self.label_of = self._label_of_unshared  # type: ignore[method-assign]
            self.arguments = self._walked_arguments  # type: ignore[method-assign]

    def _label_of_unshared(self, tensor: Tensor) -> str:
        """:meth:`label_of`, also asking the recorded writers of a storage that a ``.data``
        alias reaches: a write through one alias moves only that alias's version."""
        entry = self._live.get(id(tensor))
        if (
            entry is not None
            and entry() is tensor
            and entry.version is not None
            and entry.version == tensor._version
            and storage_key(tensor) in self.live.unshared
        ):
            return self._unversioned(tensor, entry.label, entry.calls)
        return TraceBuilder.label_of(self, tensor)

    def _unversioned(self, tensor: Tensor, label: str, since: int) -> str:
        """:meth:`label_of` for an inference tensor, which has no version counter (under
        ``torch.inference_mode()``): a recorded write into its storage since its value was
        taken (call count ``since``) is what a moved version would have said."""
        return (
            self._refresh(tensor, label, since) if self.live.written_since(tensor, since) else label
        )

    def _refresh(
        self, tensor: Tensor, stale_label: str, since: int, stale_version: int | None = None
    ) -> str:
        """Record that ``tensor`` changed behind the capture's back (see module docstring).

        Its parents are the stale value, then the recorded writes into its storage since
        that value was taken (call count ``since``) that are not moot, in order
        (:meth:`LiveVersions.writes_since`): replay redoes each of them.

        When the recorded writes account for every step of the tensor's version counter
        since ``stale_version`` (its value then), nothing else changed it: its value is
        the writes over the stale value, and is kept that way once something writes into
        it (:meth:`~torchlens.capture.payloads.PayloadKeeper.keep_as_writes`).
        """
        geometry = _geometry(tensor)
        writes, covered, since_stale = self.live.writes_since(tensor, stale_label, since, geometry)
        parents = [stale_label, *(label for label, _ in writes)]
        refs = [ArgRef(label, str(i)) for i, label in enumerate(parents)]
        self.live.calls += 1  # a call of its own, not part of the previous one
        op = self._new_op(REFRESH_FUNC_NAME, None, (), {}, refs, tensor, 0, False)
        op.meta["reason"] = "value changed in place through another tensor"
        op.meta["geometry"] = geometry  # with the writers', replay can redo the writes
        if covered:  # the stale value is still the base replay writes over, but unread
            op.meta["covered"] = True
        stale = self._records[stale_label]
        if (
            writes
            and stale_version is not None
            and version_of(tensor) == stale_version + since_stale
            and storage_key(tensor) not in self.live.unshared
            and stale.shape == tuple(tensor.shape)
            and stale.dtype == tensor.dtype
        ):
            self.payloads.keep_as_writes(op.label, tensor, stale_label, writes, geometry)
        return op.label

    # -- ops ------------------------------------------------------------------------------
    def record_call(
        self,
        name: str,
        func: Callable[..., Any],
        args_template: tuple,
        kwargs_template: dict,
        parent_args: list[ArgRef],
        outputs: list[Tensor],
        *,
        inplace: bool,
        rng_state: dict[str, Tensor] | None = None,
    ) -> list[Op]:
        """Record the outputs of one function call as ops; returns them."""
        live = self.live
        live.calls += 1
        if name in UNSHARING:  # x.data, x.data = y: an alias with a version counter of
            self._note_unshared(outputs[0])  # its own
        if len(outputs) == 1 and not inplace:  # the common case, without the loop
            return [self._new_op(name, func, args_template, kwargs_template, parent_args,
                                 outputs[0], 0, False, None, rng_state)]  # fmt: skip
        multi = len(outputs) > 1
        base = self.labeler.new(name)
        ops = []
        for output_index, tensor in enumerate(outputs):
            label = f"{base}:{output_index}" if multi else base
            op = self._new_op(
                name, func, args_template, kwargs_template, parent_args, tensor,
                output_index, inplace, label, rng_state,
            )  # fmt: skip
            if inplace and name != SET_DATA:  # (x.data = y writes no memory: y's is x's)
                key = storage_key(tensor)
                if key is not None:  # where it wrote: for refreshes, and replay
                    region = op.meta["geometry"] = _geometry(tensor)
                    live.wrote(key, op.label, region, tensor.dtype)
            ops.append(op)
        return ops

    def _new_op(
        self,
        name: str,
        func: Callable[..., Any] | None,
        args_template: tuple,
        kwargs_template: dict,
        parent_args: list[ArgRef],
        tensor: Tensor,
        output_index: int,
        inplace: bool,
        label: str | None = None,
        rng_state: dict[str, Tensor] | None = None,
    ) -> Op:
        label = label or self.labeler.new(name)
        if len(parent_args) == 1:
            parents: tuple[str, ...] = (parent_args[0][0],)
        else:
            parents = tuple(dict.fromkeys(map(_first, parent_args)))
        frames, live = self.stack.frames, self.live
        requires_grad = tensor.requires_grad
        # positional, in field order: the per-op path, where keywords cost measurably
        op = Op(
            label, len(self.ops), name, live.calls, output_index, parents,
            tuple(parent_args), frames[-1][0] if frames else "", frames, tuple(tensor.shape),
            tensor.dtype, tensor.device, requires_grad, inplace, [], "", func,
            args_template, kwargs_template, rng_state, {}, (), self.store,
        )  # fmt: skip
        records = self._records
        for parent in parents:
            records[parent].children.append(label)
        if type(tensor) is not Tensor:  # (a wrapper subclass: a DTensor)
            self._wrappers.note(tensor)
        self.ops.append(op)
        records[label] = op
        if live.inference and tensor.is_inference():  # no version counter: no raise
            version = None
        else:
            try:  # version_of inline (the per-op path)
                version = tensor._version
            except RuntimeError:  # an inference tensor made under a mode the model entered
                version = None
        if self.save_payloads:
            if self.payload_filter is None or self.payload_filter(op):
                self.payloads.save(label, tensor, False, version)
            else:
                self.store.mark_missing(
                    label, "not_saved", f"{label!r} was not selected by save=; trace again "
                    "with a selector that matches it to keep its value",
                )  # fmt: skip
        if self.observers:
            self._remember(tensor, label, version)
        else:  # _remember inline (the per-op path)
            entry = self._live[id(tensor)] = LiveEntry(tensor)
            entry.label, entry.version, entry.calls = label, version, live.calls
        return op

    def note_returned_weight(self, op: Op, tensor: Tensor) -> None:
        """``op`` returned its argument ``tensor``, an ``nn.Parameter`` the capture did not
        know: a weight an offloading hook moves in (``param.to(device)``). Its next read
        asks :meth:`label_of`, which names it as the parameter of the open module holding
        it by then (``_FRESH_WEIGHT``). One written in place (an init) keeps its edges."""
        entry = self._live.get(id(tensor))
        if id(tensor) not in self.sources.owned and entry is not None and entry.label == op.label:
            self._live[id(tensor)] = live_entry(tensor, entry.label, _FRESH_WEIGHT, entry.calls)

    def live_entries(self, tensors: list[Tensor]) -> list[LiveEntry | None]:
        """Per tensor, what the builder knows of it when it holds a recorded value still
        (an argument returned as it is), else None: see :meth:`restore_entry`."""
        entries: list[LiveEntry | None] = []
        for tensor in tensors:
            entry = self._live.get(id(tensor))
            alive = entry is not None and entry() is tensor and entry.version == version_of(tensor)
            entries.append(entry if alive else None)
        return entries

    def restore_entry(self, tensor: Tensor, entry: LiveEntry) -> None:
        """``tensor`` holds again the value ``entry`` (from :meth:`live_entries`) labelled:
        an op returned it as it was and an edit replaced that output, so its other
        readers (a residual kept aside) still read the earlier value."""
        self._live[id(tensor)] = entry

    def replace_output(self, op: Op, tensor: Tensor) -> None:
        """An op hook (``intervene=``) swapped or rewrote ``op``'s output: downstream ops read
        ``tensor`` as ``op``, and the saved value is the edited one."""
        op.shape, op.dtype, op.device = tuple(tensor.shape), tensor.dtype, tensor.device
        op.requires_grad = tensor.requires_grad
        self.payloads.recipes.pop(op.label, None)  # (an edited refresh: its edited value)
        if self.save_payloads:
            self.payloads.save(op.label, tensor, copy=False)
        self._remember(tensor, op.label)

    def save_extra(self, key: str, value: Tensor) -> None:
        """Keep a value under a key that is not a record label (an edit's original value)."""
        if self.save_payloads:
            self.payloads.save(key, value, copy=False)

    # -- escapes --------------------------------------------------------------------------
    def record_escape(self, via: str, tensors: Sequence[Tensor], value: Any) -> Any:
        """Python read ``tensors``' values through ``via`` and got ``value``: one
        :class:`~torchlens.trace.Escape` per record read; returns the value the model gets
        (``escape_hook``'s replacement, when one is set)."""
        escapes = self.escapes
        if type(escapes) is not list:  # the first escape: a list of the instance's own
            escapes = self.escapes = []
        call = escapes[-1].call + 1 if escapes else 0
        labels = dict.fromkeys(map(self.label_of, tensors))
        kind, text, where = type_name(value), short_repr(value), caller_line(2)
        index = len(self.ops)
        escapes += [Escape(label, via, text, kind, index, call, where) for label in labels]
        return value if self.escape_hook is None else self.escape_hook(call, value)

    # -- module calls ---------------------------------------------------------------------
    def enter_module(
        self, module: nn.Module, address: str, inputs: Sequence[Tensor], type_name: str
    ) -> None:
        """A module's forward starts: push it on the module stack, named ``type_name``."""
        if self.halt_pending is not None:  # stop_after= matched: no call starts after it
            raise self.halt_pending
        self.stack.open(id(module), address, type_name, self._labels(inputs), len(self.ops), module)

    def _labels(self, tensors: Sequence[Tensor]) -> tuple[str, ...]:
        """``label_of`` each tensor; a module call's one tensor (the usual call, once on
        entry and once on exit) with the identity check of :meth:`label_of` inline."""
        if len(tensors) != 1:
            return tuple(map(self.label_of, tensors))
        tensor = tensors[0]
        entry = self._live.get(id(tensor))
        if (
            entry is not None
            and entry() is tensor
            and entry.version is not None  # an inference tensor: label_of asks
            and entry.version == tensor._version
            and not self.live.unshared
        ):
            return (entry.label,)
        return (self.label_of(tensor),)

    def exit_module(self, outputs: Sequence[Tensor]) -> ModuleCall | None:
        """A module's forward returned: pop it and note what it returned; returns the call."""
        call = self.stack.pop(len(self.ops))
        if call is not None:
            call.outputs = self._labels(outputs)
        return call

    def record(self, label: str) -> Op | Source | None:
        """The op or source recorded under ``label`` so far."""
        return self._records.get(label)

    def enter_group(self, name: str, inputs: Sequence[Tensor]) -> None:
        """An opened composite function starts (``capture/composite.py``): a call like a
        module's, at the enclosing module's address plus ``"." + name``."""
        frames = self.stack.frames  # (the address: a str key, apart from modules' ids)
        address = group_address(frames[-1][0] if frames else "", name)
        self.stack.open(address, address, name, self._labels(inputs), len(self.ops))

    # -- finish ---------------------------------------------------------------------------
    def root_call(self, root_type: str, output_tensors: Sequence[Tensor]) -> ModuleCall:
        """The call of the whole model (``<root>:1``), returning ``output_tensors``."""
        outputs = tuple(map(self.label_of, output_tensors))
        return self.stack.root(root_type, tuple(self.input_labels), outputs)

    def finish(
        self,
        root_type: str,
        output: Any,
        output_tensors: list[Tensor],
        rng_state: dict[str, Any] | None,
        meta: dict[str, Any],
        keep_safe: Iterable[Tensor] = (),
    ) -> Trace:
        """Freeze the recording into a :class:`Trace`.

        Saved aliases of ``keep_safe`` tensors (the inputs and outputs, which the caller keeps
        and may edit) are cloned so later edits cannot reach the trace.
        """
        root = self.root_call(root_type, output_tensors)
        output_labels = list(root.outputs)
        if self.sources.without_grad:
            meta = {**meta, WITHOUT_GRAD: list(self.sources.without_grad)}
        for tensor in keep_safe:
            self.payloads.protect(tensor)
        calls = [root, *self.stack.calls]
        root.ops = tuple(map(_label, self.ops))
        self.stack.close(root.ops)
        trace = Trace(
            ops=self.ops,
            sources=self.sources.records,
            modules=calls,
            input_labels=list(self.input_labels),
            output_labels=output_labels,
            output=output,
            store=self.store,
            rng_state=rng_state,
            meta=meta,
            escapes=list(self.escapes),
        )
        payloads = self.payloads
        for held in (
            self._live,
            self.sources.owned,
            payloads.aliases,
            self._writers,
            payloads.recipes,
        ):
            held.clear()
        self.__dict__.pop("label_of", None)  # set by _note_unshared: a cycle through self
        self.__dict__.pop("arguments", None)
        return trace
