"""The capture session: a torch function mode plus wrapped module forwards that build a Trace.

Layers: ``naming`` (what a call is), ``tree`` (tensors inside arguments), ``builder`` (the
mutable recording), ``mode`` and ``hooks`` (what sees the calls), ``session`` (install and
remove them), ``api`` (``tl.trace``). Nothing here imports replay, io, viz or report.
"""

from torchlens.capture.api import normalize_call, trace
from torchlens.capture.session import active_session, suspended

__all__ = ["trace", "normalize_call", "active_session", "suspended"]
