"""How the perturbation arm changes values: clearly different values of the same kind, and a
cheap sliced version of a large call to try first."""

from __future__ import annotations

import math

import torch

from torchlens.replay.exemptions import parent_kind_reason

__all__ = ["Perturber", "sliced", "SLICE_MIN_ELEMENTS"]

Tensor = torch.Tensor

# Calls whose arguments and outputs hold fewer elements than this together are perturbed at
# full size only: below it the cost of a call is Python overhead, which slicing cannot cut.
SLICE_MIN_ELEMENTS = 1 << 16

# Noise is drawn once as a block of this many values (a prime, so the pattern never lines up
# with power-of-two shapes) and tiled: drawing millions of normals per large parameter cost
# more than the perturbed calls themselves.
NOISE_PERIOD = 4093


class Perturber:
    """Makes perturbed values from its own generator (the caller's RNG is never drawn)."""

    def __init__(self, seed: int = 0) -> None:
        self._generator = torch.Generator().manual_seed(seed)
        self._noise: dict[tuple, Tensor] = {}

    def moved(self, value: Tensor, attempt: int) -> Tensor:
        """A clearly different value of the same shape, dtype and device.

        Attempt 0 adds noise scaled to the value, 1 halves it (stays inside ranges such as
        [0, 1]), 2 negates and shifts it. Non-finite entries become finite.
        """
        scale = _magnitude(value) + 1.0
        if math.isfinite(scale):  # (almost surely) every entry is finite: the cheap path
            if attempt == 0:
                return torch.add(value, self._noise_like(value), alpha=scale)
            return value * 0.5 if attempt == 1 else value * -3 - scale
        finite = value.isfinite()
        base = torch.where(finite, value, value.new_zeros(()))
        scale = float(base.abs().mean()) + 1.0
        if attempt == 0:
            return torch.add(base, self._noise_like(value), alpha=scale)
        return torch.where(finite, value * 0.5, scale) if attempt == 1 else base * -3 - scale

    def others(self, values: list[Tensor], keep: set[int]) -> list[Tensor] | None:
        """``values`` with every floating argument outside ``keep`` moved; None if none is."""
        moved, any_moved = list(values), False
        for i, value in enumerate(values):
            if i not in keep and parent_kind_reason(value) is None:
                moved[i] = self.moved(value, 0)
                any_moved = True
        return moved if any_moved else None

    def _noise_like(self, value: Tensor) -> Tensor:
        key = (tuple(value.shape), value.dtype, value.device)
        noise = self._noise.get(key)
        if noise is None:
            draw = torch.float64 if value.dtype == torch.float64 else torch.float32
            block = torch.randn(NOISE_PERIOD, generator=self._generator, dtype=draw)
            count = value.numel()
            tiled = block.repeat(-(-count // NOISE_PERIOD))[:count] if count else block[:0]
            noise = tiled.reshape(value.shape).to(dtype=value.dtype, device=value.device)
            self._noise[key] = noise
        return noise


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
    values: list[Tensor], kinds: list[str], outputs: list[Tensor], dims: int = 1
) -> list[Tensor] | None:
    """The arguments cut to the first entry of the output's ``dims`` leading dimensions.

    Batch-like arguments (not parameters or buffers) whose leading sizes equal the first
    output's are cut to one entry in each of those dimensions: ``dims=1`` keeps one row of a
    batch, ``dims=2`` one position of one sequence. A parent that changes the sliced call's
    output is read by the function: the same proof as at full size, for a fraction of the
    cost. Calls that are small (see :data:`SLICE_MIN_ELEMENTS`), have no such argument, or
    fail when sliced are perturbed at a larger point.
    """
    if not outputs or outputs[0].dim() < dims or any(n < 2 for n in outputs[0].shape[:dims]):
        return None
    if sum(t.numel() for t in (*values, *outputs)) < SLICE_MIN_ELEMENTS:
        return None
    lead = tuple(outputs[0].shape[:dims])
    small, cut = list(values), False
    for i, (value, kind) in enumerate(zip(values, kinds)):
        if kind not in ("parameter", "buffer") and tuple(value.shape[:dims]) == lead:
            small[i] = value[(slice(0, 1),) * dims]
            cut = True
    return small if cut else None
