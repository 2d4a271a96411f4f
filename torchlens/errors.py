"""Typed errors: one root, a stable ``code`` on each, and a fix in every message.

Codes are part of the public contract: tests and users match on ``err.code``, never on
message text. Add new errors here rather than raising bare built-ins from the package.
"""

from __future__ import annotations

__all__ = [
    "TorchLensError",
    "UnsupportedModelError",
    "InvalidArgumentError",
    "CaptureError",
    "PayloadUnavailableError",
    "LookupFailedError",
    "CapabilityUnsupportedError",
    "ReentrantCaptureError",
    "IntermediateDerivedGradsUnsupportedError",
    "UnknownBackendError",
    "TraceFileError",
    "GraphvizMissingError",
    "GradUnavailableError",
    "SelectorMatchError",
    "InterventionError",
    "ExtractionError",
    "DistributedError",
    "MissingDependencyError",
    "MixedShapesWarning",
]


class TorchLensError(Exception):
    """Root of every error torchlens raises on purpose.

    Attributes:
        code: a stable, machine-readable identifier such as ``"compiled_module"``.
    """

    code: str = "torchlens_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def __reduce__(self):  # keep code across pickling (multiprocessing, pytest-xdist), and
        # nothing else the error holds (a partial trace is not picklable)
        return (type(self), (str(self),), {"code": self.code})


class UnsupportedModelError(TorchLensError, TypeError):
    """The callable cannot be traced eagerly (compiled, scripted or exported artifacts).

    Codes: ``compiled_module``, ``torchscript_module``, ``exported_program``,
    ``not_callable``, ``module_class`` (an ``nn.Module`` class was passed, not an instance),
    ``pipeline_parallel`` (a ``torch.distributed.pipelining`` pipe, stage or schedule),
    ``unsupported_family`` (``tl.llm_sites`` on a model of no family it maps),
    ``unsupported_site`` (a ``tl.llm_sites`` site that model's family has no exact op for).
    """

    code = "unsupported_model"


class InvalidArgumentError(TorchLensError, ValueError):
    """An argument to a torchlens function has the wrong type or value."""

    code = "invalid_argument"


class CaptureError(TorchLensError, RuntimeError):
    """Capture could not record the forward pass faithfully.

    Codes: ``nested_tensor`` (a strided nested tensor, which has no shape to record).
    """

    code = "capture_failed"


class PayloadUnavailableError(TorchLensError, LookupError):
    """An op's saved value (``op.out``) cannot be given.

    Codes: ``structure_only`` (traced with ``structure_only=True``), ``not_saved`` (excluded
    by ``save=``), ``payload_overwritten`` (the tensor was modified in place after capture),
    ``payload_released`` (its memory was released after capture, as FSDP frees gathered
    parameters).
    """

    code = "payload_unavailable"


class LookupFailedError(TorchLensError, KeyError):
    """A label, index or name does not exist in a trace; the message lists close names."""

    code = "not_found"

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return str(self.args[0]) if self.args else ""


class CapabilityUnsupportedError(TorchLensError, NotImplementedError):
    """A backend was asked for a capability its "Can and cannot" table marks unsupported."""

    code = "capability_unsupported"


class ReentrantCaptureError(TorchLensError, RuntimeError):
    """``tl.trace`` was called while a capture is already running in this thread."""

    code = "reentrant_capture"


class IntermediateDerivedGradsUnsupportedError(CapabilityUnsupportedError):
    """Intermediate *derived* gradients were requested from a backend that records true ones.

    The torch backend captures real gradients through autograd hooks instead: trace with
    ``save_grads=True``, call ``trace.backward()``, and read ``op.grad``.
    """

    code = "intermediate_derived_grads_unsupported"


class UnknownBackendError(LookupFailedError):
    """No backend is registered under the requested name; the message lists the known ones."""

    code = "unknown_backend"


class TraceFileError(TorchLensError, OSError):
    """A saved trace cannot be written or read back faithfully; nothing from it is run.

    Codes: ``not_a_trace`` (no torchlens trace at the path), ``incomplete`` (a save or a
    streamed capture did not finish), ``corrupt_manifest`` (``manifest.json`` is missing,
    truncated or malformed), ``corrupt_payload`` (a payload file is missing, truncated or its
    bytes changed), ``format_version`` (written by an incompatible torchlens),
    ``unsafe_path`` (the manifest points outside the trace directory), ``path_exists``
    (saving over a directory that is not a torchlens trace).
    """

    code = "trace_file"


class GraphvizMissingError(TorchLensError, RuntimeError):
    """Drawing needs Graphviz's ``dot`` program, which is not installed.

    Install it with ``apt-get install graphviz``, ``brew install graphviz`` or
    ``conda install -c conda-forge graphviz``; ``trace.to_dot()`` works without it.
    """

    code = "graphviz_missing"


class GradUnavailableError(TorchLensError, LookupError):
    """An op's or source's gradient (``op.grad``, ``trace.grads[label]``) cannot be given.

    Codes: ``grads_not_captured`` (traced without ``save_grads=True``), ``backward_not_run``
    (no backward has gone through the trace yet: call ``trace.backward()``), ``no_grad`` (the
    op does not lie on the path to the loss, or was computed without gradient tracking),
    ``not_saved`` (excluded by ``save=``), ``grad_aliased`` (the op returned its input tensor
    itself, so autograd cannot tell the two gradients apart), ``no_differentiable_output``
    (``trace.backward()`` found no output that requires grad: pass ``loss_fn=``).
    """

    code = "grad_unavailable"


class SelectorMatchError(TorchLensError, LookupError):
    """A selector given to ``save=``, ``intervene=`` or ``stop_after=`` matched no op.

    Code ``no_match``; the message lists close function names, module addresses or labels.
    """

    code = "no_match"


class InterventionError(TorchLensError, ValueError):
    """An ``intervene=`` function returned something that cannot replace the op's output.

    Codes: ``bad_return`` (not a tensor), ``changed_shape``, ``changed_dtype``,
    ``changed_device`` (pass ``tl.Intervention(fn, allow_changes=True)`` to allow them),
    ``inplace_change`` (an in-place op's output is edited in place, so it must keep its
    shape, dtype and device even with ``allow_changes``); from ``trace.rerun``,
    ``not_replayable`` and ``recompute_failed`` (a recorded call downstream of the edit
    cannot run, or raises, on the edited values).
    """

    code = "intervention_failed"


class ExtractionError(TorchLensError, RuntimeError):
    """``tl.extract`` cannot start, continue or finish a run, or ``tl.load_extraction``
    cannot read one. Whatever was already written stays on disk, intact.

    Codes: ``exists`` (a finished run is in the directory: pass ``overwrite=True`` or load
    it), ``args_changed`` (the run on disk was started with other arguments; the message
    names them), ``not_an_extraction`` (the directory holds something else), ``incomplete``
    (the run did not finish: rerun ``tl.extract`` with the same arguments), ``corrupt``
    (a manifest or shard is unreadable), ``bad_batch`` (the model rejected a batch),
    ``shape_changed`` (a site's per-example shape differs between batches),
    ``sites_changed`` (a batch produced other sites than the first, or did not run the op
    a site named by label is in the first batch; the message names the batch and the
    ops), ``interrupted`` (SIGTERM stopped the run and a handler of the script's own
    returned; the rows it held are on disk), ``not_batched`` (a
    site's first dimension is not the batch size), ``write_failed`` (the disk refused a
    shard, e.g. it is full), ``distributed`` (the process group is not usable, or another
    process of the run stopped), ``ranks_differ`` (the processes of a distributed run were
    given different ``to=``, model weights, batches or arguments, or do not all see the run
    directory; the message names what differs), ``tensor_parallel`` (a site of a
    tensor-parallel model that is a local shard whose layout torchlens cannot tell, e.g.
    reshaped into heads after ``to_local()``: its global value cannot be put together).
    """

    code = "extraction_failed"


class DistributedError(TorchLensError, RuntimeError):
    """The processes of a ``torch.distributed`` run disagree, or one of them is gone, where
    torchlens needs them together: replaying a collective in lockstep, or merging the
    per-rank traces of one run. Every rank raises it instead of waiting on a peer.

    Codes: ``ranks_differ`` (the ranks reached different collectives at the same point of a
    replay, or saved traces of different forwards; the message names the rank and the op),
    ``rank_timeout`` (a rank did not reach a collective of the replay within the timeout;
    the message names it), ``not_a_rank`` (a directory given to ``load_ranks`` holds no
    trace saved by ``save_rank``), ``no_process_group`` (``torch.distributed`` is not
    initialized where a rank is needed).
    """

    code = "distributed"


class MissingDependencyError(TorchLensError, ImportError):
    """An optional dependency a feature needs is not installed; the message names the
    extra to install (``pip install 'torchlens[pandas]'``) and what works without it.

    Codes: ``pandas_missing``.
    """

    code = "missing_dependency"


class MixedShapesWarning(UserWarning):
    """One ``intervene=`` selector edited ops of different shapes (``tl.module("block")``
    matches every op inside the block, not what it returned).

    Select ``tl.module(...).output`` for what a module returned, or ``tl.label(...)`` for
    one op; silence it with ``warnings.filterwarnings("ignore", category=MixedShapesWarning)``
    when editing them all is intended.
    """

    code = "mixed_shapes"
