"""The capture session: a torch function mode plus wrapped module forwards that build a Trace.

Layers: ``naming`` (what a call is), ``tree`` (tensors inside arguments), ``builder`` (the
mutable recording), ``mode`` and ``hooks`` (what sees the calls), ``session`` (install and
remove them), ``api`` (``tl.trace``). Nothing here imports replay, io, viz or report.

This module is capture's public face: every name another package of torchlens uses from the
capture is listed in ``__all__`` below and imported from ``torchlens.capture``, never from
one of its modules (``tests/test_architecture.py`` fails otherwise; docs/capture.md,
"Capture's public face", says what each group is for).
"""

from torchlens.capture import rng
from torchlens.capture.api import normalize_call, trace, trace_for_check
from torchlens.capture.autocast import autocast_applied
from torchlens.capture.builder import (
    REFRESH_FUNC_NAME,
    TRANSFORM_RESULT,
    UNSEEN_COMPUTATION,
    WITHOUT_GRAD,
)
from torchlens.capture.composite import opened_body
from torchlens.capture.controls import (
    Controls,
    Halt,
    Intervention,
    apply_edit,
    parse_intervene,
    reapply,
    restore_buffers,
    snapshot_buffers,
    trace_candidates,
)
from torchlens.capture.grad_calls import BACKWARDS, backward_roles
from torchlens.capture.grads import GradMapping, GradStore, default_loss, grad_untracked
from torchlens.capture.mode import functorch_level, inplace_targets
from torchlens.capture.naming import FUNC_INFOS, FuncInfo, func_info
from torchlens.capture.record import record, recording_session
from torchlens.capture.record_mode import RecordMode
from torchlens.capture.refusals import check_traceable
from torchlens.capture.roots import resolve_root
from torchlens.capture.session import active_session, refuse_reentry, suspended
from torchlens.capture.sinks import register_stream_sink
from torchlens.capture.source import caller_line, is_library_file
from torchlens.capture.special import RELEASES, SETTLES, SPECIAL_OUTPUTS, side_writes
from torchlens.capture.tree import (
    ArgSlot,
    TemplateDataclass,
    fill,
    flatten,
    is_atom,
    slots_in_order,
)
from torchlens.capture.unseen import UNSEEN_META
from torchlens.capture.walk import every_address, named_modules, named_tensors, owned_tensors
from torchlens.capture.wrappers import Rewrap

__all__ = [
    # capturing: tl.trace, tl.record and the checks' own capture (replay, backends, extract)
    "trace", "trace_for_check", "record", "normalize_call", "check_traceable",
    "resolve_root",
    # the session: one capture at a time, paused for work that must not be recorded
    "active_session", "suspended", "refuse_reentry",
    # recording a forward with a RecordMode of one's own (debug's find_nonfinite)
    "RecordMode", "recording_session", "Controls", "Halt", "snapshot_buffers",
    "restore_buffers", "inplace_targets", "caller_line", "REFRESH_FUNC_NAME",
    # edits: intervene= as the capture reads it, and how an edit is applied and reapplied
    "Intervention", "parse_intervene", "apply_edit", "reapply", "trace_candidates",
    # what a call is and what it writes: the registries replay and distributed extend
    "FUNC_INFOS", "FuncInfo", "func_info", "SPECIAL_OUTPUTS", "SETTLES", "side_writes",
    "RELEASES", "Rewrap",
    "BACKWARDS", "backward_roles", "opened_body", "functorch_level", "autocast_applied",
    # the meta keys the capture writes on ops, read by replay
    "TRANSFORM_RESULT", "UNSEEN_COMPUTATION", "WITHOUT_GRAD", "UNSEEN_META",
    # tensors inside arguments: flatten, fill and the templates' slot types
    "flatten", "fill", "ArgSlot", "TemplateDataclass", "is_atom", "slots_in_order",
    # the model's tree: modules, parameters and buffers by address
    "named_modules", "named_tensors", "owned_tensors", "every_address", "is_library_file",
    # gradients (save_grads=True) and payload sinks (io's stream_to=)
    "GradStore", "GradMapping", "default_loss", "grad_untracked", "register_stream_sink",
    # the random-number state: snapshot, restore and restored, as a namespace
    "rng",
]  # fmt: skip
