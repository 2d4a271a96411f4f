"""Which batches this process runs, what part of a batch the model takes, and how many
examples each batch holds.

Batches are numbered in the order the data gives them; batch ``b`` belongs to rank
``b % world``. A ``DataLoader`` over a map-style dataset is rebuilt with a batch sampler of
this rank's batches only, so each process loads just its own data; any other iterable is
read whole by every process, which keeps the batches it owns and only counts the others.
"""

from __future__ import annotations

import copy
import hashlib
import traceback
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from torchlens.capture import fill, flatten
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
    arguments, a mapping (a dict, Hugging Face's ``BatchEncoding``) the keyword arguments,
    anything else the one argument."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _walked_mapping(obj: Any) -> bool:
    """A mapping walked here rather than by ``tree.flatten``, which walks only dicts (so
    misses ``BatchEncoding`` and other ``UserDict``-like batches)."""
    return isinstance(obj, Mapping) and (type(obj) is dict or not isinstance(obj, dict))


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``obj``, in order, including those inside any mapping."""
    if type(obj) in (tuple, list):
        for item in obj:
            yield from _tensors(item)
    elif _walked_mapping(obj):
        for item in obj.values():
            yield from _tensors(item)
    else:
        yield from (tensor for _, tensor in flatten(obj)[0])


def _moved(obj: Any, device: torch.device) -> Any:
    """``obj`` rebuilt with its tensors on ``device``; a mapping keeps its type."""
    if type(obj) in (tuple, list):
        return type(obj)(_moved(item, device) for item in obj)
    if _walked_mapping(obj):
        items = {key: _moved(value, device) for key, value in obj.items()}
        return items if type(obj) is dict else _same_mapping(obj, items)
    leaves, template = flatten(obj)
    return fill(template, [t.to(device, non_blocking=True) for _, t in leaves])


def _same_mapping(original: Mapping, items: dict) -> Any:
    """A mapping like ``original`` holding ``items``: a copy keeps its other attributes (a
    ``BatchEncoding``'s encodings); a plain dict when the type cannot be rebuilt."""
    try:
        if isinstance(original, MutableMapping):
            new = copy.copy(original)
            new.update(items)
            return new
        return type(original)(items)
    except (TypeError, ValueError, AttributeError, KeyError):
        return items


def count_examples(inputs: Any) -> int:
    """The batch size: the first dimension of the first tensor in ``inputs``."""
    for tensor in _tensors(inputs):
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    raise InvalidArgumentError(
        f"a batch's inputs ({type(inputs).__name__}) hold no tensor with a batch dimension; "
        "pass inputs= naming the tensor part of each batch",
        code="bad_inputs",
    )


def to_device(obj: Any, device: torch.device | None) -> Any:
    """``obj`` with every tensor moved to ``device`` (unchanged when already there)."""
    if device is None or all(t.device == device for t in _tensors(obj)):
        return obj
    return _moved(obj, device)


class BatchPlan:
    """Iterates this rank's batches that are not yet on disk (``skip`` names those that are).

    After iteration, ``n_batches`` and ``n_examples`` count the whole run's batches and
    examples (all ranks together). ``order`` identifies a map-style loader's batches (their
    dataset indices) before anything is loaded, so that ranks can check they agree.
    """

    def __init__(self, data: Any, inputs: Any, rank: int, world: int) -> None:
        self.data, self.inputs = data, inputs
        self.rank, self.world = rank, world
        self.done: set[int] | frozenset[int] = frozenset()
        self.n_batches = 0
        self.n_examples = 0
        self.known_total: int | None = None  # examples this rank will run, when known ahead
        self.order: str | None = None
        self._mine: list[tuple[int, int, list[Any]]] | None = None
        if _map_style_loader(data):
            self._mine = self._own_batches(data)

    def skip(self, done: set[int] | frozenset[int]) -> None:
        """Leave out ``done``, the batches already on disk."""
        self.done = done
        if self._mine is not None:
            self._mine = [batch for batch in self._mine if batch[0] not in done]
            self.known_total = sum(len(i) for _, _, i in self._mine)

    def _own_batches(self, loader: DataLoader) -> list[tuple[int, int, list[Any]]]:
        _check_sampler(loader)
        mine, start, b = [], 0, -1
        digest = hashlib.sha256()
        for b, indices in enumerate(loader.batch_sampler):
            indices = list(indices)
            digest.update(f"{_base_indices(loader.dataset, indices)!r};".encode())
            if b % self.world == self.rank:
                mine.append((b, start, indices))
            start += len(indices)
        self.n_batches, self.n_examples = b + 1, start
        self.order = digest.hexdigest()[:16]
        if not _sequential(loader):
            again = hashlib.sha256()
            for indices in loader.batch_sampler:
                again.update(f"{list(indices)!r};".encode())
            if again.hexdigest()[:16] != self.order:
                raise InvalidArgumentError(
                    f"the DataLoader's sampler ({type(loader.sampler).__name__}, batch sampler "
                    f"{type(loader.batch_sampler).__name__}) gives its examples in another order "
                    "each time it is iterated; rows are stored in the order the loader gives "
                    "them and a resumed run (or another process) must see the same batches: "
                    "use a sampler with a fixed order",
                    code="shuffled_loader",
                )
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


def _base_indices(dataset: Any, indices: list[Any]) -> list[Any]:
    """``indices`` into the dataset under any ``Subset``s, so that ranks handed different
    parts of one dataset (each its own ``Subset``) are seen to run different batches."""
    while isinstance(dataset, Subset):
        indices = [dataset.indices[i] for i in indices]
        dataset = dataset.dataset
    return [int(i) if isinstance(i, torch.Tensor) else i for i in indices]


def _map_style_loader(data: Any) -> bool:
    return (
        isinstance(data, DataLoader)
        and data.batch_sampler is not None
        and not isinstance(data.dataset, IterableDataset)
    )


def _sequential(loader: DataLoader) -> bool:
    """A plain loader (no shuffle, no sampler given): its order is the dataset's."""
    return type(loader.batch_sampler) is BatchSampler and type(loader.sampler) is SequentialSampler


_SHUFFLING = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def _check_sampler(loader: DataLoader) -> None:
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        raise InvalidArgumentError(
            "the DataLoader already has a DistributedSampler; pass the plain (unsharded) "
            "loader: tl.extract gives each process its own batches itself",
            code="sharded_loader",
        )
    if isinstance(sampler, _SHUFFLING):
        raise InvalidArgumentError(
            f"the DataLoader draws its examples in a random order ({type(sampler).__name__}"
            f"{', shuffle=True' if type(sampler) is RandomSampler else ''}); rows are stored "
            "in the order the loader gives them, and a resumed run (or another process) must "
            "see the same batches: build it with shuffle=False, or a sampler with a fixed "
            "order (e.g. a list of indices) to extract a subset",
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
        f"{batch.start + batch.size - 1}): {describe_error(err)}; the batches before it are "
        "saved: fix the data or inputs= and rerun tl.extract with the same arguments",
        code="bad_batch",
    )


def describe_error(err: BaseException) -> str:
    """``Type: message``, and where it was raised when the message is empty."""
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    frames = traceback.extract_tb(err.__traceback__)
    if not str(err) and frames:
        frame = frames[-1]
        text += f" (no message; raised in {frame.name} at {frame.filename}:{frame.lineno})"
    return text
