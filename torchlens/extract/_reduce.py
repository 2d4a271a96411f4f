"""Per-site reductions applied to a batch's activations before anything is stored.

A reduction is a name from :data:`REDUCTIONS`, a function ``tensor -> tensor``, or a function
``(tensor, batch) -> tensor`` that also sees the batch as the data gave it (to pool over the
real tokens with the batch's attention mask, say). It must keep the batch dimension first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchlens._calls import with_second
from torchlens.errors import InvalidArgumentError
from torchlens.selectors import Selector

__all__ = ["REDUCTIONS", "Reducer"]

Tensor = torch.Tensor


REDUCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "flatten": lambda t: t.flatten(1),  # (N, ...) -> (N, prod(...))
    # (N, C, *spatial) -> (N, C)
    "spatial_mean": lambda t: t.mean(dim=tuple(range(2, t.dim()))) if t.dim() > 2 else t,
    "token_mean": lambda t: t.mean(dim=1) if t.dim() > 2 else t,  # (N, T, ...) -> (N, ...)
    "token_last": lambda t: t[:, -1] if t.dim() > 2 else t,  # (N, T, ...) -> (N, ...)
}


def _as_fn(value: Any) -> Callable[[Tensor, Any], Tensor]:
    """The reduction as ``fn(tensor, batch)``: named ones and one-argument functions ignore
    the batch; a two-argument function gets it (for a padding mask, say)."""
    if callable(value) and not isinstance(value, str):
        fn = with_second(value, "batch")  # the batch only when the function asks for it
        if fn is None:
            raise InvalidArgumentError(
                f"the reduce= function {value!r} takes neither (tensor) nor (tensor, batch); "
                "write it as fn(tensor) -> tensor or fn(tensor, batch) -> tensor",
                code="bad_reduce",
            )
        return fn
    if isinstance(value, str):
        fn = REDUCTIONS.get(value)
        if fn is None:
            raise InvalidArgumentError(
                f"reduce={value!r} is not a known reduction; use one of {sorted(REDUCTIONS)} "
                "or a function tensor -> tensor",
                code="bad_reduce",
            )
        return lambda t, batch: fn(t)
    raise InvalidArgumentError(
        f"reduce= takes a name, a function or a {{site: reduction}} dict, got "
        f"{type(value).__name__}",
        code="bad_reduce",
    )


class Reducer:
    """``reduce=`` parsed: one reduction for every site, or a ``{site name, label or
    selector: reduction}`` table whose first matching entry applies (sites no entry matches
    are kept whole)."""

    def __init__(self, spec: Any) -> None:
        self.rules: list[tuple[Any, Callable[[Tensor, Any], Tensor]]] = []
        if spec is None:
            return
        if isinstance(spec, dict):
            for key, value in spec.items():
                if not isinstance(key, (str, Selector)):
                    raise InvalidArgumentError(
                        f"reduce= keys are site labels or selectors, got {key!r}",
                        code="bad_reduce",
                    )
                self.rules.append((key, _as_fn(value)))
        else:
            self.rules.append((None, _as_fn(spec)))

    def __call__(self, view: Any, value: Tensor, batch: Any = None, site: str | None = None):
        """``value`` of the op ``view``, stored as ``site`` (its label unless named by a
        module's address), reduced by the first rule that names the site or op."""
        site = view.label if site is None else site
        for key, fn in self.rules:
            if isinstance(key, str):
                hit = key in (site, view.label)
            else:
                hit = key is None or key.matches(view)
            if hit:
                return self._apply(fn, site, value, batch)
        return value

    @staticmethod
    def _apply(fn: Callable[[Tensor, Any], Tensor], label: str, value: Tensor, batch: Any):
        try:
            out = fn(value, batch)
        except Exception as err:
            raise InvalidArgumentError(
                f"the reduction for site {label!r} failed on a {tuple(value.shape)} "
                f"{value.dtype} tensor: {type(err).__name__}: {err}; give that site another "
                "reduction in a {site: reduction} dict",
                code="bad_reduce",
            ) from err
        if not isinstance(out, Tensor):
            raise InvalidArgumentError(
                f"the reduction for site {label!r} returned {type(out).__name__}, not a tensor",
                code="bad_reduce",
            )
        return out
