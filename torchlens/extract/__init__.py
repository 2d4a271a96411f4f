"""Dataset-scale extraction: run a model over a data loader and keep a few sites per example.

``tl.extract(model, loader, save=selector, to=run_dir)`` streams each batch's selected
activations into safetensors shards with a JSON manifest; ``tl.load_extraction(run_dir)``
reads them back lazily, one logical array per site with row *i* = example *i*. Runs resume
after a kill and split across processes under ``torchrun``. See ``docs/extraction.md``.
"""

from torchlens.extract._read import Extraction, SiteArray, load_extraction
from torchlens.extract._reduce import REDUCTIONS
from torchlens.extract._run import extract

__all__ = ["extract", "load_extraction", "Extraction", "SiteArray", "REDUCTIONS"]
