"""Arm 1, the ground truth: rerun the pristine model and compare with what was captured.

The rerun and the capture must start from the same state: the same inputs (the rerun gets
copies, since a forward may modify them), the same buffers (batch norm in training mode
updates its statistics) and the same RNG state. Buffers are snapshotted before the first
of the two forwards and put back only if it changed them, and after the second they must
equal what the first left. Parameters are only watched (version counters), since copying
every weight would add a full pass over the model to each validation.
"""

from __future__ import annotations

import copy
import types
import weakref
from typing import Any

import torch
from torch import nn

from torchlens._tensors import copy_keeping_layout, storage_key, version_of
from torchlens.capture import SETTLES, every_address, fill, flatten, named_tensors, record, rng
from torchlens.errors import PayloadUnavailableError
from torchlens.replay.escape_values import PerturbingMode, Plan
from torchlens.replay.findings import Findings
from torchlens.replay.interpreter import settle_of
from torchlens.replay.tolerances import equal, mismatch

__all__ = [
    "ModelState",
    "copy_inputs",
    "compare_outputs",
    "detached",
    "note_moved_parameters",
    "rerun",
]

Tensor = torch.Tensor


def copy_inputs(args: tuple, kwargs: dict, problems: list[str] | None = None) -> tuple[tuple, dict]:
    """A deep copy of a call's arguments, as the forward is about to see them.

    Tensors are cloned (same ``requires_grad``; one tensor passed twice stays one), and so is
    every object around them: a cache, list, dict or object the forward extends or edits
    in place is copied too, so one forward cannot change what the other starts from.
    ``copy.deepcopy`` refuses a tensor that is not a leaf of autograd: one the argument
    tree does not show (a key-value cache from a forward run with grad holds them) is found
    by walking the objects, and cloned like the rest. An argument ``copy.deepcopy`` still
    refuses (a lock) leaves only the tensors the argument tree shows copied, and the
    reason is appended to ``problems``.
    """
    leaves, template = flatten((args, kwargs))
    tensors = [tensor for _, tensor in leaves]
    clones = _clones(tensors)
    try:  # deepcopy adds to the memo it is given: the clones stay as they are for a retry
        return copy.deepcopy((args, kwargs), dict(clones))
    except Exception:  # any __deepcopy__/__reduce__ may raise anything
        pass
    memo = _clones(_tensors_within((args, kwargs)), clones)
    try:
        return copy.deepcopy((args, kwargs), memo)
    except Exception as err:
        if problems is not None:
            problems.append(
                f"an input could not be copied ({type(err).__name__}: {err}), so if the "
                "forward modifies it, the rerun and the capture did not start from the "
                "same inputs"
            )
        return fill(template, [memo[id(tensor)] for tensor in tensors])


def _clones(tensors: list[Tensor], memo: dict[int, Any] | None = None) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo that copies each tensor (deepcopy itself refuses tensors
    that are not leaves of autograd): a leaf as a detached clone with its
    ``requires_grad``, a tensor with autograd history by ``clone()``, which keeps it a
    non-leaf that a forward may write into in place (a static cache's ``index_copy_``).
    Tensors ``memo`` has already are not copied again."""
    memo = {} if memo is None else memo
    with torch.enable_grad():
        for tensor in tensors:
            if id(tensor) in memo:
                continue
            if tensor.grad_fn is not None:
                memo[id(tensor)] = copy_keeping_layout(tensor)
            else:
                copy = copy_keeping_layout(tensor.detach())
                memo[id(tensor)] = copy.requires_grad_(tensor.requires_grad)
    return memo


# what copy.deepcopy does not copy (it keeps them as they are), or holds no tensor
_ATOMS = (
    str, bytes, int, float, complex, bool, type(None), type, torch.dtype, torch.device,
    types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
    weakref.ref,
)  # fmt: skip


def _tensors_within(root: Any, limit: int = 100_000) -> list[Tensor]:
    """The tensors ``root`` holds, found along the references ``copy.deepcopy`` follows
    (containers, ``__dict__`` and ``__slots__``), visiting at most ``limit`` objects."""
    found: list[Tensor] = []
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if isinstance(obj, _ATOMS) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            found.append(obj)
        elif isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += obj
        else:
            attributes = getattr(obj, "__dict__", None)
            stack += attributes.values() if isinstance(attributes, dict) else ()
            for cls in type(obj).__mro__:
                slots = getattr(cls, "__slots__", ())
                for slot in (slots,) if isinstance(slots, str) else slots:  # one slot: a str
                    value = getattr(obj, slot, None)
                    if value is not None:
                        stack.append(value)
    return found


def detached(obj: Any) -> Any:
    """``obj`` with its tensors detached, so the autograd graph behind them (every
    activation the forward saved for backward) is freed rather than held through the checks.
    """
    leaves, template = flatten(obj)
    return fill(template, [t.detach() for _, t in leaves])


_STATE = frozenset({Tensor, torch.Generator})  # module attributes a forward may advance


class ModelState:
    """The model's buffers (copied) and parameters (versions and memory) before a forward.

    A parameter is watched by its version counter and the address of its memory: an
    in-place write moves the first, ``param.data = value`` (older spectral-norm code
    updating its power-iteration vectors) only the second.

    With ``keep_parameters``, the parameters are copied too, so :meth:`rewind` puts back
    weights the forward wrote in place (taken only once a forward was seen to do that:
    a copy of every weight is not paid for on every check).
    """

    def __init__(
        self, model: Any, *, keep_parameters: bool = False, by_value: frozenset[str] = frozenset()
    ) -> None:
        self.model = model if isinstance(model, nn.Module) else None
        # kept parameters told changed by their values too: those whose .data the forward
        # took, since a write through that alias moves neither version nor memory
        self.by_value = set(by_value)
        # name -> (buffer, version, copy, address of its memory)
        self.buffers: dict[str, tuple[Tensor, int | None, Tensor, int | None]] = {}
        self.params: dict[str, tuple[Tensor, tuple]] = {}  # name -> (param, _mark)
        self.kept: dict[str, Tensor] = {}  # parameter copies, with keep_parameters
        self._ids: dict[int, str] | None = None  # see param_ids
        # tensors kept as plain module attributes (torchmetrics' accumulators, counters):
        # (module, name, tensor, version, copy)
        self.attributes: list[tuple[nn.Module, str, Tensor, int | None, Tensor]] = []
        # generators a module holds (torch.randn(..., generator=self.gen)): their states
        self.generators: list[tuple[torch.Generator, Tensor]] = []
        if self.model is None:
            return
        walk = every_address(self.model)
        seen: set[int] = set()
        for _, module in walk:
            if id(module) in seen or _STATE.isdisjoint(map(type, module.__dict__.values())):
                continue  # (most modules hold no tensor or generator of their own)
            seen.add(id(module))
            for name, value in [kv for kv in module.__dict__.items() if type(kv[1]) in _STATE]:
                if type(value) is Tensor:
                    copy = value.detach().clone()
                    self.attributes.append((module, name, value, version_of(value), copy))
                else:
                    self.generators.append((value, value.get_state()))
        for name, buf in named_tensors(self.model, "_buffers", walk).items():
            self.buffers[name] = (buf, version_of(buf), buf.detach().clone(), storage_key(buf))
        for name, param in named_tensors(self.model, "_parameters", walk).items():
            self.params[name] = (param, _mark(param))
            if keep_parameters:
                self.kept[name] = param.detach().clone()

    def changed_parameters(self) -> list[str]:
        """Parameters the forward modified or replaced by other values (the rerun cannot
        start from before). One replaced by a new object holding the same values (what
        accelerate's offload hooks do at every call) is not changed."""
        current = named_tensors(self.model, "_parameters") if self.model else {}
        return [
            name
            for name, (param, mark) in self.params.items()
            if not _same_parameter(current.get(name), param, mark) or self._written(name)
        ]

    def param_ids(self) -> dict[int, str]:
        """The watched parameters, by ``id``: their names (made once)."""
        if self._ids is None:
            self._ids = {id(param): name for name, (param, _) in self.params.items()}
        return self._ids

    def keep(self, name: str) -> None:
        """Keep a copy of parameter ``name`` as it is now (a later forward is about to
        write it, see :class:`~torchlens.replay.param_guard.ParamGuard`), told changed by
        its values too: :meth:`rewind` puts it back. A parameter kept already (with
        ``keep_parameters``) keeps its first copy."""
        if name not in self.kept:
            self.kept[name] = self.params[name][0].detach().clone()
        self.by_value.add(name)

    def aliased(self, ids: set[int]) -> frozenset[str]:
        """The parameters among ``ids`` (tensors whose ``.data`` a forward took, see
        :func:`rerun`): the forward may have written them through that alias."""
        return frozenset(name for name, (param, _) in self.params.items() if id(param) in ids)

    def _written(self, name: str) -> bool:
        """A kept parameter of :attr:`by_value` whose values moved."""
        saved = self.kept.get(name) if name in self.by_value else None
        if saved is None:
            return False
        param = self.params[name][0]
        return param.shape != saved.shape or not equal(param.detach(), saved)

    def rerun_blocked(self, findings: Findings) -> bool:
        """Whether the forward changed parameters in place, which rules out a faithful
        rerun; if so, the ground-truth arm is noted as unverified in ``findings``."""
        changed = self.changed_parameters()
        note_moved_parameters(findings, changed, "the rerun cannot start from the captured state")
        return bool(changed)

    def rewind(self) -> dict[str, Tensor]:
        """Put changed buffers (and kept parameters) back as they were; returns copies of
        the buffers' changed values."""
        after: dict[str, Tensor] = {}
        if self.model is None:
            return after
        self.rewind_parameters()
        self._rewind_attributes()
        current = named_tensors(self.model, "_buffers")
        rewound: dict[int, Tensor] = {}  # a buffer under two names (a module kept twice)
        with torch.no_grad():
            for name, (buf, version, saved, address) in self.buffers.items():
                now = current.get(name)
                if now is not None and id(now) in rewound:  # put back under its first name
                    after[name] = rewound[id(now)]
                    continue
                if now is None or (now is buf and _same(now, saved, version)):
                    continue
                after[name] = rewound[id(now)] = now.detach().clone()
                if now is buf and storage_key(now) != address:  # buf.data = value: that
                    now.data = saved.clone()  # memory may be another tensor's (an output)
                else:
                    _put_buffer(self.model, name, now, saved)
        return after

    def leave(self, after: dict[str, Tensor]) -> None:
        """Rewind, then give the buffers ``after`` names the values it holds (what
        :meth:`rewind` returned after a forward): the model as that forward left it."""
        self.rewind()
        if self.model is None:
            return
        current = named_tensors(self.model, "_buffers")
        with torch.no_grad():
            for name, value in after.items():
                _put_buffer(self.model, name, current.get(name), value)

    def _rewind_attributes(self) -> None:
        """Put tensor attributes back: the object the attribute held, with its values
        (the forward may have rebound the name or written into the tensor); and the
        generators modules hold, to their states."""
        for generator, state in self.generators:
            generator.set_state(state)
        with torch.no_grad():
            for module, name, tensor, version, copy in self.attributes:
                if version_of(tensor) != version and tensor.shape == copy.shape:
                    tensor.copy_(copy)
                if module.__dict__.get(name) is not tensor:
                    module.__dict__[name] = tensor

    def rewind_parameters(self) -> None:
        """Put the kept parameters back where the forward wrote them in place (or gave
        them other memory, ``param.data = value``: they get a copy of their own, since
        that memory may be another tensor's); they then count as unchanged (the versions
        are taken again)."""
        with torch.no_grad():
            for name, saved in self.kept.items():
                param, (version, address) = self.params[name]
                if storage_key(param) != address:
                    param.data = saved.clone()
                elif (version_of(param) != version or self._written(name)) and (
                    param.shape == saved.shape
                ):
                    param.copy_(saved)
                else:
                    continue
                self.params[name] = (param, _mark(param))

    def compare_buffers(self, after: dict[str, Tensor], findings: Findings, atol, rtol) -> None:
        """Buffers now (after the second forward) must equal ``after`` (after the first)."""
        if not after:
            return
        current = named_tensors(self.model, "_buffers") if self.model else {}
        for name, expected in after.items():
            now = current.get(name)
            problem = "missing" if now is None else mismatch(now, expected, atol, rtol)
            if problem:
                findings.fail(
                    name,
                    "ground_truth",
                    f"buffer differs between the rerun and the capture: {problem}",
                )


def note_moved_parameters(findings: Findings, changed: list[str], consequence: str) -> None:
    """Note the ground-truth arm unverified when the forward modified ``changed``
    parameters in place (they cannot be rewound); ``consequence`` says what that ruled out."""
    if changed:
        findings.unchecked(
            changed[0], "ground_truth",
            f"the forward modified parameter(s) {changed} in place, so {consequence}",
        )  # fmt: skip


def _mark(param: Tensor) -> tuple[int | None, int | None]:
    """What moves when a parameter's values change: its version counter (an in-place
    write) and the address of its memory (``param.data = value``)."""
    return version_of(param), storage_key(param)


def _same_parameter(now: Tensor | None, before: Tensor, mark: tuple) -> bool:
    """``now`` holds what ``before`` (at ``mark``, see :func:`_mark`) held: it is that
    parameter, unwritten, or another object with its shape, dtype and values (both on the
    meta device: no values to differ)."""
    if _mark(before) != mark or now is None:
        return False
    if now is before:
        return True
    if now.shape != before.shape or now.dtype != before.dtype:
        return False
    if now.is_meta or before.is_meta:
        return now.is_meta and before.is_meta
    return equal(now.detach().to(before.device), before.detach())


def _same(buffer: Tensor, saved: Tensor, version: int | None) -> bool:
    """Unchanged since the snapshot. Kernels such as batch norm update their running
    statistics without bumping the version counter, so the values are compared too."""
    if version_of(buffer) != version:
        return False
    return buffer.shape == saved.shape and buffer.dtype == saved.dtype and equal(buffer, saved)


def _put_buffer(model: nn.Module, name: str, now: Tensor | None, value: Tensor) -> None:
    """Give buffer ``name`` (``now``, the tensor it names) the values of ``value``: copied
    into it where shape and dtype allow, else a copy of ``value`` set in its place."""
    if now is not None and now.shape == value.shape and now.dtype == value.dtype:
        now.copy_(value)
        return
    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    setattr(owner, attr, value.clone())


def rerun(
    model: Any,
    args: tuple,
    kwargs: dict,
    rng_state: dict | None,
    intervene: Any = None,
    aliased: set[int] | None = None,
    watch: bool = False,
) -> Any:
    """One plain forward with the captured RNG state in place (the caller's comes back).

    With ``intervene``, the edits are applied by ``tl.record``'s lean mode, which shares no
    bookkeeping with the capture being checked. ``aliased`` (a set) receives the ids of the
    tensors whose ``.data`` the forward took: a write through such an alias moves neither
    the tensor's version nor its memory (see :meth:`ModelState.aliased`). With ``watch``,
    it returns ``(output, mode)``: the mode (a :class:`PerturbingMode` perturbing nothing)
    lists the escape calls the forward made and the calls after the first, so the
    completeness arm knows, before the capture, whether it has work, and its own forwards
    can stop where they leave this one's path.
    """
    with rng.restored(rng_state):
        if intervene is None:
            mode = _Unrecorded(aliased, watch)
            with mode:
                output = model(*args, **kwargs)
            return (output, mode) if watch else output
        output = record(model, args, kwargs, intervene=intervene).output
        return (output, None) if watch else output


_DATA = torch._C.TensorBase.data.__get__


class _Unrecorded(PerturbingMode):
    """A mode that records nothing. Under the capture a mode is active, so code that asks
    whether one is (``has_torch_function``: the fast paths of ``nn.MultiheadAttention`` and
    ``nn.TransformerEncoderLayer``) takes its general path; the rerun takes the same. With
    ``aliased``, the ids of tensors whose ``.data`` is taken are added to it; with
    ``watch``, it notes what a :class:`PerturbingMode` notes (perturbing nothing)."""

    def __init__(self, aliased: set[int] | None = None, watch: bool = False) -> None:
        super().__init__(Plan(()))
        self.aliased = aliased
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.aliased is not None and args and func == _DATA:
            self.aliased.add(id(args[0]))
        if self.watch:
            return super().__torch_function__(func, types, args, kwargs)
        result = func(*args, **kwargs) if kwargs else func(*args)
        settle = settle_of(func) if SETTLES else None  # (a collective in flight)
        if settle is not None:
            settle(result)
        return result


def expected_outputs(trace: Any) -> list[Tensor | None]:
    """The captured output values, in the order of the flattened output (compared at once:
    nothing writes into them meanwhile, so they are not copied)."""
    live = [t for _, t in flatten(trace.output)[0]]
    expected: list[Tensor | None] = []
    for i, label in enumerate(trace.output_labels):
        try:
            value = trace[label].out
        except PayloadUnavailableError:
            value = live[i] if i < len(live) else None
        expected.append(None if value is None else value.detach())
    return expected


def compare_outputs(
    trace: Any, expected: list[Tensor | None], reference: Any, findings: Findings, atol, rtol
) -> None:
    """The reference run's output tensors must match the captured ones, one by one."""
    got = [t for _, t in flatten(reference)[0]]
    if len(got) != len(expected):
        findings.fail(
            "output", "ground_truth",
            f"the reference returned {len(got)} tensors but the capture recorded {len(expected)}",
        )  # fmt: skip
        return
    for label, value, want in zip(trace.output_labels, got, expected):
        if want is None:
            findings.unchecked(label, "ground_truth", "no captured value for this output")
            continue
        problem = mismatch(value.detach(), want, atol, rtol)
        if problem:
            findings.fail(label, "ground_truth", f"output differs from the rerun: {problem}")
