"""How the perturbation arm changes values and tells whether an output moved.

Probes are named moves of one argument (:data:`SLICED_PROBES` at every point,
:data:`BATTERY` at the recorded point before any edge may fail); :class:`Baseline` judges
a probed output against the unperturbed one on the output's own scale; :func:`sliced`
makes a cheap sliced version of a large call to try first."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import torch

from torchlens._tensors import inner_of, rewrap
from torchlens.replay.exemptions import parent_kind_reason
from torchlens.replay.tolerances import comparable

__all__ = [
    "BATTERY",
    "Baseline",
    "NEUTRAL_PROBES",
    "Perturber",
    "QUICK_PROBES",
    "SLICED_PROBES",
    "SLICE_MIN_ELEMENTS",
    "cut",
    "large_enough",
    "same_elements",
    "slice_plan",
    "sliced",
]

Tensor = torch.Tensor
_STRIDED = torch.strided

# Calls whose arguments and outputs hold fewer elements than this together are perturbed at
# full size only: below it the cost of a call is Python overhead, which slicing cannot cut.
SLICE_MIN_ELEMENTS = 1 << 16

# Noise is a vector along the last dimension, drawn as a block of this many values (a prime,
# so the pattern never lines up with power-of-two shapes) and tiled when the dimension is
# longer; it is broadcast over the other dimensions. A full-size noise tensor per shape cost
# more than the perturbed calls themselves.
NOISE_PERIOD = 4093

# The cheap moves, tried at every point (sliced ones included): noise relative to each entry,
# halving (stays inside ranges such as [0, 1]), and negating with a shift.
QUICK_PROBES = ("noise", "half", "shift")
_QUICK_ATTEMPT = {name: attempt for attempt, name in enumerate(QUICK_PROBES)}
# Tried at sliced points: the cheap moves, then NaN, which passes through every arithmetic
# path, even ``x * 0``: a batch norm whose scale starts at zero (the last one of each timm
# ResNet block) hides its input and mean from every finite move, at any point.
SLICED_PROBES = (*QUICK_PROBES, "nan")
# Tried at the recorded point before an edge may fail, in that order: each reaches a class
# of values the cheap moves leave silent. NaN and inf pass through every arithmetic path,
# even ``x * 0`` and a softmax over one entry (NaN comes first: it shows the most such
# edges); a sign flip un-saturates tanh/softmax and flips comparisons; zero turns a mask of
# ones false; a huge value outweighs a huge partner (``1e20 + x``); a random point breaks
# ties a broadcast noise keeps (arg-max along a constant column).
BATTERY = (*SLICED_PROBES, "sign", "zero", "large", "random", "inf")
# Tried at neutral points (the other arguments replaced by fresh finite values). Halving and
# a random point make a parent that is NaN everywhere finite: NaN rows of a padded token
# that an MoE adds into rows of its target already NaN show the edge only where both the
# target and the parent are finite (DBRX in float64 with left padding).
NEUTRAL_PROBES = ("noise", "sign", "nan", "half", "random")


class Perturber:
    """Makes perturbed values from its own generator (the caller's RNG is never drawn)."""

    def __init__(self, seed: int = 0) -> None:
        self._generator = torch.Generator().manual_seed(seed)
        self._noise: dict[tuple, tuple[Tensor, Tensor]] = {}

    def moved(self, value: Tensor, attempt: int) -> Tensor:
        """A clearly different value of the same shape, dtype and device (floating or complex).

        Attempt 0 adds ``noise * (value + 1)`` in one fused op: relative to large entries,
        absolute to small ones, with no pass over the value to find its scale. Attempt 1
        halves it (stays inside ranges such as [0, 1]) and 2 negates and shifts it; both
        make non-finite entries finite.
        """
        if attempt == 0:
            noise, noise_plus_one = self._noise_like(value)
            return torch.addcmul(noise, value, noise_plus_one)
        scale = _magnitude(value) + 1.0
        if math.isfinite(scale):  # (almost surely) every entry is finite: the cheap path
            return value * 0.5 if attempt == 1 else value * -3 - scale
        finite = value.isfinite()
        base = torch.where(finite, value, 0)
        scale = float(base.abs().mean()) + 1.0
        return torch.where(finite, value * 0.5, scale) if attempt == 1 else base * -3 - scale

    def probe(self, value: Tensor, name: str) -> Tensor:
        """``value`` moved by the probe called ``name`` (see :data:`BATTERY`); a wrapper
        subclass (a ``DTensor``) by moving the tensor it holds (its local shard)."""
        inner = inner_of(value)
        if inner is not None:
            return rewrap(value, self.probe(inner, name))
        attempt = _QUICK_ATTEMPT.get(name)
        if attempt is not None:
            return self.moved(value, attempt)
        if name == "sign":
            return -value
        if name == "zero":
            return torch.zeros_like(value)
        if name in ("nan", "inf"):
            return torch.full_like(value, float(name))
        if name == "large":  # broadcast noise, made full size
            noise = self._noise_like(value)[0]
            return torch.zeros_like(value).add_(noise, alpha=_huge(value.dtype))
        if name == "random":
            return self.random_like(value)
        raise ValueError(f"unknown probe {name!r}; the probes are {BATTERY}")

    def random_like(self, value: Tensor, positive: bool = False) -> Tensor:
        """Fresh finite values of ``value``'s shape, scaled to its finite entries (the
        caller's RNG is not drawn). With ``positive``, in [0.5, 1.5) times that scale."""
        if _quantized(value):  # (a dead int8 partner silences an edge as a zero does)
            fresh = self.random_like(value.dequantize(), positive)
            return _quantized_like(fresh, value)
        finite = value[value.isfinite()] if value.is_floating_point() else value
        scale = float(finite.abs().mean()) + 1.0 if finite.numel() else 1.0
        draw = torch.float64 if value.dtype == torch.float64 else torch.float32
        if positive:
            fresh = torch.rand(value.shape, generator=self._generator, dtype=draw) + 0.5
        else:
            fresh = torch.randn(value.shape, generator=self._generator, dtype=draw)
        if value.is_complex():  # an imaginary part too (x.to(cfloat).imag reads only it)
            imag = torch.randn(value.shape, generator=self._generator, dtype=draw)
            fresh = torch.complex(fresh, imag)
        return (fresh * scale).to(dtype=value.dtype, device=value.device)

    def neutral_points(self, values: list[Tensor], keep: set[int]) -> Iterator[list[Tensor]]:
        """``values`` with every floating argument outside ``keep`` replaced by fresh finite
        values, first positive ones (valid variances, probabilities), then signed ones.

        An edge can be real yet silenced by another argument's value (a zero weight, a NaN
        or a saturating partner); at such a point the parent is probed again.
        """
        others = [
            i for i, v in enumerate(values) if i not in keep and (_movable(v) or _quantized(v))
        ]
        if not others:
            return
        for positive in (True, False):
            point = list(values)
            for i in others:
                point[i] = self.random_like(values[i], positive=positive)
            yield point

    def _noise_like(self, value: Tensor) -> tuple[Tensor, Tensor]:
        """``(noise, noise + 1)`` along ``value``'s last dimension, broadcast over the rest.

        Broadcasting keeps the noise tiny however large the value is (building a full-size
        noise tensor per shape cost more than the perturbed calls). Attempt 0 multiplies it
        by ``value + 1``, so the change is still different in every element.
        """
        width = value.shape[-1] if value.dim() else 1
        key = (width, value.dtype, value.device, value.dim() == 0)
        cached = self._noise.get(key)
        if cached is None:
            draw = torch.float64 if value.dtype == torch.float64 else torch.float32
            block = torch.randn(NOISE_PERIOD, generator=self._generator, dtype=draw)
            tiled = block.repeat(-(-width // NOISE_PERIOD))[:width]
            noise = tiled.to(dtype=value.dtype, device=value.device)
            noise = noise if value.dim() else noise.reshape(())
            cached = self._noise[key] = (noise, noise + 1)
        return cached


def _movable(value: Tensor) -> bool:
    return parent_kind_reason(value) is None


def _quantized(value: Tensor) -> bool:
    return value.is_quantized and value.numel() > 0


def _quantized_like(fresh: Tensor, like: Tensor) -> Tensor:
    """``fresh`` (float) quantized with ``like``'s scheme and parameters."""
    if like.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return torch.quantize_per_tensor(fresh, like.q_scale(), like.q_zero_point(), like.dtype)
    return torch.quantize_per_channel(
        fresh, like.q_per_channel_scales(), like.q_per_channel_zero_points(),
        like.q_per_channel_axis(), like.dtype,
    )  # fmt: skip


def _huge(dtype: torch.dtype) -> float:
    """A magnitude that outweighs any finite partner short of overflow: sqrt of the max."""
    info = torch.finfo(dtype if dtype.is_floating_point else torch.float32)
    return math.sqrt(info.max)


def _magnitude(value: Tensor, sample: int = 4096) -> float:
    """Mean absolute value, estimated from an evenly strided sample of a large tensor.

    Only the noise scale depends on it; a non-finite entry outside the sample just leaves
    that entry non-finite, which still differs from the original value.
    """
    flat = value.reshape(-1) if value.is_contiguous() else value.flatten()
    if flat.numel() > sample:
        flat = flat[:: flat.numel() // sample]
    return float(flat.abs().mean())


def sliced(
    values: list[Tensor],
    kinds: list[str],
    shapes: list[tuple[int, ...]],
    dims: int = 1,
    weights: bool = False,
) -> list[Tensor] | None:
    """The arguments cut to the first entry of the output's ``dims`` leading dimensions.

    ``shapes`` are the call's output shapes. Batch-like arguments (not parameters or
    buffers) whose leading sizes equal the first output's (or are 1 there: broadcast, as
    an attention mask over heads) are cut to one entry in each of those dimensions:
    ``dims=1`` keeps one row of a batch, ``dims=2`` one position of one sequence. With
    ``weights``, parameters and buffers are cut to their first entry too (a linear or
    convolution layer's first output unit); then reading a large weight no longer dominates
    each perturbed call. A parent that changes the sliced call's output is read by the
    function: the same proof as at full size, for a fraction of the cost. Calls that are
    small (see :data:`SLICE_MIN_ELEMENTS`), have nothing to cut, or fail when cut are
    perturbed at a larger point.
    """
    if not large_enough(values, shapes):
        return None
    plan = slice_plan(values, kinds, shapes, dims, weights)
    return None if plan is None else cut(values, plan)


def large_enough(values: list[Tensor], shapes: list[tuple[int, ...]]) -> bool:
    """Whether a call's arguments and outputs hold enough elements to be worth slicing."""
    total = sum(map(Tensor.numel, values)) + sum(map(math.prod, shapes))
    return total >= SLICE_MIN_ELEMENTS


def slice_plan(
    values: list[Tensor],
    kinds: list[str],
    shapes: list[tuple[int, ...]],
    dims: int = 1,
    weights: bool = False,
) -> list[tuple[int, int]] | None:
    """What :func:`sliced` cuts, without cutting: ``(argument index, leading dimensions
    cut)`` pairs, or None when that point does not exist (the size test aside)."""
    if not shapes or len(shapes[0]) < dims or any(n < 2 for n in shapes[0][:dims]):
        return None
    lead = tuple(shapes[0][:dims])
    plan, cut_batch, cut_weights = [], False, False
    for i, (value, kind) in enumerate(zip(values, kinds)):
        if kind not in ("parameter", "buffer"):
            if _batch_like(tuple(value.shape[:dims]), lead):
                plan.append((i, dims))
                cut_batch = True
        elif weights and value.dim() and value.shape[0] > 1:
            plan.append((i, 1))
            cut_weights = True
    return plan if (cut_weights if weights else cut_batch) else None


def _batch_like(head: tuple[int, ...], lead: tuple[int, ...]) -> bool:
    """Whether an argument whose leading sizes are ``head`` is cut with the output's
    ``lead`` (each at least 2): each size is the output's or 1, a dimension broadcast
    over it (an attention mask of one head beside queries of four), and one at least is
    the output's. Cutting a size-1 dimension to its first entry leaves it as it is."""
    if head == lead:
        return True
    if len(head) != len(lead):
        return False
    return all(n == m or n == 1 for n, m in zip(head, lead)) and any(map(int.__eq__, head, lead))


def cut(values: list[Tensor], plan: list[tuple[int, int]]) -> list[Tensor]:
    """``values`` with each argument of ``plan`` cut to its first entry in its leading
    dimensions (see :func:`slice_plan`)."""
    small = list(values)
    for i, dims in plan:
        small[i] = values[i][(_FIRST,) * dims]
    return small


_FIRST = slice(0, 1)


def same_elements(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` reads exactly the memory elements ``b`` reads, in some order.

    True when both start at the same address with the same dtype and element count, and
    either both are contiguous (a reshape) or their layouts address the same offsets: the
    (size, stride) pairs, ordered by stride and with each dimension that continues the
    next merged into it, are the same (a permutation, or a view of a strided tensor that
    splits or merges such dimensions: heads split off a slice of a fused projection). Every
    change to ``b`` then changes ``a``: such an edge (a transpose, a view, dropout in eval
    mode returning its input) is proved without a call.
    """
    if a.layout != _STRIDED or b.layout != _STRIDED or a.is_quantized:
        return False
    if a.data_ptr() != b.data_ptr():  # the usual answer, asked first
        return False
    if a.dtype != b.dtype or a.numel() == 0 or a.numel() != b.numel() or a.device != b.device:
        return False
    if a.is_contiguous() and b.is_contiguous():
        return True
    return _layout(a) == _layout(b)


def _layout(t: Tensor) -> list[tuple[int, int]]:
    """The offsets ``t`` addresses from its start, as (size, stride) pairs by decreasing
    stride, a pair merged into the one before it when that one steps over it exactly
    (``(4, 64), (64, 1)`` is ``(256, 1)``): the same set of offsets, one form for it."""
    pairs = sorted(
        ((size, stride) for size, stride in zip(t.shape, t.stride()) if size != 1),
        key=lambda pair: (-pair[1], pair[0]),
    )
    merged: list[tuple[int, int]] = []
    for size, stride in pairs:
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged


_NUMPY_FLOATS = frozenset({torch.float32, torch.float64})


@functools.cache
def _relative_bound(dtype: torch.dtype) -> float:
    """``4 * eps`` of a floating dtype (cached: ``torch.finfo`` is slow to ask)."""
    return 4 * torch.finfo(dtype).eps


class Baseline:
    """An unperturbed output, against which probed outputs are judged moved or not.

    A probed output moved when its shape, dtype or NaN pattern changed, or when some
    element changed by more than a few rounding errors of *that element*
    (``|a - b| > 4 * eps * |b|``; any change of an exact zero counts). Judging each element
    on its own scale, rather than with the replay's fixed ``atol``, sees a move among
    activations of 1e-10 and a move of an attention score beside a ``finfo.min`` mask.
    Integer, boolean and quantized outputs move when any element changes.
    """

    __slots__ = ("shape", "dtype", "value", "_rel", "_empty", "_bound", "_first")

    def __init__(self, value: Tensor) -> None:
        self.shape, self.dtype = value.shape, value.dtype
        self.value = comparable(value)
        wide = self.value.is_floating_point()
        self._rel = _relative_bound(self.value.dtype) if wide else 0.0
        if self.value.dtype in (torch.float16, torch.bfloat16):
            self.value = self.value.float()
        self._empty = self.value.numel() == 0
        self._bound: float | None = None
        self._first: tuple | bool | None = None  # see _first_element, made on first use

    def moved(self, other: Tensor) -> bool:
        """Whether ``other`` (the output of a probed call) differs from this baseline."""
        if other.shape != self.shape or other.dtype != self.dtype:
            return True
        if self._empty:
            return False
        b = self.value
        a = comparable(other)
        if not self._rel:
            return not torch.equal(a, b)
        a = a.float() if a.dtype != b.dtype else a
        if self._first_moved(a):
            return True
        largest = float(torch.sub(a, b).abs_().max())
        if largest > self._rel * self.bound():  # NaN compares False: decided below
            return True
        if largest == 0:
            return False
        a_nan, b_nan = a.isnan(), b.isnan()
        if not torch.equal(a_nan, b_nan):
            return True
        close = (a == b) | a_nan | ((a - b).abs() <= self._rel * b.abs())
        return not bool(close.all())

    def _first_moved(self, a: Tensor) -> bool:
        """Whether the first element alone moved on its own scale (a probe usually moves
        every element), as the elementwise test below would find: the baseline's first
        element is a number, and the probed one is NaN or infinite (a new NaN, or an
        infinite difference: ``rsqrt`` of a variance the noise made negative), or
        ``|a - b| > 4 * eps * |b|`` there, computed in their dtype as that test does."""
        if self._first is None:
            self._first = self._first_element()
        if self._first is False or type(a) is not Tensor or not a.is_cpu or a.is_neg():
            return False
        base, y, threshold, clear = self._first
        x = a.numpy().item(0)  # a Python float, exact
        if not math.isfinite(x):
            return True  # y is finite (see _first_element)
        if x * y < 0:  # opposite signs: |a - b| > |b| > 4 * eps * |b|, rounded or not
            return True
        if abs(x - y) > clear:  # twice the bound in doubles: no rounding can undo that
            return True
        # same sign (no overflow): the elementwise test's own arithmetic, in the dtype
        return bool(abs(type(base)(x) - base) > threshold)

    def _first_element(self) -> tuple | bool:
        """``(b, float(b), 4 * eps * |b|, 8 * eps * |b|)`` of the first element, ``b`` and
        the first bound as numpy scalars of the dtype, the second a float; False when the
        shortcut does not apply."""
        b = self.value
        if type(b) is not Tensor or not b.is_cpu or b.dtype not in _NUMPY_FLOATS or b.is_neg():
            return False
        base = b.numpy().flat[0]
        y = float(base)
        if not math.isfinite(y):
            return False
        return base, y, type(base)(self._rel) * abs(base), 2 * self._rel * abs(y)

    @property
    def silent(self) -> bool:
        """Whether the value is NaN in every element (no change can show in it)."""
        return self._rel > 0 and bool(self.value.isnan().all())

    def bound(self) -> float:
        """``max |value|``, computed once."""
        if self._bound is None:
            self._bound = float(self.value.abs().max())
        return self._bound
