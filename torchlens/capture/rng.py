"""Snapshots of the random number generators, so that replay draws the same numbers.

A snapshot holds the CPU generator's state and, when CUDA has been initialised, the state
of every CUDA generator. :func:`restored` puts a snapshot in place for the duration of a block
and then gives the caller back exactly the state it had before. A call handed its own
``torch.Generator`` (``torch.rand(3, generator=g)``) also keeps that generator's state, under
``"generator"``, and :func:`generator_restored` puts it back on the generator it names.

``snapshot(host=True)`` also keeps the state of Python's ``random`` and, once NumPy is
imported, of ``numpy.random``'s global generator, under ``"python"`` and ``"numpy"``: a
forward may draw from them (SpecAugment's time masks in ``transformers`` come from
``np.random``, LayerDrop from ``random``). Validation runs a model twice, and both runs must
draw the same. A trace's own ``rng_state`` holds the torch generators only.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "snapshot",
    "host_snapshot",
    "restore",
    "restored",
    "call_snapshot",
    "draws",
    "generator_restored",
]

RngSnapshot = dict[str, Any]  # generator -> state: tensors, save "python" and "numpy"


def snapshot(include_cuda: bool = True, host: bool = False) -> RngSnapshot:
    """The current state of the CPU generator and, if initialised, the CUDA generators;
    with ``host``, of Python's and NumPy's global generators too.

    Example:
        >>> sorted(snapshot(host=True))[-1], "python" in snapshot()
        ('python', False)
    """
    state: RngSnapshot = {"cpu": torch.get_rng_state()}
    if include_cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            state[f"cuda:{index}"] = torch.cuda.get_rng_state(index)
    if host:
        state.update(host_snapshot())
    return state


def host_snapshot() -> RngSnapshot:
    """The state of Python's ``random`` and, once NumPy is imported, of ``np.random``'s
    global generator (reading NumPy's costs some 30 microseconds: take it once per run).

    Example:
        >>> "python" in host_snapshot() and "cpu" not in host_snapshot()
        True
    """
    state: RngSnapshot = {"python": random.getstate()}
    numpy = sys.modules.get("numpy")  # not imported for this: a forward drawing from
    if numpy is not None:  # NumPy has imported it already
        state["numpy"] = numpy.random.get_state()
    return state


def restore(state: RngSnapshot) -> None:
    """Put ``state`` in place on every generator it names."""
    for key, value in state.items():
        if key == "cpu":
            torch.set_rng_state(value)
        elif key.startswith("cuda:") and torch.cuda.is_available():
            torch.cuda.set_rng_state(value, int(key.split(":", 1)[1]))
        elif key == "python":
            random.setstate(value)
        elif key == "numpy" and "numpy" in sys.modules:
            sys.modules["numpy"].random.set_state(value)


@contextmanager
def restored(state: RngSnapshot | None) -> Iterator[None]:
    """Run a block with ``state`` in place; the caller's own state comes back afterwards
    (Python's and NumPy's too when ``state`` holds theirs)."""
    if state is None:
        yield
        return
    saved = snapshot(host="python" in state)
    restore(state)
    try:
        yield
    finally:
        restore(saved)


def _generator_of(args: Any, kwargs: dict) -> torch.Generator | None:
    return next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Generator)), None)


# Random functions that draw only when one argument says so: name -> (its position, its
# keywords, its default). A dropout not training, and attention without dropout (the
# common case of every model in eval mode), draw nothing: their snapshot (a copy of the
# generator's state, several microseconds) is not taken.
_DRAW_FLAGS: dict[str, tuple[int, tuple[str, ...], Any]] = {
    **dict.fromkeys(
        (
            "dropout",
            "dropout1d",
            "dropout2d",
            "dropout3d",
            "alpha_dropout",
            "feature_alpha_dropout",
            "feature_dropout",
        ),
        (2, ("training", "train"), True),
    ),  # fmt: skip
    "scaled_dot_product_attention": (4, ("dropout_p",), 0.0),
}


def draws(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call of the random function ``name`` may draw random numbers.

    Example:
        >>> draws("dropout", (None, 0.1, False), {}), draws("dropout", (None,), {"p": 0.1})
        (False, True)
    """
    rule = _DRAW_FLAGS.get(name)
    if rule is None:
        return True
    position, keywords, default = rule
    value = args[position] if len(args) > position else default
    for key in keywords:
        if key in kwargs:
            value = kwargs[key]
    if not isinstance(value, (bool, int, float)):  # anything else: assume it may draw
        return True
    return bool(value)


def call_snapshot(args: Any, kwargs: dict) -> RngSnapshot:
    """:func:`snapshot`, plus the state of the generator the call was handed, if any."""
    state = snapshot()
    generator = _generator_of(args, kwargs)
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


@contextmanager
def generator_restored(state: RngSnapshot, args: Any, kwargs: dict) -> Iterator[None]:
    """Run a block with the call's own generator (found in ``args``/``kwargs``) set to the
    state saved under ``"generator"``; its state comes back afterwards."""
    generator = _generator_of(args, kwargs) if "generator" in state else None
    if generator is None:
        yield
        return
    saved = generator.get_state()
    generator.set_state(state["generator"])
    try:
        yield
    finally:
        generator.set_state(saved)
