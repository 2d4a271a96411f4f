"""Models sharded across processes (FSDP2, tensor parallel over ``DTensor``, DDP) under
``torchrun``: what torchlens knows of ``torch.distributed`` lives here, above capture.

Importing it registers the collectives with capture and replay
(:mod:`torchlens.distributed.collectives`), which changes nothing in torch.
"""

from __future__ import annotations

from torchlens.distributed.collectives import is_collective, register
from torchlens.distributed.fsdp import register_fsdp
from torchlens.distributed.placements import assemble, placement_of
from torchlens.distributed.ranks import RankOp, RankTraces, load_ranks, save_rank
from torchlens.distributed.release import register_release

register()
register_fsdp()
register_release()

__all__ = [
    "save_rank", "load_ranks", "RankTraces", "RankOp", "is_collective", "placement_of",
    "assemble",
]  # fmt: skip
