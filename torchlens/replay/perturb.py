"""How the perturbation arm changes values: clearly different values of the same kind, and a
cheap sliced version of a large call to try first."""

from __future__ import annotations

import math

import torch

from torchlens.replay.exemptions import parent_kind_reason

__all__ = ["Perturber", "same_elements", "sliced", "SLICE_MIN_ELEMENTS"]

Tensor = torch.Tensor

# Calls whose arguments and outputs hold fewer elements than this together are perturbed at
# full size only: below it the cost of a call is Python overhead, which slicing cannot cut.
SLICE_MIN_ELEMENTS = 1 << 16

# Noise is a vector along the last dimension, drawn as a block of this many values (a prime,
# so the pattern never lines up with power-of-two shapes) and tiled when the dimension is
# longer; it is broadcast over the other dimensions. A full-size noise tensor per shape cost
# more than the perturbed calls themselves.
NOISE_PERIOD = 4093


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

    def others(self, values: list[Tensor], keep: set[int]) -> list[Tensor] | None:
        """``values`` with every floating argument outside ``keep`` moved; None if none is."""
        moved, any_moved = list(values), False
        for i, value in enumerate(values):
            if i not in keep and parent_kind_reason(value) is None:
                moved[i] = self.moved(value, 0)
                any_moved = True
        return moved if any_moved else None

    def _noise_like(self, value: Tensor) -> tuple[Tensor, Tensor]:
        """``(noise, noise + 1)`` along ``value``'s last dimension, broadcast over the rest.

        Broadcasting keeps the noise tiny however large the value is (building a full-size
        noise tensor per shape cost more than the perturbed calls). Attempt 0 multiplies it
        by ``value + 1``, so the change is still different in every element.
        """
        width = value.shape[-1] if value.dim() else 1
        key = (width, value.dtype, value.device)
        cached = self._noise.get(key)
        if cached is None:
            draw = torch.float64 if value.dtype == torch.float64 else torch.float32
            block = torch.randn(NOISE_PERIOD, generator=self._generator, dtype=draw)
            tiled = block.repeat(-(-width // NOISE_PERIOD))[:width]
            noise = tiled.to(dtype=value.dtype, device=value.device)
            noise = noise if value.dim() else noise.reshape(())
            cached = self._noise[key] = (noise, noise + 1)
        return cached


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
    buffers) whose leading sizes equal the first output's are cut to one entry in each of
    those dimensions: ``dims=1`` keeps one row of a batch, ``dims=2`` one position of one
    sequence. With ``weights``, parameters and buffers are cut to their first entry too (a
    linear or convolution layer's first output unit); then reading a large weight no longer
    dominates each perturbed call. A parent that changes the sliced call's output is read
    by the function: the same proof as at full size, for a fraction of the cost. Calls that
    are small (see :data:`SLICE_MIN_ELEMENTS`), have nothing to cut, or fail when cut are
    perturbed at a larger point.
    """
    if not shapes or len(shapes[0]) < dims or any(n < 2 for n in shapes[0][:dims]):
        return None
    total = sum(t.numel() for t in values) + sum(math.prod(shape) for shape in shapes)
    if total < SLICE_MIN_ELEMENTS:
        return None
    lead = tuple(shapes[0][:dims])
    small, cut, cut_weights = list(values), False, False
    for i, (value, kind) in enumerate(zip(values, kinds)):
        if kind not in ("parameter", "buffer"):
            if tuple(value.shape[:dims]) == lead:
                small[i] = value[(slice(0, 1),) * dims]
                cut = True
        elif weights and value.dim() and value.shape[0] > 1:
            small[i] = value[:1]
            cut_weights = True
    if weights:
        return small if cut_weights else None
    return small if cut else None


def same_elements(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` reads exactly the memory elements ``b`` reads, in some order.

    True when both start at the same address with the same dtype and element count, and
    either both are contiguous (a reshape) or their (size, stride) pairs are the same up
    to order (a permutation). Every change to ``b`` then changes ``a``: such an edge (a
    transpose, a view, dropout in eval mode returning its input) is proved without a call.
    """
    if a.layout != torch.strided or b.layout != torch.strided or a.is_quantized:
        return False
    if a.dtype != b.dtype or a.numel() == 0 or a.numel() != b.numel():
        return False
    if a.device != b.device or a.data_ptr() != b.data_ptr():
        return False
    if a.is_contiguous() and b.is_contiguous():
        return True
    return _layout(a) == _layout(b)


def _layout(t: Tensor) -> list[tuple[int, int]]:
    return sorted((size, stride) for size, stride in zip(t.shape, t.stride()) if size != 1)
