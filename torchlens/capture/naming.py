"""What a torch function is called in a trace, and what kind of call it is.

Every function the capture mode sees is looked up once and cached as a :class:`FuncInfo`:
its readable name (``Tensor.__iadd__`` is ``add_``, ``Tensor.__getitem__`` is ``getitem``),
whether it writes into an existing tensor, whether it draws random numbers, and whether it
can only return non-tensors (``x.shape``, ``x.size()``), in which case it is never an op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torchlens.capture.special import SETTLES, SIDE_WRITES, SPECIAL_OUTPUTS, side_writes

__all__ = [
    "FuncInfo",
    "FUNC_INFOS",
    "func_info",
    "forget",
    "OPENED",
    "OPENED_WHEN",
    "STOCHASTIC_FUNCS",
    "TENSOR_PROPERTIES",
    "ESCAPES",
    "SET_DATA",
    "UNSHARING",
]

# Dunder methods whose readable name differs from the stripped dunder.
_DUNDER_NAMES = {
    "getitem": "getitem",
    "setitem": "setitem",
    "truediv": "div",
    "rtruediv": "rdiv",
    "floordiv": "floor_divide",
    "rfloordiv": "rfloor_divide",
    "mod": "remainder",
    "rmod": "rremainder",
    "and": "bitwise_and",
    "rand": "bitwise_and",
    "or": "bitwise_or",
    "ror": "bitwise_or",
    "xor": "bitwise_xor",
    "rxor": "bitwise_xor",
    "invert": "bitwise_not",
    "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift",
    "radd": "add",
    "rmul": "mul",
    "rmatmul": "matmul",
    "rsub": "rsub",
    "rpow": "rpow",
}
_INPLACE_DUNDERS = {
    "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul",
    "iand", "ior", "ixor", "ilshift", "irshift",
}  # fmt: skip

# Tensor properties that give a tensor: a new one, or an alias (``x.data`` shares ``x``'s
# memory but not its version counter, so writes through it are followed by storage; see
# ``TraceBuilder.label_of``); every other property read is not an op.
TENSOR_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})

# ``x.data = value`` (the setter of Tensor.data), recorded as a write into ``x``
SET_DATA = "set_data"
# x.data and x.data = ...: an alias with a version counter of its own (capture/live.py)
UNSHARING = frozenset({"data", SET_DATA})

# Calls that never return a tensor: skipped before any bookkeeping, for speed.
_NEVER_TENSOR_METHODS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "item", "tolist", "stride",
    "storage_offset", "is_contiguous", "element_size", "data_ptr", "is_floating_point",
    "is_complex", "is_signed", "get_device", "untyped_storage", "storage", "numpy",
    "is_nonzero", "is_same_size", "has_names", "register_hook", "dim_order", "is_set_to",
    "is_pinned", "is_shared", "is_inference", "is_conj", "is_neg", "nbytes", "itemsize",
})  # fmt: skip
_NEVER_TENSOR_DUNDERS = frozenset({
    "len", "bool", "format", "repr", "hash", "int", "float", "complex", "index",
    "reduce_ex", "contains", "iter", "reversed", "array", "dlpack", "dlpack_device",
})  # fmt: skip

# Calls through which a tensor's value leaves torch as a Python value (an escape, see
# capture/escapes.py): Tensor methods and dunders by name, and torch functions that
# compare values and answer with a bool (``x in t`` too). ``format`` and ``repr`` (so
# ``str(t)``, ``print(t)``) give text, ``dlpack`` a capsule; they are recorded too.
ESCAPES = frozenset({
    "item", "tolist", "numpy", "is_nonzero", "equal", "allclose",
    "__bool__", "__int__", "__float__", "__index__", "__complex__", "__array__",
    "__format__", "__repr__", "__dlpack__", "__contains__",
})  # fmt: skip

# Functions that draw from a random generator: capture snapshots the RNG state before them
# so per-op replay reproduces their output. Names are the readable names defined above.
STOCHASTIC_FUNCS = frozenset({
    "dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "alpha_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_", "feature_dropout",
    "feature_dropout_", "native_dropout", "rrelu", "rrelu_", "gumbel_softmax",
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "poisson",
    "exponential_", "geometric_", "log_normal_", "cauchy_", "random_",
    "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "orthogonal_", "sparse_",  # torch.nn.init, as in a fresh nn.Linear
    "multi_head_attention_forward", "scaled_dot_product_attention",
    "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell",
})  # fmt: skip


@dataclass(frozen=True)
class FuncInfo:
    """What the capture mode needs to know about one torch function."""

    name: str  # readable name used in labels
    # True: writes into its first tensor argument by definition; a tuple: the positions of
    # the arguments it writes besides what it returns (special.SIDE_WRITES)
    inplace: bool | tuple[int, ...]
    never_tensor: bool  # can only return non-tensors: pass straight through
    stochastic: bool  # may draw random numbers
    # a composite recorded as a group of its inner ops (composite.py): always (True), or
    # at the calls where opens(args, kwargs) holds
    opens: bool | Callable[[tuple, dict], bool] = False
    escape: str | None = None  # its value leaves torch (ESCAPES): recorded as an escape
    settles: bool = False  # returns with its outputs still being written (special.SETTLES)
    backward: bool = False  # a backward call: the .grad it writes are its outputs (grad_calls)
    # none of the above, and outputs found the usual way: a recording's fast path takes it
    plain: bool = False


# func -> its FuncInfo. The capture modes read it directly on their per-op paths (a dict
# lookup costs less than a call), falling back to func_info for a function not seen yet.
FUNC_INFOS: dict[Any, FuncInfo] = {}
# Composite functions recorded as groups; filled by torchlens.capture.composite.
OPENED: set[Callable[..., Any]] = set()
# Composite functions recorded as groups at some calls only: func -> when(args, kwargs)
OPENED_WHEN: dict[Callable[..., Any], Callable[[tuple, dict], bool]] = {}


def forget(func: Callable[..., Any]) -> None:
    """Drop ``func``'s cached :class:`FuncInfo` (after it was opened or closed)."""
    FUNC_INFOS.pop(func, None)


def func_info(func: Callable[..., Any]) -> FuncInfo:
    """The cached :class:`FuncInfo` of ``func``."""
    try:
        return FUNC_INFOS[func]
    except (KeyError, TypeError):
        pass
    info = _describe(func)
    if _settles(func) or info.name == "backward":
        info = replace(info, settles=_settles(func), backward=info.name == "backward")
    plain = not (info.inplace or info.never_tensor or info.opens or info.settles or info.backward)
    if plain and info.name not in SPECIAL_OUTPUTS and info.name not in UNSHARING:
        info = replace(info, plain=True)
    try:
        FUNC_INFOS[func] = info
    except TypeError:  # unhashable callables are described afresh each time
        pass
    return info


def _settles(func: Callable[..., Any]) -> bool:
    try:
        return func in SETTLES
    except TypeError:  # unhashable
        return False


def _schema_writes(func: Callable[..., Any], name: str) -> tuple[int, ...] | None:
    """The positions of the arguments an op writes besides ``out=``, when other than its
    first alone (which its name says): from an op's schema (a ``torch.library`` custom op
    with ``mutates_args``, an aten overload), or a ``_foreach_*_`` call's tensor list.
    They become outputs of the call (``special.side_writes``)."""
    schema = getattr(func, "_schema", None)
    if schema is not None:
        written = tuple(
            i for i, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
            and not argument.kwarg_only
        )  # fmt: skip
    elif name.startswith("_foreach_") and name.endswith("_"):
        written = (0,)
    else:
        return None
    if not written or (written == (0,) and not name.startswith("_")):
        return None  # nothing, or an in-place op of the usual kind
    if name not in SPECIAL_OUTPUTS:
        SPECIAL_OUTPUTS[name] = side_writes(written)
        for other, info in list(FUNC_INFOS.items()):  # one of that name is plain no more
            if info.plain and info.name == name:
                del FUNC_INFOS[other]
    return written


def _describe(func: Callable[..., Any]) -> FuncInfo:
    packet = getattr(func, "_overloadpacket", None)
    if packet is not None:  # torch.ops.aten.relu_.default, as torch.export's modules call
        raw = packet.__name__  # named as the function: in place, tables, labels alike
    else:
        raw = getattr(func, "__name__", None) or type(func).__name__
    if raw == "__get__":  # a property read such as x.T or x.shape
        prop = getattr(getattr(func, "__self__", None), "__name__", "")
        return FuncInfo(prop, False, prop not in TENSOR_PROPERTIES, False)
    if raw == "__set__" and getattr(getattr(func, "__self__", None), "__name__", "") == "data":
        # x.data = value: x takes value's memory, a write into x like any other (older
        # spectral-norm code updates its power-iteration vectors so)
        return FuncInfo(SET_DATA, True, False, False)
    if raw.startswith("__") and raw.endswith("__"):
        stem = raw[2:-2]
        if stem in _INPLACE_DUNDERS:
            name = _DUNDER_NAMES.get(stem[1:], stem[1:]) + "_"
            return FuncInfo(name, True, False, False)
        name = _DUNDER_NAMES.get(stem, stem)
        escape = raw if raw in ESCAPES else None
        never = stem in _NEVER_TENSOR_DUNDERS
        return FuncInfo(name, stem == "setitem", never, False, False, escape)
    inplace = SIDE_WRITES.get(raw) or _schema_writes(func, raw)
    if inplace is None:
        inplace = raw.endswith("_") and not raw.startswith("_")
    escape = raw if raw in ESCAPES and packet is None else None
    never = raw in _NEVER_TENSOR_METHODS or escape is not None
    try:
        opens: bool | Callable[[tuple, dict], bool] = func in OPENED or OPENED_WHEN.get(func, False)
    except TypeError:  # unhashable callables
        opens = False
    return FuncInfo(raw, inplace, never, raw in STOCHASTIC_FUNCS, opens, escape)
