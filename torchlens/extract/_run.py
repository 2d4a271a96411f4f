"""``tl.extract``: run a model over a dataset and store a few sites for every example."""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from torchlens._version import __version__
from torchlens.errors import ExtractionError, InvalidArgumentError
from torchlens.extract import _distributed, _signals, _store, _tensor_parallel
from torchlens.extract._batches import BatchPlan, describe
from torchlens.extract._read import Extraction, load_extraction
from torchlens.extract._reduce import Reducer
from torchlens.extract._sites import BatchRunner
from torchlens.selectors import as_selector

__all__ = ["extract"]


def extract(
    model: Any,
    data: Any,
    *,
    save: Any,
    to: str | os.PathLike,
    inputs: Any = None,
    targets: Any = None,
    reduce: Any = None,
    stop_after: Any = None,
    device: str | torch.device | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_mb: float = 16.0,
    flush_s: float | None = 30.0,
) -> Extraction:
    """Run ``model`` over every batch of ``data`` and store the ``save=`` sites, one row per
    example, in the directory ``to``; resumable, and split across processes under torchrun.

    Each batch goes through :func:`tl.record` under ``torch.no_grad()``; its kept sites
    (reduced by ``reduce=``) are streamed into safetensors shards, so memory stays bounded by
    about ``shard_mb`` plus one batch. A killed run, started again with the same arguments,
    skips the batches already on disk; SIGTERM and Ctrl-C write the rows held before the
    process stops, and a time interval bounds what a SIGKILL loses (``flush_s``). Under
    ``torch.distributed`` (e.g. ``torchrun``), rank
    ``r`` runs batches ``r, r + world, ...`` and the finished store is the same as a single
    process would write. A tensor-parallel model (``DTensor`` parameters outside FSDP2) runs
    every batch on every rank, and rank 0 stores each site's global value (shards gathered).

    Args:
        model: an ``nn.Module`` or a function of tensors, in eager mode (call ``.eval()``
            first: rows must not depend on which batch an example falls in).
        data: an iterable of batches: a ``DataLoader`` (in a fixed order: not shuffled, no
            random sampler), a list, a generator.
        save: a selector (``tl.func``, ``tl.module``, ``tl.label``, ...): the sites to keep.
            A site is named by its op label (``"relu_1"``), or, selected by what a module
            call returned (``tl.module("transformer.h.0").output``), by the module's address.
        to: the run directory (created; must be new, empty, or this run's own).
        inputs: what ``model`` takes from a batch: ``None`` (all of it), an index or key
            (``0`` for ``(x, y)`` batches), or a function of the batch. A tuple is passed
            as positional arguments, a mapping (a dict, a ``BatchEncoding``) as keyword
            arguments.
        targets: a part of each batch to store too (as ``inputs=``), e.g. ``1`` for labels:
            a tensor or numbers, one row per example.
        reduce: applied to each site before it is stored: ``"spatial_mean"``,
            ``"token_mean"``, ``"token_last"``, ``"flatten"``, a function ``tensor ->
            tensor`` or ``(tensor, batch) -> tensor`` keeping the batch dimension, or
            ``{label or selector: reduction}``.
        stop_after: a selector: halt each forward after the first matching op.
        device: where inputs go (default: the device of the model's first parameter).
        overwrite: run again over a finished run, or over one started with other arguments.
        progress: show a tqdm bar; ``None`` shows it only on a terminal (and on rank 0).
        shard_mb: megabytes of rows buffered before a shard is written (writing one briefly
            takes twice that).
        flush_s: seconds after which the rows held are written even if under ``shard_mb``
            (``None``: by size only), so a killed run (SIGKILL, a lost node) loses at most
            that long of work. SIGTERM and Ctrl-C write the rows held before the process
            stops, whatever this is.

    Returns:
        The finished :class:`~torchlens.extract.Extraction` (as :func:`load_extraction`).

    Raises:
        ExtractionError: ``exists``, ``args_changed``, ``not_an_extraction``, ``bad_batch``,
            ``shape_changed``, ``sites_changed``, ``not_batched``, ``write_failed``,
            ``distributed``, ``ranks_differ``, ``interrupted``, ``tensor_parallel`` (see
            :class:`~torchlens.errors.ExtractionError`).
            Under torchrun every rank raises it when one rank fails.
        SelectorMatchError: ``no_match`` when ``save=`` matches nothing in the first batch.
        InvalidArgumentError: ``bad_inputs``, ``bad_targets``, ``bad_reduce``,
            ``shuffled_loader``, ``sharded_loader``, ``bad_save``, ``empty_data``.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        >>> batches = [(torch.randn(8, 4), torch.arange(8)) for _ in range(3)]
        >>> ex = tl.extract(model, batches, save=tl.func("relu"), inputs=0, targets=1,
        ...                 to=tempfile.mkdtemp() + "/run", progress=False)
        >>> ex["relu_1"].shape, ex.targets[:3].tolist()
        ((24, 3), [0, 1, 2])
    """
    if save is None:
        raise InvalidArgumentError(
            "tl.extract needs save=: a selector of the sites to keep", code="bad_save"
        )
    from tqdm import tqdm  # imported here: a bar is needed only once a run starts

    selector, reducer = as_selector(save), Reducer(reduce)
    root = Path(to)
    with _signals.guarded() as guard, _process_group() as (rank, world):
        # tensor parallel: every rank runs every batch, rank 0 stores the global values
        parallel = _tensor_parallel.tensor_parallel_param(world, model) is not None
        args = _run_args(model, data, selector, stop_after, inputs, targets, reduce)
        plan = BatchPlan(data, inputs, *((0, 1) if parallel else (rank, world)))
        _distributed.agree(world, root, args, overwrite, plan.order)
        _distributed.on_rank0(world, rank, partial(_store.prepare, root, args, overwrite))
        # what earlier runs left on disk, read before check_shared's gather, which no rank
        # leaves (to write shards of its own) before every rank has read it
        done, disk_schema = _store.done_sizes(root), _store.disk_schema(root)
        disk_keys = _store.disk_site_keys(root)
        _distributed.check_shared(world, root)
        plan.skip(set(done))
        run = BatchRunner(model, selector, reducer, stop_after, targets, _device(model, device))
        run.schema = disk_schema
        run.resume(disk_keys)
        if parallel:
            run.globalize = _tensor_parallel.Globalize(model, world)
        writer: Any = _store.ShardWriter(root, int(shard_mb * 2**20), flush_s, guard.writing)
        if parallel and rank != 0:
            writer = _tensor_parallel.Discard()
        writer.sources, writer.site_keys = run.sources, run.noted
        bar = _bar(tqdm, plan, done, plan.rank, plan.world, progress if rank == 0 else False)
        failure = _run_batches(plan, run, inputs, writer, bar)
        _distributed.settle(world, rank, failure)  # every rank raises if one failed
        if plan.n_batches == 0:
            raise InvalidArgumentError(
                "data gave no batch; pass a non-empty loader or list", code="empty_data"
            )
        meta = {"args": args, "model": args["model"], "torch_version": torch.__version__,
                "torchlens_version": __version__, "world_size": world}  # fmt: skip
        finish = partial(_store.finalize, root, plan.n_batches, plan.n_examples, meta)
        _distributed.on_rank0(world, rank, finish)
        return load_extraction(root)


def _bar(tqdm, plan: BatchPlan, done: dict[int, int], rank: int, world: int, progress):
    """The progress bar (rank 0's, counting its own share): a resumed run starts it at the
    examples already on disk, and says so."""
    mine = sum(size for b, size in done.items() if b % world == rank)
    total = None if plan.known_total is None else plan.known_total + mine
    desc = f"tl.extract ({mine} on disk)" if mine else "tl.extract"
    return tqdm(total=total, initial=mine, unit="ex", desc=desc, dynamic_ncols=True,
                disable=(rank != 0) or (None if progress is None else not progress))  # fmt: skip


_TRIM_EVERY = 8  # batches


def _run_batches(plan: BatchPlan, run: BatchRunner, inputs: Any, writer, bar) -> Exception | None:
    """Run and write this rank's batches; what stopped them, if anything (the batches that
    ran are written whatever it was)."""
    trim, failure = _heap_trimmer(), None
    try:
        for k, batch in enumerate(plan, 1):
            writer.add(batch.index, batch.start, batch.size, run.sites(batch, inputs))
            bar.update(batch.size)
            if k % _TRIM_EVERY == 0:
                trim()
    except Exception as err:
        failure = err
    finally:  # a signal arriving now waits until the rows held are written
        try:
            with writer.writing():
                writer.flush()
                bar.close()
        except Exception as err:
            failure = failure or err
    return failure


def _heap_trimmer() -> Callable[[], object]:
    """A function handing freed heap memory back to the OS (glibc's ``malloc_trim``).

    Each batch frees large activation buffers; glibc keeps them in a fragmented heap whose
    resident size creeps up over thousands of batches (convnet8: +290 MB from 1k to 10k
    examples) although nothing is leaked. Trimming every few batches keeps it flat. A no-op
    where the C library has no ``malloc_trim`` (macOS, Windows, musl).
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return lambda: None
    return partial(trim, 0)


def _device(model: Any, device: str | torch.device | None) -> torch.device | None:
    """``device=``, else the first parameter's device; not ``meta`` (weights an offloading
    hook, e.g. accelerate's ``cpu_offload``, brings in at each call: inputs stay put)."""
    if device is not None:
        return torch.device(device)
    if isinstance(model, nn.Module):
        for p in model.parameters():
            return None if p.device.type == "meta" else p.device
    return None


def _run_args(model, data, selector, stop_after, inputs, targets, reduce) -> dict[str, Any]:
    """What must match for a run on disk to be resumed: compared key by key."""
    kind = type(model)
    named = {"site_names": "module address"} if selector.at_exit else {}
    return {
        **named,  # runs recorded without it named a module's output by its op label
        "model": f"{kind.__module__}.{kind.__qualname__}",
        "parameters": _digest(model),
        "save": repr(selector),
        "stop_after": None if stop_after is None else repr(as_selector(stop_after)),
        "inputs": describe(inputs),
        "targets": describe(targets),
        "reduce": describe(reduce),
        "data": _data_summary(data),
    }


_WHOLE = 1 << 24  # tensors up to this many elements are hashed whole
_SAMPLE = 1 << 20  # larger ones: this many evenly spaced elements, plus their sum


def _digest(model: Any) -> str | None:
    """A hash of the model's parameters and buffers: names, dtypes, shapes and values (a
    tensor over 16M elements by an even sample and its sum, computed on its own device, so
    that a large GPU model is not copied whole to the CPU).

    A ``DTensor`` (FSDP2, tensor parallel) is hashed whole (gathered one tensor at a time,
    a collective every rank makes in the same order), so every rank, and a resume with
    another number of processes, gets the same hash. A tensor whose values are not here (on
    the ``meta`` device, e.g. under an offloading hook; a lazy module's uninitialized
    parameter) or cannot be read as bytes (another tensor subclass) counts by its name,
    dtype and shape only.
    """
    if not isinstance(model, nn.Module):
        return None
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        if is_lazy(t):
            h.update(f"{name}:{t.dtype}:uninitialized;".encode())
            continue
        t = _whole(t.detach())
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        if t.is_meta:
            continue
        try:
            h.update(_value_bytes(t))
        except (RuntimeError, TypeError, NotImplementedError, ValueError):
            h.update(f"unreadable {type(t).__qualname__};".encode())
    return h.hexdigest()[:16]


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s full value (the same on every rank); any other tensor as it is."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return t
    return t.full_tensor() if isinstance(t, DTensor) else t


def _value_bytes(t: torch.Tensor) -> bytes:
    flat = t.reshape(-1)
    out = b""
    if flat.numel() > _WHOLE:
        total = flat.double().sum() if flat.is_floating_point() else flat.sum()
        out = repr(total.item()).encode()
        flat = flat[:: flat.numel() // _SAMPLE]
    if flat.numel():
        out += flat.contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return out


def _data_summary(data: Any) -> str:
    parts = [type(data).__qualname__]
    if isinstance(data, torch.utils.data.DataLoader):
        dataset = data.dataset
        size = len(dataset) if isinstance(dataset, Mapping) or hasattr(dataset, "__len__") else "?"
        parts += [f"dataset={type(dataset).__qualname__}[{size}]", f"batch_size={data.batch_size}"]
    elif hasattr(data, "__len__"):
        parts.append(f"len={len(data)}")
    return " ".join(parts)


@contextmanager
def _process_group():
    """``(rank, world)``; starts a process group from torchrun's environment if none is up,
    so a plain script runs unchanged under torchrun. That group stays up for later calls
    (tearing down and re-creating one races with the other ranks) and ends at exit, unless
    the script destroyed it itself."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized() and _env_world() > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        try:
            dist.init_process_group(backend)
        except Exception as err:
            raise ExtractionError(
                f"WORLD_SIZE={_env_world()} but no {backend} process group could start "
                f"({err}); launch with torchrun, or init torch.distributed yourself",
                code="distributed",
            ) from err
        atexit.register(_destroy_process_group)
    if dist.is_available() and dist.is_initialized():
        yield dist.get_rank(), dist.get_world_size()
    else:
        yield 0, 1


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # the script may have destroyed it already
        dist.destroy_process_group()


def _env_world() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1
