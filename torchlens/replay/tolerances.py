"""The one table of tolerances replay compares values with, keyed by dtype.

Floating and complex entries are the defaults behind :func:`torch.testing.assert_close`
(``rtol``, ``atol``); integer, boolean and quantized values must match exactly. A value
matches when ``|actual - expected| <= atol + rtol * |expected|`` elementwise, NaN matching
NaN in the same place. Callers may override both numbers (``atol=``/``rtol=``), which then
apply to floating and complex dtypes only: integers stay exact.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import torch

from torchlens._tensors import dense, inner_of

__all__ = ["TOLERANCES", "tolerance", "mismatch", "differs", "comparable", "equal"]

# dtype -> (rtol, atol); dtypes missing here compare exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def tolerance(
    dtype: torch.dtype, atol: float | None = None, rtol: float | None = None
) -> tuple[float, float]:
    """``(rtol, atol)`` for ``dtype``: the table's entry, with overrides for inexact dtypes.

    Example:
        >>> tolerance(torch.float32), tolerance(torch.int64, atol=1.0)
        ((1.3e-06, 1e-05), (0.0, 0.0))
    """
    default = TOLERANCES.get(dtype)
    if default is None:
        return 0.0, 0.0
    return (default[0] if rtol is None else rtol), (default[1] if atol is None else atol)


def mismatch(
    actual: torch.Tensor,
    expected: torch.Tensor,
    atol: float | None = None,
    rtol: float | None = None,
) -> str | None:
    """Why ``actual`` does not match ``expected`` under the table, or ``None`` if it does.

    Example:
        >>> mismatch(torch.ones(2), torch.ones(2)) is None
        True
        >>> mismatch(torch.tensor([1, 2]), torch.tensor([1, 3]))
        'values differ in 1 of 2 elements (max abs diff 1; exact match required for torch.int64)'
    """
    return _mismatch(actual, expected, atol, rtol, explain=True)


def _mismatch(
    actual: torch.Tensor, expected: torch.Tensor, atol: float | None, rtol: float | None,
    explain: bool,
) -> str | None:  # fmt: skip
    """:func:`mismatch`; without ``explain``, a difference is told by a short text (the
    counts and the largest difference cost several passes more)."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} but recorded {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} but recorded {expected.dtype}"
    dense_cpu = (  # both plain dense CPU values: their bytes can be compared
        type(actual) in _PLAIN
        and type(expected) in _PLAIN
        and actual.is_cpu
        and expected.is_cpu
        and actual.layout == _STRIDED
        and expected.layout == _STRIDED
    )
    if dense_cpu and actual.dtype in _NUMPY_EQUAL:  # the usual values: fewer checks
        if actual.data_ptr() == expected.data_ptr() and _same_memory(actual, expected):
            return None
        if _same_bytes(actual, expected) or _equal_plain(actual, expected):
            return None
        a, e = actual.detach(), expected.detach()  # what comparable() makes of them
    else:
        if actual.device != expected.device:
            expected = expected.to(actual.device)
        if _same_memory(actual, expected):  # a view or an alias of the saved value itself
            return None
        if dense_cpu and _same_bytes(actual, expected):  # bfloat16, complex
            return None
        a, e = comparable(actual), comparable(expected)
        if equal(a, e):  # the common case, in one pass
            return None
    rtol_, atol_ = tolerance(actual.dtype, atol, rtol)
    bad = ~_close(a, e, rtol_, atol_)
    if not bool(bad.any()):
        return None
    if not explain:
        return "values differ"
    n_bad, n = int(bad.sum()), bad.numel()
    diff = (a.double() - e.double()).abs() if a.is_floating_point() else (a.long() - e.long()).abs()
    worst = diff[bad].max().item()
    rule = (
        f"atol {atol_:g}, rtol {rtol_:g}"
        if rtol_ or atol_
        else f"exact match required for {actual.dtype}"
    )
    return f"values differ in {n_bad} of {n} elements (max abs diff {worst:g}; {rule})"


def differs(
    a: torch.Tensor, b: torch.Tensor, atol: float | None = None, rtol: float | None = None
) -> bool:
    """Whether two values differ beyond the table's tolerance (or in shape or dtype).

    Example:
        >>> differs(torch.ones(3), torch.ones(3) + 1e-9), differs(torch.ones(3), torch.zeros(3))
        (False, True)
    """
    return _mismatch(a, b, atol, rtol, explain=False) is not None


# Dtypes whose large CPU values are compared through numpy: its elementwise equality is
# several times faster than torch.equal's on CPU (which also slows down with more threads).
_NUMPY_EQUAL = frozenset({
    torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool,
})  # fmt: skip
_NUMPY_MIN_ELEMENTS = 1 << 12  # below this the conversion costs about what it saves
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # subclasses keep their own torch.equal
_STRIDED = torch.strided


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` of two dense real values of one shape and dtype (NaN is never equal).

    Example:
        >>> equal(torch.ones(2), torch.ones(2)), equal(torch.ones(2), torch.zeros(2))
        (True, False)
    """
    if _plain_cpu(a) and _plain_cpu(b) and a.shape == b.shape and a.dtype == b.dtype:
        return _equal_plain(a, b)
    if a.layout != _STRIDED or b.layout != _STRIDED:  # torch.equal refuses sparse values
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = comparable(a), comparable(b)
    return torch.equal(a, b)


def _plain_cpu(t: torch.Tensor) -> bool:
    """A dense CPU tensor of a plain class and a dtype :func:`equal` may hand to numpy
    (none complex or quantized): :func:`comparable` would only detach it."""
    return type(t) in _PLAIN and t.is_cpu and t.dtype in _NUMPY_EQUAL and t.layout == _STRIDED


def _equal_plain(a: torch.Tensor, b: torch.Tensor) -> bool:
    """:func:`equal` of two :func:`_plain_cpu` values of one shape and dtype, as
    ``equal(comparable(a), comparable(b))`` decides it."""
    if a.numel() >= _NUMPY_MIN_ELEMENTS and not (a.is_neg() or b.is_neg()):
        a = a.detach() if a.requires_grad else a
        b = b.detach() if b.requires_grad else b
        return bool((a.numpy() == b.numpy()).all())
    return torch.equal(a, b)


def _c_memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's ``memcmp``, or None where ctypes finds no C library."""
    try:
        libc = ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)
        memcmp = libc.memcmp
    except (OSError, AttributeError, TypeError):
        return None
    memcmp.restype = ctypes.c_int
    memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    return memcmp


_MEMCMP = _c_memcmp()


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two dense CPU values of a plain class, one shape and one dtype hold the same
    bytes: then they match under any tolerance (NaN in the same places included, as
    :func:`mismatch` counts NaN). A replayed value usually does, and one ``memcmp`` tells
    so in about half the time of numpy's elementwise equality. False means only "not
    shown": -0.0 beside 0.0 differs in bytes, not in value."""
    if _MEMCMP is None or a.is_quantized:  # (its values need its scales too)
        return False
    if a.is_neg() != b.is_neg() or a.is_conj() != b.is_conj():  # lazily negated, conjugated
        return False
    size = a.numel() * a.element_size()
    if size == 0:
        return True
    if not (a.is_contiguous() and b.is_contiguous()):
        if a.stride() != b.stride() or not dense((a.shape, a.stride(), 0)):
            return False  # (the same layout, filling its span: a transpose, say)
    return _MEMCMP(a.data_ptr(), b.data_ptr(), size) == 0


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Both read the same elements of the same storage (shape and dtype already match)."""
    if a.layout != torch.strided or b.layout != torch.strided or a.is_quantized:
        return False
    return (
        a.data_ptr() == b.data_ptr()
        and a.stride() == b.stride()
        and a.is_conj() == b.is_conj()
        and a.is_neg() == b.is_neg()
    )


def comparable(t: torch.Tensor) -> torch.Tensor:
    """A dense, real view of ``t`` that elementwise comparison understands (``t`` itself
    when it is one already: a plain dense real tensor outside autograd)."""
    if (
        type(t) is torch.Tensor
        and not t.requires_grad
        and t.layout == _STRIDED
        and not t.is_quantized
        and not t.is_complex()
    ):
        return t
    t = t.detach()
    inner = inner_of(t)
    if inner is not None:  # a wrapper subclass (a DTensor): what this process holds, read
        # without the subclass's ops (a Partial placement would communicate)
        return comparable(inner)
    if t.is_nested:  # (to_dense refuses them)
        t = torch.nested.to_padded_tensor(t, 0.0)
    elif t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.int_repr()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj().resolve_neg())
    return t


def _close(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    if a.dtype == torch.bool or not (a.is_floating_point()):
        return a == e
    if a.dtype in (torch.float16, torch.bfloat16):
        a, e = a.float(), e.float()
    return torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
