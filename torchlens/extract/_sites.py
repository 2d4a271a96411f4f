"""One batch through the model: which sites it gives, under which names, checked against the
first batch's.

A site selected by what a module call returned (``tl.module("transformer.h.0").output``) is
named by the module's address, ``"transformer.h.0"``, not by the op that computed it
(``"add_6"``): the address says what the row is and stays the same when the model's inside
changes. A module called more than once in a batch (a shared block) gives
``"address:call"`` sites, and a call returning several selected values ``"address[k]"``
(the k-th, in the order they were computed). Any other site keeps its op label
(``"relu_1"``), the label ``tl.trace`` gives that op. An op that two selected calls
returned (a wrapper returning its last child's output) is stored under both names, and an
op selected both by a module's output and by something else (``tl.func("add") | ...``)
under its label as well.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from torchlens.capture import record, resolve_root
from torchlens.errors import (
    ExtractionError,
    InvalidArgumentError,
    SelectorMatchError,
    TorchLensError,
)
from torchlens.extract import _store
from torchlens.extract._batches import (
    Batch,
    batch_error,
    call_args,
    describe,
    describe_error,
    pick,
    to_device,
)
from torchlens.extract._identity import Key, KeyedSave, describe_key
from torchlens.extract._layers import resolve_layers

__all__ = ["BatchRunner", "dtype_name", "SAFETENSORS_DTYPES"]


class BatchRunner:
    """Runs one batch and checks its sites against the first batch's (or the shards on
    disk); ``sources`` maps each site named by module address to its op label."""

    def __init__(self, model, selector, reducer, stop_after, targets, device) -> None:
        self.model, self.selector, self.reducer = model, selector, reducer
        self.stop_after, self.targets, self.device = stop_after, targets, device
        self.schema: dict[str, tuple[tuple[int, ...], str]] | None = None
        self.first: int | None = None  # the batch the schema was taken from
        self.sources: dict[str, str] = {}
        self.pass_names: dict[str, str] | None = None  # tl.layer sites: label -> "layer:pass"
        self.keyed = KeyedSave(selector)  # what record is given: notes each op's key
        self.identity: dict[str, Key] | None = None  # site named by label -> its op's key
        self.noted: dict[str, Key] = {}  # the same, for the shard writer (filled once)
        # a module's tree, walked once per run (a function's root may name modules first
        # met during a forward: resolved per batch)
        self.root = resolve_root(model) if isinstance(model, nn.Module) else None
        # (view, value, args, kwargs) -> the value to store: the global tensor of a site
        # of a tensor-parallel model (extract/_tensor_parallel.py); None: the value itself
        self.globalize: Any = None

    def sites(self, batch: Batch, inputs: Any) -> dict[str, torch.Tensor]:
        args, kwargs = call_args(to_device(pick(batch.data, inputs), self.device))
        if self.pass_names is None:  # tl.layer(...) is answered on a trace of the first batch
            self.selector, self.pass_names = resolve_layers(self.model, args, kwargs,
                                                            self.selector)  # fmt: skip
            if self.selector is not self.keyed.inner:  # it asked for layers
                wanted, self.keyed = self.keyed.wanted, KeyedSave(self.selector)
                self.keyed.wanted = wanted  # keys a resumed run took from its shards
        self.keyed.start()
        try:
            with torch.no_grad():
                rec = record(self.model, args, kwargs, save=self.keyed,
                             stop_after=self.stop_after, root=self.root)  # fmt: skip
        except SelectorMatchError:
            if not self.identity:  # the first batch: save= matches nothing at all
                raise
            missing = ", ".join(describe_key(n, k) for n, k in self.identity.items())
            raise self._changed(batch, f"ran none of the sites of {self._where}: "
                                f"{missing}") from None  # fmt: skip
        except TorchLensError:
            raise
        except Exception as err:
            raise batch_error(err, batch) from err
        finally:
            self.keyed.finish()
        values = {}
        for view, name in self._same_ops(self._named(rec.ops), rec.ops, batch):
            name = self.pass_names.get(name, name)  # a pass of a layer: "layer:pass"
            value = view.out
            if self.globalize is not None:
                value = self.globalize(view, value, args, kwargs)
            reduced = self.reducer(view, value, batch.data, name)
            values[name] = self._row_block(name, reduced, batch)
        if self.targets is not None:
            target = self._target(pick(batch.data, self.targets, "targets"), batch)
            values[_store.TARGETS] = self._row_block("targets=", target, batch)
        self._check(values, batch)
        return values

    def _named(self, views: list[Any]) -> list[tuple[Any, str]]:
        """``(view, site name)`` for every selected site, in the order computed: a module's
        address for what a selected call returned (``address:call`` when several calls of
        it did, ``[k]`` after it for the k-th of several values one call returned), the op
        label otherwise."""
        chosen = [(view, *self._selected_by(view)) for view in views]
        calls: dict[str, set[int]] = {}
        values = Counter()  # selected values per call
        for _, frames, _ in chosen:
            for address, call in frames:
                calls.setdefault(address, set()).add(call)
                values[address, call] += 1
        named, nth = [], Counter()
        for view, frames, by_op in chosen:
            for address, call in frames:
                name = address if len(calls[address]) == 1 else f"{address}:{call}"
                if values[address, call] > 1:
                    name += f"[{nth[address, call]}]"
                    nth[address, call] += 1
                named.append((view, name))
                self.sources.setdefault(name, view.label)
            if by_op:
                named.append((view, view.label))
        clash = [name for name, n in Counter(name for _, name in named).items() if n > 1]
        if clash:
            raise InvalidArgumentError(
                f"sites {clash} would be stored under one name twice (a module named like an "
                "op label?); select them by one means only, e.g. only by module output",
                code="bad_save",
            )
        return named

    def _same_ops(self, named: list[tuple[Any, str]], views: list[Any], batch: Batch):
        """``named`` with every site named by an op label taken from the op the first batch
        stored under that name (found by its key, wherever its label moved), or
        ``sites_changed`` naming the batch and both ops."""
        keyed = self.keyed
        if self.identity is None:
            self.resume({n: keyed.key(v) for v, n in named if n == v.label})
            return named
        by_key = {keyed.key(v): v for v in views}
        by_label = {v.label: v for v in views}
        out = [(v, n) for v, n in named if n != v.label]  # named by module address
        for view, name in named:
            if name != view.label or keyed.key(view) in keyed.wanted:
                continue
            if self._picked_by_label_only(view):
                continue  # its label named another op in the first batch: not this site
            raise self._changed(
                batch,
                f"ran {describe_key(view.label, keyed.key(view))}, which save= selects but "
                f"{self._where} did not run",
            )
        for name, key in self.identity.items():
            view = by_label.get(name) if key is None else by_key.get(key)  # None: not keyed
            if view is None:
                now = by_label.get(name)
                there = describe_key(name, keyed.key(now)) if now else "no op of that label"
                raise self._changed(
                    batch,
                    f"did not run site {describe_key(name, key)} of {self._where} "
                    f"(its label now names {there})",
                )
            out.append((view, name))
        return sorted(out, key=lambda pair: pair[0].index)  # the order computed

    @property
    def _where(self) -> str:
        """Where the sites were first seen: a batch of this run, or the shards on disk."""
        return "the shards on disk" if self.first is None else f"batch {self.first}"

    def resume(self, identity: dict[str, Key] | None) -> None:
        """Take the sites' keys (from the first batch, or the shards of an earlier run)."""
        if identity is None:
            return
        self.identity = identity
        self.noted.update(identity)
        self.keyed.wanted = frozenset(k for k in identity.values() if k is not None)

    def _picked_by_label_only(self, view: Any) -> bool:
        """Whether save= picks ``view`` only for its label (``tl.label(...)``)."""
        label = view.label
        try:
            view.label = "\0"
            return not self.selector.matches(view)
        finally:
            view.label = label

    def _changed(self, batch: Batch, what: str) -> ExtractionError:
        return ExtractionError(
            f"batch {batch.index} {what}: the model took another path there, and labels "
            "count ops over the whole forward; select a module's output "
            "(tl.module(...).output), or sites every batch runs, or pass overwrite=True if "
            "the selection changed",
            code="sites_changed",
        )

    def _selected_by(self, view: Any) -> tuple[list[tuple[str, int]], bool]:
        """The calls that returned ``view`` by whose output the selector picks it, and
        whether it also picks the op by other means (its function, label, module...). An
        op kept only because ``stop_after=`` halted on it is neither."""
        calls = [(address or "(model)", call) for address, call, _ in
                 self.selector.output_calls(view)]  # fmt: skip
        returned = view.returned_by
        try:
            view.returned_by = ()
            by_op = self.selector.matches(view)
        finally:
            view.returned_by = returned
        return calls, by_op

    def _target(self, target: Any, batch: Batch) -> torch.Tensor:
        """The ``targets=`` part of a batch as a tensor: numbers, not text or nested parts."""
        if isinstance(target, torch.Tensor):
            return target
        try:
            return torch.as_tensor(target)
        except (TypeError, ValueError, RuntimeError) as err:
            kind = type(target).__name__
            if isinstance(target, (list, tuple)) and target:
                kind += f" of {type(target[0]).__name__}"
            raise InvalidArgumentError(
                f"targets={describe(self.targets)} gave a {kind} in batch {batch.index}, which "
                f"is not a tensor of numbers ({describe_error(err)}); targets= must give a "
                "tensor or numbers with one row per example (class ids, values): pass a "
                "function of the batch returning one (e.g. torch.stack of a collated tuple, "
                "along dim 1), and keep text such as file names beside the run yourself",
                code="bad_targets",
            ) from None

    @staticmethod
    def _row_block(label: str, value: torch.Tensor, batch: Batch) -> torch.Tensor:
        if value.dim() == 0 or value.shape[0] != batch.size:
            raise ExtractionError(
                f"site {label!r} has shape {tuple(value.shape)} in batch {batch.index}, whose "
                f"first dimension is not the batch size {batch.size}; pass reduce= a function "
                "returning one row per example for it",
                code="not_batched",
            )
        value = value.detach().to("cpu")
        if value.untyped_storage().nbytes() > value.numel() * value.element_size():
            value = value.clone()  # a view: do not keep the whole base alive
        return value

    def _check(self, values: dict[str, torch.Tensor], batch: Batch) -> None:
        schema = {k: (tuple(v.shape[1:]), dtype_name(v.dtype)) for k, v in values.items()}
        if self.schema is None:
            self.schema, self.first = schema, batch.index
            return
        where = self._where
        if set(schema) != set(self.schema):
            missing = [k for k in self.schema if k not in schema]
            extra = [k for k in schema if k not in self.schema]
            said = []
            if missing:
                said.append(f"did not produce site(s) {missing} that {where} has")
            if extra:
                said.append(f"produced site(s) {extra} that {where} has not")
            raise ExtractionError(
                f"batch {batch.index} {' and '.join(said)} (its sites: {sorted(schema)}); "
                "select sites every batch reaches (a stop_after= every batch reaches after "
                "them), or pass overwrite=True if the selection changed",
                code="sites_changed",
            )
        for key, (shape, dtype) in schema.items():
            if (shape, dtype) != self.schema[key]:
                old_shape, old_dtype = self.schema[key]
                raise ExtractionError(
                    f"site {key!r} has per-example shape {shape} ({dtype}) in batch "
                    f"{batch.index} but {old_shape} ({old_dtype}) in {where}; pass "
                    "reduce='token_mean' (or another reduction) for a fixed shape, or pad the "
                    "batches to one length",
                    code="shape_changed",
                )


SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                      torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}  # fmt: skip


def dtype_name(dtype: torch.dtype) -> str:
    return SAFETENSORS_DTYPES.get(dtype, str(dtype))
