"""Whether a traceback frame is torchlens's own code: a file inside the imported torchlens
package directory, not any path that merely contains "torchlens" (a clone folder named
``torchlens``, with its ``.venv`` of torch inside, puts that word in every path)."""

from __future__ import annotations

from pathlib import Path

import torchlens

_PACKAGE = Path(torchlens.__file__).resolve().parent


def in_torchlens(filename: str) -> bool:
    """Whether ``filename`` is a file of the torchlens package itself."""
    return Path(filename).resolve().is_relative_to(_PACKAGE)
