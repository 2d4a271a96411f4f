"""``python -m torchlens`` (and the installed ``torchlens`` script): see :mod:`torchlens.cli`."""

from torchlens.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
