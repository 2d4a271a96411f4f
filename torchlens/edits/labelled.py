"""A tensor with named axes and a label for each index: what sweeps and lenses return."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchlens._table import dataframe
from torchlens.errors import InvalidArgumentError

__all__ = ["LabelledTensor"]


class LabelledTensor:
    """``values`` with a name per axis (``dims``) and a label per index (``coords``).

    Attributes:
        values: the tensor.
        dims: the axis names, e.g. ``("site", "position")``.
        coords: ``{dim: labels}``, one label per index of that axis.
        name: what a value is (the column name in :meth:`to_pandas`).
        meta: anything else worth keeping with the values (a sweep's baseline metric...).

    Example:
        >>> import torch
        >>> coords = {"site": ["a", "b"], "position": [0, 1]}
        >>> t = LabelledTensor(torch.eye(2), ("site", "position"), coords)
        >>> float(t.sel(site="b", position=1))
        1.0
    """

    def __init__(
        self,
        values: torch.Tensor,
        dims: Sequence[str],
        coords: Mapping[str, Sequence[Any]],
        *,
        name: str = "value",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        dims = tuple(dims)
        if len(dims) != values.dim() or any(
            len(coords[d]) != n for d, n in zip(dims, values.shape)
        ):
            raise InvalidArgumentError(
                f"a LabelledTensor needs one dim name per axis and one label per index: got "
                f"dims {dims} for shape {tuple(values.shape)}",
                code="bad_labels",
            )
        self.values = values
        self.dims = dims
        self.coords = {d: list(coords[d]) for d in dims}
        self.name = name
        self.meta = dict(meta or {})

    @property
    def shape(self) -> torch.Size:
        """The shape of :attr:`values`."""
        return self.values.shape

    def sel(self, **labels: Any) -> torch.Tensor:
        """The values at the given labels (``sel(site="h.0", position=3)``); the axes not
        named are kept whole.

        Raises:
            InvalidArgumentError: ``bad_labels`` for an unknown axis or label.
        """
        index: list[Any] = [slice(None)] * len(self.dims)
        for dim, label in labels.items():
            if dim not in self.coords or label not in self.coords[dim]:
                known = self.coords.get(dim, self.dims)
                raise InvalidArgumentError(
                    f"no label {label!r} on axis {dim!r}; known: {list(known)}",
                    code="bad_labels",
                )
            index[self.dims.index(dim)] = self.coords[dim].index(label)
        return self.values[tuple(index)]

    def to_dicts(self) -> list[dict[str, Any]]:
        """One dict per cell: a key per axis (its label) and :attr:`name` (the value)."""
        flat = self.values.detach().cpu().reshape(-1).tolist()
        cells = itertools.product(*(self.coords[d] for d in self.dims))
        return [{**dict(zip(self.dims, cell)), self.name: v} for cell, v in zip(cells, flat)]

    def to_pandas(self) -> Any:
        """The cells as a long ``pandas.DataFrame`` (a column per axis, one for the value);
        ``.pivot(index="site", columns="position", values="value")`` gives the heatmap.

        Raises:
            MissingDependencyError: ``pandas_missing`` when pandas is not installed.
        """
        return dataframe(self.to_dicts())

    def __repr__(self) -> str:
        axes = ", ".join(f"{d}={len(self.coords[d])}" for d in self.dims)
        return f"<LabelledTensor {self.name}: {axes}>"
