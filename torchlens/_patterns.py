"""Module address patterns: the glob that ``tl.module``, ``trace.module_calls`` and the
summaries' ``module=`` share, with ``+`` for one segment beside :mod:`fnmatch`'s rules.

Kept apart from :mod:`torchlens.selectors` so the read-only views of the data model
(:mod:`torchlens._views`) use the same rule without importing upward.
"""

from __future__ import annotations

import fnmatch
import re

from torchlens.errors import InvalidArgumentError

__all__ = ["module_pattern"]

_SEGMENT = "\ue000"  # stands for a "+" segment while fnmatch translates the rest
_PLUS_SEGMENT = re.compile(r"(?<![^.])\+(?![^.])")  # a "+" that is a whole segment
_CALL_SUFFIX = re.compile(r":\d+\Z")


def module_pattern(pattern: str) -> re.Pattern | None:
    """The regex a module address pattern stands for, or None for a plain address.

    ``*`` matches any run of characters, dots included (``"transformer.h.*"`` matches
    ``transformer.h.0`` and ``transformer.h.0.attn.c_attn`` alike), ``?`` one character and
    ``[...]`` one of a set, as :mod:`fnmatch`; ``+`` standing as a whole segment matches
    exactly one segment, no dots (``"transformer.h.+"`` matches the blocks ``transformer.h.0``,
    ``transformer.h.1``, ... and nothing inside them; ``"blocks.+.attn"`` each block's
    ``attn``). A ``+`` inside a segment is a plain character; ``[+]`` is a segment named
    ``+``.

    Raises:
        InvalidArgumentError: ``bad_selector`` for an empty segment (``"layers..0"``,
            ``"layers."``) or a call number in the pattern (``"layers.0:2"``: use
            ``call=2``).

    Example:
        >>> bool(module_pattern("h.+").match("h.0")), bool(module_pattern("h.+").match("h.0.attn"))
        (True, False)
        >>> module_pattern("h.0") is None
        True
    """
    if pattern and "" in pattern.split("."):
        raise InvalidArgumentError(
            f"module pattern {pattern!r} has an empty segment: addresses are names joined by "
            "single dots, with none at either end ('layers.0', 'layers.*', 'layers.+')",
            code="bad_selector",
        )
    if _CALL_SUFFIX.search(pattern):
        address, _, call = pattern.rpartition(":")
        raise InvalidArgumentError(
            f"module pattern {pattern!r} names a call: write tl.module({address!r}, "
            f"call={call}) (trace.module_calls and trace.modules take 'address:N')",
            code="bad_selector",
        )
    plain = _PLUS_SEGMENT.sub(_SEGMENT, pattern)
    if plain == pattern and not any(ch in pattern for ch in "*?["):
        return None
    return re.compile(fnmatch.translate(plain).replace(_SEGMENT, "[^.]+"))
