"""Which batches this process runs, what part of a batch the model takes, and how many
examples each batch holds.

Batches are numbered in the order the data gives them; batch ``b`` belongs to rank
``b % world``. A ``DataLoader`` over a map-style dataset is rebuilt with a batch sampler of
this rank's batches only, so each process loads just its own data; any other iterable is
read whole by every process, which keeps the batches it owns and only counts the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from torchlens.capture.tree import fill, flatten
from torchlens.errors import ExtractionError, InvalidArgumentError

__all__ = ["Batch", "BatchPlan", "pick", "call_args", "count_examples", "to_device"]


@dataclass
class Batch:
    """One batch this process runs: its number, its first row, its size and its data."""

    index: int  # position in the run's sequence of batches
    start: int  # row (example number) of its first example
    size: int  # examples in it
    data: Any  # the batch as the data gave it


def pick(batch: Any, spec: Any, what: str = "inputs") -> Any:
    """The part of ``batch`` that ``spec`` names: all of it (``None``), an index or key, or
    what a function of the batch returns."""
    if spec is None:
        return batch
    if callable(spec):
        return spec(batch)
    try:
        return batch[spec]
    except (IndexError, KeyError, TypeError) as err:
        raise InvalidArgumentError(
            f"{what}={spec!r} does not name a part of a {type(batch).__name__} batch ({err}); "
            f"pass an index or key the batch has, or a function of the batch",
            code=f"bad_{what}",
        ) from None


def call_args(inputs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for ``model(*args, **kwargs)``: a tuple or list is the positional
    arguments, a dict the keyword arguments, anything else the one argument."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def count_examples(inputs: Any) -> int:
    """The batch size: the first dimension of the first tensor in ``inputs``."""
    for _, tensor in flatten(inputs)[0]:
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    raise InvalidArgumentError(
        f"a batch's inputs ({type(inputs).__name__}) hold no tensor with a batch dimension; "
        "pass inputs= naming the tensor part of each batch",
        code="bad_inputs",
    )


def to_device(obj: Any, device: torch.device | None) -> Any:
    """``obj`` with every tensor moved to ``device`` (unchanged when already there)."""
    leaves, template = flatten(obj)
    if device is None or all(t.device == device for _, t in leaves):
        return obj
    return fill(template, [t.to(device, non_blocking=True) for _, t in leaves])


class BatchPlan:
    """Iterates this rank's batches that are not yet on disk.

    After iteration, ``n_batches`` and ``n_examples`` count the whole run's batches and
    examples (all ranks together).
    """

    def __init__(
        self, data: Any, inputs: Any, rank: int, world: int, done: set[int] | frozenset[int]
    ) -> None:
        self.data, self.inputs = data, inputs
        self.rank, self.world, self.done = rank, world, done
        self.n_batches = 0
        self.n_examples = 0
        self.known_total: int | None = None  # examples this rank will run, when known ahead
        self._mine: list[tuple[int, int, list[int]]] | None = None
        if _map_style_loader(data):
            self._mine = self._own_batches(data)

    def _own_batches(self, loader: DataLoader) -> list[tuple[int, int, list[int]]]:
        _check_sampler(loader)
        mine, start, b = [], 0, -1
        for b, indices in enumerate(loader.batch_sampler):
            indices = list(indices)
            if b % self.world == self.rank and b not in self.done:
                mine.append((b, start, indices))
            start += len(indices)
        self.n_batches, self.n_examples = b + 1, start
        self.known_total = sum(len(i) for _, _, i in mine)
        return mine

    def __iter__(self) -> Iterator[Batch]:
        if self._mine is not None:
            yield from self._iter_loader()
            return
        start, b = 0, -1
        for b, data in enumerate(self.data):
            size = count_examples(pick(data, self.inputs))
            if b % self.world == self.rank and b not in self.done:
                yield Batch(b, start, size, data)
            start += size
        self.n_batches, self.n_examples = b + 1, start

    def _iter_loader(self) -> Iterator[Batch]:
        assert self._mine is not None
        if not self._mine:
            return
        loader = _rebuild(self.data, [indices for _, _, indices in self._mine])
        for (b, start, indices), data in zip(self._mine, loader):
            yield Batch(b, start, len(indices), data)


def _map_style_loader(data: Any) -> bool:
    return (
        isinstance(data, DataLoader)
        and data.batch_sampler is not None
        and not isinstance(data.dataset, IterableDataset)
    )


def _check_sampler(loader: DataLoader) -> None:
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        raise InvalidArgumentError(
            "the DataLoader already has a DistributedSampler; pass the plain (unsharded) "
            "loader: tl.extract gives each process its own batches itself",
            code="sharded_loader",
        )
    if isinstance(sampler, RandomSampler):
        raise InvalidArgumentError(
            "the DataLoader shuffles (shuffle=True); rows are stored in dataset order and a "
            "resumed run must see the same batches, so build it with shuffle=False",
            code="shuffled_loader",
        )


def _rebuild(loader: DataLoader, batches: list[list[int]]) -> DataLoader:
    """A loader like ``loader`` that yields only ``batches`` (lists of dataset indices)."""
    options: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(loader.dataset, batch_sampler=batches, **options)


def describe(spec: Any) -> str | None:
    """A stable text for an ``inputs=`` / ``targets=`` / ``reduce=`` value, for the run record."""
    if spec is None or isinstance(spec, (int, str)):
        return None if spec is None else repr(spec)
    if isinstance(spec, dict):
        return repr({describe_key(k): describe(v) for k, v in spec.items()})
    return _callable_name(spec)


def describe_key(key: Any) -> str:
    return key if isinstance(key, str) else repr(key)


def _callable_name(fn: Callable | Any) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else name


def batch_error(err: BaseException, batch: Batch) -> ExtractionError:
    """The typed error for a batch the model (or the input selection) rejected."""
    return ExtractionError(
        f"the model rejected batch {batch.index} (rows {batch.start} to "
        f"{batch.start + batch.size - 1}): {type(err).__name__}: {err}; the batches before it "
        "are saved: fix the data or inputs= and rerun tl.extract with the same arguments",
        code="bad_batch",
    )
