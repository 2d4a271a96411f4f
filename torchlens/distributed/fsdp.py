"""FSDP2's own ops, as capture must see them.

``torch.ops.fsdp.all_gather_copy_in(inputs, output, ...)`` copies each rank's shards into
``output`` (the buffer the all-gather fills) and returns two views of it, but its schema does
not say that it writes ``output``. Registered here as writing that argument, so the value
saved for the buffer before the call is kept (``TraceBuilder.protect``) and the call's outputs
are the views it returns.
"""

from __future__ import annotations

from torchlens.capture import FUNC_INFOS, SPECIAL_OUTPUTS, FuncInfo, flatten

__all__ = ["register_fsdp"]

_COPY_IN = "all_gather_copy_in"


def register_fsdp() -> None:
    """Describe FSDP2's copy-in op to capture (a build without it: nothing to do)."""
    try:
        import torch.distributed.fsdp  # defines torch.ops.fsdp
    except Exception:  # noqa: BLE001 - no FSDP in this build
        return
    packet = getattr(torch.ops.fsdp, _COPY_IN, None)
    if packet is None:
        return
    info = FuncInfo(_COPY_IN, (1,), False, False)
    FUNC_INFOS[packet] = info
    for overload in packet.overloads():
        FUNC_INFOS[getattr(packet, overload)] = info
    SPECIAL_OUTPUTS[_COPY_IN] = lambda args, result: flatten(result)[0]  # the views returned
